#!/bin/bash
# kept as run on the device; the binaries go in build-dev/{head,int}/ with libbenchmark and libgomp in build-dev/lib/
# issue 31 device probe: one run, prepared on the project VM. Binaries: head/ (main HEAD), int/ (HEAD + bench/experiments/int-value-pass.patch)
set -u
D=build-dev; export LD_LIBRARY_PATH=$PWD/$D/lib; export OMP_WAIT_POLICY=passive
O=${OUT:-/tmp/out}; mkdir -p $O
log() { echo "### $(date -u +%T) $*"; }
{
log start; lscpu | grep -E 'Model name|^CPU\(s\)|Thread|Flags' | sed 's/Flags:.*/&/' | cut -c1-400
grep -o -w -E 'avx512f|avx512bw|avx512vl|avx512_vnni|avx_vnni|amx_int8|avx512_bf16' /proc/cpuinfo | sort | uniq -c
uptime
log tests
for t in test_quant_kernels test_kernels; do timeout 60 $D/head/$t --gtest_brief=1 2>&1 | tail -3; done
timeout 60 $D/int/test_quant_kernels --gtest_brief=1 2>&1 | tail -3
F32='DecodeQ/f32/N:32768'; Q='DecodeQ/(f16|q8|q4)/N:32768'; QI='DecodeQ/(q8|q4)/N:32768'
for round in 1 2; do
  log "round $round head avx512 (f32 + q)"; KVP_KERNEL_Q=avx512 timeout 90 $D/head/bench_quant --benchmark_filter="$F32|$Q" 2>&1 | grep -E '^\| 32768|^BM_'
  log "round $round head avx512z"; KVP_KERNEL_Q=avx512z timeout 90 $D/head/bench_quant --benchmark_filter="$F32|$Q" 2>&1 | grep -E '^\| 32768'
  log "round $round int (vpdpwssd)"; timeout 90 $D/int/bench_quant --benchmark_filter="$F32|$QI" 2>&1 | grep -E '^\| 32768'
  log "round $round head f32 KVP_KERNEL=avx2"; KVP_KERNEL=avx2 timeout 40 $D/head/bench_quant --benchmark_filter="$F32" 2>&1 | grep -E '^\| 32768'
  uptime
done
log kernels; timeout 60 $D/head/bench_quant --benchmark_filter='KernelQ/.*/avx512z?/N' 2>&1 | grep BM_
timeout 30 $D/int/bench_quant --benchmark_filter='KernelQ/q[48]/avx512/N' 2>&1 | grep BM_
log roofline head; timeout 150 $D/head/bench_attention --roofline --nmin 16384 --nmax 32768 --reps 2 --csv $O/roof-head.csv 2>&1
log roofline int; timeout 80 $D/int/bench_attention --roofline --nmin 32768 --nmax 32768 --reps 2 --dtypes q8,q4 --label int --csv $O/roof-int.csv 2>&1
log end; uptime
} 2>&1 | tee $O/probe.txt
