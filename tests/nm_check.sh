#!/usr/bin/env bash
# Heap-free core: no object of libkvprune.a may reference an allocator, operator new/delete or
# the exception runtime, except kvprune_capi.cpp.o, which may use aligned_alloc/free for the
# documented NULL-arena path of kvp_create (absent with KVP_NO_HEAP).
#   nm_check.sh NM LIBRARY
set -euo pipefail
nm_tool=$1 lib=$2
bad='^(malloc|calloc|realloc|free|aligned_alloc|posix_memalign|memalign|_Zn[wa][jm].*|_Zd[la]Pv.*|__cxa_.*|_Unwind_.*|__gxx_personality.*)$'
fail=0
while read -r obj sym; do
  case "$obj:$sym" in
    kvprune_capi.cpp.o:aligned_alloc|kvprune_capi.cpp.o:free) echo "allowed: $obj $sym (NULL-arena path)";;
    *) echo "FORBIDDEN: $obj references $sym"; fail=1;;
  esac
done < <("$nm_tool" -A --undefined-only "$lib" | sed -E 's/^[^:]*:([^:]*):[[:space:]]*U[[:space:]]+(.*)$/\1 \2/' | awk -v re="$bad" '$2 ~ re')
[ "$fail" = 0 ] && echo "nm check: no heap or exception symbols in the core objects"
exit "$fail"
