#include "checkpoint.h"

#include <sys/stat.h>

#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>

namespace kvh {

namespace {

std::string fmt(const char *f, long long a) {
    char b[256];
    std::snprintf(b, sizeof b, f, a);
    return b;
}

// The first bytes of a file as a message shows them: "'hell' (68 65 6c 6c)".
std::string first_bytes(const unsigned char *b, size_t n) {
    std::string t, hex;
    for (size_t i = 0; i < n; i++) {
        char x[8];
        std::snprintf(x, sizeof x, "%s%02x", i ? " " : "", b[i]);
        hex += x;
        if (b[i] >= 32 && b[i] < 127) {
            t.push_back((char)b[i]);
        } else {
            std::snprintf(x, sizeof x, "\\x%02x", b[i]);
            t += x;
        }
    }
    return "'" + t + "' (" + hex + ")";
}

bool ends_with(const std::string &s, const std::string &e) {
    return s.size() >= e.size() && s.compare(s.size() - e.size(), e.size(), e) == 0;
}

}  // namespace

bool load_checkpoint(const std::string &path, Checkpoint *out, std::string *err) {
    *out = Checkpoint();
    out->path = path;
    auto fail = [&](const std::string &m) {
        *err = "checkpoint '" + path + "': " + m;
        out->data.clear();
        return false;
    };
    // A FIFO would block fopen/fread forever and a directory "opens" with a nonsense size: only
    // regular files (or links to them) are checkpoints.
    struct stat sb;
    if (stat(path.c_str(), &sb) == 0 && !S_ISREG(sb.st_mode))
        return fail(std::string("not a regular file (") + (S_ISDIR(sb.st_mode) ? "a directory" : "a FIFO, device or socket") + ")");
    std::FILE *f = std::fopen(path.c_str(), "rb");
    if (!f) return fail(std::string("cannot open: ") + std::strerror(errno));
    if (std::fseek(f, 0, SEEK_END) != 0) {
        std::fclose(f);
        return fail("cannot seek (not a regular file?)");
    }
    long fsize = std::ftell(f);
    std::rewind(f);
    if (fsize < 0) {
        std::fclose(f);
        return fail("cannot determine file size");
    }
    char magic[4];
    if (fsize >= 4 && std::fread(magic, 4, 1, f) == 1 && std::memcmp(magic, "GGUF", 4) == 0) {
        std::fclose(f);
        if (!load_gguf(path, out, err)) return false;
        set_live_rows(out);
        return true;
    }
    // A file named *.gguf that lacks the magic is not a GGUF file (say so, not "truncated").
    unsigned char head[4] = {0, 0, 0, 0};
    std::rewind(f);
    const size_t nhead = std::fread(head, 1, 4, f);
    std::string lc = path;
    for (char &ch : lc) ch = (char)std::tolower((unsigned char)ch);
    if (ends_with(lc, ".gguf")) {
        std::fclose(f);
        return fail("not a GGUF file (bad magic): it starts with " + (nhead ? first_bytes(head, nhead) : std::string("nothing (empty)")) +
                    ", a GGUF file with 'GGUF' (47 47 55 46)");
    }
    std::rewind(f);
    out->context_length = 0;
    out->file_bytes = (uint64_t)fsize;
    int32_t h[7];
    if (fsize < (long)sizeof h || std::fread(h, sizeof h, 1, f) != 1) {
        std::fclose(f);
        return fail(fmt("truncated: %lld bytes, smaller than the 28-byte header of a llama2.c checkpoint", fsize) +
                    " (nor a GGUF file: it starts with " + (nhead ? first_bytes(head, nhead) : std::string("nothing")) +
                    ", not 'GGUF')");
    }
    ModelConfig &c = out->cfg;
    c.dim = h[0];
    c.hidden_dim = h[1];
    c.n_layers = h[2];
    c.n_heads = h[3];
    c.n_kv_heads = h[4];
    c.shared_classifier = h[5] > 0;
    c.vocab = h[5] == INT32_MIN ? 0 : (h[5] < 0 ? -h[5] : h[5]);
    c.seq_len = h[6];
    out->context_length = c.seq_len;
    static const char *names[7] = {"dim", "hidden_dim", "n_layers", "n_heads", "n_kv_heads",
                                   "vocab_size", "seq_len"};
    static const int32_t limits[7] = {1 << 16, 1 << 18, 1 << 10, 1 << 10, 1 << 10, 1 << 22, 1 << 24};
    for (int i = 0; i < 7; i++) {
        int32_t v = i == 5 ? c.vocab : h[i];
        if (v <= 0 || v > limits[i]) {
            std::fclose(f);
            char b[160];
            std::snprintf(b, sizeof b, "bad header: %s = %d (expected 1..%d); not a llama2.c checkpoint (nor a GGUF file)?",
                          names[i], (int)h[i], (int)limits[i]);
            return fail(b);
        }
    }
    if (c.dim % c.n_heads != 0 || c.n_heads % c.n_kv_heads != 0 || (c.dim / c.n_heads) % 2 != 0) {
        std::fclose(f);
        char b[200];
        std::snprintf(b, sizeof b,
                      "inconsistent header: dim %d, n_heads %d, n_kv_heads %d (need dim %% n_heads == 0, "
                      "n_heads %% n_kv_heads == 0, even head_dim)",
                      c.dim, c.n_heads, c.n_kv_heads);
        return fail(b);
    }
    const uint64_t D = (uint64_t)c.dim, Hd = (uint64_t)c.hidden_dim, L = (uint64_t)c.n_layers,
                   V = (uint64_t)c.vocab, hd = (uint64_t)c.head_dim(), Q = (uint64_t)c.q_dim(),
                   KV = (uint64_t)c.kv_dim(), S = (uint64_t)c.seq_len;
    // All factors are bounded above, so these products cannot overflow 64 bits.
    uint64_t n_emb = V * D, n_rms_att = L * D, n_wq = L * Q * D, n_wk = L * KV * D, n_wv = L * KV * D,
             n_wo = L * D * Q, n_rms_ffn = L * D, n_w1 = L * Hd * D, n_w2 = L * D * Hd, n_w3 = L * Hd * D,
             n_rms_final = D, n_freq = 2 * S * (hd / 2), n_cls = c.shared_classifier ? 0 : V * D;
    uint64_t n_floats = n_emb + n_rms_att + n_wq + n_wk + n_wv + n_wo + n_rms_ffn + n_w1 + n_w2 + n_w3 +
                        n_rms_final + n_freq + n_cls;
    uint64_t expect = 28 + 4 * n_floats;
    if ((uint64_t)fsize != expect) {
        std::fclose(f);
        char b[300];
        std::snprintf(b, sizeof b,
                      "%s: file has %lld bytes but its header (dim %d, hidden %d, layers %d, heads %d/%d, "
                      "vocab %d%s, seq_len %d) implies %llu",
                      (uint64_t)fsize < expect ? "truncated" : "inconsistent size (trailing bytes)",
                      (long long)fsize, c.dim, c.hidden_dim, c.n_layers, c.n_heads, c.n_kv_heads, c.vocab,
                      c.shared_classifier ? " shared" : " separate classifier", c.seq_len,
                      (unsigned long long)expect);
        return fail(b);
    }
    if (expect > (uint64_t)1 << 34) {
        std::fclose(f);
        return fail("checkpoint larger than 16 GiB is not supported by the harness");
    }
    out->data.resize((size_t)n_floats);
    size_t got = std::fread(out->data.data(), sizeof(float), (size_t)n_floats, f);
    std::fclose(f);
    if (got != n_floats) return fail(fmt("read error after %lld floats", (long long)got));
    // Reject non-finite weights (a corrupt file would otherwise surface as NaN logits).
    const float *p = out->data.data();
    for (uint64_t i = 0; i < n_floats; i++) {
        if (!std::isfinite(p[i])) {
            return fail(fmt("corrupt: non-finite weight at float index %lld", (long long)i));
        }
    }
    const float *w = p;
    auto take = [&](uint64_t n) {
        const float *r = w;
        w += n;
        return r;
    };
    out->tok_emb = take(n_emb);
    out->rms_att = take(n_rms_att);
    out->wq = take(n_wq);
    out->wk = take(n_wk);
    out->wv = take(n_wv);
    out->wo = take(n_wo);
    out->rms_ffn = take(n_rms_ffn);
    out->w1 = take(n_w1);
    out->w2 = take(n_w2);
    out->w3 = take(n_w3);
    out->rms_final = take(n_rms_final);
    take(n_freq);  // legacy RoPE tables, unused (kvprune applies RoPE itself)
    out->wcls = c.shared_classifier ? out->tok_emb : take(n_cls);
    set_live_rows(out);
    return true;
}

namespace {
// The rows of W[out][in] with a nonzero weight; empty when that is every row.
std::vector<int32_t> live_rows_of(const float *W, int out, int in) {
    std::vector<int32_t> rows;
    if (!W) return rows;
    for (int o = 0; o < out; o++) {
        const float *w = W + (size_t)o * in;
        bool any = false;
        for (int i = 0; i < in && !any; i++) any = w[i] != 0.0f;
        if (any) rows.push_back(o);
    }
    if ((int)rows.size() == out) rows.clear();
    return rows;
}
}  // namespace

void set_live_rows(Checkpoint *ck) {
    const ModelConfig &c = ck->cfg;
    const int L = c.n_layers, D = c.dim, QD = c.q_dim(), KVD = c.kv_dim(), HD = c.hidden_dim;
    // k = 0..6 as the forward pass numbers them: wq, wk, wv, wo, w1, w2, w3.
    const struct { const float *W; int out, in; } kinds[7] = {{ck->wq, QD, D}, {ck->wk, KVD, D}, {ck->wv, KVD, D},
                                                              {ck->wo, D, QD}, {ck->w1, HD, D}, {ck->w2, D, HD},
                                                              {ck->w3, HD, D}};
    ck->live_rows.assign((size_t)7 * L, {});
    bool any = false;
    for (int k = 0; k < 7; k++)
        for (int l = 0; l < L; l++) {
            const float *W = kinds[k].W ? kinds[k].W + (size_t)l * kinds[k].out * kinds[k].in : nullptr;
            ck->live_rows[(size_t)k * L + l] = live_rows_of(W, kinds[k].out, kinds[k].in);
            any = any || !ck->live_rows[(size_t)k * L + l].empty();
        }
    if (!any) ck->live_rows.clear();
    ck->live_rows_cls = live_rows_of(ck->wcls, c.vocab, D);
}

}  // namespace kvh
