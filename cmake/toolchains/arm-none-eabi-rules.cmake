# CMAKE_USER_MAKE_RULES_OVERRIDE of arm-none-eabi.cmake, read after CMake's compiler rules:
# bare-metal firmware is linked at fixed addresses, so position-independent code (which the
# top-level CMakeLists.txt turns on for the host's shared-object users) only adds GOT loads.
set(CMAKE_C_COMPILE_OPTIONS_PIC "")
set(CMAKE_CXX_COMPILE_OPTIONS_PIC "")
set(CMAKE_C_COMPILE_OPTIONS_PIE "")
set(CMAKE_CXX_COMPILE_OPTIONS_PIE "")
