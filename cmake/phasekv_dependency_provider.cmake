# Dependency provider for the presets in CMakePresets.json (they set
# CMAKE_PROJECT_TOP_LEVEL_INCLUDES to this file; nothing else does, so a plain
# `cmake -S . -B build` or a project that adds phasekv with add_subdirectory/FetchContent never
# gets here and never has its system touched).
#
# When find_package() cannot find one of the packages below, the provider installs the matching
# Debian package with apt-get, provided that
#   - PHASEKV_INSTALL_DEPS is not OFF (environment variable, or cache variable; the environment
#     wins, so `PHASEKV_INSTALL_DEPS=OFF cmake --workflow --preset test` prevents installing),
#   - CMake runs as root and apt-get is available, and
#   - the build is not cross-compiled (host packages would not help).
# Otherwise it prints the command that would install the package and leaves the search to
# find_package itself and to the fallback in phasekv_dependencies.cmake.
# Every other find_package() call passes through untouched.
include_guard(GLOBAL)

if(CMAKE_VERSION VERSION_LESS 3.24)
  return()
endif()

# Debian packages of find_package(<name>) (empty when the provider does not handle it), in <out>.
function(_phasekv_provider_packages name out)
  set(map
    "CLI11=libcli11-dev"
    "nlohmann_json=nlohmann-json3-dev"
    "GTest=libgtest-dev,libgmock-dev"
    "benchmark=libbenchmark-dev"
    "Doxygen=doxygen")
  set(result "")
  foreach(entry IN LISTS map)
    if(entry MATCHES "^${name}=(.*)$")
      string(REPLACE "," ";" result "${CMAKE_MATCH_1}")
    endif()
  endforeach()
  set(${out} "${result}" PARENT_SCOPE)
endfunction()

include(${CMAKE_CURRENT_LIST_DIR}/phasekv_install_deps.cmake)

# Runs apt-get with a bounded wait; <out> is TRUE when it exited with 0.
function(_phasekv_provider_apt out)
  execute_process(
    COMMAND ${CMAKE_COMMAND} -E env DEBIAN_FRONTEND=noninteractive
            apt-get -q -o Acquire::Retries=0 -o Acquire::http::Timeout=15
            -o Acquire::https::Timeout=15 -o DPkg::Lock::Timeout=120 ${ARGN}
    RESULT_VARIABLE rc
    TIMEOUT 900)
  if(rc EQUAL 0)
    set(${out} TRUE PARENT_SCOPE)
  else()
    set(${out} FALSE PARENT_SCOPE)
  endif()
endfunction()

# Installs <packages> for find_package(<name>) when allowed; otherwise prints the command.
# <out> is TRUE when the packages were installed.
function(_phasekv_provider_install name packages out)
  set(${out} FALSE PARENT_SCOPE)
  list(JOIN packages " " pkg_words)
  set(command "apt-get install -y --no-install-recommends ${pkg_words}")
  find_program(_phasekv_apt_get apt-get)
  mark_as_advanced(_phasekv_apt_get)
  set(uid "")
  find_program(_phasekv_id id)
  mark_as_advanced(_phasekv_id)
  if(_phasekv_id)
    execute_process(COMMAND ${_phasekv_id} -u OUTPUT_VARIABLE uid
                    OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
  endif()
  _phasekv_provider_enabled(enabled)

  if(NOT _phasekv_apt_get)
    message(STATUS "phasekv: ${name} not found and this system has no apt-get; install "
                   "${name} with its package manager (Debian: ${pkg_words})")
    return()
  endif()
  if(NOT enabled)
    message(STATUS "phasekv: ${name} not found; not installing it (PHASEKV_INSTALL_DEPS is "
                   "off). To install it run:  ${command}")
    return()
  endif()
  if(NOT uid STREQUAL "0")
    message(STATUS "phasekv: ${name} not found; not installing it (not running as root). "
                   "To install it run:  sudo ${command}")
    return()
  endif()

  # Installed already, yet not found (a broken or partial copy): apt-get would not help.
  set(missing "")
  foreach(p IN LISTS packages)
    execute_process(COMMAND dpkg-query -W -f=\${Status} ${p}
                    OUTPUT_VARIABLE status ERROR_QUIET RESULT_VARIABLE rc)
    if(NOT rc EQUAL 0 OR NOT status MATCHES "install ok installed")
      list(APPEND missing ${p})
    endif()
  endforeach()
  if(NOT missing)
    message(STATUS "phasekv: ${name} not found although ${pkg_words} is installed; "
                   "not installing anything")
    return()
  endif()

  list(JOIN missing " " missing_words)
  message(STATUS "phasekv: ${name} not found; installing Debian package(s) ${missing_words} "
                 "(PHASEKV_INSTALL_DEPS=OFF in the environment prevents this)")
  # Install from the current package lists; when that fails (no lists yet, or stale ones that
  # name files the mirror no longer has), update them and try once more.
  file(GLOB lists /var/lib/apt/lists/*_Packages*)
  set(ok FALSE)
  if(lists)
    _phasekv_provider_apt(ok install -y --no-install-recommends ${missing})
  endif()
  if(NOT ok)
    message(STATUS "phasekv: running apt-get update")
    _phasekv_provider_apt(updated update)
    if(updated)
      _phasekv_provider_apt(ok install -y --no-install-recommends ${missing})
    endif()
  endif()
  if(ok)
    set(${out} TRUE PARENT_SCOPE)
  else()
    message(STATUS "phasekv: installing ${missing_words} failed")
  endif()
endfunction()

# The provider. A macro, so that what find_package sets (<name>_FOUND, imported targets, the
# module's result variables) lands in the caller's scope. Its own variables carry the package
# name, because nested find_package calls (find_dependency in a config file, FindGTest looking
# for GTestConfig) run it again in the same scope.
macro(phasekv_provide_dependency method package_name)
  _phasekv_provider_packages("${package_name}" _phasekv_prov_pkgs_${package_name})
  if(_phasekv_prov_pkgs_${package_name} AND NOT CMAKE_CROSSCOMPILING
     AND NOT _phasekv_prov_active_${package_name})
    set(_phasekv_prov_active_${package_name} TRUE)
    set(_phasekv_prov_args_${package_name} "${ARGN}")
    list(REMOVE_ITEM _phasekv_prov_args_${package_name} REQUIRED QUIET)
    find_package(${package_name} ${_phasekv_prov_args_${package_name}} QUIET BYPASS_PROVIDER)
    if(NOT ${package_name}_FOUND)
      _phasekv_provider_install("${package_name}" "${_phasekv_prov_pkgs_${package_name}}"
                                _phasekv_prov_ok_${package_name})
      if(_phasekv_prov_ok_${package_name})
        find_package(${package_name} ${ARGN} BYPASS_PROVIDER)
      endif()
    endif()
    # When <name>_FOUND is still false, CMake runs its own find_package (REQUIRED and all).
    unset(_phasekv_prov_active_${package_name})
    unset(_phasekv_prov_args_${package_name})
    unset(_phasekv_prov_ok_${package_name})
  endif()
  unset(_phasekv_prov_pkgs_${package_name})
endmacro()

cmake_language(SET_DEPENDENCY_PROVIDER phasekv_provide_dependency
  SUPPORTED_METHODS FIND_PACKAGE)
