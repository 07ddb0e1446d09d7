// State save/load (issue 21): the whole mutable state of a cache into caller memory and back.
//
// Format (version 1, little-endian throughout, independent of pointer size and struct layout):
// One layout on every target (a state moves between x86-64, aarch64 and armhf); the values in it
// are what this platform's kernels computed.
//   0  "KVPSTATE"                8 bytes
//   8  u32 format version (1)   12  u32 library version (kvp_version of the writer)
//  16  u64 total bytes          24  u64 checksum of bytes [32, total) (state.cpp checksum64)
//  32  u32 config words W       36  u32 RoPE table fingerprint (rope.h rope_table_fingerprint;
//      0 = theta's frequencies; states before issue 21's tables wrote 0 here)
//  40  the writer's kvp_config after struct_size as W u32 words (model first, threads included
//      but not compared: bits do not depend on the thread count)
//  then the body, in this order (each field little-endian, fixed width):
//   cache counters; per layer its LayerState; per pool its free lists and counters; per store its
//   HeadStore scalars, block tables, formatted-store state (side rows, channel lists) and the data
//   of the blocks it holds, whole blocks (K/V rows at the row stride, slot metadata, fixed-point
//   keys, formatted rows, scales and key grids); the policy state region as bytes (policies keep
//   only fixed-width little-endian data there).
// The body holds the blocks in use, not the arena: its size is about the live bytes plus
// per-block metadata and the partly filled first/last block of each store.
// Loading checks everything first (magic, version, size, checksum, config, every index and count
// it will use) and only then writes: a refused load leaves the cache as it was.
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "cache.h"
#include "msg.h"

namespace kvp {

constexpr uint32_t kStateFormat = 1;

size_t state_size(const kvp_cache *c);
// KVP_ERR_BUFFER (with *written = the size needed) when size is too small; KVP_ERR_STATE while a
// draft is open.
kvp_status state_save(const kvp_cache *c, void *buf, size_t size, size_t *written, Msg &m);
kvp_status state_load(kvp_cache *c, const void *buf, size_t size, Msg &m);
// The checksum of the format (tests).
uint64_t state_checksum(const void *p, size_t n);
// Tests: bits of the block-ownership bitmap per check pass of kvp_state_load (rounded down to a
// multiple of 64, at least 64; 0: all that thread 0's scratch holds, the library's setting), so a
// test can run the windowed passes that only very large pools need otherwise.
extern uint64_t state_check_bits;

}  // namespace kvp
