# Evaluation examples (issue 6).
phasekv_add_example(example_induction_training SOURCES induction_training.cpp
  ARGS --out ${CMAKE_CURRENT_BINARY_DIR})
phasekv_add_example(example_mitigations SOURCES mitigations.cpp ARGS --quick --out ${CMAKE_CURRENT_BINARY_DIR})
