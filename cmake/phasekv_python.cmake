# Python for the extension phasekv._core and its pytest suite (PHASEKV_BUILD_PYTHON=ON).
#
# Under scikit-build-core (`pip install .`) the build environment already has the interpreter
# and nanobind: nothing here installs anything.
#
# In a plain CMake build the interpreter found by FindPython must import the modules the build
# needs: nanobind (always) and, with the tests, numpy, pytest and ml_dtypes. When it does not,
# and PHASEKV_INSTALL_DEPS is not OFF (environment variable or cache variable, as for the
# Debian packages of cmake/phasekv_dependency_provider.cmake), a virtual environment is made
# at ${CMAKE_BINARY_DIR}/python-venv and the missing modules are installed into it from PyPI
# with pip (Debian forbids pip outside a venv); the build then uses that interpreter. With
# PHASEKV_INSTALL_DEPS=OFF the commands that would do it are printed and configuring stops.
# On Debian the interpreter needs python3-dev and python3-venv: under the presets (as root)
# the dependency provider installs them like the other Debian packages.
include_guard(GLOBAL)

include(${CMAKE_CURRENT_LIST_DIR}/phasekv_install_deps.cmake)

# The modules of <modules> that <python> cannot import, in <out>.
function(_phasekv_python_missing python modules out)
  set(missing "")
  foreach(m IN LISTS modules)
    execute_process(COMMAND "${python}" -c "import ${m}" RESULT_VARIABLE rc OUTPUT_QUIET
                    ERROR_QUIET)
    if(NOT rc EQUAL 0)
      list(APPEND missing ${m})
    endif()
  endforeach()
  set(${out} "${missing}" PARENT_SCOPE)
endfunction()

# PyPI names of importable modules <modules>, in <out>.
function(_phasekv_python_pypi_names modules out)
  set(names "")
  foreach(m IN LISTS modules)
    if(m STREQUAL "ml_dtypes")
      list(APPEND names "ml-dtypes")
    else()
      list(APPEND names "${m}")
    endif()
  endforeach()
  set(${out} "${names}" PARENT_SCOPE)
endfunction()

# Finds Python (Interpreter + Development.Module) whose interpreter imports <modules>, making
# the venv described above when needed. Sets Python_EXECUTABLE (cache) and the FindPython
# results in the caller's scope.
macro(phasekv_find_python)
  set(_phasekv_py_modules ${ARGN})
  if(COMMAND _phasekv_provider_install AND NOT SKBUILD)
    # Debian: the headers and the venv module (installed when missing, as root, opt-out).
    find_package(Python 3.8 COMPONENTS Interpreter Development.Module QUIET)
    if(NOT Python_FOUND)
      _phasekv_provider_install("Python" "python3-dev;python3-venv" _phasekv_py_ok)
    endif()
  endif()
  find_package(Python 3.8 REQUIRED COMPONENTS Interpreter Development.Module)
  _phasekv_python_missing("${Python_EXECUTABLE}" "${_phasekv_py_modules}" _phasekv_py_missing)
  if(_phasekv_py_missing AND NOT SKBUILD)
    set(_phasekv_venv "${CMAKE_BINARY_DIR}/python-venv")
    _phasekv_python_pypi_names("${_phasekv_py_missing}" _phasekv_pkgs)
    list(JOIN _phasekv_pkgs " " _phasekv_pkg_words)
    list(JOIN _phasekv_py_missing ", " _phasekv_missing_words)
    _phasekv_provider_enabled(_phasekv_py_enabled)
    if(NOT _phasekv_py_enabled)
      message(FATAL_ERROR
        "phasekv: ${Python_EXECUTABLE} cannot import ${_phasekv_missing_words}; not installing "
        "them (PHASEKV_INSTALL_DEPS is off). To install them run:\n"
        "  python3 -m venv ${_phasekv_venv} && ${_phasekv_venv}/bin/pip install "
        "${_phasekv_pkg_words}\n"
        "and configure with -DPython_EXECUTABLE=${_phasekv_venv}/bin/python "
        "(or PHASEKV_BUILD_PYTHON=OFF)")
    endif()
    if(NOT EXISTS "${_phasekv_venv}/bin/python" AND COMMAND _phasekv_provider_install)
      # Debian's interpreter makes venvs only with python3-venv (ensurepip).
      execute_process(COMMAND "${Python_EXECUTABLE}" -c "import venv, ensurepip"
                      RESULT_VARIABLE _phasekv_rc OUTPUT_QUIET ERROR_QUIET)
      if(NOT _phasekv_rc EQUAL 0)
        _phasekv_provider_install("Python venv" "python3-venv" _phasekv_py_ok)
      endif()
    endif()
    if(NOT EXISTS "${_phasekv_venv}/bin/python")
      message(STATUS "phasekv: ${Python_EXECUTABLE} cannot import ${_phasekv_missing_words}; making "
                     "a venv at ${_phasekv_venv} (PHASEKV_INSTALL_DEPS=OFF in the environment "
                     "prevents this)")
      execute_process(COMMAND "${Python_EXECUTABLE}" -m venv "${_phasekv_venv}"
                      RESULT_VARIABLE _phasekv_rc)
      if(NOT _phasekv_rc EQUAL 0)
        message(FATAL_ERROR "phasekv: '${Python_EXECUTABLE} -m venv' failed (Debian: "
                            "apt-get install python3-venv)")
      endif()
    endif()
    _phasekv_python_missing("${_phasekv_venv}/bin/python" "${_phasekv_py_modules}"
                            _phasekv_py_missing)
    if(_phasekv_py_missing)
      _phasekv_python_pypi_names("${_phasekv_py_missing}" _phasekv_pkgs)
      list(JOIN _phasekv_pkgs " " _phasekv_pkg_words)
      message(STATUS "phasekv: installing ${_phasekv_pkg_words} from PyPI into ${_phasekv_venv}")
      execute_process(COMMAND "${_phasekv_venv}/bin/python" -m pip install -q
                              --disable-pip-version-check ${_phasekv_pkgs}
                      RESULT_VARIABLE _phasekv_rc TIMEOUT 900)
      if(NOT _phasekv_rc EQUAL 0)
        message(FATAL_ERROR "phasekv: pip install ${_phasekv_pkg_words} into ${_phasekv_venv} failed")
      endif()
    endif()
    set(Python_EXECUTABLE "${_phasekv_venv}/bin/python" CACHE FILEPATH "Python interpreter" FORCE)
    set(Python_EXECUTABLE "${_phasekv_venv}/bin/python")
    unset(Python_FOUND)
    unset(_Python_EXECUTABLE CACHE)
    find_package(Python 3.8 REQUIRED COMPONENTS Interpreter Development.Module)
  elseif(_phasekv_py_missing)
    message(FATAL_ERROR "phasekv: ${Python_EXECUTABLE} cannot import ${_phasekv_py_missing}")
  endif()
endmacro()
