# Warning and sanitizer settings for phasekv's own targets (tests, benchmarks, tools,
# examples). Consumers of phasekv::phasekv inherit none of this.
include_guard(GLOBAL)

add_library(phasekv_build_flags INTERFACE)
if(CMAKE_CXX_COMPILER_ID MATCHES "GNU|Clang")
  target_compile_options(phasekv_build_flags INTERFACE
    $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic -Wshadow -Wconversion -Wno-sign-conversion>)
  if(PHASEKV_WARNINGS_AS_ERRORS)
    target_compile_options(phasekv_build_flags INTERFACE $<$<COMPILE_LANGUAGE:CXX>:-Werror>)
  endif()
endif()
if(PHASEKV_SANITIZE)
  target_compile_options(phasekv_build_flags INTERFACE
    $<$<COMPILE_LANGUAGE:CXX>:-fsanitize=${PHASEKV_SANITIZE} -fno-omit-frame-pointer -fno-sanitize-recover=all>)
  target_link_options(phasekv_build_flags INTERFACE -fsanitize=${PHASEKV_SANITIZE})
endif()
