# Disassembles an object compiled with baseline x86-64 flags that calls phasekv's dispatching
# entry points, and checks the target regions of run-time dispatch (core/foreach_target.inc):
#  - some function of the AVX-512 passes (namespace tgt_avx512 / tgt_avx512bf16) uses zmm
#    registers and some function of the AVX2 pass uses ymm registers: the passes are compiled;
#  - no function outside the tgt_avx2 / tgt_avx512* namespaces uses ymm or zmm registers:
#    nothing else (standard-library inline functions, phasekv's own entry points, checks)
#    picked up the passes' instruction sets, which a baseline CPU could not run.
# Usage: cmake -DOBJDUMP=<objdump> -DOBJECT=<file.o> -P check_targets.cmake
cmake_minimum_required(VERSION 3.25)
if(NOT OBJDUMP OR NOT OBJECT)
  message(FATAL_ERROR "check_targets.cmake: pass -DOBJDUMP=<objdump> -DOBJECT=<file.o>")
endif()
execute_process(COMMAND ${OBJDUMP} -d -C --no-show-raw-insn ${OBJECT}
                OUTPUT_VARIABLE out RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "check_targets.cmake: ${OBJDUMP} -d ${OBJECT} failed (${rc})")
endif()
string(REPLACE ";" "," out "${out}")  # demangled names contain no ';' but keep lists sane
string(REPLACE "\n" ";" lines "${out}")
set(fn "")
set(leaks "")
set(zmm_in_pass 0)
set(ymm_in_pass 0)
set(functions 0)
foreach(line IN LISTS lines)
  if(line MATCHES "^[0-9a-f]+ <(.*)>:$")
    set(fn "${CMAKE_MATCH_1}")
    math(EXPR functions "${functions} + 1")
  elseif(line MATCHES "%[yz]mm")
    if(fn MATCHES "::tgt_avx512(bf16)?::")
      if(line MATCHES "%zmm")
        set(zmm_in_pass 1)
      endif()
    elseif(fn MATCHES "::tgt_avx2::")
      set(ymm_in_pass 1)
    else()
      list(APPEND leaks "${fn}")
    endif()
  endif()
endforeach()
list(REMOVE_DUPLICATES leaks)
message(STATUS "${OBJECT}: ${functions} functions")
if(leaks)
  list(LENGTH leaks n)
  string(REPLACE ";" "\n  " text "${leaks}")
  message(FATAL_ERROR "${n} function(s) outside the target passes use ymm/zmm registers:\n  ${text}")
endif()
if(NOT zmm_in_pass OR NOT ymm_in_pass)
  message(FATAL_ERROR "the AVX2/AVX-512 passes are missing (zmm in tgt_avx512*: ${zmm_in_pass}, "
                      "ymm in tgt_avx2: ${ymm_in_pass}); is PHASEKV_DISPATCH on?")
endif()
message(STATUS "wide registers only inside the tgt_avx2 / tgt_avx512* passes")
