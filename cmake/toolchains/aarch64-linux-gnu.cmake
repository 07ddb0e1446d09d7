# Cross build for 64-bit ARM Linux with Debian's g++-aarch64-linux-gnu; tests run under
# qemu-aarch64 (Debian qemu-user) through CMAKE_CROSSCOMPILING_EMULATOR, so `ctest` and
# gtest_discover_tests work unchanged.
#
#   cmake -S . -B build-aarch64 -DCMAKE_TOOLCHAIN_FILE=cmake/toolchains/aarch64-linux-gnu.cmake \
#         -DCMAKE_PREFIX_PATH=<aarch64 GoogleTest install prefix>
#
# SIMDe maps the 256-bit AVX2 code of src/kernels to NEON (baseline on aarch64); add
# -DCMAKE_CXX_FLAGS=-DSIMDE_NO_NATIVE for SIMDe's portable C path. KVP_AVX2 is x86-only
# and ignored here.
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)

set(KVP_CROSS_TRIPLE aarch64-linux-gnu)
set(CMAKE_C_COMPILER   ${KVP_CROSS_TRIPLE}-gcc)
set(CMAKE_CXX_COMPILER ${KVP_CROSS_TRIPLE}-g++)

# Target libraries (libc, libstdc++, libgomp) live in /usr/aarch64-linux-gnu. The prefixes in
# CMAKE_PREFIX_PATH (e.g. a cross-built GoogleTest) are searched as they are, too.
set(CMAKE_FIND_ROOT_PATH /usr/${KVP_CROSS_TRIPLE})
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE BOTH)

# Run target binaries (tests, gtest discovery) under user-mode QEMU.
find_program(KVP_QEMU_AARCH64 NAMES qemu-aarch64 qemu-aarch64-static)
if(KVP_QEMU_AARCH64)
  set(CMAKE_CROSSCOMPILING_EMULATOR ${KVP_QEMU_AARCH64} -L /usr/${KVP_CROSS_TRIPLE})
endif()

include(${CMAKE_CURRENT_LIST_DIR}/simde.cmake)
