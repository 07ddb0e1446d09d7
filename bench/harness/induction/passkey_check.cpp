#include "passkey_check.h"

#include <algorithm>
#include <cstdio>

namespace kvh {

const char *const kPasskeyQuestion = " What is the pass key? The pass key is";

bool passkey_prompt(const std::vector<uint8_t> &hay, size_t offset, int n, double depth, unsigned key,
                    PasskeyPrompt *out, std::string *err) {
    if (key < 10000 || key > 99999) {
        *err = "passkey: the key must have 5 digits";
        return false;
    }
    if (!(depth >= 0.0 && depth <= 1.0)) {
        *err = "passkey: depth must be in [0, 1]";
        return false;
    }
    out->key = std::to_string(key);
    const std::string needle = "The pass key is " + out->key + ". Remember it. " + out->key + " is the pass key. ";
    const std::string question = kPasskeyQuestion;
    if (n < (int)(needle.size() + question.size())) {
        *err = "passkey: " + std::to_string(n) + " bytes cannot hold the needle and the question";
        return false;
    }
    const size_t room = (size_t)n - needle.size() - question.size();
    if (hay.size() < offset + room) {
        *err = "passkey: the haystack is shorter than offset + " + std::to_string(room) + " bytes";
        return false;
    }
    out->needle_at = (size_t)(depth * (double)room + 0.5);
    std::string s(hay.begin() + (long)offset, hay.begin() + (long)(offset + room));
    s.insert(out->needle_at, needle);
    s += question;
    out->tokens.assign(s.begin(), s.end());
    for (int32_t &t : out->tokens) t &= 0xFF;  // bytes, not signed chars
    return true;
}

bool greedy_answer(Session &s, const std::vector<int32_t> &prompt, int len, std::string *out, std::string *err) {
    out->clear();
    if (!s.reset(err)) return false;
    const int V = s.model().vocab;
    std::vector<float> lg((size_t)V);
    if (!s.prefill(prompt.data(), (int)prompt.size(), lg.data(), false, err)) return false;
    for (int t = 0; t < len; t++) {
        const int best = (int)(std::max_element(lg.begin(), lg.end()) - lg.begin());  // first maximum
        out->push_back((char)best);
        if (t + 1 < len && !s.decode(best, lg.data(), err)) return false;
    }
    return true;
}

bool compare_passkey(const Checkpoint &a, const Checkpoint &b, const std::vector<uint8_t> &hay,
                     const std::vector<int> &lengths, PasskeyComparison *out, std::string *err,
                     const std::vector<int> &deciles) {
    *out = PasskeyComparison();
    // Full KV over the models' whole context (policy=full capacity=1024 for induction6).
    const int cap = std::min(a.cfg.seq_len, b.cfg.seq_len);
    for (int n : lengths) {
        if (n + 6 > cap) {
            *err = "passkey: length " + std::to_string(n) + " plus the 6-byte answer exceeds the context " +
                   std::to_string(cap);
            return false;
        }
    }
    const std::string spec = "policy=full capacity=" + std::to_string(cap);
    Session sa, sb;
    if (!sa.init(a, spec, err) || !sb.init(b, spec, err)) return false;
    for (int n : lengths) {
        for (int d : deciles) {
            if (d < 0 || d > 10) {
                *err = "passkey: depth deciles must be in 0..10";
                return false;
            }
            uint32_t h = 0x9E3779B9u * (uint32_t)(out->cases + 1);  // a fixed, well-mixed key per prompt
            h ^= h >> 15;
            h *= 0x2C1B3C6Du;
            h ^= h >> 12;
            const unsigned key = 10000u + h % 90000u;
            const size_t offset = 9000u * (size_t)(out->cases + 1) % (hay.size() > (size_t)n ? hay.size() - n : 1);
            PasskeyPrompt p;
            if (!passkey_prompt(hay, offset, n, d / 10.0, key, &p, err)) return false;
            std::string ans_a, ans_b;
            if (!greedy_answer(sa, p.tokens, 6, &ans_a, err) || !greedy_answer(sb, p.tokens, 6, &ans_b, err))
                return false;
            const std::string want = " " + p.key;
            out->cases++;
            out->right_a += ans_a == want;
            out->right_b += ans_b == want;
            out->same += ans_a == ans_b;
            auto show = [](const std::string &s) {
                std::string r;
                for (unsigned char c : s) r += (c >= 32 && c < 127) ? (char)c : '?';
                return r;
            };
            char line[160];
            std::snprintf(line, sizeof line, "N %4d depth %.1f key %s: '%s' %s | '%s' %s", n, d / 10.0, p.key.c_str(),
                          show(ans_a).c_str(), ans_a == want ? "right" : "WRONG", show(ans_b).c_str(),
                          ans_b == want ? "right" : "WRONG");
            out->lines.push_back(line);
        }
    }
    return true;
}

}  // namespace kvh
