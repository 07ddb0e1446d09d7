// kvprune port: llama-kvp-tasks runs the prompts of kvprune's retrieval task grid through llama.cpp
// with the kvprune memory (ports/llama.cpp/tasks.sh in the kvprune repository).
//
//   llama-kvp-tasks -m MODEL.gguf --rows ROWS --out RESULTS [-t N] [-ub N] [-v]
//
// ROWS is written by `kvprune eval --task ... --port-rows ROWS` (format in kvprune's
// bench/harness/tasks.h): per row the spec as applied, the prompt as token ids (context, question)
// and the answer's length in tokens. For each row this program, on a context created with
// KVP_SPEC = the row's spec (one context per run of rows with the same spec):
//   - clears the memory;
//   - query-aware: decodes context + question as one batch (llama.cpp splits it into micro-batches;
//     the port's max_prompt selects once, at the first generated token, as one kvp_prefill would);
//     query-agnostic: the context as one batch, then the question one token per llama_decode (the
//     first ends the prompt: the selection sees the context only), as the harness does;
//   - greedy-decodes as many tokens as the answer has (argmax, lowest id on ties);
//   - reads the sequence's kvprune counters after the last generated token but one is decoded.
// RESULTS gets "kvprune-task-results 1", then per row
//   row <i> <live bytes> <peak live bytes> <arena bytes> <tokens seen> <n> <n generated ids>
// which `kvprune eval --task ... --port-results RESULTS` scores and reports.

#include "llama.h"
#include "llama-kvp.h"

#include "kvprune/kvprune.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace {

struct row_t {
    long long index = 0;
    bool aware = false;
    size_t n_answer = 0;
    std::string spec;
    std::vector<llama_token> context, question;
};

bool read_ids(std::istream & in, size_t n, std::vector<llama_token> & out) {
    std::string line;
    if (!std::getline(in, line)) {
        return false;
    }
    std::istringstream ls(line);
    out.resize(n);
    for (auto & t : out) {
        if (!(ls >> t)) {
            return false;
        }
    }
    return true;
}

bool read_rows(const char * path, std::vector<row_t> & rows, std::string & err) {
    std::ifstream in(path);
    std::string line, magic;
    int version = 0;
    size_t n = 0;
    if (!in || !(in >> magic >> version >> n) || magic != "kvprune-task-rows" || version != 1) {
        err = std::string(path) + ": not a rows file of kvprune eval --port-rows";
        return false;
    }
    std::getline(in, line);
    for (size_t i = 0; i < n; ++i) {
        row_t r;
        std::string word;
        int aware = 0;
        size_t nc = 0, nq = 0;
        if (!std::getline(in, line)) {
            err = std::string(path) + ": " + std::to_string(i) + " rows of " + std::to_string(n);
            return false;
        }
        std::istringstream ls(line);
        if (!(ls >> word >> r.index >> aware >> r.n_answer >> nc >> nq) || word != "row") {
            err = std::string(path) + ": a malformed row line: " + line;
            return false;
        }
        std::getline(ls >> std::ws, r.spec);
        r.aware = aware != 0;
        if (!read_ids(in, nc, r.context) || !read_ids(in, nq, r.question)) {
            err = std::string(path) + ": row " + std::to_string(r.index) + ": fewer ids than the row line says";
            return false;
        }
        rows.push_back(std::move(r));
    }
    return true;
}

bool decode(llama_context * ctx, std::vector<llama_token> & toks, std::string & err) {
    if (toks.empty()) {
        return true;
    }
    const int rc = llama_decode(ctx, llama_batch_get_one(toks.data(), (int32_t) toks.size()));
    if (rc != 0) {
        err = "llama_decode returned " + std::to_string(rc);
        return false;
    }
    return true;
}

llama_token argmax(const float * lg, int n) { // lowest id on ties
    int b = 0;
    for (int j = 1; j < n; ++j) {
        if (lg[j] > lg[b]) {
            b = j;
        }
    }
    return b;
}

bool verbose = false;

void log_cb(ggml_log_level level, const char * text, void *) {
    if (verbose || level == GGML_LOG_LEVEL_ERROR) {
        fputs(text, stderr);
    }
}

int usage() {
    fprintf(stderr, "usage: llama-kvp-tasks -m MODEL.gguf --rows ROWS --out RESULTS [-t THREADS] [-ub UBATCH] [-v]\n"
                    "  ROWS from kvprune eval --task ... --port-rows ROWS; RESULTS for kvprune eval --task ... --port-results RESULTS\n");
    return 2;
}

} // namespace

