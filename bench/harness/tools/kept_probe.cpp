// What a policy keeps of a task's needle (docs/harness.md "Retrieval tasks"): builds one task prompt,
// feeds it (query-aware or query-agnostic), and prints per layer and KV head how many of the answer's
// bytes inside the asked needle (the positions the model copies from) are still held, and which.
//   kvprune-kept-probe MODEL TEXT TASK LENGTH DEPTH SETTING SPEC...
// e.g. kvprune-kept-probe models/induction6.bin models/enbytes-1m.eval.txt passkey 512 0.5 query-aware
//   "policy=snapkv budget=128" "policy=snapkv budget=128 pool_kernel=15"
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "session.h"
#include "tasks.h"

using namespace kvh;

int main(int argc, char **argv) {
    if (argc < 8) {
        std::fprintf(stderr, "usage: kvprune-kept-probe MODEL TEXT TASK LENGTH DEPTH query-aware|query-agnostic SPEC...\n");
        return 2;
    }
    std::string err;
    Checkpoint ck;
    if (!load_checkpoint(argv[1], &ck, &err)) return std::fprintf(stderr, "%s\n", err.c_str()), 1;
    std::ifstream f(argv[2], std::ios::binary);
    const std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    TaskPrompt p;
    if (!make_task_prompt(argv[3], text, std::atoi(argv[4]), std::atof(argv[5]), 0, 0, &p, &err))
        return std::fprintf(stderr, "%s\n", err.c_str()), 1;
    const bool aware = std::string(argv[6]) == "query-aware";
    // The answer's bytes inside the asked needle: every occurrence of the answer in the block.
    std::vector<int32_t> want;
    for (size_t at = p.needle.find(p.answer); at != std::string::npos; at = p.needle.find(p.answer, at + 1))
        for (size_t i = 0; i < p.answer.size(); i++) want.push_back((int32_t)(p.needle_at + at + i));
    std::printf("%s length %s depth %s, %s: answer '%s', its bytes in the needle at positions %d..%d (%zu)\n", argv[3],
                argv[4], argv[5], argv[6], p.answer.c_str(), want.empty() ? -1 : want.front(),
                want.empty() ? -1 : want.back(), want.size());
    for (int a = 7; a < argc; a++) {
        Session s;
        if (!s.init(ck, argv[a], &err)) return std::fprintf(stderr, "%s\n", err.c_str()), 1;
        std::vector<float> lg((size_t)ck.cfg.vocab);
        std::vector<int32_t> ctx(p.context.begin(), p.context.end()), q(p.question.begin(), p.question.end());
        if (aware) ctx.insert(ctx.end(), q.begin(), q.end());
        if (!s.prefill(ctx.data(), (int)ctx.size(), lg.data(), false, &err)) return std::fprintf(stderr, "%s\n", err.c_str()), 1;
        if (!aware)
            for (int32_t t : q)
                if (!s.decode(t, lg.data(), &err)) return std::fprintf(stderr, "%s\n", err.c_str()), 1;
        std::printf("  %s\n", argv[a]);
        for (int l = 0; l < ck.cfg.n_layers; l++)
            for (int h = 0; h < ck.cfg.n_kv_heads; h++) {
                std::vector<int32_t> pos(4096);
                uint32_t n = 0;
                if (kvp_layer_positions(s.cache(), (uint32_t)l, (uint32_t)h, pos.data(), (uint32_t)pos.size(), &n) != KVP_OK)
                    return std::fprintf(stderr, "kvp_layer_positions: %s\n", kvp_last_error(s.cache())), 1;
                pos.resize(n);
                std::sort(pos.begin(), pos.end());
                std::string marks;
                size_t kept = 0;
                for (int32_t w : want) {
                    const bool k = std::binary_search(pos.begin(), pos.end(), w);
                    kept += k;
                    marks += k ? '+' : '.';
                }
                std::printf("    layer %d head %d: holds %u tokens; answer bytes kept %zu/%zu  %s\n", l, h, n, kept,
                            want.size(), marks.c_str());
            }
    }
    return 0;
}
