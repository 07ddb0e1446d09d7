// Policy costs (issue "scoring core"), all in one run so that ratios are measured side by side:
//
//   BM_DecodeStep/<policy>/N:<N>/threads:<T>   one kvp_decode of a 32 q-head / 8 kv-head / d 128
//                                              fp32 layer attending N+1 tokens:
//        window   policy=window window=N: ring, no scoring (the attention-only baseline)
//        h2o      policy=h2o budget=N: fused score accumulation, victim scan, compaction
//        full     policy=full: N..N+255 tokens (the cache is refilled every 256 steps, untimed)
//        triattention  policy=triattention beta=128 budget=N-127 (issue 32), every token generated:
//                 each 128th step scores the ~N generated tokens and cuts them back (amortised);
//                 tri_mode=union (one choice for all heads, made on the calling thread), and
//        triattention_plh  the same with tri_mode=per_layer_perhead (each head in its own work)
//        h2o_ada, triattention_plh_ada  the same with head_budget=ada (issue 32 item 1): one ranking
//                 of all 8 heads' tokens on the calling thread (h2o: every step; triattention:
//                 at each cut, scoring the heads one after another)
//        h2o_ada_holes  h2o_ada planned with every head's hole allowance in the pools (the test
//                 hook lend_lean_homes = 0), as before the heads shared it: the cost of the
//                 compactions a shared allowance adds (--paired only)
//   BM_PruneEvent/L:<kept>/moved:<m>/cap:<C>   one arbitrary eviction compacted at once
//                                              (store_evict with no hole allowance) in a
//                                              (layer, head) of capacity C holding L tokens,
//                                              the victim m tokens before the end, so m-1 rows
//                                              move; then one kvp_append restores L
//   BM_RingEvict/L:<kept>/cap:<C>               one streaming front eviction + append (O(1))
//   BM_Prompt/<mode>/P:<P>/threads:<T>         one kvp_prefill of a P-token prompt (with q and out)
//                                              into an 8 q-head / 2 kv-head / d 64 layer, from empty:
//        full            policy=full: causal attention only (the baseline)
//        h2o_window      h2o scored by the prompt's last 32 queries (prompt_scores=window, before 0.3)
//        h2o_all         h2o scored by every query (the default since 0.3, fused into the attention)
//        *_fixed         the same with score=fixed (every query's integer weights are recomputed)
//
//   --paired[=S]   instead of the benchmarks: h2o, h2o_ada, h2o_ada_holes, triattention,
//                  triattention_plh, triattention_plh_ada and h2o again at N 32768 on 1 and 2 threads, one decode step
//                  of each in turn for S steps (default 512: four cuts), mean ms per step and the
//                  ratio to the first h2o (issue 32's target: triattention within 10 %)
//   --homes[=S]    instead of the benchmarks: what the homes' shared rounding costs (DECISIONS
//                  "Heads share their homes' rounding too"): 8-layer caches (32 q / 8 KV heads,
//                  d 128) with head_budget=ada, each planned twice (homes rounded each: the test
//                  hook lend_lean_homes = 1; shared: the default), a random prompt, then S decode
//                  steps (default 600) of every layer, the two caches in turn, twice (created in
//                  either order); arena bytes and mean ms per step, 1 and 2 threads
//
// Run (random interleaving and repetitions make the decode ratios robust on a shared machine):
//   build/bench/bench_policies --benchmark_repetitions=5 --benchmark_enable_random_interleaving=true
//       --benchmark_report_aggregates_only=true        (one command line)
#include <benchmark/benchmark.h>

#include <cstdint>
#include <cstdlib>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "arena.h"
#include "cache.h"
#include "kvprune/kvprune.h"

