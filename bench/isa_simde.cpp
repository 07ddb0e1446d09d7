// Bench baselines at the baseline ISA (see isa.h).
#define KVP_BENCH_ISA simde
#include "isa.inc"
