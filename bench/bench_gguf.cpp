// GGUF forward-pass speed (issue 20): writes a synthetic 0.5B-shaped model (Qwen2.5-0.5B's shape:
// qwen2, dim 896, ffn 4864, 24 layers, 14/2 heads of 64, vocab 151936, tied output) with random
// weights of one type into a temporary file, loads it through the harness (kvh::load_model), then
// times a prefill of P tokens and D decode steps under policy=full with T threads for the
// quantized products. Prints one line: load_s, prefill tok/s, decode tok/s, peak RSS.
//
//   bench_gguf [--type q8_0|q8_1|q4_0|q4_1|q5_0|q5_1|q2_K|q3_K|q4_K|q5_K|q6_K|iq4_nl|iq4_xs|f16|bf16|f32] [--threads 2]
//              [--prefill 128] [--decode 32] [--layers 24] [--dim 896] [--vocab 151936] [--file /tmp/kvh-bench-0.5b.gguf]
//              [--keep] [--reuse]
// --vocab 256 makes a byte-level model (no tokenizer needed) that `kvprune eval --task` accepts: the
// 0.5B shape's cost per task cell (docs/harness.md "Task grids on real models").
// The file says it has no tokenizer (tokenizer.ggml.model "none", llama.cpp's convention), so
// llama.cpp's llama-bench loads it too (the llama.cpp port's speed targets, issue 30).
// --keep leaves the file; --reuse loads an existing file without writing it (so the peak RSS is
// the harness's alone: the writer holds the whole file in memory while it writes).
#include <sys/resource.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "checkpoint.h"
#include "gguf.h"
#include "gguf_writer.h"
#include "session.h"

