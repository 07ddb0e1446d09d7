// No allocation after kvp_create: malloc and friends are replaced process-wide (glibc's
// documented replacement set, forwarding to __libc_*), so allocations by the OpenMP runtime,
// libstdc++ or libc count too. Runs in the non-sanitizer build only (ASan owns malloc there).
#include <gtest/gtest.h>
#include <malloc.h>
#include <math.h>
#include <string.h>

#include <atomic>
#include <thread>

#if defined(_OPENMP)
#include <omp.h>
#endif

#include "reference.h"

extern "C" {
void *__libc_malloc(size_t);
void *__libc_calloc(size_t, size_t);
void *__libc_realloc(void *, size_t);
void *__libc_memalign(size_t, size_t);
void __libc_free(void *);
}

static std::atomic<long> g_allocs{0};

extern "C" {
void *malloc(size_t n) {
    g_allocs.fetch_add(1, std::memory_order_relaxed);
    return __libc_malloc(n);
}
void *calloc(size_t a, size_t b) {
    g_allocs.fetch_add(1, std::memory_order_relaxed);
    return __libc_calloc(a, b);
}
void *realloc(void *p, size_t n) {
    g_allocs.fetch_add(1, std::memory_order_relaxed);
    return __libc_realloc(p, n);
}
void *memalign(size_t a, size_t n) {
    g_allocs.fetch_add(1, std::memory_order_relaxed);
    return __libc_memalign(a, n);
}
void *aligned_alloc(size_t a, size_t n) { return memalign(a, n); }
int posix_memalign(void **out, size_t a, size_t n) {
    void *p = memalign(a, n);
    if (!p) return 12;  // ENOMEM
    *out = p;
    return 0;
}
void *valloc(size_t n) { return memalign(4096, n); }
void *pvalloc(size_t n) { return memalign(4096, (n + 4095) / 4096 * 4096); }
void free(void *p) { __libc_free(p); }
}

