// FMA peak at the baseline ISA (see fma_peak.h).
#define KVP_FMA_PEAK_NAME fma_peak_simde
#include "fma_peak.inc"
