#!/usr/bin/env bash
# Issue 9 figures (docs/harness.md "Results (issue 9)"): SimLayerKV's lazy layers against trimming
# as many randomly chosen layers, and ASL's selection layer, quality, memory and prefill time
# against SnapKV at the same budget and full KV, over several held-out passages.
#   bash bench/harness/results/layers.sh [build dir, default build]
# Passages: 256 bytes of models/enbytes-1m.eval.txt at offsets 0, 40000, ..., 160000 (N 256 = the
# model's trained context, P 192 by kvp_prefill, NLL of the last 64 by kvp_decode), and the same
# offsets with N 1024, P 960 for prefill times. stories260K has no tokenizer: its passages are its
# own samples (`kvprune run --temp 0.8 --seed S`, 400 token ids), a loader/GQA check more than a
# quality figure (models/README.md).
set -euo pipefail
cd "$(dirname "$0")/../../.."
B=${1:-build}
K=$B/bench/harness/kvprune
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
SIM="policy=simlayerkv sinks=4 window=28 capacity=256 lazy_threshold=0.6"
for off in 0 40000 80000 120000 160000; do
  dd if=models/enbytes-1m.eval.txt of="$T/p$off.txt" bs=1024 skip=$off count=1 iflag=skip_bytes status=none
  echo "== enbytes-1m, passage at byte $off: simlayerkv (also in a shared pool of 768 slots per KV head) vs random layers (seeds 1 2 3)"
  "$K" eval --no-progress --text "$T/p$off.txt" --tokens 256 --prefill 192 \
    --policy "policy=full capacity=256 positions=original" --policy "$SIM" --policy "$SIM total_capacity=768" --random-lazy 1 || true  # the shared pool fails (KVP_ERR_FULL) where fewer layers are lazy
  for seed in 2 3; do
    "$K" eval --no-progress --text "$T/p$off.txt" --tokens 256 --prefill 192 --policy "$SIM" --random-lazy $seed | grep "lazy_force=" | grep -v "^  " || true
  done
  echo "== enbytes-1m, passage at byte $off: asl vs snapkv, budget 64 (N 256, P 192)"
  "$K" eval --no-progress --text "$T/p$off.txt" --tokens 256 --prefill 192 \
    --policy "policy=full capacity=256 positions=original" --policy "policy=snapkv budget=64" \
    --policy "policy=asl budget=64 asl_obs_layers=2" --policy "policy=asl budget=64 asl_obs_layers=2 asl_min_layer=1" || true
  echo "== enbytes-1m, passage at byte $off: prefill time, P 960 (N 1024)"
  "$K" eval --no-progress --text "$T/p$off.txt" --tokens 1024 --prefill 960 \
    --policy "policy=full capacity=1024 positions=original" --policy "policy=snapkv budget=64" \
    --policy "policy=asl budget=64 asl_obs_layers=2" --policy "policy=asl budget=64 asl_obs_layers=2 asl_min_layer=1" || true
done
for seed in 1 2 3; do
  "$K" run --model models/stories260K.bin --policy "policy=full capacity=512" --tokens 400 --temp 0.8 --seed $seed --prompt 1 2>/dev/null | head -1 > "$T/s$seed.txt"
  echo "== stories260K, sample seed $seed (400 token ids)"
  "$K" eval --no-progress --model models/stories260K.bin --text "$T/s$seed.txt" --tokens 400 --prefill 300 \
    --policy "policy=full capacity=512 positions=original" \
    --policy "policy=simlayerkv sinks=4 window=28 capacity=512 lazy_threshold=0.6" --random-lazy 1 \
    --policy "policy=snapkv budget=64" --policy "policy=asl budget=64 asl_obs_layers=2" || true
done
