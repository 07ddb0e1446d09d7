# Cross build for 32-bit ARM Linux (armhf: ARMv7-A, hard float) with Debian's
# g++-arm-linux-gnueabihf; tests run under qemu-arm (Debian qemu-user) through
# CMAKE_CROSSCOMPILING_EMULATOR. The 32-bit target of CI (.ci/cross.sh armhf): size_t is 32 bits,
# so every size computation's overflow checks are exercised for real.
#
#   cmake -S . -B build-armhf -DCMAKE_TOOLCHAIN_FILE=cmake/toolchains/arm-linux-gnueabihf.cmake \
#         -DCMAKE_PREFIX_PATH=<armhf GoogleTest install prefix>
#
# Debian's armhf baseline has no NEON: SIMDe takes its portable path. KVP_AVX2 is x86-only.
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR armv7l)

set(KVP_CROSS_TRIPLE arm-linux-gnueabihf)
set(CMAKE_C_COMPILER   ${KVP_CROSS_TRIPLE}-gcc)
set(CMAKE_CXX_COMPILER ${KVP_CROSS_TRIPLE}-g++)

set(CMAKE_FIND_ROOT_PATH /usr/${KVP_CROSS_TRIPLE})
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE BOTH)

find_program(KVP_QEMU_ARM NAMES qemu-arm qemu-arm-static)
if(KVP_QEMU_ARM)
  set(CMAKE_CROSSCOMPILING_EMULATOR ${KVP_QEMU_ARM} -L /usr/${KVP_CROSS_TRIPLE})
endif()

include(${CMAKE_CURRENT_LIST_DIR}/simde.cmake)