namespace {

// Exercises every entry point after create: prefill (tiles, several key blocks), decode with
// prunes (ring wrap), append, positions, stats, failed calls, reset. Geometry: nq query heads,
// nkv KV heads (<= 4), head_dim 64.
long allocations_during_workload(kvp_cache *c, uint32_t layers, uint32_t nq = 8, uint32_t nkv = 4) {
    const uint32_t hd = 64;
    static float q[300 * 8 * 64], k[300 * 4 * 64], v[300 * 4 * 64], o[300 * 8 * 64];
    ref::Rng rng(3);
    for (float &x : q) x = rng.uniform(-1, 1);
    for (float &x : k) x = rng.uniform(-1, 1);
    for (float &x : v) x = rng.uniform(-1, 1);
    int32_t pos[512];
    uint32_t n;
    kvp_stats st;
    st.struct_size = sizeof st;
    static float nanq[8 * 64];
    memcpy(nanq, q, sizeof nanq);
    nanq[5] = NAN;

    static int32_t sel_idx[300];
    kvp_selection sel;
    memset(&sel, 0, sizeof sel);
    sel.struct_size = sizeof sel;
    sel.capacity = 300;
    sel.indices = sel_idx;

    const long before = g_allocs.load();
    for (int round = 0; round < 2; ++round) {
        for (uint32_t l = 0; l < layers; ++l)
            if (kvp_prefill(c, l, 200, nullptr, q, k, v, o, &sel) != KVP_OK) return -1;
        for (int t = 0; t < 150; ++t)
            for (uint32_t l = 0; l < layers; ++l)
                if (kvp_decode(c, l, q + t * nq * hd, k + t * nkv * hd, v + t * nkv * hd, o) != KVP_OK) return -1;
        if (kvp_append(c, 0, 1, nullptr, k, v) != KVP_OK) return -1;
        if (kvp_layer_positions(c, 0, nkv - 1, pos, 512, &n) != KVP_OK) return -1;
        if (kvp_get_stats(c, &st) != KVP_OK) return -1;
        if (kvp_decode(c, 0, nanq, k, v, o) != KVP_ERR_NONFINITE) return -1;
        if (kvp_decode(c, 99, q, k, v, o) != KVP_ERR_LAYER) return -1;
        (void)kvp_last_error(c);
        if (kvp_reset(c) != KVP_OK) return -1;
    }
    return g_allocs.load() - before;
}

kvp_config config(const char *spec, uint32_t nq = 8, uint32_t nkv = 4) {
    const kvp_model m = ref::model(2, nq, nkv, 64);
    kvp_config cfg;
    kvp_config_default(&cfg, &m);
    char err[128];
    kvp_config_apply(&cfg, spec, err, sizeof err);
    return cfg;
}

// A cache of `spec` in caller memory (the 2-layer geometry above) runs the workload without an
// allocation.
void expect_no_allocation(const char *spec) {
    kvp_config cfg = config(spec);
    const size_t bytes = kvp_arena_size(&cfg);
    ASSERT_GT(bytes, 0u) << spec;
    void *arena = __libc_memalign(64, bytes);
    kvp_cache *c = nullptr;
    ASSERT_EQ(kvp_create(&cfg, arena, bytes, &c), KVP_OK) << spec;
    EXPECT_EQ(allocations_during_workload(c, 2), 0) << spec;
    kvp_destroy(c);
    __libc_free(arena);
}

TEST(NoAllocation, AfterCreateInCallerMemory) {
    kvp_config cfg = config("policy=streaming sinks=4 window=120 compress_every=16 slack=8 max_drop=8 capacity=260 threads=2");
    const size_t bytes = kvp_arena_size(&cfg);
    ASSERT_GT(bytes, 0u);
    void *arena = __libc_memalign(64, bytes);
    kvp_cache *c = nullptr;
    const long before_create = g_allocs.load();
    ASSERT_EQ(kvp_create(&cfg, arena, bytes, &c), KVP_OK);
    const long in_create = g_allocs.load() - before_create;  // the OpenMP pool may allocate here
    EXPECT_EQ(allocations_during_workload(c, 2), 0) << "(create itself made " << in_create << ")";
    kvp_destroy(c);
    __libc_free(arena);
}

// Scored policies (h2o: fused decode scores, prefill observation, nth_element/sort victim
// selection, compaction) and a dry shared pool (self-prune) allocate nothing either, with
// original and realign positions and on 1 and 2 threads.
TEST(NoAllocation, ScoredPolicyAndDryPool) {
    for (const char *spec : {"policy=h2o budget=120 recent=16 capacity=260 threads=2",
                             "policy=h2o budget=120 recent=16 capacity=260 positions=realign threads=1",
                             "policy=h2o budget=200 recent=16 capacity=260 total_capacity=420 threads=2",
                             "policy=streaming sinks=4 window=200 capacity=260 total_capacity=460 threads=1",
                             // sliding-window layers: pieces, evictions before and after, masked tiles
                             "policy=h2o budget=120 recent=16 capacity=260 sliding_window=40 sliding_pattern=2 threads=2",
                             "policy=full capacity=260 sliding_window=33 kv_dtype=q8 threads=1"}) {
        expect_no_allocation(spec);  // its 200-token prefill prunes (or self-prunes)
    }
}

// DuoAttention heads (kvp_create_heads, issue 32 item 2): streaming heads' ring evictions before
// and after each call, beside retrieval heads of full and h2o, 1 and 2 threads.
TEST(NoAllocation, DuoAttentionHeads) {
    const uint8_t roles[8] = {1, 0, 0, 1, 0, 1, 1, 0};
    for (const char *spec : {"policy=full capacity=420 duo_sink=4 duo_window=256 threads=2",
                             "policy=h2o budget=120 recent=16 capacity=260 duo_sink=8 duo_window=200 score=fixed threads=1"}) {
        kvp_config cfg = config(spec);
        const size_t bytes = kvp_arena_size_heads(&cfg, roles, 8);
        ASSERT_GT(bytes, 0u) << spec;
        void *arena = __libc_memalign(64, bytes);
        kvp_cache *c = nullptr;
        ASSERT_EQ(kvp_create_heads(&cfg, nullptr, 0, roles, 8, arena, bytes, &c, nullptr, 0), KVP_OK) << spec;
        EXPECT_EQ(allocations_during_workload(c, 2), 0) << spec;
        kvp_destroy(c);
        __libc_free(arena);
    }
}

// Quantized storage and ThinK: staged prefill chunks, group conversion, ThinK's selection,
// repacks after scored evictions, realign, the ring's front eviction and the shared pool.
TEST(NoAllocation, QuantizedAndThinkStorage) {
    for (const char *spec : {"policy=h2o budget=120 recent=16 capacity=260 kv_dtype=q4 threads=2",
                             "policy=h2o budget=120 recent=16 capacity=260 kv_dtype=q8 positions=realign threads=1",
                             "policy=think token_policy=h2o budget=120 recent=16 capacity=260 key_channel_ratio=0.4 "
                             "value_channel_ratio=0.3 kv_dtype=q8 threads=2",
                             "policy=think token_policy=streaming sinks=4 window=200 capacity=260 kv_dtype=f16 "
                             "key_channel_ratio=0.5 threads=2",
                             "policy=streaming sinks=4 window=120 compress_every=16 capacity=260 kv_dtype=q4 quant_group=8",
                             "policy=think key_channel_ratio=0.4 capacity=600 kv_dtype=f32 threads=3",
                             "policy=h2o budget=200 recent=16 capacity=260 total_capacity=420 kv_dtype=q8 threads=2"}) {
        expect_no_allocation(spec);
    }
}

// The policies of issue 8: snapkv/pyramidkv (the staged 200-token prompt, vote pooling, selection,
// commit), lethe (layer phase, breakpoint sort, a shared pool's layer-wide room making), and
// score=fixed (integer RoPE tables, logits, observation), original and realign, 1 and 2 threads.
// The layer-level policies of issue 9: simlayerkv (the second observation, the first-decode
// observation, the layer-wide decision and trim, lazy streaming evictions, forced layers, a
// shared pool) and asl (per-head votes into the state region, ranks, variance, the selection).
TEST(NoAllocation, SimLayerKvAndAsl) {
    for (const char *spec :
         {"policy=simlayerkv sinks=4 window=40 lazy_last=16 lazy_force=1 capacity=400 threads=2",
          "policy=simlayerkv nonlazy=h2o budget=120 capacity=260 lazy_mode=decode lazy_threshold=0.2 sinks=4 window=40 "
          "positions=realign score=fixed threads=2",
          "policy=simlayerkv nonlazy=snapkv budget=64 capacity=100 sinks=4 window=20 lazy_threshold=0.1 total_capacity=120 threads=1",
          "policy=simlayerkv nonlazy=h2o budget=120 capacity=260 sinks=4 window=40 lazy_force=2 kv_dtype=q8 threads=2",
          "policy=asl budget=48 obs_window=16 asl_tau=1e6 threads=2",
          "policy=asl budget=64 asl_obs_layers=1 score=fixed positions=realign threads=1",
          // formatted storage under the staged prompt (quantized commit, lazy trim, selection)
          "policy=simlayerkv nonlazy=snapkv budget=64 capacity=100 sinks=4 window=20 lazy_force=1 kv_dtype=q4 threads=2",
          "policy=asl budget=48 obs_window=16 asl_tau=1e6 kv_dtype=q8 threads=2",
          "policy=think token_policy=asl budget=48 obs_window=16 asl_tau=1e6 key_channel_ratio=0.4 kv_dtype=f16 threads=2",
          // issue 28/32: prompts held to their end (asl, think's deferred rows) and the random baseline
          "policy=asl budget=48 obs_window=16 asl_tau=1e6 max_prompt=256 threads=2",
          "policy=think token_policy=h2o budget=48 key_channel_ratio=0.5 kv_dtype=q8 max_prompt=256 threads=2",
          "policy=random keep_prompt=0 budget=48 capacity=260 seed=3 threads=2",
          "policy=random budget=16 capacity=400 threads=1",
          "policy=triattention budget=16 beta=8 capacity=400 threads=2",
          "policy=triattention budget=16 beta=8 capacity=400 tri_mode=per_layer_perhead threads=2",
          "policy=triattention budget=16 beta=8 capacity=400 score=fixed kv_dtype=q4 max_prompt=256 threads=2"}) {
        expect_no_allocation(spec);
    }
}

TEST(NoAllocation, SnapKvPyramidKvLetheAndFixedScores) {
    for (const char *spec :
         {"policy=snapkv budget=48 obs_window=16 pool=avg positions=realign threads=2",
          "policy=snapkv budget=64 capacity=200 total_capacity=240 score=fixed threads=2",
          "policy=pyramidkv budget=48 obs_window=8 beta=5 score=fixed positions=realign threads=1",
          "policy=lethe capacity=260 evict_threshold=40 sparse_ratio=3 threads=2",
          "policy=lethe capacity=260 evict_threshold=40 sparse_ratio=3 total_capacity=440 score=fixed threads=1",
          "policy=h2o budget=120 recent=16 capacity=260 score=fixed positions=realign threads=2",
          // prompt staging with formatted storage (f32 staging rows, commit into the format)
          "policy=snapkv budget=48 obs_window=16 kv_dtype=q4 quant_group=16 threads=2",
          "policy=snapkv budget=64 capacity=200 total_capacity=240 score=fixed kv_dtype=f16 prefill_stage=200 threads=2",
          "policy=think token_policy=pyramidkv budget=48 obs_window=8 beta=5 key_channel_ratio=0.4 kv_dtype=q8 "
          "positions=realign threads=1",
          // issue 32 item 1: AdaKV's ranking over the layer's heads (std::sort in the layer phase)
          "policy=snapkv budget=48 obs_window=16 head_budget=ada threads=2",
          "policy=pyramidkv budget=48 obs_window=8 beta=5 head_budget=ada score=fixed max_prompt=256 threads=1",
          "policy=h2o budget=120 recent=16 capacity=260 head_budget=ada max_prompt=256 threads=2",
          "policy=lethe capacity=260 evict_threshold=40 sparse_ratio=3 head_budget=ada score=fixed threads=2",
          "policy=lethe capacity=260 evict_threshold=40 sparse_ratio=3 total_capacity=440 head_budget=ada threads=1",
          "policy=triattention budget=64 beta=16 tri_mode=per_layer_perhead head_budget=ada score=fixed threads=2"}) {
        expect_no_allocation(spec);
    }
}

// A host's parallel-for (kvp_set_parallel) that runs the tasks in a row on the calling thread,
// counting its calls.
std::atomic<int> g_host_calls{0};
void host_in_a_row(void *, uint32_t n, void (*task)(void *, uint32_t), void *arg) {
    g_host_calls.fetch_add(1);
    for (uint32_t t = n; t-- > 0;) task(arg, t);
}

// thread_pool=host: every call handed to the host's function (one head per participant, 4 and
// 2 KV heads on 3 threads) allocates nothing.
TEST(NoAllocation, HostParallelForAllocatesNothing) {
    for (const auto &cs : {std::make_pair("policy=h2o budget=120 recent=16 capacity=260 threads=3 thread_pool=host", 4u),
                           std::make_pair("policy=streaming sinks=4 window=200 capacity=260 threads=3 thread_pool=host", 2u)}) {
        kvp_config cfg = config(cs.first, 8, cs.second);
        const size_t bytes = kvp_arena_size(&cfg);
        ASSERT_GT(bytes, 0u) << cs.first;
        void *arena = __libc_memalign(64, bytes);
        kvp_cache *c = nullptr;
        ASSERT_EQ(kvp_create(&cfg, arena, bytes, &c), KVP_OK) << cs.first;
        const kvp_status st = kvp_set_parallel(c, host_in_a_row, nullptr);
        if (st == KVP_ERR_UNSUPPORTED) {  // a build without threads
            kvp_destroy(c);
            __libc_free(arena);
            GTEST_SKIP() << "KVP_THREADS=OFF";
        }
        ASSERT_EQ(st, KVP_OK);
        g_host_calls.store(0);
        EXPECT_EQ(allocations_during_workload(c, 2, 8, cs.second), 0) << cs.first;
        EXPECT_GT(g_host_calls.load(), 0) << cs.first << ": the host's function was never called";
        kvp_destroy(c);
        __libc_free(arena);
    }
}

// Every parallel path (KVP_PAR_WORK=0 puts every call on all threads): prefill one thread per
// KV head (4 heads), split decode (owned and stolen chunk ranges, any head count) and
// tile-split prefill (MQA: 1 KV head, 2 KV heads on 3 threads).
TEST(NoAllocation, ParallelPathsAllocateNothing) {
    setenv("KVP_PAR_WORK", "0", 1);
    const struct {
        const char *spec;
        uint32_t nq, nkv;
    } cases[] = {{"policy=h2o budget=120 recent=16 capacity=260 threads=2", 8, 4},
                 {"policy=h2o budget=120 recent=16 capacity=260 threads=2", 8, 1},
                 {"policy=streaming sinks=4 window=200 capacity=260 threads=3", 8, 2},
                 {"policy=h2o budget=200 recent=16 capacity=260 positions=realign threads=3", 4, 1},
                 // heads that lend blocks (pool.h): moved between pools before the heads run
                 {"policy=snapkv budget=60 obs_window=8 head_budget=ada ada_floor=0 threads=2", 8, 4},
                 {"policy=lethe capacity=260 evict_threshold=40 sparse_ratio=3 head_budget=ada threads=3", 8, 4}};
    for (const auto &cs : cases) {
        kvp_config cfg = config(cs.spec, cs.nq, cs.nkv);
        const size_t bytes = kvp_arena_size(&cfg);
        ASSERT_GT(bytes, 0u) << cs.spec;
        void *arena = __libc_memalign(64, bytes);
        kvp_cache *c = nullptr;
        ASSERT_EQ(kvp_create(&cfg, arena, bytes, &c), KVP_OK) << cs.spec;
        EXPECT_EQ(allocations_during_workload(c, 2, cs.nq, cs.nkv), 0) << cs.spec << " nkv=" << cs.nkv;
        kvp_destroy(c);
        __libc_free(arena);
    }
    {  // split-K decode over 3 chunks (head_dim 64: 512 tokens per chunk), MQA, 3 threads
        kvp_config cfg = config("policy=h2o budget=1300 recent=16 capacity=1400 threads=3", 8, 1);
        const size_t bytes = kvp_arena_size(&cfg);
        void *arena = __libc_memalign(64, bytes);
        kvp_cache *c = nullptr;
        ASSERT_EQ(kvp_create(&cfg, arena, bytes, &c), KVP_OK);
        static float k[1300 * 64], v[1300 * 64], q[8 * 64], o[8 * 64];
        ref::Rng rng(4);
        for (float &x : k) x = rng.uniform(-1, 1);
        for (float &x : v) x = rng.uniform(-1, 1);
        for (float &x : q) x = rng.uniform(-1, 1);
        for (uint32_t l = 0; l < 2; ++l) ASSERT_EQ(kvp_append(c, l, 1200, nullptr, k, v), KVP_OK);
        const long before = g_allocs.load();
        for (int t = 0; t < 40; ++t)
            for (uint32_t l = 0; l < 2; ++l) ASSERT_EQ(kvp_decode(c, l, q, k + t * 64, v + t * 64, o), KVP_OK);
        EXPECT_EQ(g_allocs.load() - before, 0) << "split-K decode";
        kvp_destroy(c);
        __libc_free(arena);
    }
    unsetenv("KVP_PAR_WORK");
}

// DESIGN.md "Threads": no allocation whichever host thread calls. A cache made on this thread is
// used from another one, then from two host threads taking turns call by call (a goroutine
// that migrates between OS threads, a Rust cache moved between threads). OpenMP in the library
// allocated here: libgomp keeps a thread pool per host thread.
TEST(NoAllocation, CallsFromOtherHostThreads) {
    kvp_config cfg = config("policy=streaming sinks=4 window=120 compress_every=16 capacity=260 threads=2");
    const size_t bytes = kvp_arena_size(&cfg);
    void *arena = __libc_memalign(64, bytes);
    kvp_cache *c = nullptr;
    setenv("KVP_PAR_WORK", "0", 1);
    ASSERT_EQ(kvp_create(&cfg, arena, bytes, &c), KVP_OK);
    unsetenv("KVP_PAR_WORK");
    long other = -1;
    std::thread t([&] { other = allocations_during_workload(c, 2); });
    t.join();
    EXPECT_EQ(other, 0) << "calls from a second host thread";

    // Two host threads alternate: each decode step runs on the other thread than the last.
    static float q[8 * 64], k[4 * 64], v[4 * 64], o[8 * 64];
    ref::Rng rng(9);
    for (float &x : q) x = rng.uniform(-1, 1);
    for (float &x : k) x = rng.uniform(-1, 1);
    for (float &x : v) x = rng.uniform(-1, 1);
    // Both players wait for `go`, set once both threads exist: creating a std::thread allocates
    // (its state object, glibc's TLS vector) on the creating thread, and the counter is
    // process-wide, so a player measuring while the other is still being created would count
    // the test's own allocations (seen under qemu, where a decode step is slow enough to overlap).
    std::atomic<int> turn{0};
    std::atomic<long> allocs{0};
    std::atomic<bool> failed{false}, go{false};
    auto player = [&](int me) {
        while (!go.load()) std::this_thread::yield();
        for (int step = 0; step < 200; ++step) {
            while (turn.load() % 2 != me) std::this_thread::yield();
            const long before = g_allocs.load();
            for (uint32_t l = 0; l < 2; ++l)
                if (kvp_decode(c, l, q, k, v, o) != KVP_OK) failed = true;
            allocs += g_allocs.load() - before;
            turn.fetch_add(1);
        }
    };
    std::thread a(player, 0), b(player, 1);
    go = true;
    a.join();
    b.join();
    EXPECT_FALSE(failed.load());
    EXPECT_EQ(allocs.load(), 0) << "calls alternating between two host threads";
    kvp_destroy(c);
    __libc_free(arena);
}

#if defined(_OPENMP)
// ... and whatever OpenMP teams the host runs between calls (libgomp resizes its pool for a
// team of another size; in the library it allocated on the next call).
TEST(NoAllocation, AfterHostOpenMpTeamsOfOtherSizes) {
    setenv("KVP_PAR_WORK", "0", 1);
    kvp_config cfg = config("policy=h2o budget=120 recent=16 capacity=260 threads=2");
    const size_t bytes = kvp_arena_size(&cfg);
    void *arena = __libc_memalign(64, bytes);
    kvp_cache *c = nullptr;
    ASSERT_EQ(kvp_create(&cfg, arena, bytes, &c), KVP_OK);
    unsetenv("KVP_PAR_WORK");
    for (int team : {3, 1, 4}) {
        std::atomic<int> ran{0};
#pragma omp parallel num_threads(team)
        { ran.fetch_add(1); }
        EXPECT_EQ(ran.load(), team);
        EXPECT_EQ(allocations_during_workload(c, 2), 0) << "after a host OpenMP team of " << team;
    }
    kvp_destroy(c);
    __libc_free(arena);
}
#endif

TEST(NoAllocation, NullArenaAllocatesExactlyOnceInCreate) {
    kvp_config cfg = config("policy=window window=250 threads=1");
    kvp_cache *c = nullptr;
    const long before = g_allocs.load();
    ASSERT_EQ(kvp_create(&cfg, nullptr, 0, &c), KVP_OK);
    EXPECT_EQ(g_allocs.load() - before, 1);
    EXPECT_EQ(allocations_during_workload(c, 2), 0);
    kvp_destroy(c);
}

TEST(NoAllocation, CounterSeesAllocations) {  // the counting itself works
    const long before = g_allocs.load();
    void *volatile p = malloc(16);
    free(p);
    std::string *s = new std::string(100, 'x');
    delete s;
    EXPECT_GE(g_allocs.load() - before, 2);
}

}  // namespace
