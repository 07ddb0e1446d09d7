#!/usr/bin/env bash
# Can the bundled model recall at all? (docs/harness.md "Recall"): a 32-byte passage of the held-out
# text, F bytes of other held-out text, then the passage again. The prompt runs through the first 8
# bytes of the repeat (the cue); the NLL is of the repeat's last 24 bytes, teacher-forced by
# kvp_decode. A model that copies (induction heads) predicts them almost for free with full KV and
# loses that when the passage is evicted; `window=24` never holds the first occurrence. Six passages
# (offsets 5000 + 25000 i of models/enbytes-1m.eval.txt, filler 40000 bytes further on) per F.
#   bash bench/harness/results/recall-probe.sh [build dir, default build]
set -euo pipefail
cd "$(dirname "$0")/../../.."
B=${1:-build}
K=$B/bench/harness/kvprune
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
TXT=models/enbytes-1m.eval.txt
echo "filler_bytes policy mean_nll_of_the_repeat (6 passages)"
for F in 16 48 96 192; do
  for i in 0 1 2 3 4 5; do
    o=$((5000 + 25000 * i))
    { dd if=$TXT bs=1 skip=$o count=32 status=none
      dd if=$TXT bs=1 skip=$((o + 40000)) count=$F status=none
      dd if=$TXT bs=1 skip=$o count=32 status=none; } >"$T/d$i.txt"
    "$K" eval --no-progress --text "$T/d$i.txt" --tokens $((64 + F)) --prefill $((40 + F)) --csv "$T/r$F-$i.csv" \
      --policy "policy=full capacity=256 positions=original" --policy "policy=window window=24" >/dev/null
  done
  # CSV columns: policy is the first, nll the one named "nll" in the header
  for pol in "policy=full capacity=256 positions=original" "policy=window window=24"; do
    cat "$T"/r$F-*.csv | awk -F, -v pol="\"$pol\"" -v F=$F '
      NR == 1 { for (i = 1; i <= NF; i++) if ($i == "nll") c = i; next }
      $1 == pol { s += $c; n++ }
      END { printf "%d %s %.4f\n", F, pol, s / n }'
  done
done
