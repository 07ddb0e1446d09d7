#!/usr/bin/env bash
# kvprune's retrieval task grid (kvprune eval --task) run by llama.cpp with the kvprune port:
#
#   bash ports/llama.cpp/tasks.sh DIR MODEL.gguf [kvprune eval --task arguments...]
#   e.g. bash ports/llama.cpp/tasks.sh /tmp/llama-kvp model.gguf --task passkey,niah --lengths 4096 \
#            --policy policy=snapkv --policy policy=h2o --compression-ratio 0.75 --json grid.json
#
# DIR is a build of the port (build.sh DIR, with llama-kvp-tasks among LLAMA_TARGETS: the default).
# Three steps:
#   1. kvprune eval --task ARGS --port-rows ROWS   the grid's prompts, encoded by the model's
#      tokenizer (kvprune's, equal to llama.cpp's: .ci/vocab.sh), and each row's spec as applied
#   2. DIR/bin/llama-kvp-tasks                      each row through llama.cpp with --kvp's memory:
#      the prompt, greedy answer tokens, kvprune's live/peak/arena bytes
#   3. kvprune eval --task ARGS --port-results RES  scored and reported exactly as the harness
#      reports its own runs (the table; --json/--csv rows; kvprune report/plot read them)
# The harness (kvprune eval --task ARGS without step 1/3's flags) stays the bit-exact reference;
# on the bundled GGUF-written models the two give the same answers and bytes row for row
# (test.sh check 14).
#
# Environment: KVP_CLI (default: build/bench/harness/kvprune of this repository, built when
# missing), THREADS for llama.cpp (default: the machine's cores).
set -euo pipefail
[ $# -ge 2 ] || { echo "usage: $0 DIR MODEL.gguf [kvprune eval --task arguments...]" >&2; exit 2; }
DIR=$1
MODEL=$2
shift 2
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
CLI=${KVP_CLI:-$REPO/build/bench/harness/kvprune}
THREADS=${THREADS:-$(nproc)}
[ -x "$DIR/bin/llama-kvp-tasks" ] || { echo "tasks.sh: $DIR/bin/llama-kvp-tasks is missing (build.sh DIR)" >&2; exit 1; }
if [ ! -x "$CLI" ]; then
    [ -f "$REPO/build/CMakeCache.txt" ] || cmake -S "$REPO" -B "$REPO/build" -DCMAKE_BUILD_TYPE=Release >/dev/null
    cmake --build "$REPO/build" --target kvprune_cli -j"$THREADS" >/dev/null
    CLI=$REPO/build/bench/harness/kvprune
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$CLI" eval "$@" --model "$MODEL" --port-rows "$tmp/rows.txt"
"$DIR/bin/llama-kvp-tasks" -m "$MODEL" --rows "$tmp/rows.txt" --out "$tmp/results.txt" -t "$THREADS"
"$CLI" eval "$@" --model "$MODEL" --port-results "$tmp/results.txt"
