// Fuzz targets of kvprune (issue 11, "keep the attack in the project"). Each target is a plain
// function of a byte string, so the same code runs under libFuzzer (tests/fuzz/fuzz_main.cpp,
// clang, ASan + UBSan, coverage-guided) and as a seeded deterministic GoogleTest under any
// compiler (tests/fuzz/test_fuzz_replay.cpp: generated inputs and the committed corpus).
//
// A target returns normally when every invariant held and calls kvpfuzz::violation() (which
// prints what broke and aborts, so libFuzzer saves the input) when one did not.
#pragma once
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include <string>

// For the targets' own files: checks an invariant; when it does not hold, calls the file's
// fail(std::string) with the condition and a printf-style message (fail reports it through
// violation()).
#define KVPFUZZ_CHECK(cond, ...)                          \
    do {                                                  \
        if (!(cond)) {                                    \
            char msg_[512];                               \
            snprintf(msg_, sizeof msg_, __VA_ARGS__);     \
            fail(std::string(#cond) + ": " + msg_);       \
        }                                                 \
    } while (0)

namespace kvpfuzz {

// A 64-aligned arena of n bytes (NULL for 0) for the targets' caches, freed with it.
struct Arena {
    void *p = nullptr;
    explicit Arena(size_t n) { p = n ? aligned_alloc(64, (n + 63) / 64 * 64) : nullptr; }
    ~Arena() { free(p); }
};

// Counters of what the call-sequence target did (summed over runs; for the figures).
struct CallStats {
    uint64_t sequences = 0, configs_rejected = 0, calls = 0, calls_ok = 0, calls_failed = 0, bad_inputs = 0;
    uint64_t selections = 0;  // prefills that returned an ASL selection (equal to the twin's)
    uint64_t policy_runs[16] = {};
    uint64_t drafts = 0, drafts_accepted = 0;  // kvp_draft_commit calls that succeeded, and of them with accepted > 0
    uint64_t half_calls = 0;  // successful f16 calls (kvp_*_ex) whose outputs were checked against the twin
};

// Config strings: kvp_config_apply on a default config (model from the first bytes), then
// kvp_config_check, kvp_arena_size, kvp_config_key_used, and a small cache when the arena is small.
// Invariants: a failed apply leaves the config byte-identical; KVP_OK means check OK and a non-zero
// arena; every message is NUL-terminated within its buffer and starts with the status's text.
void config_target(const uint8_t *data, size_t size);

// Call sequences against a twin cache: a config from a table of every implemented policy (both
// position modes, shared pools, 1-2 threads), then prefill/decode/append/reset/positions/stats/
// layer_stats/prefill_room calls with good and bad inputs. The twin (another thread count) gets
// only the calls that succeeded. Invariants: a failed call changes nothing (the two caches stay
// identical: lengths, positions, counters, later outputs and ASL selections bit for bit), a bad
// input fails with its status, outputs are finite, live_bytes <= arena_bytes, layer lengths <=
// capacity, positions ascending, kvp_prefill_room tokens fit every layer in turn, policies that
// evict never say FULL for a decode.
void calls_target(const uint8_t *data, size_t size, CallStats *stats = nullptr);

// States (issue 29): the bytes are a kvp_state_load buffer whose size and checksum the target
// recomputes (so mutations reach the body); the cache is built from the state's own kvp_config
// words (threads 1, arena <= 16 MB) and holds tokens of its own. Invariants: a refused load gives
// ARG / UNSUPPORTED / CONFIG and the cache saves the same bytes as before; an accepted one saves
// the input's body back unchanged, and lengths <= capacity, ascending positions, stats that sum,
// finite outputs of decodes, a draft and a prefill, and a reload of its own save hold after it.
void state_target(const uint8_t *data, size_t size);

// Names of the policies calls_target draws from (the implemented rows of its table).
const char *calls_policy_name(uint32_t i);
uint32_t calls_policy_count();

// The harness readers (built where bench/harness is): the llama2.c checkpoint loader on a file
// holding the bytes (never reads past what it read; a loaded checkpoint is consistent), the
// results-JSON reader (parsed rows round-trip through to_json), and the token-text reader.
void checkpoint_target(const uint8_t *data, size_t size);
void results_target(const uint8_t *data, size_t size);
// The GGUF reader (issue 20) on the bytes as a buffer, then the model loader on them as a file.
// Invariants: a failure has a one-line message; an accepted file's tensors lie inside it, its
// metadata reads back (every getter, the tokenizer), and a loaded model is consistent (sizes,
// pointers inside the weights, finite weights).
void gguf_target(const uint8_t *data, size_t size);

[[noreturn]] void violation(const char *target, const char *what);

}  // namespace kvpfuzz
