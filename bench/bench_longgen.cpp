// Memory over time of the scored policies on the bundled model (issue 8's report): teacher-forced
// like `kvprune eval` (tokens 0..P-1 by kvp_prefill, the rest by kvp_decode, through the harness's
// forward pass), but it also records live KV bytes after every token, so policies whose memory
// changes over time (lethe) can be compared with fixed-budget ones at equal AVERAGE memory, and
// prints each layer's final length, Lethe threshold and sparsity.
//
//   bench_longgen [--model M] [--text F] [--tokens N] [--prefill P] [--every K] --policy SPEC...
//
// Output: a markdown table (nll over tokens P..N-1, nll of the last quarter, mean / peak / final
// live bytes, arena bytes) and one line of per-layer figures per policy; with --every K, the
// live bytes every K tokens.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "checkpoint.h"
#include "eval.h"
#include "session.h"

#ifndef KVP_HARNESS_MODELS_DIR
#define KVP_HARNESS_MODELS_DIR "models"
#endif

namespace {

double nll_of(const float *lg, int V, int target) {
    double m = lg[0];
    for (int i = 1; i < V; i++) m = lg[i] > m ? lg[i] : m;
    double s = 0;
    for (int i = 0; i < V; i++) s += std::exp(double(lg[i]) - m);
    return m + std::log(s) - double(lg[target]);
}

int usage() {
    std::fprintf(stderr, "usage: bench_longgen [--model M] [--text F] [--tokens N] [--prefill P] [--every K] --policy SPEC...\n");
    return 2;
}

}  // namespace

int main(int argc, char **argv) {
    const char *env = std::getenv("KVPRUNE_MODEL_DIR");
    const std::string dir = env && *env ? env : KVP_HARNESS_MODELS_DIR;
    std::string model = dir + "/enbytes-1m.bin", text = dir + "/enbytes-1m.eval.txt";
    int N = 1024, P = -1, every = 0;
    std::vector<std::string> specs;
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        if (i + 1 >= argc) return usage();
        const char *v = argv[++i];
        if (a == "--model") model = v;
        else if (a == "--text") text = v;
        else if (a == "--tokens") N = std::atoi(v);
        else if (a == "--prefill") P = std::atoi(v);
        else if (a == "--every") every = std::atoi(v);
        else if (a == "--policy") specs.push_back(v);
        else return usage();
    }
    if (P < 0) P = N / 4;
    if (specs.empty() || N < 2 || P < 1 || P >= N) return usage();
    kvh::Checkpoint ck;
    std::string err;
    if (!kvh::load_checkpoint(model, &ck, &err)) {
        std::fprintf(stderr, "bench_longgen: %s\n", err.c_str());
        return 1;
    }
    std::vector<int32_t> tokens;
    if (!kvh::load_tokens(text, ck.cfg.vocab, &tokens, &err) || int(tokens.size()) < N) {
        std::fprintf(stderr, "bench_longgen: %s\n", err.empty() ? "text shorter than --tokens" : err.c_str());
        return 1;
    }
    const int V = ck.cfg.vocab;
    std::printf("N=%d P=%d (nll: tokens P..N-1; last quarter: tokens %d..%d)\n\n", N, P, N - (N - P) / 4, N - 1);
    std::printf("| policy | nll | nll last quarter | mean live KiB | peak live KiB | final live KiB | arena KiB |\n");
    std::printf("|---|---|---|---|---|---|---|\n");
    std::vector<std::string> layer_lines, traces;
    for (const std::string &spec : specs) {
        kvh::Session s;
        if (!s.init(ck, spec, &err)) {
            std::fprintf(stderr, "bench_longgen: %s: %s\n", spec.c_str(), err.c_str());
            return 1;
        }
        std::vector<float> logits(static_cast<size_t>(V));
        if (!s.prefill(tokens.data(), P, logits.data(), false, &err)) {
            std::fprintf(stderr, "bench_longgen: %s: %s\n", spec.c_str(), err.c_str());
            return 1;
        }
        double sum = 0, sum_q = 0, live_sum = 0;
        const int q0 = N - (N - P) / 4;
        std::string trace = spec + ":";
        for (int t = P; t < N; ++t) {
            const double l = nll_of(logits.data(), V, tokens[t]);
            sum += l;
            if (t >= q0) sum_q += l;
            if (!s.decode(tokens[t], logits.data(), &err)) {
                std::fprintf(stderr, "bench_longgen: %s: token %d: %s\n", spec.c_str(), t, err.c_str());
                return 1;
            }
            const kvp_stats st = s.stats();
            live_sum += double(st.live_bytes);
            if (every > 0 && (t - P) % every == 0) trace += " " + std::to_string(st.live_bytes / 1024);
        }
        const kvp_stats st = s.stats();
        std::printf("| `%s` | %.4f | %.4f | %.1f | %.1f | %.1f | %.1f |\n", spec.c_str(), sum / (N - P), sum_q / (N - q0),
                    live_sum / (N - P) / 1024.0, st.peak_live_bytes / 1024.0, st.live_bytes / 1024.0,
                    st.arena_bytes / 1024.0);
        std::string line = "`" + spec + "`: len/evict_threshold/sparsity per layer:";
        for (int l = 0; l < ck.cfg.n_layers; ++l) {
            kvp_layer_stats ls;
            std::memset(&ls, 0, sizeof ls);
            ls.struct_size = sizeof ls;
            if (kvp_get_layer_stats(s.cache(), uint32_t(l), &ls) != KVP_OK) continue;
            char b[64];
            std::snprintf(b, sizeof b, " %u/%u/%.2f", ls.len, ls.evict_threshold, ls.sparsity);
            line += b;
        }
        layer_lines.push_back(line);
        traces.push_back(trace);
    }
    std::printf("\n");
    for (const std::string &l : layer_lines) std::printf("%s\n", l.c_str());
    if (every > 0) {
        std::printf("\nlive KiB every %d tokens:\n", every);
        for (const std::string &t : traces) std::printf("%s\n", t.c_str());
    }
    return 0;
}
