# Third-party dependencies of the tests, benchmarks, tools and examples (never of the headers).
# Each is looked up with find_package first (Debian: libgtest-dev + libgmock-dev,
# libbenchmark-dev, libcli11-dev, nlohmann-json3-dev; the presets' dependency provider,
# cmake/phasekv_dependency_provider.cmake, installs them when it may). A dependency that is
# still missing is built from its release archive: from FETCHCONTENT_SOURCE_DIR_<NAME> when that
# points at a source tree, else downloaded once, with no retries and at most
# PHASEKV_FETCH_TIMEOUT seconds, so that a machine without internet access stops at once with
# one message that says what to install or set.
include_guard(GLOBAL)
include(FetchContent)

set(PHASEKV_FETCH_TIMEOUT 20 CACHE STRING
  "Seconds allowed to download one missing dependency archive (0: never download)")

# Debian packages of dependency <name> (FetchContent name), in <out>.
function(_phasekv_debian_packages name out)
  set(googletest libgtest-dev libgmock-dev)
  set(googlebenchmark libbenchmark-dev)
  set(cli11 libcli11-dev)
  set(nlohmann_json nlohmann-json3-dev)
  set(${out} ${${name}} PARENT_SCOPE)
endfunction()

# The Debian packages this configuration needs and dpkg does not list as installed, plus the
# packages of <name> itself, in <out>.
function(_phasekv_missing_debian_packages name out)
  _phasekv_debian_packages(${name} own)
  set(needed ${own})
  set(deps "")
  if(PHASEKV_BUILD_TESTS)
    list(APPEND deps googletest)
  endif()
  if(PHASEKV_BUILD_BENCHMARKS)
    list(APPEND deps googlebenchmark)
  endif()
  if(PHASEKV_BUILD_TOOLS OR PHASEKV_BUILD_EXAMPLES)
    list(APPEND deps cli11 nlohmann_json)
  endif()
  foreach(dep IN LISTS deps)
    _phasekv_debian_packages(${dep} pkgs)
    list(APPEND needed ${pkgs})
  endforeach()
  list(REMOVE_DUPLICATES needed)
  set(missing ${own})
  find_program(_phasekv_dpkg_query dpkg-query)
  mark_as_advanced(_phasekv_dpkg_query)
  if(_phasekv_dpkg_query)
    foreach(p IN LISTS needed)
      execute_process(COMMAND ${_phasekv_dpkg_query} -W -f=\${Status} ${p}
                      OUTPUT_VARIABLE status ERROR_QUIET RESULT_VARIABLE rc)
      if(NOT rc EQUAL 0 OR NOT status MATCHES "install ok installed")
        list(APPEND missing ${p})
      endif()
    endforeach()
  endif()
  list(REMOVE_DUPLICATES missing)
  set(${out} ${missing} PARENT_SCOPE)
endfunction()

# Makes the archive <url> of dependency <name> (FetchContent name) available as a local file and
# sets <out> to its path; sets <out> to "" when FETCHCONTENT_SOURCE_DIR_<NAME> is given. When the
# download fails, stops with one message. <label> says what the dependency is and what needs it,
# <find_hint> how to point find_package at an installed copy, <off_hint> what turns the need off.
function(_phasekv_fetch_archive name url label find_hint off_hint out)
  string(TOUPPER "${name}" uc)
  if(FETCHCONTENT_SOURCE_DIR_${uc})
    set(${out} "" PARENT_SCOPE)
    return()
  endif()
  get_filename_component(file_name "${url}" NAME)
  set(archive "${CMAKE_BINARY_DIR}/_deps/${name}-archive/${file_name}")
  if(NOT EXISTS "${archive}")
    if(PHASEKV_FETCH_TIMEOUT GREATER 0)
      message(STATUS "phasekv: ${label} not found, downloading ${url}")
      file(DOWNLOAD "${url}" "${archive}.part" STATUS status
           TIMEOUT ${PHASEKV_FETCH_TIMEOUT} INACTIVITY_TIMEOUT 10)
      list(GET status 0 code)
      list(GET status 1 reason)
    else()
      set(code -1)
      set(reason "downloads are off: PHASEKV_FETCH_TIMEOUT=0")
    endif()
    if(NOT code EQUAL 0)
      file(REMOVE "${archive}.part")
      _phasekv_missing_debian_packages(${name} packages)
      list(JOIN packages " " packages)
      message(FATAL_ERROR
        "phasekv: ${label} is not installed and could not be downloaded "
        "(${url}: ${reason}; limit PHASEKV_FETCH_TIMEOUT=${PHASEKV_FETCH_TIMEOUT} s).\n"
        "Any one of these fixes it:\n"
        "  - install the Debian package(s) this configuration lacks:\n"
        "      apt-get install -y --no-install-recommends ${packages}\n"
        "    (the README's presets do that themselves when run as root, unless "
        "PHASEKV_INSTALL_DEPS=OFF)\n"
        "  - point CMake at an installed copy: ${find_hint}\n"
        "  - or at its source tree: -DFETCHCONTENT_SOURCE_DIR_${uc}=<source directory>\n"
        "  - or build without it: ${off_hint}")
    endif()
    file(RENAME "${archive}.part" "${archive}")
  endif()
  set(${out} "${archive}" PARENT_SCOPE)
