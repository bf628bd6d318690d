# Third-party dependencies of the tests, benchmarks, tools and examples (never of the headers).
# Each is looked up with find_package first (Debian: libgtest-dev, libbenchmark-dev,
# libcli11-dev, nlohmann-json3-dev); machines without them fall back to FetchContent.
include_guard(GLOBAL)
include(FetchContent)

macro(phasekv_require_gtest)
  if(NOT TARGET GTest::gtest_main)
    find_package(GTest QUIET)
    if(NOT GTest_FOUND)
      message(STATUS "phasekv: GoogleTest not found, fetching it")
      set(INSTALL_GTEST OFF CACHE BOOL "" FORCE)
      set(gtest_force_shared_crt ON CACHE BOOL "" FORCE)
      FetchContent_Declare(googletest
        URL https://github.com/google/googletest/archive/refs/tags/v1.14.0.tar.gz)
      FetchContent_MakeAvailable(googletest)
    endif()
  endif()
  include(GoogleTest)
endmacro()

macro(phasekv_require_benchmark)
  if(NOT TARGET benchmark::benchmark)
    find_package(benchmark QUIET)
    if(NOT benchmark_FOUND)
      message(STATUS "phasekv: Google Benchmark not found, fetching it")
      set(BENCHMARK_ENABLE_TESTING OFF CACHE BOOL "" FORCE)
      set(BENCHMARK_ENABLE_INSTALL OFF CACHE BOOL "" FORCE)
      FetchContent_Declare(googlebenchmark
        URL https://github.com/google/benchmark/archive/refs/tags/v1.8.3.tar.gz)
      FetchContent_MakeAvailable(googlebenchmark)
    endif()
  endif()
endmacro()

macro(phasekv_require_cli11)
  if(NOT TARGET CLI11::CLI11)
    find_package(CLI11 CONFIG QUIET)
    if(NOT CLI11_FOUND)
      message(STATUS "phasekv: CLI11 not found, fetching it")
      FetchContent_Declare(cli11
        URL https://github.com/CLIUtils/CLI11/archive/refs/tags/v2.4.1.tar.gz)
      FetchContent_MakeAvailable(cli11)
    endif()
  endif()
endmacro()

macro(phasekv_require_json)
  if(NOT TARGET nlohmann_json::nlohmann_json)
    find_package(nlohmann_json 3.9 CONFIG QUIET)
    if(NOT nlohmann_json_FOUND)
      message(STATUS "phasekv: nlohmann_json not found, fetching it")
      FetchContent_Declare(nlohmann_json
        URL https://github.com/nlohmann/json/releases/download/v3.11.3/json.tar.xz)
      FetchContent_MakeAvailable(nlohmann_json)
    endif()
  endif()
endmacro()
