// Test support: tokenizer-llama2.bin (llama2.c's export of the Llama 2 SentencePiece vocabulary,
// ../shared/models) read back to GGUF's pieces, scores and token types.
#pragma once
#include <stdint.h>

#include <fstream>
#include <string>
#include <vector>

struct SpmVocab {
    std::vector<std::string> pieces;
    std::vector<float> scores;
    std::vector<int32_t> types;
};

// The file: int32 max length, then per token f32 score, int32 length, bytes, with U+2581 written
// as a space and BOS/EOS as "\n<s>\n" / "\n</s>\n". Token types as GGUF's: 2 unknown (token 0),
// 3 control (BOS, EOS), 6 byte (<0xNN>), 1 normal. False when the file is missing, malformed or
// not the 32000-token vocabulary.
inline bool read_llama2c_vocab(const std::string &path, SpmVocab *v) {
    std::ifstream f(path, std::ios::binary);
    int32_t maxlen;
    if (!f.read((char *)&maxlen, 4)) return false;
    for (int i = 0;; i++) {
        float s;
        int32_t n;
        if (!f.read((char *)&s, 4)) break;
        if (!f.read((char *)&n, 4) || n < 0 || n > 1000) return false;
        std::string p((size_t)n, '\0');
        if (!f.read(&p[0], n)) return false;
        int32_t ty = i == 0 ? 2 : (i == 1 || i == 2) ? 3 : 1;
        if (i == 1 || i == 2) p = i == 1 ? "<s>" : "</s>";
        if (p.size() == 6 && p.compare(0, 3, "<0x") == 0) ty = 6;
        std::string g;
        for (char ch : p) g += ch == ' ' ? std::string("\xE2\x96\x81") : std::string(1, ch);
        v->pieces.push_back(g);
        v->scores.push_back(s);
        v->types.push_back(ty);
    }
    return v->pieces.size() == 32000;
}