namespace {

constexpr uint32_t kQ = 32, kKv = 8, kD = 128;

struct Rng {  // splitmix64
    uint64_t s;
    float uni() {
        uint64_t z = (s += 0x9E3779B97F4A7C15ull);
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        z ^= z >> 31;
        return float((z >> 40) * (2.0 / 16777216.0) - 1.0);
    }
};

struct Owned {
    kvp_cache *c = nullptr;
    void *arena = nullptr;
    std::string error;
    Owned(uint32_t layers, uint32_t nq, uint32_t nkv, uint32_t d, const std::string &spec) {
        const kvp_model m = {layers, nq, nkv, d, KVP_ROPE_NEOX, 0, 10000.0f};
        kvp_config cfg;
        char err[256] = "";
        if (kvp_config_default(&cfg, &m) != KVP_OK || kvp_config_apply(&cfg, spec.c_str(), err, sizeof err) != KVP_OK) {
            error = spec + ": " + err;
            return;
        }
        const size_t n = kvp_arena_size(&cfg);
        arena = std::aligned_alloc(64, (n + 63) / 64 * 64);
        if (!arena || kvp_create(&cfg, arena, n, &c) != KVP_OK) error = spec + ": create failed";
    }
    ~Owned() {
        kvp_destroy(c);
        std::free(arena);
    }
};

// Appends n random tokens (no attention) to layer 0.
bool fill(kvp_cache *c, uint32_t n, uint32_t nkv, uint32_t d, uint64_t seed) {
    Rng r{seed};
    std::vector<float> k(size_t(1024) * nkv * d), v(k.size());
    for (float &x : k) x = r.uni();
    for (float &x : v) x = r.uni();
    for (uint32_t done = 0; done < n;) {
        const uint32_t m = n - done < 1024 ? n - done : 1024;
        if (kvp_append(c, 0, m, nullptr, k.data(), v.data()) != KVP_OK) return false;
        done += m;
    }
    return true;
}

// A layer holding N tokens under `policy` (BM_DecodeStep's names), and the decode inputs. error
// says why not.
struct DecodeCase {
    std::unique_ptr<Owned> o;
    std::vector<float> q, k, v, out;
    std::string error;
};

DecodeCase decode_case(const std::string &p, uint32_t N, int threads) {
    std::string spec;
    const bool holes = p == "h2o_ada_holes";
    const bool ada = holes || (p.size() > 4 && p.compare(p.size() - 4, 4, "_ada") == 0);
    if (p == "window") spec = "policy=window window=" + std::to_string(N);
    else if (p.rfind("h2o", 0) == 0) spec = "policy=h2o recent=32 budget=" + std::to_string(N);
    else if (p.rfind("triattention", 0) == 0)  // every beta = 128 steps the N generated tokens are scored and cut back
        spec = "policy=triattention beta=128 budget=" + std::to_string(N - 127) + " capacity=" + std::to_string(N + 2) +
               (p.rfind("triattention_plh", 0) == 0 ? " tri_mode=per_layer_perhead" : " tri_mode=union");
    else spec = "policy=full capacity=" + std::to_string(N + 256);
    if (ada) spec += " head_budget=ada";
    spec += " threads=" + std::to_string(threads);
    DecodeCase d;
    const uint32_t lean = kvp::lend_lean_homes;
    if (holes) kvp::lend_lean_homes = 0;
    d.o.reset(new Owned(1, kQ, kKv, kD, spec));
    kvp::lend_lean_homes = lean;
    if (!d.o->error.empty() || !fill(d.o->c, N, kKv, kD, 1)) {
        d.error = "setup: " + d.o->error;
        return d;
    }
    if (p.rfind("triattention", 0) == 0) {  // the appended tokens count as generated (the policy marks them 1.0 in the slot score)
        for (uint32_t h = 0; h < kKv; ++h) {  // and their count in the head's pword[0]
            kvp::HeadStore &hs = kvp::head_of(d.o->c, 0, h);
            kvp::BlockPool &pool = d.o->c->pools[h];
            kvp::store_for_each_live(hs, pool, [&](uint32_t slot, uint32_t n, uint32_t) {
                for (uint32_t i = 0; i < n; ++i) pool.score[slot + i] = 1.0f;
            });
            hs.pword[0] = hs.len();
        }
    }
    Rng r{9};
    d.q.resize(kQ * kD);
    d.k.resize(kKv * kD);
    d.v.resize(kKv * kD);
    d.out.resize(kQ * kD);
    for (float &x : d.q) x = r.uni();
    for (float &x : d.k) x = r.uni();
    for (float &x : d.v) x = r.uni();
    return d;
}

void BM_DecodeStep(benchmark::State &state, const char *policy, uint32_t N, int threads) {
    const std::string p = policy;
    DecodeCase d = decode_case(p, N, threads);
    if (!d.error.empty()) {
        state.SkipWithError(d.error.c_str());
        return;
    }
    Owned &o = *d.o;
    std::vector<float> &q = d.q, &k = d.k, &v = d.v, &out = d.out;
    uint32_t since = 0;
    for (auto _ : state) {
        if (p == "full" && since == 256) {
            state.PauseTiming();
            kvp_reset(o.c);
            fill(o.c, N, kKv, kD, 1);
            since = 0;
            state.ResumeTiming();
        }
        if (kvp_decode(o.c, 0, q.data(), k.data(), v.data(), out.data()) != KVP_OK) {
            state.SkipWithError(kvp_last_error(o.c));
            return;
        }
        ++since;
        benchmark::DoNotOptimize(out.data());
    }
    state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(N + 1) * kKv * kD * 2 * sizeof(float));
}

