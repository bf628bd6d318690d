# Runtime dispatch between per-instruction-set builds of the decode kernel
# (examples/cpu_dispatch/): kernel.cpp is compiled once per instruction set into an object
# library, main.cpp picks the widest build the CPU supports. On x86 with GCC or clang the
# builds are base (x86-64), avx2 and avx512; elsewhere only base. Each build appends its
# -march/-m flags after the build's own, so a -march=native build still gets a real baseline.
set(_pkv_dispatch_dir ${CMAKE_CURRENT_SOURCE_DIR}/cpu_dispatch)
set(_pkv_dispatch_builds base)
set(_pkv_dispatch_flags_base "")
if(CMAKE_SYSTEM_PROCESSOR MATCHES "x86_64|AMD64" AND CMAKE_CXX_COMPILER_ID MATCHES "GNU|Clang")
  include(CheckCXXCompilerFlag)
  set(_pkv_dispatch_flags_base -march=x86-64 -mtune=generic)
  set(_pkv_dispatch_flags_avx2 -march=x86-64 -mtune=generic -mavx2 -mfma -mf16c)
  set(_pkv_dispatch_flags_avx512 -march=x86-64 -mtune=generic -mavx2 -mfma -mf16c -mavx512f
      -mavx512bw -mavx512vl -mavx512dq)
  foreach(b avx2 avx512)
    string(REPLACE ";" " " _f "${_pkv_dispatch_flags_${b}}")
    check_cxx_compiler_flag("${_f}" PHASEKV_DISPATCH_FLAGS_${b})
    if(PHASEKV_DISPATCH_FLAGS_${b})
      list(APPEND _pkv_dispatch_builds ${b})
    endif()
  endforeach()
endif()

set(_pkv_dispatch_objects "")
foreach(b IN LISTS _pkv_dispatch_builds)
  add_library(example_cpu_dispatch_${b} OBJECT ${_pkv_dispatch_dir}/kernel.cpp)
  target_link_libraries(example_cpu_dispatch_${b} PRIVATE phasekv::phasekv phasekv_build_flags)
  target_compile_definitions(example_cpu_dispatch_${b} PRIVATE PHASEKV_EXAMPLE_BUILD=${b})
  target_compile_options(example_cpu_dispatch_${b} PRIVATE ${_pkv_dispatch_flags_${b}})
  # GCC 12's AVX-512 intrinsic headers trip -Wmaybe-uninitialized (GCC PR 105593).
  if(b STREQUAL "avx512" AND CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
    target_compile_options(example_cpu_dispatch_${b} PRIVATE -Wno-maybe-uninitialized)
  endif()
  list(APPEND _pkv_dispatch_objects $<TARGET_OBJECTS:example_cpu_dispatch_${b}>)
endforeach()

phasekv_add_example(example_cpu_dispatch SOURCES ${_pkv_dispatch_dir}/main.cpp
  ${_pkv_dispatch_objects})
target_include_directories(example_cpu_dispatch PRIVATE ${_pkv_dispatch_dir})
foreach(b IN LISTS _pkv_dispatch_builds)
  if(NOT b STREQUAL "base")
    string(TOUPPER ${b} _B)
    target_compile_definitions(example_cpu_dispatch PRIVATE PHASEKV_EXAMPLE_HAVE_${_B})
  endif()
endforeach()

# The builds must not share a phasekv symbol (see check_odr.cmake).
list(LENGTH _pkv_dispatch_objects _n)
if(PHASEKV_BUILD_TESTS AND _n GREATER 1 AND CMAKE_NM)
  string(REPLACE ";" "|" _objs "${_pkv_dispatch_objects}")
  add_test(NAME example.cpu_dispatch.odr
    COMMAND ${CMAKE_COMMAND} -DNM=${CMAKE_NM} "-DOBJECTS=${_objs}"
            -P ${_pkv_dispatch_dir}/check_odr.cmake)
  set_tests_properties(example.cpu_dispatch.odr PROPERTIES LABELS example)
endif()
