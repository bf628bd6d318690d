# Compressor examples: a user-written compressor policy used end to end.
phasekv_add_example(example_custom_compressor SOURCES custom_compressor.cpp)