void BM_PruneEvent(benchmark::State &state) {
    const uint32_t L = uint32_t(state.range(0)), moved = uint32_t(state.range(1)), cap = uint32_t(state.range(2));
    Owned o(1, 1, 1, kD, "policy=full capacity=" + std::to_string(cap));
    if (!o.error.empty() || !fill(o.c, L, 1, kD, 2)) {
        state.SkipWithError("setup");
        return;
    }
    kvp::HeadStore &hs = kvp::head_of(o.c, 0, 0);
    kvp::BlockPool &pool = o.c->pools[0];
    std::vector<float> k(kD, 0.5f), v(kD, 0.25f);
    const uint32_t victim = L - moved;
    for (auto _ : state) {
        // full stores are dense from the first body slot: the victim's slot by block arithmetic
        const uint32_t slot = hs.blk[(hs.bhead + victim / pool.block) % hs.blk_cap] * pool.block + victim % pool.block;
        kvp::store_evict(hs, pool, 0, &slot, 1);  // full has no hole allowance: compacts at once
        if (kvp_append(o.c, 0, 1, nullptr, k.data(), v.data()) != KVP_OK) {
            state.SkipWithError(kvp_last_error(o.c));
            return;
        }
    }
    state.counters["rows_moved"] = double(moved - 1);
    state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(moved - 1) * kD * 2 * sizeof(float));
}

void BM_RingEvict(benchmark::State &state) {
    const uint32_t L = uint32_t(state.range(0)), cap = uint32_t(state.range(1));
    Owned o(1, 1, 1, kD, "policy=streaming sinks=4 window=" + std::to_string(L - 4) + " capacity=" + std::to_string(cap));
    if (!o.error.empty() || !fill(o.c, L, 1, kD, 3)) {
        state.SkipWithError("setup");
        return;
    }
    std::vector<float> k(kD, 0.5f), v(kD, 0.25f);
    for (auto _ : state)
        if (kvp_append(o.c, 0, 1, nullptr, k.data(), v.data()) != KVP_OK) {  // append + evict the oldest
            state.SkipWithError(kvp_last_error(o.c));
            return;
        }
}

void BM_Prompt(benchmark::State &state, std::string mode, uint32_t P, int threads) {
    constexpr uint32_t nq = 8, nkv = 2, d = 64;
    std::string spec = "policy=full capacity=" + std::to_string(P + 8);
    if (mode.rfind("h2o_window", 0) == 0) spec = "policy=h2o budget=1024 prompt_scores=window capacity=" + std::to_string(P + 8);
    if (mode.rfind("h2o_all", 0) == 0) spec = "policy=h2o budget=1024 capacity=" + std::to_string(P + 8);
    if (mode.find("_fixed") != std::string::npos) spec += " score=fixed";
    spec += " threads=" + std::to_string(threads);
    Owned o(1, nq, nkv, d, spec);
    if (!o.error.empty()) {
        state.SkipWithError(("setup: " + o.error).c_str());
        return;
    }
    Rng r{5};
    std::vector<float> q(size_t(P) * nq * d), k(size_t(P) * nkv * d), v(k.size()), out(q.size());
    for (float &x : q) x = r.uni();
    for (float &x : k) x = r.uni();
    for (float &x : v) x = r.uni();
    for (auto _ : state) {
        kvp_reset(o.c);
        if (kvp_prefill(o.c, 0, P, nullptr, q.data(), k.data(), v.data(), out.data(), nullptr) != KVP_OK) {
            state.SkipWithError(kvp_last_error(o.c));
            return;
        }
        benchmark::DoNotOptimize(out.data());
    }
    state.SetItemsProcessed(int64_t(state.iterations()) * P);
}

