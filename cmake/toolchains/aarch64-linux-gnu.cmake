# Cross-compiling toolchain for 64-bit ARM Linux (Debian: g++-aarch64-linux-gnu), with the
# tests run under user-mode QEMU (Debian: qemu-user), so that the NEON paths of the CPU
# kernels are built and tested on an x86 machine. Used by the `neon-qemu` preset.
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)
set(CMAKE_FIND_ROOT_PATH /usr/aarch64-linux-gnu)
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)
# CTest (and gtest_discover_tests) run the test binaries through this; -L points QEMU's
# loader at the target's C and C++ runtime libraries.
set(CMAKE_CROSSCOMPILING_EMULATOR qemu-aarch64 -L /usr/aarch64-linux-gnu)
