# `cmake --install` into a fresh prefix, then the installed `kvprune` finds its bundled model in
# <prefix>/share/kvprune/models (not in the source tree).   -DBUILD=<build dir> -DPREFIX=<dir>
file(REMOVE_RECURSE "${PREFIX}")
execute_process(COMMAND ${CMAKE_COMMAND} --install "${BUILD}" --prefix "${PREFIX}" RESULT_VARIABLE rc OUTPUT_QUIET)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "cmake --install failed")
endif()
foreach(f bin/kvprune share/kvprune/models/enbytes-1m.bin share/kvprune/models/enbytes-1m.eval.txt
          share/kvprune/models/induction6.bin)
  if(NOT EXISTS "${PREFIX}/${f}")
    message(FATAL_ERROR "${PREFIX}/${f} was not installed")
  endif()
endforeach()
unset(ENV{KVPRUNE_MODEL_DIR})
execute_process(COMMAND "${PREFIX}/bin/kvprune" run --tokens 8 --quiet RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
message("${out}${err}")
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "the installed kvprune failed")
endif()
if(NOT err MATCHES "kvprune run: [^\n]*/share/kvprune/models/enbytes-1m.bin")
  message(FATAL_ERROR "the installed kvprune did not use its installed model")
endif()
# the installed retrieval model loads and runs
execute_process(COMMAND "${PREFIX}/bin/kvprune" run --tokens 8 --quiet --model "${PREFIX}/share/kvprune/models/induction6.bin"
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "the installed kvprune failed on induction6.bin: ${out}${err}")
endif()
file(REMOVE_RECURSE "${PREFIX}")