endfunction()

# FetchContent_Declare + MakeAvailable of <name> from the archive at <url> (see above).
macro(_phasekv_fetch name url label find_hint off_hint)
  _phasekv_fetch_archive(${name} "${url}" "${label}" "${find_hint}" "${off_hint}"
                         _phasekv_archive_${name})
  if(_phasekv_archive_${name})
    FetchContent_Declare(${name} URL "${_phasekv_archive_${name}}")
  else()
    FetchContent_Declare(${name} URL "${url}")
  endif()
  FetchContent_MakeAvailable(${name})
endmacro()

macro(phasekv_require_gtest)
  if(NOT TARGET GTest::gtest_main)
    find_package(GTest QUIET)
    if(NOT GTest_FOUND)
      set(INSTALL_GTEST OFF CACHE BOOL "" FORCE)
      set(gtest_force_shared_crt ON CACHE BOOL "" FORCE)
      _phasekv_fetch(googletest
        https://github.com/google/googletest/archive/refs/tags/v1.14.0.tar.gz
        "GoogleTest (needed by the tests)"
        "-DGTest_DIR=<directory with GTestConfig.cmake>"
        "-DPHASEKV_BUILD_TESTS=OFF")
    endif()
  endif()
  include(GoogleTest)
endmacro()

macro(phasekv_require_benchmark)
  if(NOT TARGET benchmark::benchmark)
    find_package(benchmark QUIET)
    if(NOT benchmark_FOUND)
      set(BENCHMARK_ENABLE_TESTING OFF CACHE BOOL "" FORCE)
      set(BENCHMARK_ENABLE_INSTALL OFF CACHE BOOL "" FORCE)
      _phasekv_fetch(googlebenchmark
        https://github.com/google/benchmark/archive/refs/tags/v1.8.3.tar.gz
        "Google Benchmark (needed by the benchmarks)"
        "-Dbenchmark_DIR=<directory with benchmarkConfig.cmake>"
        "-DPHASEKV_BUILD_BENCHMARKS=OFF")
    endif()
  endif()
endmacro()

macro(phasekv_require_cli11)
  if(NOT TARGET CLI11::CLI11)
    find_package(CLI11 CONFIG QUIET)
    if(NOT CLI11_FOUND)
      _phasekv_fetch(cli11
        https://github.com/CLIUtils/CLI11/archive/refs/tags/v2.4.1.tar.gz
        "CLI11 (needed by the tools and examples)"
        "-DCLI11_DIR=<directory with CLI11Config.cmake>"
        "-DPHASEKV_BUILD_TOOLS=OFF -DPHASEKV_BUILD_EXAMPLES=OFF")
    endif()
  endif()
endmacro()

macro(phasekv_require_json)
  if(NOT TARGET nlohmann_json::nlohmann_json)
    find_package(nlohmann_json 3.9 CONFIG QUIET)
    if(NOT nlohmann_json_FOUND)
      _phasekv_fetch(nlohmann_json
        https://github.com/nlohmann/json/releases/download/v3.11.3/json.tar.xz
        "nlohmann_json (needed by the tools and examples)"
        "-Dnlohmann_json_DIR=<directory with nlohmann_jsonConfig.cmake>"
        "-DPHASEKV_BUILD_TOOLS=OFF -DPHASEKV_BUILD_EXAMPLES=OFF")
    endif()
  endif()
endmacro()
