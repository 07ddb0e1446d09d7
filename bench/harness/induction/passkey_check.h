// Hand-built passkey prompts and greedy answers through the harness Session: what the generator's
// --compare mode and tests/test_induction.cpp use to check that two retrieval models answer alike.
// (The harness's own retrieval tasks are `kvprune eval --task`; this is a small, independent check.)
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "checkpoint.h"
#include "session.h"

namespace kvh {

// The question every prompt ends with; the answer follows it (" " then the 5 digits).
extern const char *const kPasskeyQuestion;  // " What is the pass key? The pass key is"

struct PasskeyPrompt {
    std::vector<int32_t> tokens;  // exactly n bytes
    std::string key;              // 5 digits
    size_t needle_at = 0;         // byte offset of the needle
};

// n bytes: `hay` from byte `offset`, with "The pass key is K. Remember it. K is the pass key. " placed
// after round(depth * room) of its bytes (room = n - needle - question), then the question. Returns false
// with *err when n is too short for needle and question, depth is outside [0, 1], key is not 5 digits,
// or hay is shorter than offset + room.
bool passkey_prompt(const std::vector<uint8_t> &hay, size_t offset, int n, double depth, unsigned key,
                    PasskeyPrompt *out, std::string *err);

// Greedy continuation of `len` bytes after prefilling the whole prompt (the session is reset first).
bool greedy_answer(Session &s, const std::vector<int32_t> &prompt, int len, std::string *out, std::string *err);

struct PasskeyComparison {
    int cases = 0, right_a = 0, right_b = 0, same = 0;
    std::vector<std::string> lines;  // one per prompt: N, depth, key, both answers
};

// Both checkpoints on the same prompts (every length x depths d/10 for d in `deciles`, default 1..9;
// keys from a fixed sequence,
// haystack offsets spread over `hay`), full KV with capacity = the smaller model context (every length
// plus the 6-byte answer must fit in it). Answers are 6 bytes: the space after "is" and the key.
bool compare_passkey(const Checkpoint &a, const Checkpoint &b, const std::vector<uint8_t> &hay,
                     const std::vector<int> &lengths, PasskeyComparison *out, std::string *err,
                     const std::vector<int> &deciles = {1, 2, 3, 4, 5, 6, 7, 8, 9});

}  // namespace kvh
