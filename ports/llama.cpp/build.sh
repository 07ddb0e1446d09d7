#!/usr/bin/env bash
# Builds llama.cpp (CPU, Release) with the kvprune port: bash ports/llama.cpp/build.sh OUT
#
#   OUT/src       the pinned llama.cpp tree with the port applied (overlay/ copied, port.patch applied)
#   OUT/kvprune   kvprune's static library (this repository, target kvprune only)
#   OUT/build     llama.cpp's build tree
#   OUT/bin       the programs
#
# Environment:
#   LLAMA_CPP_DIR   a git checkout holding the pinned commit; without it the tree comes from the npm
#                   package node-llama-cpp@3.21.1 (llama/gitRelease.bundle, llama.cpp release v0.4.0),
#                   fetched once into KVP_LLAMA_CACHE (default ~/.cache/kvprune-llama.cpp)
#   KVP_PORT=0      build unmodified llama.cpp (no overlay, no patch, no kvprune): the baseline
#   LLAMA_TARGETS   the programs to build (default below)
#   JOBS            parallel build jobs (default 2)
set -euo pipefail

PIN=80fb11ac73e66d89eae2c6a91d8a77428fa733ed
NPM_PKG=node-llama-cpp@3.21.1

[ $# -eq 1 ] || { echo "usage: $0 OUT" >&2; exit 2; }
mkdir -p "$1"
OUT=$(cd "$1" && pwd)
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
JOBS=${JOBS:-2}
PORT=${KVP_PORT:-1}
TARGETS=${LLAMA_TARGETS:-"llama-completion llama-cli llama-server llama-perplexity llama-bench llama-speculative-simple llama-kvp-tasks"}

log() { echo "build.sh: $*" >&2; }
# quiet LOGFILE CMD...: runs CMD with its output in LOGFILE, which is shown (its end) if CMD fails
quiet() {
    local f=$1
    shift
    if ! "$@" >"$f" 2>&1; then
        log "failed: $* (last lines of $f follow)"
        tail -30 "$f" >&2
        exit 1
    fi
}
t0=$(date +%s)

# 1. the llama.cpp tree
if [ -n "${LLAMA_CPP_DIR:-}" ]; then
    SRC=$LLAMA_CPP_DIR
else
    CACHE=${KVP_LLAMA_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/kvprune-llama.cpp}
    SRC=$CACHE/llama.cpp
    if [ ! -d "$SRC/.git" ] && [ ! -f "$SRC/HEAD" ]; then
        log "obtaining llama.cpp from npm package $NPM_PKG into $CACHE"
        mkdir -p "$CACHE"
        tmp=$(mktemp -d "$CACHE/tmp.XXXXXX")
        (cd "$tmp" && npm pack --silent "$NPM_PKG" >/dev/null && tar xzf node-llama-cpp-*.tgz package/llama/gitRelease.bundle)
        git clone -q --no-checkout "$tmp/package/llama/gitRelease.bundle" "$tmp/llama.cpp"
        mv "$tmp/llama.cpp" "$SRC"
        rm -rf "$tmp"
    fi
fi
if ! git -C "$SRC" cat-file -e "$PIN^{commit}" 2>/dev/null; then
    log "error: $SRC does not hold llama.cpp commit $PIN (release v0.4.0 of $NPM_PKG)"
    exit 1
fi
if head=$(git -C "$SRC" rev-parse -q --verify HEAD 2>/dev/null) && [ "$head" != "$PIN" ]; then
    log "error: $SRC is at $head, the port is pinned to $PIN"
    exit 1
fi

# 2. a fresh copy of the pinned commit's tree (git archive: exactly the commit, whatever the checkout holds)
rm -rf "$OUT/src"
mkdir -p "$OUT/src"
git -C "$SRC" archive --format=tar "$PIN" | tar -x -C "$OUT/src"

CMAKE_EXTRA=()
if [ "$PORT" != 0 ]; then
    # 3. the port: new files, then the patch to llama.cpp's own files
    cp -r "$HERE/overlay/." "$OUT/src/"
    quiet "$OUT/patch.log" patch -d "$OUT/src" -p1 --no-backup-if-mismatch -i "$HERE/port.patch"

    # 4. kvprune's static library (position-independent: it may end up in libllama.so)
    log "building kvprune"
    quiet "$OUT/kvprune-cmake.log" cmake -S "$REPO" -B "$OUT/kvprune" -DCMAKE_BUILD_TYPE=Release \
        -DCMAKE_POSITION_INDEPENDENT_CODE=ON -DKVP_BUILD_TESTS=OFF -DKVP_BUILD_BENCH=OFF -DKVP_WERROR=OFF -DKVP_INSTALL=OFF
    quiet "$OUT/kvprune-build.log" cmake --build "$OUT/kvprune" --target kvprune -j "$JOBS"
    CMAKE_EXTRA+=(-DLLAMA_KVPRUNE_INCLUDE="$REPO/include" -DLLAMA_KVPRUNE_LIB="$OUT/kvprune/libkvprune.a")
fi
t1=$(date +%s)

# 5. llama.cpp, CPU, Release, static programs
log "building llama.cpp: $TARGETS"
quiet "$OUT/llama-cmake.log" cmake -S "$OUT/src" -B "$OUT/build" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_OPENSSL=OFF -DGGML_CCACHE=OFF ${CMAKE_EXTRA[@]+"${CMAKE_EXTRA[@]}"}
# shellcheck disable=SC2086
quiet "$OUT/llama-build.log" cmake --build "$OUT/build" --target $TARGETS -j "$JOBS"
mkdir -p "$OUT/bin"
for t in $TARGETS; do cp "$OUT/build/bin/$t" "$OUT/bin/"; done
t2=$(date +%s)
log "done in $((t2 - t0)) s (kvprune and tree: $((t1 - t0)) s, llama.cpp: $((t2 - t1)) s): $OUT/bin"
