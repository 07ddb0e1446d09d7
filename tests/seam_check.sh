#!/usr/bin/env bash
# The policy seam is narrow (src/policies/policy.h, issue 32 item 0): a policy file includes only
# the seam (policies/*.h), the public header, kernel headers and the small shared ones (align.h,
# msg.h, pool.h, storage.h): never a core header (cache.h, config.h, arena.h, prompt.h, step.h,
# quant/...). It must also not reach into the cache through PolicyCtx::c.
#   seam_check.sh SRC_DIR
set -euo pipefail
dir=$1/src/policies
allowed='^(policies/[a-z0-9_]+\.h|kernels/[a-z0-9_]+\.h|kvprune/kvprune\.h|align\.h|msg\.h|pool\.h|storage\.h)$'
fail=0
for f in "$dir"/*.h "$dir"/*.cpp; do
  while read -r inc; do
    if ! [[ $inc =~ $allowed ]]; then echo "FORBIDDEN: $(basename "$f") includes \"$inc\""; fail=1; fi
  done < <(sed -nE 's/^#include "([^"]+)".*/\1/p' "$f")
  if grep -nE '(ctx|hc)\.c\b|->c\b' "$f" | grep -v '^\s*//' >/dev/null; then
    echo "FORBIDDEN: $(basename "$f") uses PolicyCtx::c:"; grep -nE '(ctx|hc)\.c\b|->c\b' "$f"; fail=1
  fi
done
[ "$fail" = 0 ] && echo "seam check: policy files include no core header and use no core handle"
exit "$fail"
