#!/usr/bin/env bash
# The port's check: bash ports/llama.cpp/test.sh DIR [BASE_DIR]
#
# Builds the port into DIR (ports/llama.cpp/build.sh DIR; KVP_SKIP_BUILD=1 reuses DIR/bin), writes
# the enbytes-1m llama2.c checkpoint as an f32 llama GGUF, and with llama-completion (greedy, a
# 300-byte prompt in micro-batches of 64, 96 generated tokens) checks:
#   1. --kvp "policy=full" gives the same tokens as llama.cpp's own cache (the same binary without
#      --kvp), and so does KVP_SPEC="policy=full" in the environment; also written as qwen2 and
#      qwen3 files (llama2c_to_gguf.py --arch);
#   2. with BASE_DIR (an unmodified build: KVP_PORT=0 build.sh BASE_DIR), the port's binary without
#      --kvp gives the same tokens as unmodified llama.cpp;
#   3. scored policies (h2o budget=64, snapkv compression_ratio=0.5 of the prompt) run to completion,
#      generate every token and evict;
#   4. snapkv over the prompt's 5 micro-batches gives the tokens of snapkv over one (max_prompt);
#   5. streaming with a capacity below the micro-batch runs (prefill chunked by the layer's room).
# The vocabulary is byte-level (one token per byte), so equal text is equal tokens.
set -euo pipefail

[ $# -ge 1 ] || { echo "usage: $0 DIR [BASE_DIR]" >&2; exit 2; }
mkdir -p "$1"
DIR=$(cd "$1" && pwd)
BASE=${2:-}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
MODELS=${KVP_MODELS:-$REPO/../shared/models}
N_GEN=96
t0=$(date +%s)

if [ -z "${KVP_SKIP_BUILD:-}" ]; then
    LLAMA_TARGETS=${LLAMA_TARGETS:-llama-completion} bash "$HERE/build.sh" "$DIR"
fi
t1=$(date +%s)

T=$DIR/test
mkdir -p "$T"
python3 "$HERE/llama2c_to_gguf.py" "$MODELS/enbytes-1m.bin" "$T/enbytes-1m.gguf"
for a in qwen2 qwen3; do python3 "$HERE/llama2c_to_gguf.py" "$MODELS/enbytes-1m.bin" "$T/enbytes-$a.gguf" --arch $a; done
head -c 300 "$MODELS/enbytes-1m.eval.txt" > "$T/prompt.txt"
N_PROMPT=$(wc -c < "$T/prompt.txt")

fail=0
# run NAME BIN [ARGS...]: greedy completion into $T/NAME.txt (stdout) and $T/NAME.log (stderr)
# (MODEL: the GGUF, default the llama file). llama.cpp's common log (which prints the text too) is
# written by a worker thread that is not joined at exit, so on a loaded machine the end of the
# output can be lost (llama.cpp issue 22142): a run whose log lacks its last line (the perf
# summary, or with -v the kvprune counters printed when the context is freed) is run again.
run() {
    local name=$1 bin=$2 mark='graphs reused' try
    shift 2
    case " $* " in *" -v "*" --kvp "*) mark='kvprune: [1-9][0-9]* tokens seen' ;; esac
    for try in 1 2 3 4 5; do
        if ! "$bin/llama-completion" -m "${MODEL:-$T/enbytes-1m.gguf}" -f "$T/prompt.txt" -n $N_GEN --temp 0 \
                -c 512 -b 512 -ub 64 -t 2 -no-cnv --simple-io --no-warmup "$@" >"$T/$name.txt" 2>"$T/$name.log"; then
            echo "FAIL $name: llama-completion exited with an error (see $T/$name.log):"
            tail -5 "$T/$name.log"
            fail=1
            return 1
        fi
        grep -q "$mark" "$T/$name.log" && return 0
        echo "note $name: output cut at exit (try $try), running it again"
    done
    echo "FAIL $name: the output was cut at exit 5 times"
    fail=1
    return 1
}
same() { # same A B WHAT
    if cmp -s "$T/$1.txt" "$T/$2.txt"; then
        echo "ok   $3: $(wc -c < "$T/$1.txt") bytes identical ($1 = $2)"
    else
        echo "FAIL $3: $1 and $2 differ:"
        cmp "$T/$1.txt" "$T/$2.txt" || true
        fail=1
    fi
}
generated() { # generated NAME: every token generated and the cache evicted
    local n ev
    n=$(wc -c < "$T/$1.txt")
    ev=$(sed -n 's/.*kvprune: [0-9]* tokens seen, \([0-9]*\) evicted.*/\1/p' "$T/$1.log" | tail -1)
    if [ "$n" -ge $((N_PROMPT + N_GEN)) ] && [ "${ev:-0}" -gt 0 ]; then
        echo "ok   $1: $((n - N_PROMPT)) bytes after the prompt, $ev tokens evicted (summed over layers and KV heads)"
    else
        echo "FAIL $1: $((n - N_PROMPT)) bytes after the prompt (want >= $N_GEN), evicted '${ev:-}'"
        fail=1
    fi
}

run plain "$DIR/bin" || true
run full "$DIR/bin" --kvp "policy=full" || true
KVP_SPEC="policy=full" run full-env "$DIR/bin" || true
same plain full "--kvp policy=full = llama.cpp's cache"
same plain full-env "KVP_SPEC=policy=full = llama.cpp's cache"
for a in qwen2 qwen3; do
    MODEL=$T/enbytes-$a.gguf run plain-$a "$DIR/bin" || true
    MODEL=$T/enbytes-$a.gguf run full-$a "$DIR/bin" --kvp "policy=full" || true
    same plain-$a full-$a "$a: --kvp policy=full = llama.cpp's cache"
done
if [ -n "$BASE" ]; then
    run base "$BASE/bin" || true
    same base plain "the port without --kvp = unmodified llama.cpp"
fi
# -v: llama.cpp's info log, where the kvprune memory prints its counters when it is destroyed
run h2o "$DIR/bin" -v --kvp "policy=h2o budget=64" && generated h2o
run snapkv "$DIR/bin" -v --kvp "policy=snapkv compression_ratio=0.5 ratio_tokens=$N_PROMPT" && generated snapkv
# 4. whole-prompt selection: the prompt in 5 micro-batches selects what one micro-batch selects
run snapkv-ub512 "$DIR/bin" -ub 512 --kvp "policy=snapkv compression_ratio=0.5 ratio_tokens=$N_PROMPT" || true
same snapkv snapkv-ub512 "snapkv over 5 micro-batches (max_prompt) = over one"
# 5. a policy whose capacity is below the micro-batch (prefill in chunks of the layer's room)
run streaming "$DIR/bin" -v --kvp "policy=streaming sinks=4 window=60" && generated streaming

t2=$(date +%s)
echo "test.sh: build $((t1 - t0)) s, checks $((t2 - t1)) s, total $((t2 - t0)) s"
[ $fail = 0 ] && echo "PASS" || { echo "FAILED"; exit 1; }