void register_all() {
    for (int t : {1, 2})
        for (const char *mode : {"full", "h2o_window", "h2o_all", "h2o_window_fixed", "h2o_all_fixed"}) {
            const std::string name = std::string("BM_Prompt/") + mode + "/P:4096/threads:" + std::to_string(t);
            benchmark::RegisterBenchmark(name.c_str(), BM_Prompt, std::string(mode), 4096u, t)
                ->Unit(benchmark::kMillisecond)->UseRealTime();
        }
    for (int t : {1, 2})
        for (const char *p : {"window", "h2o", "full"}) {
            const std::string name = std::string("BM_DecodeStep/") + p + "/N:4096/threads:" + std::to_string(t);
            benchmark::RegisterBenchmark(name.c_str(), BM_DecodeStep, p, 4096u, t)->Unit(benchmark::kMicrosecond)->UseRealTime();
        }
    // issue 32: TriAttention's scoring (every 128 steps, over every generated token) against h2o's
    for (int t : {1, 2})
        for (const char *p : {"h2o", "h2o_ada", "triattention", "triattention_plh", "triattention_plh_ada"}) {
            const std::string name = std::string("BM_DecodeStep/") + p + "/N:32768/threads:" + std::to_string(t);
            benchmark::RegisterBenchmark(name.c_str(), BM_DecodeStep, p, 32768u, t)
                ->Unit(benchmark::kMicrosecond)->UseRealTime()->Iterations(256);  // two cuts of triattention
        }
    auto *pe = benchmark::RegisterBenchmark("BM_PruneEvent", BM_PruneEvent);
    pe->ArgNames({"L", "moved", "cap"})->Unit(benchmark::kMicrosecond);
    for (int64_t cap : {16384, 262144})
        for (int64_t L : {1024, 16384})
            for (int64_t m : {32, 1024})
                if (L <= cap - 16) pe->Args({L, m, cap});
    pe->Args({16384, 8192, 262144});
    auto *re = benchmark::RegisterBenchmark("BM_RingEvict", BM_RingEvict);
    re->ArgNames({"L", "cap"})->Unit(benchmark::kMicrosecond);
    for (int64_t L : {1024, 16384}) re->Args({L, 262144});
}

}  // namespace

// --paired: the issue 32 decode rows side by side in one process, one step of each cache in turn
// (the order rotating every step), so that a busy machine's drift falls on all of them alike; the
// mean ms per step of each over `steps` steps (beta 128: steps/128 cuts amortised) and its ratio
// to h2o's. Returns false when a cache could not be set up.
bool paired(uint32_t N, uint32_t steps, const std::vector<int> &threads) {
    const char *pols[] = {"h2o", "h2o_ada", "h2o_ada_holes", "triattention", "triattention_plh", "triattention_plh_ada", "h2o"};
    constexpr size_t P = sizeof pols / sizeof *pols;
    printf("paired decode steps, N %u, %u steps each (one step of each in turn)\n", N, steps);
    printf("%-22s %7s %10s %9s\n", "policy", "threads", "ms/step", "vs h2o");  // the first h2o row
    for (int T : threads) {
        // Not measured: on the 2-core Zen 4 VM the first of these caches to be created decoded
        // 12-16 % slower than the others whatever its policy (the same policy created first and
        // last: 16.9 / 13.5 ms), so a window cache of the same size goes first. h2o is created
        // again last: its two rows show what is left of such an effect.
        const DecodeCase first = decode_case("window", N, T);
        std::vector<DecodeCase> cs;
        for (const char *p : pols) {
            cs.push_back(decode_case(p, N, T));
            if (!cs.back().error.empty()) {
                fprintf(stderr, "%s: %s\n", p, cs.back().error.c_str());
                return false;
            }
        }
        std::vector<double> ms(P, 0.0);
        for (uint32_t s = 0; s < steps + 8; ++s)
            for (size_t j = 0; j < P; ++j) {
                const size_t i = (s + j) % P;
                DecodeCase &d = cs[i];
                const auto t0 = std::chrono::steady_clock::now();
                if (kvp_decode(d.o->c, 0, d.q.data(), d.k.data(), d.v.data(), d.out.data()) != KVP_OK) {
                    fprintf(stderr, "%s: %s\n", pols[i], kvp_last_error(d.o->c));
                    return false;
                }
                const auto t1 = std::chrono::steady_clock::now();
                if (s >= 8) ms[i] += std::chrono::duration<double, std::milli>(t1 - t0).count();  // 8 warm-up steps
            }
        for (size_t i = 0; i < P; ++i)
            printf("%-22s %7d %10.3f %+8.1f%%\n", pols[i], T, ms[i] / steps, (ms[i] / ms[0] - 1.0) * 100.0);
    }
    return true;
}

