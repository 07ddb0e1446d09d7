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
#   5. streaming with a capacity below the micro-batch runs (prefill chunked by the layer's room);
#   6. speculative decoding (llama-speculative-simple, draft model induction6 written as GGUF, the
#      same byte vocabulary, 4 draft tokens a step, greedy): the text without --kvp is llama-completion's;
#      --kvp "policy=full" on both contexts gives the same text with rejected suffixes removed through
#      kvprune drafts (seq_rm), and so does "policy=full max_draft=0" through llama.cpp's checkpoints
#      (llama_state_seq_* -> kvp_state_save/kvp_state_load); h2o and window (drafts) and h2o
#      (checkpoints) run to the end and evict;
#   7. session save/load (llama-completion --prompt-cache): a run that saves the state after the
#      prompt and a second process that loads it and continues give the same text (policy=full: also
#      llama.cpp's; h2o budget=64), and a state saved under another spec is refused with kvprune's
#      message;
#   8. when DIR/bin holds llama-server (LLAMA_TARGETS=... llama-server): three greedy /completion
#      requests (a 150-byte prompt twice, then its first 100 bytes: the server's prompt cache reuses
#      or reprocesses them) give llama.cpp's texts under --kvp "policy=full" (drafts: the server
#      reprocesses) and "policy=full max_draft=0" (it restores its checkpoints: llama_state_seq_*),
#      and run under "policy=h2o budget=64";
#   9. (the same) llama-server --parallel 2 (one kvprune cache per sequence): two different prompts
#      sent at once get the answers each gets alone from a --parallel 1 server, under policy=full
#      (also llama.cpp's own cache's answers) and policy=h2o budget=64, and their batches did carry
#      both sequences.
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
    LLAMA_TARGETS=${LLAMA_TARGETS:-"llama-completion llama-speculative-simple"} bash "$HERE/build.sh" "$DIR"
fi
t1=$(date +%s)

