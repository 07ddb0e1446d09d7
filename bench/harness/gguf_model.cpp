// GGUF model loader: llama / qwen2 / qwen3 into the harness Checkpoint (weights dequantized to f32).
#include <cmath>
#include <cstdio>
#include <cstring>

#include "checkpoint.h"
#include "gguf.h"
#include "tokenizer.h"

namespace kvh {

namespace {

const char *kSupportedArch = "llama, qwen2, qwen3";
const char *kSupportedTypes = "f32, f16, bf16, q8_0, q8_1, q4_0, q4_1, q5_0, q5_1, q2_K, q3_K, q4_K, q5_K, q6_K, iq4_nl, iq4_xs";

}  // namespace

bool load_gguf(const std::string &path, Checkpoint *out, std::string *err) {
    *out = Checkpoint();
    out->path = path;
    out->format = "gguf";
    auto fail = [&](const std::string &m) {
        *err = "gguf '" + path + "': " + m;
        out->data.clear();
        return false;
    };
    auto fp = std::make_shared<GgufFile>();
    GgufFile &f = *fp;
    if (!f.open(path, err)) return false;
    out->file_bytes = f.file_size();
    std::string arch;
    if (!f.get_str("general.architecture", &arch)) return fail("missing metadata general.architecture (a string)");
    out->arch = arch;
    f.get_str("general.name", &out->name);
    if (arch != "llama" && arch != "qwen2" && arch != "qwen3")
        return fail("architecture '" + gguf_shown(arch) + "' is not supported (supported: " + kSupportedArch + ")");
    const std::string a = arch + ".";
    auto need_int = [&](const std::string &key, int64_t lo, int64_t hi, int64_t *v) {
        if (!f.get_int(a + key, v)) {
            *err = f.find(a + key) ? "metadata " + a + key + " is not an integer (per-layer arrays are not supported)"
                                   : "missing metadata " + a + key;
            return false;
        }
        if (*v < lo || *v > hi) {
            *err = "metadata " + a + key + " = " + std::to_string(*v) + " is out of range " + std::to_string(lo) + ".." +
                   std::to_string(hi);
            return false;
        }
        return true;
    };
    auto opt_int = [&](const std::string &key, int64_t lo, int64_t hi, int64_t def, int64_t *v) {
        if (!f.find(a + key)) {
            *v = def;
            return true;
        }
        return need_int(key, lo, hi, v);
    };
    ModelConfig &c = out->cfg;
    int64_t L, D, F, H, KVH, hd, vd, ctx;
    std::string e;
    if (!need_int("block_count", 1, 1 << 10, &L) || !need_int("embedding_length", 1, 1 << 16, &D) ||
        !need_int("feed_forward_length", 1, 1 << 18, &F) || !need_int("attention.head_count", 1, 1 << 10, &H) ||
        !opt_int("attention.head_count_kv", 1, 1 << 10, H, &KVH) ||
        !opt_int("attention.key_length", 2, 1 << 12, D / H, &hd) ||
        !opt_int("attention.value_length", 2, 1 << 12, hd, &vd) || !opt_int("context_length", 1, 1 << 24, 2048, &ctx))
        return fail(*err);
    if (H % KVH != 0) return fail("head_count " + std::to_string(H) + " is not a multiple of head_count_kv " + std::to_string(KVH));
    if (vd != hd) return fail("key_length " + std::to_string(hd) + " differs from value_length " + std::to_string(vd) + " (kvprune has one head_dim)");
    if (hd % 2 != 0) return fail("head dimension " + std::to_string(hd) + " is odd");
    c.dim = (int)D;
    c.hidden_dim = (int)F;
    c.n_layers = (int)L;
    c.n_heads = (int)H;
    c.n_kv_heads = (int)KVH;
    c.head_dim_override = (int)hd;
    c.seq_len = (int)ctx;
    out->context_length = ctx;
    // Positions: llama GGUFs hold q/k rows permuted (the converter regroups each head's rotate-half
    // pairs (i, i + hd/2) into adjacent rows (2i, 2i+1)), so the file's rotation is GPT-J style;
    // qwen2/qwen3 are converted unpermuted and rotate halves (NeoX). See docs/harness.md.
    c.rope = arch == "llama" ? KVP_ROPE_GPTJ : KVP_ROPE_NEOX;
    int64_t rd;
    if (!opt_int("rope.dimension_count", 2, hd, hd, &rd)) return fail(*err);
    if (rd % 2 != 0) return fail("rope.dimension_count " + std::to_string(rd) + " is odd");
    c.rope_dim = rd == hd ? 0 : (int)rd;
    double theta = 10000.0, eps = 1e-5;
    if (f.find(a + "rope.freq_base") && !f.get_float(a + "rope.freq_base", &theta)) return fail("rope.freq_base is not a float");
    if (!(theta > 1.0 && theta < 1e12)) return fail("rope.freq_base " + std::to_string(theta) + " is out of range");
    c.rope_theta = (float)theta;
    // Scaled RoPE (issue 20 item 5): kvprune takes a table of per-pair inverse frequencies
    // (kvp_create_rope) and an attention factor. GGUF keys as llama.cpp writes them:
    // rope.scaling.type none|linear|yarn (+ rope.scaling.factor, rope.scaling.original_context_length,
    // rope.scaling.attn_factor, rope.scaling.yarn_beta_fast/_slow), the older rope.scale_linear,
    // and Llama 3.1's scaling as the tensor rope_freqs.weight (a divisor per pair).
    {
        const uint32_t pairs = (uint32_t)(rd / 2);
        std::string scaling = "none";
        if (f.find(a + "rope.scaling.type") && !f.get_str(a + "rope.scaling.type", &scaling))
            return fail("rope.scaling.type is not a string");
        double factor = 1.0, lin = 1.0;
        if (f.find(a + "rope.scaling.factor") && !f.get_float(a + "rope.scaling.factor", &factor))
            return fail("rope.scaling.factor is not a float");
        if (f.find(a + "rope.scale_linear") && !f.get_float(a + "rope.scale_linear", &lin))
            return fail("rope.scale_linear is not a float");
        if (scaling == "none" && lin != 1.0) {
            scaling = "linear";
            factor = lin;
        }
        auto opt_float = [&](const std::string &key, double def, double *v) {
            *v = def;
            return !f.find(a + key) || f.get_float(a + key, v);
        };
        char re[320] = "";
        if (scaling == "linear" || scaling == "yarn") {
            if (!(factor >= 1.0 && factor <= 1e6))
                return fail("rope.scaling.factor " + std::to_string(factor) + " is out of range 1..1e6 (" + scaling + ")");
            c.rope_freqs.resize(pairs);
        }
        if (scaling == "linear") {
            if (kvp_rope_freqs_linear(c.rope_freqs.data(), pairs, theta, factor, re, sizeof re) != KVP_OK)
                return fail(std::string("linear RoPE scaling: ") + re);
        } else if (scaling == "yarn") {
            int64_t orig = 0;
            if (!f.get_int(a + "rope.scaling.original_context_length", &orig) || orig < 1 || orig > (1 << 24))
                return fail("yarn RoPE scaling needs " + a + "rope.scaling.original_context_length (an integer 1..16777216)");
            double bf, bs, af;
            if (!opt_float("rope.scaling.yarn_beta_fast", 32.0, &bf) || !opt_float("rope.scaling.yarn_beta_slow", 1.0, &bs) ||
                !opt_float("rope.scaling.attn_factor", 1.0, &af))
                return fail("yarn RoPE scaling: yarn_beta_fast, yarn_beta_slow and attn_factor must be floats");
            float mscale = 1.0f;
            if (kvp_rope_freqs_yarn(c.rope_freqs.data(), pairs, theta, factor, (double)orig, bf, bs, &mscale, re, sizeof re) != KVP_OK)
                return fail(std::string("yarn RoPE scaling: ") + re);
            if (!(af > 0.0 && af < 64.0)) return fail("rope.scaling.attn_factor " + std::to_string(af) + " is out of range (0, 64)");
            c.rope_attn_factor = (float)(af * (double)mscale);  // llama.cpp: attn_factor times YaRN's 0.1 ln(s) + 1
        } else if (scaling != "none") {
            return fail("RoPE scaling type '" + gguf_shown(scaling) + "' is not supported (supported: none, linear, yarn, and "
                        "llama3-style rope_freqs.weight factors)");
        }
        if (const GgufTensor *rf = f.tensor("rope_freqs.weight")) {
            if (scaling != "none")
                return fail("rope_freqs.weight together with rope.scaling.type " + scaling + " is not supported (one of them)");
            if (rf->type != GGML_F32 || rf->n_elems() != pairs)
                return fail("tensor rope_freqs.weight must be f32 with rope.dimension_count/2 = " + std::to_string(pairs) +
                            " elements (it has " + std::to_string(rf->n_elems()) + ", " + ggml_type_phrase(rf->type) + ")");
            std::vector<float> div(pairs);
            std::memcpy(div.data(), rf->data, pairs * sizeof(float));
            c.rope_freqs.resize(pairs);
            if (kvp_rope_freqs_divided(c.rope_freqs.data(), pairs, theta, div.data(), re, sizeof re) != KVP_OK)
                return fail(std::string("rope_freqs.weight: ") + re);
            scaling = "llama3 (rope_freqs)";
        }
        c.rope_scaling = scaling;
    }
    if (f.find(a + "attention.sliding_window"))
        return fail("sliding-window attention (" + a + "attention.sliding_window) is not supported");
    if (f.find(a + "attention.layer_norm_rms_epsilon") && !f.get_float(a + "attention.layer_norm_rms_epsilon", &eps))
        return fail("attention.layer_norm_rms_epsilon is not a float");
    if (!(eps > 0 && eps < 1)) return fail("attention.layer_norm_rms_epsilon out of range");
    c.norm_eps = (float)eps;

    const GgufTensor *emb = f.tensor("token_embd.weight");
    if (!emb) return fail("missing tensor token_embd.weight");
    if (emb->n_dims != 2 || emb->ne[0] != (uint64_t)D || emb->ne[1] > (1u << 22))
        return fail("tensor token_embd.weight has shape [" + std::to_string(emb->ne[0]) + ", " + std::to_string(emb->ne[1]) +
                    "], expected [" + std::to_string(D) + ", vocab <= 4194304]");
    c.vocab = (int)emb->ne[1];
    const GgufTensor *cls = f.tensor("output.weight");
    c.shared_classifier = cls == nullptr;

    // Every tensor: name, expected [ne0, ne1] (ne1 = 1 for vectors), required.
    struct Want {
        std::string name;
        uint64_t ne0, ne1;
        const GgufTensor *t;
    };
    const uint64_t QD = (uint64_t)H * hd, KVD = (uint64_t)KVH * hd;
    std::vector<Want> order;
    auto want = [&](const std::string &n, uint64_t n0, uint64_t n1) { order.push_back({n, n0, n1, nullptr}); };
    want("token_embd.weight", D, c.vocab);
    const char *per_layer[] = {"attn_norm.weight", "attn_q.weight", "attn_k.weight", "attn_v.weight", "attn_output.weight",
                               "ffn_norm.weight", "ffn_gate.weight", "ffn_down.weight", "ffn_up.weight"};
    const uint64_t shapes[][2] = {{(uint64_t)D, 1}, {(uint64_t)D, QD}, {(uint64_t)D, KVD}, {(uint64_t)D, KVD}, {QD, (uint64_t)D},
                                  {(uint64_t)D, 1}, {(uint64_t)D, (uint64_t)F}, {(uint64_t)F, (uint64_t)D}, {(uint64_t)D, (uint64_t)F}};
    for (int k = 0; k < 9; k++)
        for (int64_t l = 0; l < L; l++) want("blk." + std::to_string(l) + "." + per_layer[k], shapes[k][0], shapes[k][1]);
    want("output_norm.weight", D, 1);
    if (cls) want("output.weight", D, c.vocab);
    const bool bias = arch == "qwen2", qknorm = arch == "qwen3";
    if (bias) {
        const char *bn[] = {"attn_q.bias", "attn_k.bias", "attn_v.bias"};
        const uint64_t bs[] = {QD, KVD, KVD};
        for (int k = 0; k < 3; k++)
            for (int64_t l = 0; l < L; l++) want("blk." + std::to_string(l) + "." + bn[k], bs[k], 1);
    }
    if (qknorm) {
        for (const char *n : {"attn_q_norm.weight", "attn_k_norm.weight"})
            for (int64_t l = 0; l < L; l++) want("blk." + std::to_string(l) + "." + n, (uint64_t)hd, 1);
    }
    uint64_t total = 0;
    for (Want &w : order) {
        w.t = f.tensor(w.name);
        if (!w.t) return fail("missing tensor " + w.name + " (architecture " + arch + ")");
        const GgufTensor &t = *w.t;
        const bool shape_ok = t.ne[0] == w.ne0 && t.ne[1] == w.ne1 && t.ne[2] == 1 && t.ne[3] == 1;
        if (!shape_ok)
            return fail("tensor " + w.name + " has shape [" + std::to_string(t.ne[0]) + ", " + std::to_string(t.ne[1]) +
                        (t.n_dims > 2 ? ", ..." : "") + "], expected [" + std::to_string(w.ne0) + ", " + std::to_string(w.ne1) + "]");
        if (!t.data)
            return fail("tensor " + w.name + " has " + ggml_type_phrase(t.type) + ", not supported (supported: " +
                        kSupportedTypes + ")");
        out->weight_types[ggml_type_name(t.type)]++;
    }
    // Matrices (embedding, the seven per-layer products, the output) of a type other than f32 stay
    // in the mapping and are read there (QView); everything else is dequantized into data.
    std::vector<char> mapped(order.size(), 0);
    const int kinds[7] = {1, 2, 3, 4, 6, 7, 8};  // attn_q, attn_k, attn_v, attn_output, ffn_gate, ffn_down, ffn_up
    // A kind is mapped in every layer when any of its layers is not f32 (the f32 path needs the
    // layers of a kind contiguous in data).
    mapped[0] = order[0].t->type != GGML_F32;
    for (int j = 0; j < 7; j++) {
        bool any_q = false;
        for (int64_t l = 0; l < L; l++) any_q = any_q || order[1 + (size_t)kinds[j] * L + (size_t)l].t->type != GGML_F32;
        for (int64_t l = 0; l < L; l++) mapped[1 + (size_t)kinds[j] * L + (size_t)l] = any_q;
    }
    if (cls) mapped[1 + 9 * (size_t)L + 1] = order[1 + 9 * (size_t)L + 1].t->type != GGML_F32;
    for (size_t i = 0; i < order.size(); i++) {
        if (mapped[i]) {
            uint64_t bad = 0;
            if (!ggml_finite(order[i].t->type, order[i].t->data, order[i].t->n_elems(), &bad))
                return fail("corrupt: tensor " + order[i].name + " holds a non-finite scale or weight in block " + std::to_string(bad));
        } else {
            total += order[i].t->n_elems();
        }
    }
    if (total > ((uint64_t)1 << 32)) return fail("model larger than 4G parameters is not supported by the harness");
    out->data.resize((size_t)total);
    float *w = out->data.data();
    std::vector<const float *> at(order.size());
    for (size_t i = 0; i < order.size(); i++) {
        const GgufTensor &t = *order[i].t;
        if (mapped[i]) continue;  // at[i] stays null: read through the QView
        dequantize(t.type, t.data, w, t.n_elems());
        for (uint64_t j = 0; j < t.n_elems(); j++)
            if (!std::isfinite(w[j])) return fail("corrupt: tensor " + order[i].name + " holds a non-finite weight at element " + std::to_string(j));
        at[i] = w;
        w += t.n_elems();
    }
    size_t k = 0;
    out->tok_emb = at[k++];
    const float **per[] = {&out->rms_att, &out->wq, &out->wk, &out->wv, &out->wo, &out->rms_ffn, &out->w1, &out->w2, &out->w3};
    for (int j = 0; j < 9; j++) {
        *per[j] = at[k];
        k += (size_t)L;
    }
    out->rms_final = at[k++];
    out->wcls = cls ? at[k++] : out->tok_emb;
    if (bias) {
        out->bq = at[k];
        out->bk = at[k + (size_t)L];
        out->bv = at[k + 2 * (size_t)L];
        k += 3 * (size_t)L;
    }
    if (qknorm) {
        out->q_norm = at[k];
        out->k_norm = at[k + (size_t)L];
        k += 2 * (size_t)L;
    }
    // Non-f32 matrices stay readable in the mapping for the quantized products.
    auto view = [&](size_t i) {
        QView v;
        const GgufTensor &t = *order[i].t;
        if (!mapped[i]) return v;
        v.type = t.type;
        v.data = t.data;
        v.row_bytes = t.nbytes / t.ne[1];
        return v;
    };
    bool any = false;
    out->qmat.resize(7 * (size_t)L);
    for (int j = 0; j < 7; j++)
        for (int64_t l = 0; l < L; l++) {
            out->qmat[(size_t)j * L + l] = view(1 + (size_t)kinds[j] * L + l);
            any = any || out->qmat[(size_t)j * L + l];
        }
    out->qcls = view(cls ? 1 + 9 * (size_t)L + 1 : 0);
    out->qemb = view(0);
    any = any || out->qcls || out->qemb;
    if (any) {
        out->keep = fp;
    } else {
        out->qmat.clear();
    }
    std::shared_ptr<const Tokenizer> tk;
    if (!Tokenizer::from_gguf(f, c.vocab, &tk, &e)) return fail(e);
    out->tok = tk;
    return true;
}

}  // namespace kvh