namespace {

uint64_t rng_state = 0x1234567;
uint64_t next64() {
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

// Random valid blocks of `type` for rows x cols, magnitudes ~0.05.
std::string blocks(uint32_t type, uint64_t rows, uint64_t cols) {
    uint64_t be, bb;
    kvh::ggml_block(type, &be, &bb);
    const uint64_t nb = rows * cols / be;
    std::string o(nb * bb, '\0');
    for (size_t i = 0; i + 8 <= o.size(); i += 8) {
        uint64_t v = next64();
        std::memcpy(&o[i], &v, 8);
    }
    const float scale = type == kvh::GGML_Q8_0 || type == kvh::GGML_Q8_1 ? 0.05f / 127
                        : type == kvh::GGML_Q4_0 || type == kvh::GGML_Q4_1 ? 0.01f
                        : type == kvh::GGML_Q5_0 || type == kvh::GGML_Q5_1 ? 0.005f
                        : type == kvh::GGML_Q4_K || type == kvh::GGML_Q5_K ? 0.0001f
                        : type == kvh::GGML_Q2_K                           ? 0.0005f
                        : type == kvh::GGML_Q3_K || type == kvh::GGML_IQ4_NL ? 0.0004f
                        : type == kvh::GGML_IQ4_XS                         ? 0.00001f
                                                                           : 0.00003f;
    const uint16_t d = gguftest::to_f16(scale);
    // q4_1 / q5_1: a minimum that centres the values (d q + m with q in 0..15 / 0..31)
    const uint16_t m = gguftest::to_f16(type == kvh::GGML_Q4_1 ? -7.5f * scale : -15.5f * scale);
    for (uint64_t b = 0; b < nb; b++) {
        char *p = &o[b * bb];
        // float types: random bits with the exponent pinned to magnitudes 2^-8..2^-5 (fast to make)
        if (type == kvh::GGML_F32) {
            const uint64_t r = next64();
            const uint32_t u = (uint32_t)(r & 0x807FFFFFu) | ((uint32_t)(119 + (r >> 40) % 4) << 23);
            std::memcpy(p, &u, 4);
        } else if (type == kvh::GGML_F16) {
            const uint64_t r = next64();
            const uint16_t h = (uint16_t)((r & 0x83FF) | ((7 + (r >> 40) % 4) << 10));
            std::memcpy(p, &h, 2);
        } else if (type == kvh::GGML_BF16) {
            const uint64_t r = next64();
            const uint16_t h = (uint16_t)((r & 0x807F) | ((119 + (r >> 40) % 4) << 7));
            std::memcpy(p, &h, 2);
        } else if (type == kvh::GGML_Q6_K) {
            std::memcpy(p + 208, &d, 2);
        } else if (type == kvh::GGML_Q2_K) {  // d and dmin at the end
            std::memcpy(p + 80, &d, 2);
            std::memcpy(p + 82, &d, 2);
        } else if (type == kvh::GGML_Q3_K) {
            std::memcpy(p + 108, &d, 2);
        } else {
            std::memcpy(p, &d, 2);
            if (type == kvh::GGML_Q4_K || type == kvh::GGML_Q5_K) std::memcpy(p + 2, &d, 2);
            if (type == kvh::GGML_Q4_1 || type == kvh::GGML_Q5_1) std::memcpy(p + 2, &m, 2);
        }
    }
    return o;
}

double cpu() {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_utime.tv_sec + 1e-6 * (double)ru.ru_utime.tv_usec + (double)ru.ru_stime.tv_sec + 1e-6 * (double)ru.ru_stime.tv_usec;
}

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

}  // namespace

int main(int argc, char **argv) {
    std::string type_name = "q8_0", file = "/tmp/kvh-bench-0.5b.gguf";
    int threads = 2, P = 128, Dn = 32, L = 24, Dim = 896, Vocab = 151936;
    bool keep = false, reuse = false;
    for (int i = 1; i < argc; i++) {
        std::string a = argv[i];
        auto val = [&]() { return i + 1 < argc ? std::string(argv[++i]) : std::string(); };
        if (a == "--type") type_name = val();
        else if (a == "--threads") threads = std::atoi(val().c_str());
        else if (a == "--prefill") P = std::atoi(val().c_str());
        else if (a == "--decode") Dn = std::atoi(val().c_str());
        else if (a == "--layers") L = std::atoi(val().c_str());
        else if (a == "--dim") Dim = std::atoi(val().c_str());
        else if (a == "--vocab") Vocab = std::atoi(val().c_str());
        else if (a == "--file") file = val();
        else if (a == "--keep") keep = true;
        else if (a == "--reuse") reuse = keep = true;
        else {
            std::fprintf(stderr, "usage: bench_gguf [--type T] [--threads N] [--prefill P] [--decode D] [--layers L] [--dim D] [--vocab V] [--file F] [--keep] [--reuse]\n");
            return 2;
        }
    }
    uint32_t type = 999;
    for (uint32_t t : kvh::kGgmlSupported)
        if (kvh::ggml_type_name(t) == type_name) type = t;
    if (type == 999 || P < 1 || Dn < 1 || L < 1 || Dim < 128 || Dim % 128 != 0 || Vocab < 2) {
        std::fprintf(stderr, "bench_gguf: bad --type/--prefill/--decode/--layers\n");
        return 2;
    }
    // --dim 1024 (16 heads): K-quant blocks are 256 wide and 896 is not a multiple of 256.
    const uint64_t D = (uint64_t)Dim, F = 4864, H = D / 64, KVH = 2, hd = 64, V = (uint64_t)Vocab;
    double t0 = now();
    if (!reuse) {
        gguftest::Writer w;
        w.str("general.architecture", "qwen2");
        w.str("general.name", "synthetic 0.5B-shaped " + type_name);
        w.u32("qwen2.block_count", (uint32_t)L);
        w.u32("qwen2.embedding_length", (uint32_t)D);
        w.u32("qwen2.feed_forward_length", (uint32_t)F);
        w.u32("qwen2.attention.head_count", (uint32_t)H);
        w.u32("qwen2.attention.head_count_kv", (uint32_t)KVH);
        w.u32("qwen2.context_length", 32768);
        w.f32("qwen2.rope.freq_base", 1000000.0f);
        w.f32("qwen2.attention.layer_norm_rms_epsilon", 1e-6f);
        // no tokenizer, in llama.cpp's words ("none": LLAMA_VOCAB_TYPE_NONE with vocab_size dummy
        // tokens), so that llama.cpp's programs (llama-bench) load the same file
        w.str("tokenizer.ggml.model", "none");
        w.u32("qwen2.vocab_size", (uint32_t)V);
        std::vector<float> ones(F, 1.0f), zeros(F, 0.0f);
        w.tensor("token_embd.weight", {D, V}, type, blocks(type, V, D));
        w.tensor_f32("output_norm.weight", {D}, ones.data(), D);
        for (int l = 0; l < L; l++) {
            const std::string b = "blk." + std::to_string(l) + ".";
            w.tensor_f32(b + "attn_norm.weight", {D}, ones.data(), D);
            w.tensor_f32(b + "ffn_norm.weight", {D}, ones.data(), D);
            w.tensor(b + "attn_q.weight", {D, H * hd}, type, blocks(type, H * hd, D));
            w.tensor(b + "attn_k.weight", {D, KVH * hd}, type, blocks(type, KVH * hd, D));
            w.tensor(b + "attn_v.weight", {D, KVH * hd}, type, blocks(type, KVH * hd, D));
            w.tensor(b + "attn_output.weight", {H * hd, D}, type, blocks(type, D, H * hd));
            w.tensor(b + "ffn_gate.weight", {D, F}, type, blocks(type, F, D));
            w.tensor(b + "ffn_down.weight", {F, D}, type, blocks(type, D, F));
            w.tensor(b + "ffn_up.weight", {D, F}, type, blocks(type, F, D));
            w.tensor_f32(b + "attn_q.bias", {H * hd}, zeros.data(), H * hd);
            w.tensor_f32(b + "attn_k.bias", {KVH * hd}, zeros.data(), KVH * hd);
            w.tensor_f32(b + "attn_v.bias", {KVH * hd}, zeros.data(), KVH * hd);
        }
        if (!w.write(file)) {
            std::fprintf(stderr, "bench_gguf: cannot write %s\n", file.c_str());
            return 1;
        }
    }
    const double write_s = now() - t0;
    t0 = now();
    kvh::Checkpoint ck;
    std::string err;
    if (!kvh::load_model(file, &ck, &err)) {
        std::fprintf(stderr, "bench_gguf: %s\n", err.c_str());
        return 1;
    }
    const double load_s = now() - t0;
    kvh::Session s;
    if (!s.init(ck, "policy=full capacity=" + std::to_string(P + Dn), &err)) {
        std::fprintf(stderr, "bench_gguf: %s\n", err.c_str());
        return 1;
    }
    s.set_threads(threads);
    std::vector<int32_t> toks((size_t)P);
    for (int i = 0; i < P; i++) toks[(size_t)i] = (int32_t)(next64() % V);
    std::vector<float> logits(V);
    t0 = now();
    double c0 = cpu();
    if (!s.prefill(toks.data(), P, logits.data(), false, &err)) {
        std::fprintf(stderr, "bench_gguf: %s\n", err.c_str());
        return 1;
    }
    const double prefill_s = now() - t0, prefill_cpu = cpu() - c0;
    t0 = now();
    c0 = cpu();
    int32_t tok = 0;
    for (int i = 0; i < Dn; i++) {
        if (!s.decode(tok, logits.data(), &err)) {
            std::fprintf(stderr, "bench_gguf: %s\n", err.c_str());
            return 1;
        }
        for (uint64_t v = 1; v < V; v++)
            if (logits[v] > logits[(size_t)tok]) tok = (int32_t)v;
    }
    const double decode_s = now() - t0, decode_cpu = cpu() - c0;
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    std::printf("bench_gguf type=%s dim=%d layers=%d threads=%d file_mb=%.0f write_s=%.1f load_s=%.2f prefill_tokens=%d "
                "prefill_tok_per_s=%.1f decode_tokens=%d decode_tok_per_s=%.2f peak_rss_mb=%.0f prefill_cpu_s=%.2f decode_cpu_s=%.2f\n",
                type_name.c_str(), Dim, L, threads, (double)ck.file_bytes / 1048576.0, write_s, load_s, P, P / prefill_s, Dn,
                Dn / decode_s, (double)ru.ru_maxrss / 1024.0, prefill_cpu, decode_cpu);
    if (!keep) std::remove(file.c_str());
    return 0;
}
