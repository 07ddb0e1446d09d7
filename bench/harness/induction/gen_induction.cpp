// kvprune-gen-induction: writes a retrieval model (exact n-byte induction, llama2.c format) whose
// bigram default comes from a byte corpus. See induction_model.h and docs/harness.md.
//
//   kvprune-gen-induction --corpus FILE --out FILE [--seed N] [--order N] [--context N] [--kv-heads 1|2]
//   kvprune-gen-induction --compare A.bin B.bin --text FILE [--lengths N,N,...]
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "checkpoint.h"
#include "induction_model.h"
#include "passkey_check.h"

namespace {

const char *kUsage =
    "usage: kvprune-gen-induction --corpus FILE --out FILE [--seed N] [--order N] [--context N] [--kv-heads 1|2]\n"
    "  Writes a constructed 2-layer byte model whose attention copies what followed an earlier\n"
    "  occurrence of the current N-byte context (default 6), with a bigram table of\n"
    "  FILE as the fallback. Defaults give the geometry of models/induction6.bin: dim 1152,\n"
    "  6 query heads x 192, 1 KV head, context 1024, separate classifier (vocab -256).\n"
    "  --kv-heads 2: two KV heads per layer; layer 2's second is a local head (it attends to the\n"
    "  previous byte, read by the classifier as a skip-bigram) beside the matching head.\n"
    "usage: kvprune-gen-induction --compare A.bin B.bin --text FILE [--lengths 256,512,1000]\n"
    "  Builds passkey prompts from FILE (each length x depths 0.1..0.9), prints both models' greedy\n"
    "  answers with full KV and a summary line; exits 0 when every answer is the same and right.\n";

bool read_file(const std::string &path, std::vector<uint8_t> *out) {
    std::FILE *f = std::fopen(path.c_str(), "rb");
    if (!f) {
        std::fprintf(stderr, "kvprune-gen-induction: cannot open '%s': %s\n", path.c_str(), std::strerror(errno));
        return false;
    }
    out->clear();
    unsigned char buf[1 << 16];
    size_t got;
    while ((got = std::fread(buf, 1, sizeof buf, f)) > 0) out->insert(out->end(), buf, buf + got);
    const bool ok = !std::ferror(f);
    std::fclose(f);
    if (!ok) std::fprintf(stderr, "kvprune-gen-induction: read error on '%s'\n", path.c_str());
    return ok;
}

int compare(const std::string &pa, const std::string &pb, const std::string &text, const std::vector<int> &lengths) {
    kvh::Checkpoint a, b;
    std::string err;
    std::vector<uint8_t> hay;
    if (!kvh::load_checkpoint(pa, &a, &err) || !kvh::load_checkpoint(pb, &b, &err)) {
        std::fprintf(stderr, "kvprune-gen-induction: %s\n", err.c_str());
        return 1;
    }
    if (!read_file(text, &hay)) return 1;
    kvh::PasskeyComparison r;
    if (!kvh::compare_passkey(a, b, hay, lengths, &r, &err)) {
        std::fprintf(stderr, "kvprune-gen-induction: %s\n", err.c_str());
        return 1;
    }
    std::printf("passkey prompts from %s, full KV; answers of A = %s | B = %s\n", text.c_str(), pa.c_str(), pb.c_str());
    for (const std::string &l : r.lines) std::printf("  %s\n", l.c_str());
    std::printf("%d prompts: A %d right, B %d right, %d identical answers\n", r.cases, r.right_a, r.right_b, r.same);
    return r.right_a == r.cases && r.right_b == r.cases && r.same == r.cases ? 0 : 1;
}

bool parse_int(const char *s, long long lo, long long hi, long long *out) {
    char *end = nullptr;
    errno = 0;
    long long v = std::strtoll(s, &end, 10);
    if (errno != 0 || end == s || *end != '\0' || v < lo || v > hi) return false;
    *out = v;
    return true;
}

}  // namespace

int main(int argc, char **argv) {
    kvh::InductionParams p;
    std::string corpus_path, out_path, cmp_a, cmp_b, text;
    std::vector<int> lengths = {256, 512, 1000};
    for (int i = 1; i < argc; i++) {
        const std::string a = argv[i];
        if (a == "--help" || a == "-h") {
            std::fputs(kUsage, stdout);
            return 0;
        }
        if (a == "--compare") {
            if (i + 2 >= argc) {
                std::fprintf(stderr, "kvprune-gen-induction: --compare needs two checkpoints\n%s", kUsage);
                return 2;
            }
            cmp_a = argv[++i];
            cmp_b = argv[++i];
            continue;
        }
        if (i + 1 >= argc) {
            std::fprintf(stderr, "kvprune-gen-induction: %s needs a value\n%s", a.c_str(), kUsage);
            return 2;
        }
        const char *v = argv[++i];
        long long x = 0;
        if (a == "--corpus") {
            corpus_path = v;
        } else if (a == "--out") {
            out_path = v;
        } else if (a == "--text") {
            text = v;
        } else if (a == "--lengths") {
            lengths.clear();
            std::string item;
            for (const char *c = v;; c++) {
                if (*c == ',' || *c == '\0') {
                    if (!parse_int(item.c_str(), 64, 1 << 20, &x)) {
                        std::fprintf(stderr, "kvprune-gen-induction: bad length '%s' in --lengths (64..1048576)\n",
                                     item.c_str());
                        return 2;
                    }
                    lengths.push_back((int)x);
                    item.clear();
                    if (*c == '\0') break;
                } else {
                    item += *c;
                }
            }
        } else if (a == "--seed" && parse_int(v, 0, INT64_MAX, &x)) {
            p.seed = (uint64_t)x;
        } else if (a == "--order" && parse_int(v, 1, 64, &x)) {
            p.order = (int)x;
        } else if (a == "--context" && parse_int(v, 2, 1 << 20, &x)) {
            p.context = (int)x;
        } else if (a == "--kv-heads" && parse_int(v, 1, 2, &x)) {
            p.kv_heads = (int)x;
        } else if (a == "--seed" || a == "--order" || a == "--context" || a == "--kv-heads") {
            std::fprintf(stderr, "kvprune-gen-induction: bad value '%s' for %s\n", v, a.c_str());
            return 2;
        } else {
            std::fprintf(stderr, "kvprune-gen-induction: unknown option '%s'\n%s", a.c_str(), kUsage);
            return 2;
        }
    }
    if (!cmp_a.empty()) {
        if (text.empty()) {
            std::fprintf(stderr, "kvprune-gen-induction: --compare needs --text FILE (the haystack)\n");
            return 2;
        }
        return compare(cmp_a, cmp_b, text, lengths);
    }
    if (corpus_path.empty() || out_path.empty()) {
        std::fprintf(stderr, "kvprune-gen-induction: --corpus and --out are required\n%s", kUsage);
        return 2;
    }
    std::vector<uint8_t> corpus;
    if (!read_file(corpus_path, &corpus)) return 1;
    std::string err, summary;
    if (!kvh::write_induction_model(p, corpus, out_path, &err, &summary)) {
        std::fprintf(stderr, "kvprune-gen-induction: %s\n", err.c_str());
        return 1;
    }
    std::printf("wrote %s: %s\n", out_path.c_str(), summary.c_str());
    return 0;
}