// --homes: see the header comment. Returns false when a cache could not be set up or a call failed.
bool homes(uint32_t steps) {
    constexpr uint32_t L = 8;
    struct Row {
        const char *spec;
        uint32_t prompt;
    };
    // budgets whose layers have short homes (capacity + 15 not a multiple of the block 16)
    const Row rows[] = {{"policy=h2o recent=32 budget=2047", 2048}, {"policy=lethe budget=2040", 2048}, {"policy=snapkv budget=128", 1024}};
    printf("homes rounded each (hook 1) vs shared (the default): %u layers, %u decode steps of every layer, twice\n", L, steps);
    printf("%-36s %7s %12s %12s %9s %9s %8s\n", "config", "threads", "arena each", "arena shared", "ms each", "ms shared", "shared");
    Rng r{7};
    for (const Row &row : rows)
        for (int T : {1, 2}) {
            const std::string spec = std::string(row.spec) + " head_budget=ada threads=" + std::to_string(T);
            size_t bytes[2] = {0, 0};
            double ms[2] = {0.0, 0.0};
            // On the 2-core VM a later-created cache of this size decoded 4-7 % faster than an
            // earlier one whatever its plan (the same plan twice shows it), so each round creates
            // the two in the other order, after a first one of the same size that stays (as
            // paired()); ms are summed over both rounds.
            for (int round = 0; round < 2; ++round) {
                const Owned first(L, kQ, kKv, kD, spec);
                std::unique_ptr<Owned> cs[2];  // [0] homes rounded each, [1] shared
                const uint32_t lean = kvp::lend_lean_homes;
                for (int n = 0; n < 2; ++n) {
                    const int i = round == 0 ? n : 1 - n;
                    kvp::lend_lean_homes = i == 0 ? 1 : lean;
                    cs[i].reset(new Owned(L, kQ, kKv, kD, spec));
                    kvp::lend_lean_homes = lean;
                    if (!cs[i]->error.empty()) {
                        fprintf(stderr, "%s\n", cs[i]->error.c_str());
                        return false;
                    }
                    kvp_stats st;
                    st.struct_size = sizeof st;
                    if (kvp_get_stats(cs[i]->c, &st) != KVP_OK) return false;
                    bytes[i] = st.arena_bytes;
                }
                std::vector<float> q(size_t(row.prompt) * kQ * kD), k(size_t(row.prompt) * kKv * kD), v(k.size()), o(q.size());
                for (float &x : q) x = r.uni();
                for (float &x : k) x = r.uni();
                for (float &x : v) x = r.uni();
                for (auto &c : cs)
                    for (uint32_t l = 0; l < L; ++l)
                        if (kvp_prefill(c->c, l, row.prompt, nullptr, q.data(), k.data(), v.data(), o.data(), nullptr) != KVP_OK) {
                            fprintf(stderr, "%s: %s\n", spec.c_str(), kvp_last_error(c->c));
                            return false;
                        }
                for (uint32_t s = 0; s < steps; ++s) {
                    for (size_t i = 0; i < size_t(kQ) * kD; ++i) q[i] = r.uni();
                    for (size_t i = 0; i < size_t(kKv) * kD; ++i) k[i] = r.uni(), v[i] = r.uni();
                    for (int j = 0; j < 2; ++j) {
                        const int i = int(s + j) % 2;  // the order alternates every step
                        const auto t0 = std::chrono::steady_clock::now();
                        for (uint32_t l = 0; l < L; ++l)
                            if (kvp_decode(cs[i]->c, l, q.data(), k.data(), v.data(), o.data()) != KVP_OK) {
                                fprintf(stderr, "%s: %s\n", spec.c_str(), kvp_last_error(cs[i]->c));
                                return false;
                            }
                        ms[i] += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
                    }
                }
            }
            printf("%-36s %7d %12zu %12zu %9.3f %9.3f %+7.1f%%\n", row.spec, T, bytes[0], bytes[1], ms[0] / (2 * steps),
                   ms[1] / (2 * steps), (ms[1] / ms[0] - 1.0) * 100.0);
        }
    return true;
}

int main(int argc, char **argv) {
    for (int i = 1; i < argc; ++i)
        if (strncmp(argv[i], "--homes", 7) == 0) {  // --homes[=steps]: see homes()
            const uint32_t steps = argv[i][7] == '=' ? uint32_t(atoi(argv[i] + 8)) : 600u;
            return homes(steps ? steps : 600u) ? 0 : 1;
        }
    for (int i = 1; i < argc; ++i)
        if (strncmp(argv[i], "--paired", 8) == 0) {  // --paired[=steps]: see paired()
            const uint32_t steps = argv[i][8] == '=' ? uint32_t(atoi(argv[i] + 9)) : 512u;
            return paired(32768, steps ? steps : 512u, {1, 2}) ? 0 : 1;
        }
    register_all();
    benchmark::Initialize(&argc, argv);
    if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
    benchmark::RunSpecifiedBenchmarks();
    benchmark::Shutdown();
    return 0;
}
