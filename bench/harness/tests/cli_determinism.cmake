# `kvprune eval` twice on a short text: the JSON and CSV must be identical, except tok_per_s
# (wall-clock throughput, the one field that is not a function of the inputs).
#   -DCLI=path -DTEXT=file -DWORK=dir
file(REMOVE_RECURSE "${WORK}")
file(MAKE_DIRECTORY "${WORK}")
foreach(i 1 2)
  execute_process(COMMAND ${CLI} eval --text ${TEXT} --tokens 128 --prefill 32 --no-progress
                  --policy "policy=full capacity=128"
                  --policy "policy=streaming sinks=4 window=28"
                  --policy "policy=window window=32 positions=original"
                  --json ${WORK}/run${i}.json --csv ${WORK}/run${i}.csv
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  message("run ${i}: exit ${rc}\n${out}${err}")
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "kvprune eval failed")
  endif()
  file(READ ${WORK}/run${i}.json j${i})
  file(READ ${WORK}/run${i}.csv c${i})
  string(REGEX REPLACE "\"tok_per_s\": [0-9.e+-]+" "\"tok_per_s\": X" j${i} "${j${i}}")
  string(REGEX REPLACE ",[0-9.e+-]+\n" ",X\n" c${i} "${c${i}}")
endforeach()
message("${j1}")
if(NOT j1 STREQUAL j2)
  message(FATAL_ERROR "JSON differs between two identical runs:\n${j1}\n---\n${j2}")
endif()
if(NOT c1 STREQUAL c2)
  message(FATAL_ERROR "CSV differs between two identical runs")
endif()
set(fields policy spec model text tokens prefill nll ppl agreement live_bytes peak_live_bytes arena_bytes capacity
    threads kv_ratio version tok_per_s)
foreach(f ${fields})
  if(NOT j1 MATCHES "\"${f}\": ")
    message(FATAL_ERROR "JSON lacks the field ${f}")
  endif()
endforeach()
string(REGEX MATCHALL "\"[a-z_]+\": " keys "${j1}")
list(REMOVE_DUPLICATES keys)
list(LENGTH keys nkeys)
list(LENGTH fields nfields)
if(NOT nkeys EQUAL nfields)
  message(FATAL_ERROR "JSON has ${nkeys} distinct fields, expected exactly ${nfields}: ${keys}")
endif()
# The rows say how to reproduce them: model and text file, N, P, threads, resolved capacity, version.
foreach(want "\"model\": \"enbytes-1m.bin\"" "\"tokens\": 128, \"prefill\": 32" "\"capacity\": 128" "\"threads\": 1"
        "\"version\": \"[0-9]+\\.[0-9]+\\.[0-9]+\"" "\"kv_ratio\": 1,")
  if(NOT j1 MATCHES "${want}")
    message(FATAL_ERROR "JSON lacks ${want}")
  endif()
endforeach()
