# Evaluation examples (issue 6).
phasekv_add_example(example_induction_training SOURCES induction_training.cpp
  ARGS --out ${CMAKE_CURRENT_BINARY_DIR})
