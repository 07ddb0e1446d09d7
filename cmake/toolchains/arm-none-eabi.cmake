# Bare-metal Cortex-M build (Debian gcc-arm-none-eabi + libnewlib-arm-none-eabi + libstdc++-arm-none-eabi-newlib).
# Builds the core static library only: no worker threads, no heap, no tests, no benchmarks.
#
#   cmake -S . -B build-cortexm -DCMAKE_TOOLCHAIN_FILE=cmake/toolchains/arm-none-eabi.cmake
#
# KVP_CORTEX_CPU selects the core: cortex-m7 (default; FPv5 double-precision FPU, hard float)
# or cortex-m4 (FPv4-SP, hard float). SIMDe finds no x86 or NEON here and compiles to plain C
# (SIMDE_NO_NATIVE is set as well so that nothing native is ever tried).
set(CMAKE_SYSTEM_NAME Generic)
set(CMAKE_SYSTEM_PROCESSOR arm)

set(CMAKE_C_COMPILER   arm-none-eabi-gcc)
set(CMAKE_CXX_COMPILER arm-none-eabi-g++)
set(CMAKE_AR           arm-none-eabi-ar CACHE FILEPATH "")
set(CMAKE_RANLIB       arm-none-eabi-ranlib CACHE FILEPATH "")
# No OS to link test programs against: try_compile builds static libraries.
set(CMAKE_TRY_COMPILE_TARGET_TYPE STATIC_LIBRARY)

set(KVP_CORTEX_CPU cortex-m7 CACHE STRING "cortex-m7 or cortex-m4")
if(KVP_CORTEX_CPU STREQUAL "cortex-m4")
  set(_kvp_cpu_flags "-mcpu=cortex-m4 -mthumb -mfpu=fpv4-sp-d16 -mfloat-abi=hard")
else()
  set(_kvp_cpu_flags "-mcpu=cortex-m7 -mthumb -mfpu=fpv5-d16 -mfloat-abi=hard")
endif()
# Enums: arm-none-eabi sizes enums to their values by default (short enums); kvprune.h's enums
# carry *_FORCE_INT32_ sentinels, so they are int-sized under either setting and no flag is needed.
# -fno-threadsafe-statics: single-threaded MCU, no __cxa_guard_* runtime.
set(_kvp_common "${_kvp_cpu_flags} -ffunction-sections -fdata-sections -DSIMDE_NO_NATIVE")
set(CMAKE_C_FLAGS_INIT   "${_kvp_common}")
set(CMAKE_CXX_FLAGS_INIT "${_kvp_common} -fno-exceptions -fno-rtti -fno-threadsafe-statics")

set(CMAKE_FIND_ROOT_PATH /usr/lib/arm-none-eabi)
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)

# The options a heap-free MCU build needs (cache defaults; the command line still wins).
set(KVP_THREADS     OFF CACHE BOOL "")
set(KVP_NO_HEAP     ON  CACHE BOOL "")
set(KVP_AVX2        OFF CACHE BOOL "")
set(KVP_BUILD_TESTS OFF CACHE BOOL "")
set(KVP_BUILD_BENCH OFF CACHE BOOL "")

include(${CMAKE_CURRENT_LIST_DIR}/simde.cmake)

# No -fPIC on bare metal (see arm-none-eabi-rules.cmake).
set(CMAKE_USER_MAKE_RULES_OVERRIDE ${CMAKE_CURRENT_LIST_DIR}/arm-none-eabi-rules.cmake)
