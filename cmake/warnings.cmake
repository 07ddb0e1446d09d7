# Warning set for every project target: -Wall -Wextra (-Werror unless KVP_WERROR=OFF).
function(kvp_warnings target)
  target_compile_options(${target} PRIVATE -Wall -Wextra -Wshadow -Wno-psabi
    $<$<BOOL:${KVP_WERROR}>:-Werror>)
endfunction()