T=$DIR/test
mkdir -p "$T"
python3 "$HERE/llama2c_to_gguf.py" "$MODELS/enbytes-1m.bin" "$T/enbytes-1m.gguf"
for a in qwen2 qwen3; do python3 "$HERE/llama2c_to_gguf.py" "$MODELS/enbytes-1m.bin" "$T/enbytes-$a.gguf" --arch $a; done
python3 "$HERE/llama2c_to_gguf.py" "$MODELS/induction6.bin" "$T/induction6.gguf" # the speculative draft model
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
    case " $* " in *" -v "*"--kvp "*) mark='kvprune: [1-9][0-9]* tokens seen' ;; esac
    for try in 1 2 3 4 5; do
        [ -z "${RM_BEFORE:-}" ] || rm -f "$RM_BEFORE" # a run that must start without this file (a prompt cache it writes)
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
# run_spec NAME BIN [ARGS...]: llama-speculative-simple, target enbytes-1m, draft induction6, greedy,
# into $T/NAME.txt and $T/NAME.log (-v: the log says how the cache removed suffixes); rerun as run()
run_spec() {
    local name=$1 bin=$2 mark='n_accept' try
    shift 2
    case " $* " in *" --kvp "*) mark='kvprune: [1-9][0-9]* tokens seen' ;; esac
    for try in 1 2 3 4 5; do
        if ! "$bin/llama-speculative-simple" -m "$T/enbytes-1m.gguf" -md "$T/induction6.gguf" --spec-type draft-simple \
                --spec-draft-n-max 4 -f "$T/prompt.txt" -n $N_GEN --temp 0 --top-k 1 -c 512 -b 512 -ub 64 -t 2 -v "$@" \
                >"$T/$name.txt" 2>"$T/$name.log"; then
            echo "FAIL $name: llama-speculative-simple exited with an error (see $T/$name.log):"
            grep -v ' D ' "$T/$name.log" | tail -5
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
# same_prefix A B WHAT: the first prompt + N_GEN bytes are equal (speculative decoding may accept a
# few tokens beyond -n; the text's length depends on how many drafts were accepted)
same_prefix() {
    local n=$((N_PROMPT + 2 + N_GEN)) # speculative-simple prints two newlines before the prompt
    if [ "$(wc -c < "$T/$1.txt")" -ge $n ] && [ "$(wc -c < "$T/$2.txt")" -ge $n ] && \
            cmp -s -n $n "$T/$1.txt" "$T/$2.txt"; then
        echo "ok   $3: the first $n bytes are identical ($1 = $2)"
    else
        echo "FAIL $3: $1 and $2 differ in their first $n bytes (or one is shorter):"
        cmp -n $n "$T/$1.txt" "$T/$2.txt" || true
        fail=1
    fi
}
# accepted NAME: the speculative run verified drafts and rejected some (so suffixes were removed)
accepted() {
    local d a
    d=$(sed -n 's/.*n_drafted = \([0-9]*\).*/\1/p' "$T/$1.log" | tail -1)
    a=$(sed -n 's/.*n_accept  = \([0-9]*\).*/\1/p' "$T/$1.log" | tail -1)
    if [ "${d:-0}" -gt 0 ] && [ "${a:-0}" -gt 0 ] && [ "$a" -lt "$d" ]; then
        echo "ok   $1: $a of $d draft tokens accepted"
    else
        echo "FAIL $1: drafted '${d:-}', accepted '${a:-}' (want 0 < accepted < drafted)"
        fail=1
    fi
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
generated() { # generated NAME: every token generated and the cache evicted (the target's, last in the log)
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

# 6. speculative decoding: the target verifies 1 + 4 tokens a step; rejected ones are removed by seq_rm
run_spec spec-plain "$DIR/bin" && accepted spec-plain
# llama-completion prints no leading newlines: compare it shifted by two
{ printf '\n\n'; cat "$T/plain.txt"; } > "$T/plain-nl.txt"
same_prefix plain-nl spec-plain "speculative decoding without --kvp = llama-completion"
run_spec spec-full "$DIR/bin" --kvp "policy=full" && accepted spec-full
same_prefix spec-plain spec-full "speculative, --kvp policy=full (seq_rm -> kvprune drafts) = llama.cpp's cache"
if grep -q 'kvprune: a suffix was removed' "$T/spec-full.log" && grep -q 'committed [0-9]* of [0-9]* draft tokens' "$T/spec-full.log" \
        && ! grep -q 'use checkpoints' "$T/spec-full.log"; then
    echo "ok   spec-full: the contexts removed rejected suffixes through kvprune drafts (no checkpoints)"
else
    echo "FAIL spec-full: the log shows no draft commits, or llama.cpp fell back to checkpoints"
    fail=1
fi
# (with checkpoints speculative-simple counts only fully accepted drafts: no accepted() check)
run_spec spec-full-ckpt "$DIR/bin" --kvp "policy=full max_draft=0" || true
same_prefix spec-plain spec-full-ckpt "speculative, --kvp 'policy=full max_draft=0' (checkpoints: llama_state_seq_*) = llama.cpp's cache"
if grep -q 'use checkpoints' "$T/spec-full-ckpt.log" && grep -q 'restoring checkpoint' "$T/spec-full-ckpt.log"; then
    echo "ok   spec-full-ckpt: llama.cpp restored kvprune checkpoints (state_seq_get/set_data)"
else
    echo "FAIL spec-full-ckpt: no checkpoint was restored"
    fail=1
fi
run_spec spec-h2o "$DIR/bin" --kvp "policy=h2o budget=64" && generated spec-h2o
run_spec spec-window "$DIR/bin" --kvp "policy=window window=60" && generated spec-window
run_spec spec-h2o-ckpt "$DIR/bin" --kvp "policy=h2o budget=64 max_draft=0" && generated spec-h2o-ckpt

# 7. session save/load: A saves the state after the prompt (--prompt-cache writes it before the
# prompt's last token and decodes that token after), B is a new process that loads it, replays the
# last token and continues
for p in "full:policy=full" "h2o:policy=h2o budget=64"; do
    n=${p%%:*} spec=${p#*:}
    RM_BEFORE=$T/session-$n.bin run session-$n-save "$DIR/bin" -v --kvp "$spec" --prompt-cache "$T/session-$n.bin" || true
    run session-$n-load "$DIR/bin" -v --kvp "$spec" --prompt-cache "$T/session-$n.bin" --prompt-cache-ro || true
    same session-$n-save session-$n-load "$spec: generation continued from a loaded state = the run that saved it"
    if grep -q 'replayed last token from session' "$T/session-$n-load.log"; then
        echo "ok   session-$n-load: the state was loaded ($(wc -c < "$T/session-$n.bin") bytes)"
    else
        echo "FAIL session-$n-load: the state was not loaded"
        fail=1
    fi
done
same plain session-full-load "policy=full: generation from a loaded state = llama.cpp's cache"
# a state saved under another spec: refused with kvprune's message (llama-completion exits with an error)
# (the error message is logged by the worker thread too: a log cut at exit is run again)
cp "$T/session-full.bin" "$T/session-other.bin"
other=refused
for try in 1 2 3 4 5; do
    if "$DIR/bin/llama-completion" -m "$T/enbytes-1m.gguf" -f "$T/prompt.txt" -n 8 --temp 0 -c 512 -b 512 -ub 64 -t 2 \
            -no-cnv --simple-io --no-warmup --kvp "policy=h2o budget=64" --prompt-cache "$T/session-other.bin" \
            >"$T/session-other.txt" 2>"$T/session-other.log"; then
        other=loaded
        break
    fi
    grep -q 'failed to load session file' "$T/session-other.log" && break
    echo "note session-other: output cut at exit (try $try), running it again"
done
if [ $other = loaded ]; then
    echo "FAIL session-other: a state saved under policy=full loaded into policy=h2o"
    fail=1
elif grep -q 'policy differs' "$T/session-other.log"; then
    echo "ok   session-other: a state of another spec is refused: $(grep -o 'kvp_state_load: .*' "$T/session-other.log" | head -1)"
else
    echo "FAIL session-other: refused without kvprune's message (see $T/session-other.log)"
    fail=1
fi

# 8. llama-server (only when it was built)
if [ -x "$DIR/bin/llama-server" ]; then
    head -c 150 "$T/prompt.txt" > "$T/server-p1.txt"
    head -c 100 "$T/prompt.txt" > "$T/server-p2.txt"
    cat > "$T/server-req.py" <<'PYEOF'
import json, sys, urllib.request
port, out = sys.argv[1], sys.argv[2]
with open(out, "w") as f:
    for path, n in ((sys.argv[3], 32), (sys.argv[3], 32), (sys.argv[4], 16)):
        body = json.dumps({"prompt": open(path).read(), "n_predict": n, "temperature": 0, "top_k": 1,
                           "cache_prompt": True}).encode()
        req = urllib.request.Request("http://127.0.0.1:%s/completion" % port, body, {"Content-Type": "application/json"})
        f.write(json.loads(urllib.request.urlopen(req, timeout=300).read())["content"] + "\n")
PYEOF
    # server NAME [ARGS...]: start it on a free port, send the requests into $T/NAME.txt, stop it
    server() {
        local name=$1 port pid i ok=0
        shift
        port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
        "$DIR/bin/llama-server" -m "$T/enbytes-1m.gguf" -c 512 -t 2 -np 1 --host 127.0.0.1 --port "$port" -v "$@" \
            >"$T/$name.out" 2>"$T/$name.log" &
        pid=$!
        for i in $(seq 1 120); do
            if python3 -c "import urllib.request, sys; urllib.request.urlopen('http://127.0.0.1:$port/health', timeout=2)" 2>/dev/null; then
                ok=1
                break
            fi
            kill -0 $pid 2>/dev/null || break
            sleep 0.5
        done
        if [ $ok = 1 ] && python3 "$T/server-req.py" "$port" "$T/$name.txt" "$T/server-p1.txt" "$T/server-p2.txt" 2>"$T/$name.err"; then
            echo "ok   $name: 3 requests answered"
        else
            echo "FAIL $name: llama-server did not answer (see $T/$name.log, $T/$name.err)"
            grep -v ' D ' "$T/$name.log" | tail -3
            fail=1
        fi
        kill $pid 2>/dev/null || true
        wait $pid 2>/dev/null || true
    }
    server server-plain
    server server-full --kvp "policy=full"
    server server-full-ckpt --kvp "policy=full max_draft=0"
    server server-h2o --kvp "policy=h2o budget=64"
    same server-plain server-full "llama-server, --kvp policy=full (drafts; repeated prompts reprocessed) = llama.cpp's cache"
    same server-plain server-full-ckpt "llama-server, --kvp 'policy=full max_draft=0' (checkpoints) = llama.cpp's cache"
    if grep -q 'restored context checkpoint' "$T/server-full-ckpt.log"; then
        echo "ok   server-full-ckpt: the server restored a kvprune checkpoint (llama_state_seq_set_data)"
    else
        echo "FAIL server-full-ckpt: no checkpoint was restored"
        fail=1
    fi

    # 9. llama-server --parallel 2: one kvprune cache per sequence. Two different prompts sent at
    # once (their batches carry both sequences, split per sequence into the two caches) get the
    # answers each gets alone from a --parallel 1 server, under policy=full and h2o (scored).
    head -c 100 "$T/prompt.txt" > "$T/server-pa.txt"
    tail -c +151 "$T/prompt.txt" | head -c 100 > "$T/server-pb.txt"
    cat > "$T/server-par.py" <<'PYEOF'
import json, sys, threading, urllib.request
port, out, mode, paths = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
res = [None] * len(paths)
def ask(i):
    body = json.dumps({"prompt": open(paths[i]).read(), "n_predict": 120, "temperature": 0, "top_k": 1,
                       "cache_prompt": False}).encode()
    req = urllib.request.Request("http://127.0.0.1:%s/completion" % port, body, {"Content-Type": "application/json"})
    res[i] = json.loads(urllib.request.urlopen(req, timeout=300).read())["content"]
if mode == "together":
    ts = [threading.Thread(target=ask, args=(i,)) for i in range(len(paths))]
    for t in ts: t.start()
    for t in ts: t.join()
else:
    for i in range(len(paths)): ask(i)
with open(out, "w") as f:
    for r in res: f.write(r + "\n")
PYEOF
    # server_par NAME NP MODE [ARGS...]: a server with -np NP; MODE together (both requests at once) or alone
    server_par() {
        local name=$1 np=$2 mode=$3 port pid i ok=0
        shift 3
        port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
        "$DIR/bin/llama-server" -m "$T/enbytes-1m.gguf" -c $((256 * np)) -t 2 -np "$np" --host 127.0.0.1 --port "$port" -v "$@" \
            >"$T/$name.out" 2>"$T/$name.log" &
        pid=$!
        for i in $(seq 1 120); do
            if python3 -c "import urllib.request, sys; urllib.request.urlopen('http://127.0.0.1:$port/health', timeout=2)" 2>/dev/null; then
                ok=1
                break
            fi
            kill -0 $pid 2>/dev/null || break
            sleep 0.5
        done
        if [ $ok = 1 ] && python3 "$T/server-par.py" "$port" "$T/$name.txt" "$mode" "$T/server-pa.txt" "$T/server-pb.txt" 2>"$T/$name.err"; then
            echo "ok   $name: 2 requests answered ($mode, --parallel $np)"
        else
            echo "FAIL $name: llama-server did not answer (see $T/$name.log, $T/$name.err)"
            grep -v ' D ' "$T/$name.log" | tail -3
            fail=1
        fi
        kill $pid 2>/dev/null || true
        wait $pid 2>/dev/null || true
    }
    for p in "full:policy=full" "h2o:policy=h2o budget=64"; do
        n=${p%%:*} spec=${p#*:}
        server_par server-par1-$n 1 alone --kvp "$spec"
        # (on a loaded machine one request may be answered before the other arrives: run it again)
        for try in 1 2 3 4 5; do
            server_par server-par2-$n 2 together --kvp "$spec"
            m=$(sed -n 's/.*kvprune: 2 sequences, \([0-9]*\) batches carried tokens of several sequences.*/\1/p' "$T/server-par2-$n.log" | tail -1)
            [ "${m:-0}" -eq 0 ] || break
            echo "note server-par2-$n: the two requests did not overlap (try $try), running it again"
        done
        same server-par1-$n server-par2-$n "llama-server --parallel 2, --kvp '$spec': two requests at once = each alone with --parallel 1"
        if [ "${m:-0}" -gt 0 ]; then
            echo "ok   server-par2-$n: $m batches carried tokens of both sequences (two kvprune caches)"
        else
            echo "FAIL server-par2-$n: no batch carried both sequences ('${m:-}'): the requests did not overlap in 5 tries"
            fail=1
        fi
    done
    server_par server-par2-plain 2 together
    same server-par1-full server-par2-plain "llama-server --parallel 2 without --kvp = --kvp policy=full"
else
    echo "skip llama-server checks: $DIR/bin/llama-server was not built (LLAMA_TARGETS=\"llama-completion llama-speculative-simple llama-server\")"
fi

t2=$(date +%s)
echo "test.sh: build $((t1 - t0)) s, checks $((t2 - t1)) s, total $((t2 - t0)) s"
[ $fail = 0 ] && echo "PASS" || { echo "FAILED"; exit 1; }
