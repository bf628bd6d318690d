# Whether phasekv's build may install what it is missing (PHASEKV_INSTALL_DEPS): shared by the
# presets' dependency provider (Debian packages) and cmake/phasekv_python.cmake (a venv with
# PyPI packages).
include_guard(GLOBAL)

# Whether installing is switched on: the environment variable wins over the cache variable.
function(_phasekv_provider_enabled out)
  if(DEFINED ENV{PHASEKV_INSTALL_DEPS} AND NOT "$ENV{PHASEKV_INSTALL_DEPS}" STREQUAL "")
    set(value "$ENV{PHASEKV_INSTALL_DEPS}")
  elseif(DEFINED PHASEKV_INSTALL_DEPS)
    set(value "${PHASEKV_INSTALL_DEPS}")
  else()
    set(value ON)
  endif()
  if(value)
    set(${out} TRUE PARENT_SCOPE)
  else()
    set(${out} FALSE PARENT_SCOPE)
  endif()
endfunction()
