# Shared by the cross toolchain files: point SIMDE_INCLUDE_DIR at a folder that holds only
# the host's (architecture-independent, header-only) SIMDe, never at /usr/include itself:
# -I/usr/include in a cross build would put the host's libc headers before the target's.
#
# Override with -DSIMDE_INCLUDE_DIR=<dir containing simde/x86/avx2.h> or env SIMDE_ROOT.
if(NOT DEFINED SIMDE_INCLUDE_DIR)
  set(_kvp_simde_src "")
  foreach(_d $ENV{SIMDE_ROOT} /usr/include /usr/local/include)
    if(EXISTS "${_d}/simde/x86/avx2.h")
      set(_kvp_simde_src "${_d}/simde")
      break()
    endif()
  endforeach()
  if(_kvp_simde_src)
    # A private folder whose only entry is a link to simde/ (the toolchain file also runs for
    # try_compile projects, where CMAKE_BINARY_DIR differs: each gets its own link).
    set(_kvp_simde_inc "${CMAKE_BINARY_DIR}/_simde_include")
    if(NOT EXISTS "${_kvp_simde_inc}/simde")
      file(MAKE_DIRECTORY "${_kvp_simde_inc}")
      file(CREATE_LINK "${_kvp_simde_src}" "${_kvp_simde_inc}/simde" SYMBOLIC)
    endif()
    set(SIMDE_INCLUDE_DIR "${_kvp_simde_inc}" CACHE PATH "SIMDe include root (cross build)")
  endif()
endif()
