#!/usr/bin/env bash
# libFuzzer stage (issue 11): builds tests/fuzz with clang (coverage + ASan + UBSan; OpenMP off, as
# Debian's clang has no libomp by default) and runs each target for FUZZ_SECONDS (default 40) from
# its committed seed corpus tests/fuzz/corpus/<target>/ (read only: new inputs go to a scratch
# folder). A crash or a violated invariant fails the stage; the input is kept under
# build-fuzz/artifacts/ and printed as hex so it can be committed to the corpus with its fix.
#
#   bash .ci/fuzz.sh                  # all six targets, FUZZ_SECONDS each
#   FUZZ_SECONDS=600 bash .ci/fuzz.sh calls
#
# Writes build-fuzz/figures.txt, one line per target:
#   fuzz target=<t> seconds=<s> runs=<executions> exec_per_s=<n> new_inputs=<n> corpus=<seed files> peak_rss_mb=<n>
# (tests/fuzz/reliability.sh turns them into docs/reliability.md).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
JOBS=${JOBS:-2}
SECONDS_PER=${FUZZ_SECONDS:-40}
TARGETS=("$@")
[ ${#TARGETS[@]} -eq 0 ] && TARGETS=(config calls state checkpoint results gguf)
t0=$(date +%s)
log() { echo "== fuzz: $* (+$(( $(date +%s) - t0 ))s)"; }

pkgs=(clang libclang-rt-14-dev cmake ninja-build libsimde-dev)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  log "apt-get install ${missing[*]}"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

B=$ROOT/build-fuzz
mkdir -p "$B"
log "clang build (fuzzer-no-link, address, undefined)"
CC=clang CXX=clang++ cmake -S "$ROOT" -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=Debug -DKVP_FUZZ=ON -DKVP_BUILD_TESTS=OFF \
  -DKVP_BUILD_BENCH=OFF -DKVP_OPENMP=OFF -DKVP_WERROR=OFF \
  "-DCMAKE_CXX_FLAGS=-O1 -g -fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined" \
  "-DCMAKE_EXE_LINKER_FLAGS=-fsanitize=address,undefined" >"$B/configure.log" 2>&1 || { cat "$B/configure.log"; exit 1; }
cmake --build "$B" -j"$JOBS" --target "${TARGETS[@]/#/fuzz_}"

mkdir -p "$B/artifacts"
: >"$B/figures.txt"
status=0
summary=()
for t in "${TARGETS[@]}"; do
  seeds=$ROOT/tests/fuzz/corpus/$t
  work=$B/corpus-$t
  rm -rf "$work"; mkdir -p "$work"
  log "fuzz_$t for ${SECONDS_PER}s from $(ls "$seeds" | wc -l) seed inputs"
  logf=$B/fuzz_$t.log
  maxlen=4096; [ "$t" = gguf ] && maxlen=16384  # the seed models are a few KB
  [ "$t" = state ] && maxlen=8192  # the seed states are 1-6 KB
  # -rss_limit_mb: ASan and the two caches of the calls target (up to 8 MB each)
  if ASAN_OPTIONS=detect_leaks=1:allocator_may_return_null=1 UBSAN_OPTIONS=print_stacktrace=1 \
     "$B/tests/fuzz/fuzz_$t" -max_total_time="$SECONDS_PER" -print_final_stats=1 -rss_limit_mb=2048 -max_len=$maxlen \
       -artifact_prefix="$B/artifacts/$t-" "$work" "$seeds" >"$logf" 2>&1; then
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$logf")
    eps=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$logf")
    new=$(sed -n 's/^stat::new_units_added: *//p' "$logf")
    rss=$(sed -n 's/^stat::peak_rss_mb: *//p' "$logf")
    echo "fuzz target=$t seconds=$SECONDS_PER runs=$runs exec_per_s=$eps new_inputs=$new corpus=$(ls "$seeds" | wc -l) peak_rss_mb=$rss" | tee -a "$B/figures.txt"
    summary+=("fuzz_$t: passed ($runs executions in ${SECONDS_PER}s)")
  else
    status=1
    summary+=("fuzz_$t: FAILED")
    grep -E "invariant violated|ERROR: |SUMMARY: |Test unit written" "$logf" | head -20 || tail -40 "$logf"
    for a in "$B/artifacts/$t-"*; do
      [ -f "$a" ] || continue
      echo "failing input $a ($(stat -c %s "$a") bytes):"; od -A x -t x1z -v "$a" | head -40
    done
  fi
done
log "done"
for s in "${summary[@]}"; do echo "fuzz: $s"; done
npass=$(printf '%s\n' "${summary[@]}" | grep -c ': passed' || true)
nfail=$(printf '%s\n' "${summary[@]}" | grep -c 'FAILED' || true)
echo "fuzz: $npass passed, $nfail failed"
exit $status
