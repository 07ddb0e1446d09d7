// The harness readers (targets.h): checkpoint loader and results-JSON reader.
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include <cmath>
#include <string>
#include <vector>

#include "checkpoint.h"
#include "eval.h"
#include "gguf.h"
#include "tokenizer.h"
#include "plot.h"
#include "targets.h"

namespace kvpfuzz {

void checkpoint_target(const uint8_t *data, size_t size) {
    // The loader reads a path: one scratch file per process.
    static std::string path;
    if (path.empty()) {
        const char *dir = getenv("TMPDIR");
        path = std::string(dir && *dir ? dir : "/tmp") + "/kvpfuzz-ckpt-" + std::to_string(getpid()) + ".bin";
    }
    FILE *f = fopen(path.c_str(), "wb");
    if (!f) violation("checkpoint", "cannot write the scratch file");
    if (size && fwrite(data, 1, size, f) != size) violation("checkpoint", "short write of the scratch file");
    fclose(f);
    kvh::Checkpoint ck;
    std::string err;
    const bool ok = kvh::load_checkpoint(path, &ck, &err);
    remove(path.c_str());
    if (!ok) {
        if (err.empty()) violation("checkpoint", "failure without a message");
        return;
    }
    // A loaded checkpoint is consistent: sane positive sizes, pointers inside the data, finite weights.
    const kvh::ModelConfig &c = ck.cfg;
    if (c.dim <= 0 || c.n_layers <= 0 || c.n_heads <= 0 || c.n_kv_heads <= 0 || c.vocab <= 0 || c.seq_len <= 0 ||
        c.hidden_dim <= 0 || c.dim % c.n_heads != 0 || c.n_heads % c.n_kv_heads != 0)
        violation("checkpoint", "accepted an inconsistent header");
    const float *lo = ck.data.data(), *hi = ck.data.data() + ck.data.size();
    for (const float *p : {ck.tok_emb, ck.rms_att, ck.wq, ck.wk, ck.wv, ck.wo, ck.rms_ffn, ck.w1, ck.w2, ck.w3,
                           ck.rms_final, ck.wcls})
        if (!p || p < lo || p >= hi) violation("checkpoint", "a tensor pointer outside the data");
    if (size != 28 + ck.data.size() * 4) violation("checkpoint", "accepted a file whose size the header does not give");
    for (float x : ck.data)
        if (!std::isfinite(x)) violation("checkpoint", "accepted a non-finite weight");
}

void results_target(const uint8_t *data, size_t size) {
    const std::string text(reinterpret_cast<const char *>(data), size);
    std::vector<kvh::EvalResult> rs;
    std::string err;
    if (!kvh::parse_results_json(text, &rs, &err)) {
        if (err.empty()) violation("results", "failure without a message");
        return;
    }
    // What was read writes back and reads again to the same figures.
    std::vector<kvh::EvalResult> again;
    if (!kvh::parse_results_json(kvh::to_json(rs), &again, &err)) violation("results", ("to_json output does not parse: " + err).c_str());
    if (again.size() != rs.size()) violation("results", "round trip changed the row count");
    for (size_t i = 0; i < rs.size(); ++i) {
        std::string diff;
        if (!kvh::same_figures(rs[i], again[i], &diff)) violation("results", ("round trip changed " + diff).c_str());
    }
    // The plot script of what was read is built without trouble (the numbers were range-checked).
    (void)kvh::gnuplot_script(rs, "out.png");
    (void)kvh::to_csv(rs);
    (void)kvh::to_markdown(rs);
    // Token text: digits and separators of the same bytes.
    std::vector<int32_t> toks;
    (void)kvh::parse_tokens(text, 256, &toks, &err);
}

void gguf_target(const uint8_t *data, size_t size) {
    std::string err;
    {
        kvh::GgufFile f;
        if (!f.parse(data, size, "fuzz", &err)) {
            if (err.empty()) violation("gguf", "failure without a message");
            if (err.find('\n') != std::string::npos) violation("gguf", "a message of more than one line");
        } else {
            for (const kvh::GgufTensor &t : f.tensors()) {
                if (!t.data) continue;
                if (t.data < data || t.nbytes > size || t.data + t.nbytes > data + size)
                    violation("gguf", "a tensor outside the file");
                std::vector<float> row(256);
                uint64_t be = 0, bb = 0;
                if (kvh::ggml_block(t.type, &be, &bb) && t.ne[0] >= be && be <= 256)
                    kvh::dequantize(t.type, t.data, row.data(), be);  // one block: reads bb bytes inside
            }
            for (const kvh::GgufKV &k : f.kvs()) {
                std::string s;
                std::vector<std::string> ss;
                std::vector<float> fs;
                std::vector<int32_t> is;
                int64_t i;
                double d;
                bool b;
                (void)f.value_text(k);
                (void)f.get_str(k.key, &s);
                (void)f.get_int(k.key, &i);
                (void)f.get_float(k.key, &d);
                (void)f.get_bool(k.key, &b);
                (void)f.get_str_array(k.key, &ss);
                (void)f.get_f32_array(k.key, &fs);
                (void)f.get_i32_array(k.key, &is);
            }
            std::shared_ptr<const kvh::Tokenizer> tk;
            if (kvh::Tokenizer::from_gguf(f, 1 << 22, &tk, &err) && tk) {
                std::vector<int32_t> ids = tk->encode("Hello, world 123 caf\xC3\xA9\n", true);
                for (int32_t id : ids)
                    if (id < 0 || id >= tk->size()) violation("gguf", "the tokenizer returned an id outside its vocabulary");
                (void)tk->decode(ids);
            }
        }
    }
    // The model loader reads a path: one scratch file per process.
    static std::string path;
    if (path.empty()) {
        const char *dir = getenv("TMPDIR");
        path = std::string(dir && *dir ? dir : "/tmp") + "/kvpfuzz-gguf-" + std::to_string(getpid()) + ".gguf";
    }
    FILE *fp = fopen(path.c_str(), "wb");
    if (!fp) violation("gguf", "cannot write the scratch file");
    if (size && fwrite(data, 1, size, fp) != size) violation("gguf", "short write of the scratch file");
    fclose(fp);
    kvh::Checkpoint ck;
    const bool ok = kvh::load_gguf(path, &ck, &err);
    remove(path.c_str());
    if (!ok) {
        if (err.empty()) violation("gguf", "model failure without a message");
        if (err.find('\n') != std::string::npos) violation("gguf", "a model message of more than one line");
        return;
    }
    const kvh::ModelConfig &c = ck.cfg;
    if (c.dim <= 0 || c.n_layers <= 0 || c.n_heads <= 0 || c.n_kv_heads <= 0 || c.vocab <= 0 || c.hidden_dim <= 0 ||
        c.n_heads % c.n_kv_heads != 0 || c.head_dim() <= 0 || c.head_dim() % 2 != 0)
        violation("gguf", "accepted an inconsistent model");
    const float *lo = ck.data.data(), *hi = ck.data.data() + ck.data.size();
    // f32 tensors lie in data; a matrix kind read from the mapping has a null f32 pointer and a view.
    const float *mats[8] = {ck.tok_emb, ck.wq, ck.wk, ck.wv, ck.wo, ck.w1, ck.w3, ck.w2};
    const bool views[8] = {(bool)ck.qemb, !ck.qmat.empty() && ck.qmat[0], !ck.qmat.empty() && ck.qmat[(size_t)c.n_layers],
                           !ck.qmat.empty() && ck.qmat[2 * (size_t)c.n_layers], !ck.qmat.empty() && ck.qmat[3 * (size_t)c.n_layers],
                           !ck.qmat.empty() && ck.qmat[4 * (size_t)c.n_layers], !ck.qmat.empty() && ck.qmat[6 * (size_t)c.n_layers],
                           !ck.qmat.empty() && ck.qmat[5 * (size_t)c.n_layers]};
    for (int i = 0; i < 8; i++)
        if (mats[i] ? (mats[i] < lo || mats[i] >= hi || views[i]) : !views[i]) violation("gguf", "a matrix neither in the weights nor mapped");
    if (!ck.wcls && !ck.qcls) violation("gguf", "no output matrix");
    for (const float *p : {ck.rms_att, ck.rms_ffn, ck.rms_final})
        if (!p || p < lo || p >= hi) violation("gguf", "a norm pointer outside the weights");
    for (float x : ck.data)
        if (!std::isfinite(x)) violation("gguf", "accepted a non-finite weight");
    if (ck.tok && ck.tok->size() > c.vocab) violation("gguf", "a tokenizer larger than the embedding");
}

}  // namespace kvpfuzz