int main(int argc, char ** argv) {
    const char * model_path = nullptr, * rows_path = nullptr, * out_path = nullptr;
    int threads = 2, ubatch = 512;
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        if (a == "-v") {
            verbose = true;
        } else if (i + 1 < argc && (a == "-m" || a == "--model")) {
            model_path = argv[++i];
        } else if (i + 1 < argc && a == "--rows") {
            rows_path = argv[++i];
        } else if (i + 1 < argc && a == "--out") {
            out_path = argv[++i];
        } else if (i + 1 < argc && (a == "-t" || a == "--threads")) {
            threads = atoi(argv[++i]);
        } else if (i + 1 < argc && (a == "-ub" || a == "--ubatch-size")) {
            ubatch = atoi(argv[++i]);
        } else {
            return usage();
        }
    }
    if (!model_path || !rows_path || !out_path || threads < 1 || ubatch < 1) {
        return usage();
    }
    std::vector<row_t> rows;
    std::string err;
    if (!read_rows(rows_path, rows, err)) {
        fprintf(stderr, "llama-kvp-tasks: %s\n", err.c_str());
        return 1;
    }
    llama_log_set(log_cb, nullptr);
    llama_backend_init();
    llama_model * model = llama_model_load_from_file(model_path, llama_model_default_params());
    if (!model) {
        fprintf(stderr, "llama-kvp-tasks: cannot load %s\n", model_path);
        return 1;
    }
    const int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
    FILE * out = fopen(out_path, "w");
    if (!out) {
        fprintf(stderr, "llama-kvp-tasks: cannot write %s\n", out_path);
        return 1;
    }
    fprintf(out, "kvprune-task-results 1\n");

    llama_context * ctx = nullptr;
    std::string ctx_spec;
    int rc = 0;
    for (size_t i = 0; i < rows.size() && rc == 0; ++i) {
        const row_t & r = rows[i];
        if (!ctx || r.spec != ctx_spec) {
            // one context for this run of rows with the same spec, sized for its longest prompt + answer
            size_t n_ctx = 0;
            for (size_t j = i; j < rows.size() && rows[j].spec == r.spec; ++j) {
                n_ctx = std::max(n_ctx, rows[j].context.size() + rows[j].question.size() + rows[j].n_answer);
            }
            llama_free(ctx);
            setenv("KVP_SPEC", r.spec.c_str(), 1);
            llama_context_params cp = llama_context_default_params();
            cp.n_ctx           = (uint32_t) ((n_ctx + 255) / 256 * 256);
            cp.n_batch         = cp.n_ctx;
            cp.n_ubatch        = (uint32_t) ubatch;
            cp.n_seq_max       = 1;
            cp.n_threads       = threads;
            cp.n_threads_batch = threads;
            cp.no_perf         = true;
            ctx = llama_init_from_model(model, cp);
            if (!ctx) {
                fprintf(stderr, "llama-kvp-tasks: row %lld: no context for spec '%s' (see the log above)\n", r.index, r.spec.c_str());
                rc = 1;
                break;
            }
            ctx_spec = r.spec;
        }
        llama_memory_clear(llama_get_memory(ctx), true);
        std::vector<llama_token> first = r.context;
        if (r.aware) {
            first.insert(first.end(), r.question.begin(), r.question.end());
        }
        bool ok = decode(ctx, first, err);
        for (size_t q = 0; ok && !r.aware && q < r.question.size(); ++q) {
            std::vector<llama_token> one(1, r.question[q]);
            ok = decode(ctx, one, err);
        }
        std::vector<llama_token> gen;
        for (size_t j = 0; ok && j < r.n_answer; ++j) {
            const float * lg = llama_get_logits_ith(ctx, -1);
            if (!lg) {
                err = "no logits";
                ok = false;
                break;
            }
            gen.push_back(argmax(lg, n_vocab));
            if (j + 1 < r.n_answer) {
                std::vector<llama_token> one(1, gen.back());
                ok = decode(ctx, one, err);
            }
        }
        kvp_stats st = {};
        if (ok && !llama_kvp_seq_stats(ctx, 0, &st)) {
            err = "the context's memory is not kvprune's";
            ok = false;
        }
        if (!ok) {
            fprintf(stderr, "llama-kvp-tasks: row %lld (spec '%s'): %s\n", r.index, r.spec.c_str(), err.c_str());
            rc = 1;
            break;
        }
        fprintf(out, "row %lld %llu %llu %llu %llu %zu", r.index, (unsigned long long) st.live_bytes,
                (unsigned long long) st.peak_live_bytes, (unsigned long long) st.arena_bytes,
                (unsigned long long) st.tokens_seen, gen.size());
        for (llama_token t : gen) {
            fprintf(out, " %d", t);
        }
        fprintf(out, "\n");
    }
    llama_free(ctx);
    llama_model_free(model);
    llama_backend_free();
    if (fclose(out) != 0) {
        fprintf(stderr, "llama-kvp-tasks: cannot write %s\n", out_path);
        rc = 1;
    }
    if (rc == 0) {
        fprintf(stderr, "llama-kvp-tasks: %zu rows answered into %s\n", rows.size(), out_path);
    }
    return rc;
}
