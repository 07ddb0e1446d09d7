// kv_rotate=hadamard (issue 23 item 3): the orthonormal Walsh-Hadamard rotation of head rows.
// Same scheme as vec_f32.h: a scalar reference (rotate_f32_scalar.cpp) and SIMD variants from
// one SIMDe source (rotate_f32_simd.inc: simde at the baseline ISA, avx2 chosen at run time);
// tests/test_rotate.cpp compares every variant with the reference, bit for bit.
//
// The rotation of a row of width hd: hd is cut into power-of-two blocks by its binary digits,
// largest first (128 = one block; 96 = 64 + 32; 80 = 64 + 16; an odd width ends in a block of
// 1, which is left as it is). Each block of width b = 2^m gets the Sylvester-Hadamard transform
// scaled by 1/sqrt(b): m butterfly stages with half-widths h = 1, 2, 4, ..., b/2 in that order;
// in stage h, for every j in the block with (j & h) == 0: (x[j], x[j+h]) = (x[j] + x[j+h],
// x[j] - x[j+h]); then every element is multiplied by the float nearest 1/sqrt(b). The matrix
// is symmetric and orthonormal, so the rotation is its own inverse in exact arithmetic.
//
// Arithmetic (identical in every variant): each element goes through the same adds and
// subtractions in the same order and one final product, so every variant gives the same bits.
#pragma once
#include <stddef.h>
#include <stdint.h>

namespace kvp {
namespace kern {

// Rotates rows x[j*ld ...] (j < n) of width hd in place.
typedef void (*f32_hadamard_fn)(float *x, uint32_t n, size_t ld, uint32_t hd);

struct RotateF32 {
    const char *name;  // "scalar", "simde", "avx2"
    f32_hadamard_fn hadamard;
};

// The scale of a block of width b (a power of two): the float nearest 1/sqrt(b).
float hadamard_scale(uint32_t b);

const RotateF32 *rotate_f32_scalar();
const RotateF32 *rotate_f32_simde();
const RotateF32 *rotate_f32_avx2();  // nullptr where not compiled in or not supported
// avx2, else simde; KVP_KERNEL=scalar|simde picks those (as vec_f32_best). Call once at create.
const RotateF32 *rotate_f32_best();

// The variants by id (kvp_cache stores an id): 1 scalar, 2 simde, 3 avx2 (where available; the
// id of an unavailable variant gives simde). rotate_f32_best_id: rotate_f32_best's id.
const RotateF32 *rotate_f32_variant(uint32_t id);
uint32_t rotate_f32_best_id();

// Internal tables of rotate_f32_simd.inc (no CPU check; use the functions above).
const RotateF32 *rotate_f32_simde_table();
const RotateF32 *rotate_f32_avx2_table();

}  // namespace kern
}  // namespace kvp
