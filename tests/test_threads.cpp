// Worker threads (src/threads.h) and the parallel schedules of src/cache.cpp:
//   - the pool: every participant id runs at most once per job, the caller always, workers do
//     join, many jobs back to back, idle workers use no CPU, kvp_destroy joins them;
//   - bit-identical outputs, kept positions and layer sparsity for threads = 1, 2, 3, with the
//     parallel paths forced on every call (KVP_PAR_WORK=0) and with the automatic choice, on
//     geometries with fewer KV heads than threads (split-K decode, tile-split prefill) and more
//     (one thread per head), over several split-K chunks, for full / window / streaming / h2o
//     (fused scores), original and realign positions, contiguous and gapped prefill positions;
//   - a long MQA decode (several chunks) against the double-precision reference.
#include <gtest/gtest.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <atomic>
#include <string>
#include <utility>
#include <vector>

#if KVP_THREADS
#include <pthread.h>
#endif
#if defined(__linux__)
#include <dirent.h>
#include <sys/resource.h>
#include <time.h>
#endif

#include "arena.h"
#include "cache.h"
#include "reference.h"
#include "threads.h"

namespace {

// ---- the pool ---------------------------------------------------------------------------

struct PoolMem {
    void *mem = nullptr;
    kvp::ThreadPool *p = nullptr;
    explicit PoolMem(uint32_t threads) {
        const size_t n = kvp::pool_bytes(threads, false);
        mem = n ? aligned_alloc(64, (n + 63) / 64 * 64) : nullptr;
        int err = -1;
        p = kvp::pool_start(threads, false, mem, &err);
        EXPECT_EQ(err, 0);
    }
    ~PoolMem() {
        kvp::pool_stop(p);
        free(mem);
    }
};

struct Tally {
    std::atomic<uint32_t> ran[8];
    std::atomic<uint32_t> items{0};
    uint32_t nitems = 0;
    std::atomic<uint32_t> next{0};
    bool wait_for_worker = false;
    Tally() {
        for (auto &r : ran) r.store(0);
    }
};

void tally_fn(void *arg, uint32_t tid) {
    Tally &t = *static_cast<Tally *>(arg);
    t.ran[tid].fetch_add(1);
    if (tid == 0 && t.wait_for_worker) {  // the caller waits (bounded) until a worker joined
        for (int i = 0; i < 2000000 && t.ran[1].load() + t.ran[2].load() + t.ran[3].load() == 0; ++i) {
#if defined(__linux__)
            timespec ts{0, 1000};
            nanosleep(&ts, nullptr);
#endif
        }
    }
    for (;;) {
        const uint32_t i = t.next.fetch_add(1);
        if (i >= t.nitems) return;
        t.items.fetch_add(1);
    }
}

#if KVP_THREADS
TEST(Pool, EveryParticipantAtMostOnceAndAllItemsDone) {
    PoolMem pm(4);
    ASSERT_NE(pm.p, nullptr);
    for (int rep = 0; rep < 3000; ++rep) {
        const uint32_t k = 1 + uint32_t(rep) % 5;  // 5 > threads: clamped to 4
        Tally t;
        t.nitems = uint32_t(rep % 7) * 3;
        kvp::pool_run(pm.p, k, tally_fn, &t);
        EXPECT_EQ(t.ran[0].load(), 1u);
        for (uint32_t i = 1; i < 8; ++i) EXPECT_LE(t.ran[i].load(), i < (k < 4 ? k : 4) ? 1u : 0u) << i;
        EXPECT_EQ(t.items.load(), t.nitems);
    }
}

// pool_run reports the share of the call the caller spent waiting for participants after its
// own part: about 1 when a worker holds an item long after the caller is done, 0 alone.
void slow_worker_fn(void *arg, uint32_t tid) {
    std::atomic<int> &claimed = *static_cast<std::atomic<int> *>(arg);
    if (tid == 0) {  // wait (bounded) until the worker has started, then return at once
        for (int i = 0; i < 200000 && claimed.load() == 0; ++i) {
#if defined(__linux__)
            timespec ts{0, 1000};
            nanosleep(&ts, nullptr);
#endif
        }
        return;
    }
    claimed.store(1);
#if defined(__linux__)
    timespec ts{0, 100 * 1000 * 1000};
    nanosleep(&ts, nullptr);
#endif
}

TEST(Pool, ReportsTheCallersJoinWait) {
    PoolMem pm(2);
    ASSERT_NE(pm.p, nullptr);
    std::atomic<int> claimed{0};
    const double late = kvp::pool_run(pm.p, 2, slow_worker_fn, &claimed);
    ASSERT_EQ(claimed.load(), 1);
    EXPECT_GT(late, 0.3);  // 100 ms of waiting after however long the wake took
    Tally t;
    EXPECT_EQ(kvp::pool_run(pm.p, 1, tally_fn, &t), 0.0);
}

TEST(Pool, WorkersWakeAndJoin) {
    PoolMem pm(3);
    ASSERT_NE(pm.p, nullptr);
    for (int rep = 0; rep < 50; ++rep) {
        Tally t;
        t.wait_for_worker = true;
        t.nitems = 10;
        kvp::pool_run(pm.p, 3, tally_fn, &t);
        EXPECT_GE(t.ran[1].load() + t.ran[2].load(), 1u) << "no worker joined job " << rep;
        EXPECT_EQ(t.items.load(), 10u);
    }
}

#if defined(__linux__)
double cpu_seconds() {
    rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return double(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) + 1e-6 * double(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec);
}

size_t os_threads() {
    size_t n = 0;
    if (DIR *d = opendir("/proc/self/task")) {
        while (dirent *e = readdir(d))
            if (e->d_name[0] != '.') ++n;
        closedir(d);
    }
    return n;
}

// Between calls the workers sleep: a cache with 4 threads, idle for 300 ms after a busy call,
// uses (almost) no CPU; kvp_destroy joins its workers.
TEST(Pool, IdleWorkersSleepAndDestroyJoins) {
    const size_t before = os_threads();
    {
        const kvp_model m = ref::model(1, 8, 2, 64);
        ref::Cache c(m, "policy=full capacity=300 threads=4");
        ASSERT_NE(c.c, nullptr);
        EXPECT_EQ(os_threads(), before + 3);
        std::vector<float> q(200 * 8 * 64), k(200 * 2 * 64), v(k.size()), o(q.size());
        ref::Rng rng(5);
        rng.fill(q);
        rng.fill(k);
        rng.fill(v);
        c.c->par_work = 0;  // every call uses all threads
        ASSERT_EQ(kvp_prefill(c.c, 0, 200, nullptr, q.data(), k.data(), v.data(), o.data(), nullptr), KVP_OK);
        const double t0 = cpu_seconds();
        timespec ts{0, 300 * 1000 * 1000};
        nanosleep(&ts, nullptr);
        EXPECT_LT(cpu_seconds() - t0, 0.05) << "idle workers used CPU";
    }
    // kvp_destroy has joined its workers; a joined thread can still be listed in /proc for a
    // moment (the kernel, or qemu-user's emulation of it, wakes the joiner before the task is
    // gone), so wait up to 5 s for the listing to catch up.
    size_t now = os_threads();
    for (int i = 0; i < 500 && now != before; ++i) {
        timespec ts{0, 10 * 1000 * 1000};
        nanosleep(&ts, nullptr);
        now = os_threads();
    }
    EXPECT_EQ(now, before) << "workers still running after kvp_destroy";
}
#endif
#endif  // KVP_THREADS

// ---- bit-identical for every thread count --------------------------------------------------

struct Work {
    const char *name;
    uint32_t layers, nq, nkv, hd;
    kvp_rope_style rope;
    const char *spec;
    uint32_t prefill, decode;
    bool gapped;  // prefill positions 3t+1 (no call tables), decode after them
};

// The host's threads (thread_pool=host, kvp_set_parallel): parallel-fors a host could have.
struct HostPool {
    enum Kind { kNone, kReverse, kThreads } kind = kNone;
    std::atomic<uint32_t> calls{0};  // fn calls
    std::atomic<uint32_t> tasks{0};  // task calls
};
struct HostJob {
    HostPool *hp;
    void (*task)(void *, uint32_t);
    void *arg;
};
// One after another on the calling thread, the last t first (t 0, the caller's in the own pool,
// is not special: whoever runs first takes the items).
void host_reverse(void *user, uint32_t n, void (*task)(void *, uint32_t), void *arg) {
    HostPool &hp = *static_cast<HostPool *>(user);
    hp.calls.fetch_add(1);
    for (uint32_t t = n; t-- > 0;) {
        task(arg, t);
        hp.tasks.fetch_add(1);
    }
}
// t 1..n-1 on threads of their own (started per call), t 0 on the caller, joined before return.
void *host_thread_main(void *p) {
    auto *a = static_cast<std::pair<HostJob *, uint32_t> *>(p);
    a->first->task(a->first->arg, a->second);
    a->first->hp->tasks.fetch_add(1);
    return nullptr;
}
void host_threads(void *user, uint32_t n, void (*task)(void *, uint32_t), void *arg) {
    HostPool &hp = *static_cast<HostPool *>(user);
    hp.calls.fetch_add(1);
    HostJob job{&hp, task, arg};
    pthread_t th[8];
    std::pair<HostJob *, uint32_t> args[8];
    for (uint32_t t = 1; t < n; ++t) {
        args[t] = {&job, t};
        EXPECT_EQ(pthread_create(&th[t], nullptr, host_thread_main, &args[t]), 0);
    }
    task(arg, 0);
    hp.tasks.fetch_add(1);
    for (uint32_t t = 1; t < n; ++t) pthread_join(th[t], nullptr);
}

// Outputs, kept positions of every (layer, KV head) and each layer's sparsity, as bytes.
// With a host pool: thread_pool=host and its function (kNone: none set, the caller alone).
std::vector<uint8_t> run_work(const Work &w, uint32_t threads, bool force, HostPool *host = nullptr) {
    ref::ForceParallel fp(force);
    const kvp_model m = ref::model(w.layers, w.nq, w.nkv, w.hd, w.rope);
    ref::Cache c(m, std::string(w.spec) + " threads=" + std::to_string(threads) + (host ? " thread_pool=host" : ""));
    std::vector<uint8_t> all;
    if (!c.c) return all;
    if (host && host->kind != HostPool::kNone) {
        EXPECT_EQ(kvp_set_parallel(c.c, host->kind == HostPool::kReverse ? host_reverse : host_threads, host), KVP_OK);
    }
    auto put = [&](const void *p, size_t n) {
        const uint8_t *b = static_cast<const uint8_t *>(p);
        all.insert(all.end(), b, b + n);
    };
    const uint32_t T = w.prefill + w.decode, qd = w.nq * w.hd, kd = w.nkv * w.hd;
    std::vector<float> q(size_t(T) * qd), k(size_t(T) * kd), v(size_t(T) * kd), out(q.size());
    ref::Rng rng(w.hd * 7 + w.nkv);
    rng.fill(q, -1.5f, 1.5f);
    rng.fill(k, -1.5f, 1.5f);
    rng.fill(v);
    std::vector<int32_t> pos(w.prefill);
    for (uint32_t t = 0; t < w.prefill; ++t) pos[t] = int32_t(w.gapped ? 3 * t + 1 : t);
    for (uint32_t l = 0; l < w.layers; ++l) {
        EXPECT_EQ(kvp_prefill(c.c, l, w.prefill, pos.data(), q.data(), k.data(), v.data(), out.data(), nullptr), KVP_OK)
            << w.name << ": " << kvp_last_error(c.c);
        put(out.data(), size_t(w.prefill) * qd * sizeof(float));
    }
    for (uint32_t t = w.prefill; t < T; ++t)
        for (uint32_t l = 0; l < w.layers; ++l) {
            EXPECT_EQ(kvp_decode(c.c, l, &q[size_t(t) * qd], &k[size_t(t) * kd], &v[size_t(t) * kd], out.data()), KVP_OK)
                << w.name << ": " << kvp_last_error(c.c);
            put(out.data(), size_t(qd) * sizeof(float));
        }
    for (uint32_t l = 0; l < w.layers; ++l) {
        for (uint32_t h = 0; h < w.nkv; ++h) {
            const std::vector<int32_t> p = c.positions(l, h);
            put(p.data(), p.size() * sizeof(int32_t));
        }
        kvp_layer_stats ls;
        ls.struct_size = sizeof ls;
        EXPECT_EQ(kvp_get_layer_stats(c.c, l, &ls), KVP_OK);
        put(&ls.sparsity, sizeof ls.sparsity);
    }
    return all;
}

// head_dim 128: split-K chunks of 256 tokens; 64: 512 tokens. Prefills of 280-540 tokens and
// the decodes after them attend over 2 chunks per head (sizes kept small: the suite also runs
// under qemu).
const Work kWorks[] = {
    {"mqa_full", 2, 8, 1, 128, KVP_ROPE_NEOX, "policy=full capacity=360", 300, 30, false},
    {"mqa_full_gapped", 1, 4, 1, 128, KVP_ROPE_GPTJ, "policy=full capacity=360", 290, 20, true},
    {"mqa_h2o", 2, 8, 1, 128, KVP_ROPE_NEOX, "policy=h2o budget=270 recent=16 capacity=300", 290, 40, false},
    {"mqa_h2o_realign", 1, 8, 1, 128, KVP_ROPE_GPTJ,
     "policy=h2o budget=260 recent=8 capacity=300 positions=realign", 280, 50, false},
    {"mqa_streaming", 1, 4, 1, 128, KVP_ROPE_NEOX, "policy=streaming sinks=4 window=280 compress_every=8", 290, 40, false},
    {"kv2_window", 2, 8, 2, 64, KVP_ROPE_GPTJ, "policy=window window=560", 540, 30, false},
    {"kv4_h2o", 1, 8, 4, 32, KVP_ROPE_NEOX, "policy=h2o budget=200 recent=8 capacity=260", 220, 40, false},
    // As many KV heads as threads or more: decode claims whole heads and takes their chunks in
    // order, a participant with no head left moves the back half of another's chunks into its
    // own range (3 chunks per head here, so threads 2 and 3 both steal).
    {"kv4_window_chunks", 1, 4, 4, 128, KVP_ROPE_NEOX, "policy=window window=600", 540, 24, false},
    {"kv4_h2o_chunks", 1, 8, 4, 128, KVP_ROPE_GPTJ, "policy=h2o budget=300 recent=16 capacity=340", 320,
     30, false},
    // The other features on the parallel paths: score=fixed (split-K decode scores at the merge,
    // split prefill observes in fixed point), snapkv's staged prompt and formatted storage (their
    // heads run whole on one thread; decode after them splits where the storage is f32).
    {"mqa_h2o_fixed", 1, 8, 1, 128, KVP_ROPE_NEOX,
     "policy=h2o budget=270 recent=16 capacity=300 score=fixed", 290, 20, false},
    {"mqa_snapkv_realign", 1, 8, 1, 128, KVP_ROPE_GPTJ,
     "policy=snapkv budget=200 obs_window=16 capacity=300 positions=realign", 280, 30, false},
    {"kv2_pyramidkv_fixed", 2, 4, 2, 32, KVP_ROPE_NEOX,
     "policy=pyramidkv budget=100 obs_window=8 capacity=200 score=fixed", 160, 20, false},
    {"mqa_h2o_q8", 1, 4, 1, 128, KVP_ROPE_NEOX,
     "policy=h2o budget=270 recent=16 capacity=300 kv_dtype=q8", 290, 20, false},
    {"kv2_think_q4", 1, 4, 2, 32, KVP_ROPE_GPTJ,
     "policy=think token_policy=h2o budget=150 recent=16 capacity=200 key_channel_ratio=0.5 kv_dtype=q4", 180, 20,
     false},
    {"kv2_lethe", 1, 4, 2, 32, KVP_ROPE_NEOX, "policy=lethe capacity=200 evict_threshold=40 sparse_ratio=3", 180, 30,
     false},
    // simlayerkv: the first decode observes (never split), then lazy layers stream
    {"mqa_simlayerkv_decode", 2, 8, 1, 128, KVP_ROPE_NEOX,
     "policy=simlayerkv sinks=4 window=60 capacity=300 lazy_mode=decode lazy_threshold=0.05", 280, 20, false},
    {"kv2_simlayerkv_h2o", 2, 4, 2, 32, KVP_ROPE_GPTJ,
     "policy=simlayerkv nonlazy=h2o budget=120 recent=8 capacity=200 sinks=4 window=40 lazy_last=8 lazy_force=1", 180, 30,
     false},
    // simlayerkv over snapkv's staged prompt with q8 storage: layer 0 lazy (trimmed), layer 1 snapkv
    {"kv2_simlayerkv_snapkv_q8", 2, 4, 2, 32, KVP_ROPE_GPTJ,
     "policy=simlayerkv nonlazy=snapkv budget=100 obs_window=8 recent=8 capacity=160 sinks=4 window=40 lazy_force=1 "
     "kv_dtype=q8 quant_group=16",
     180, 30, false},
};

TEST(Threads, SameBitsForEveryThreadCountAndSchedule) {
    for (const Work &w : kWorks) {
        const std::vector<uint8_t> base = run_work(w, 1, false);
        ASSERT_FALSE(base.empty()) << w.name;
        for (uint32_t threads : {1u, 2u, 3u})
            for (bool force : {false, true}) {
                if (threads == 1 && !force) continue;
                const std::vector<uint8_t> r = run_work(w, threads, force);
                ASSERT_EQ(r.size(), base.size()) << w.name;
                EXPECT_EQ(memcmp(r.data(), base.data(), r.size()), 0)
                    << w.name << ": threads=" << threads << (force ? " (forced parallel)" : " (automatic)");
            }
    }
}

#if KVP_THREADS
// thread_pool=host: the same bits with the host's parallel-for (its threads, or every task in a
// row from the last t down) as with the own workers and with one thread; without a function the
// caller runs alone. Every forced call with threads > 1 goes through the host's function, which
// runs each t once.
TEST(Threads, HostPoolSameBits) {
    for (const Work &w : kWorks) {
        const std::vector<uint8_t> base = run_work(w, 1, false);
        ASSERT_FALSE(base.empty()) << w.name;
        for (uint32_t threads : {2u, 3u})
            for (HostPool::Kind kind : {HostPool::kNone, HostPool::kReverse, HostPool::kThreads}) {
                HostPool hp;
                hp.kind = kind;
                const std::vector<uint8_t> r = run_work(w, threads, true, &hp);
                ASSERT_EQ(r.size(), base.size()) << w.name;
                EXPECT_EQ(memcmp(r.data(), base.data(), r.size()), 0)
                    << w.name << ": threads=" << threads << " host kind " << int(kind);
                // One KV head whose calls are never split (formatted storage; snapkv's decode
                // observes): every call has one participant, in the own pool too.
                const bool alone = w.nkv == 1 && (strstr(w.spec, "kv_dtype") || strstr(w.spec, "snapkv"));
                if (kind == HostPool::kNone || alone) {
                    EXPECT_EQ(hp.calls.load(), 0u) << w.name;
                } else {
                    EXPECT_GT(hp.calls.load(), 0u) << w.name << ": the host's function was never called";
                    EXPECT_GE(hp.tasks.load(), 2 * hp.calls.load()) << w.name;
                    EXPECT_LE(hp.tasks.load(), threads * hp.calls.load()) << w.name;
                }
            }
    }
}

#if defined(__linux__)
// thread_pool=host starts no thread; kvp_set_parallel(NULL) gives an own pool its workers back.
TEST(Threads, HostPoolStartsNoThreadAndNullRestores) {
    const size_t before = os_threads();
    const kvp_model m = ref::model(1, 8, 2, 64);
    {
        ref::Cache c(m, "policy=full capacity=300 threads=4 thread_pool=host");
        ASSERT_NE(c.c, nullptr);
        EXPECT_EQ(os_threads(), before);
    }
    ref::Cache own(m, "policy=full capacity=300 threads=3"), host(m, "policy=full capacity=300 threads=3 thread_pool=host");
    ASSERT_NE(own.c, nullptr);
    ASSERT_NE(host.c, nullptr);
    EXPECT_LT(host.bytes, own.bytes);  // no thread handles in the arena
    HostPool hp;
    ASSERT_EQ(kvp_set_parallel(own.c, host_reverse, &hp), KVP_OK);
    std::vector<float> q(100 * 8 * 64), k(100 * 2 * 64), v(k.size()), o(q.size());
    ref::Rng rng(9);
    rng.fill(q);
    rng.fill(k);
    rng.fill(v);
    own.c->par_work = 0;
    ASSERT_EQ(kvp_prefill(own.c, 0, 50, nullptr, q.data(), k.data(), v.data(), o.data(), nullptr), KVP_OK);
    EXPECT_EQ(hp.calls.load(), 1u);
    ASSERT_EQ(kvp_set_parallel(own.c, nullptr, &hp), KVP_OK);  // the own workers again
    ASSERT_EQ(kvp_prefill(own.c, 0, 50, nullptr, q.data() + 50 * 8 * 64, k.data() + 50 * 2 * 64, v.data() + 50 * 2 * 64,
                          o.data(), nullptr),
              KVP_OK);
    EXPECT_EQ(hp.calls.load(), 1u);
    // kept across kvp_reset
    ASSERT_EQ(kvp_set_parallel(host.c, host_reverse, &hp), KVP_OK);
    ASSERT_EQ(kvp_reset(host.c), KVP_OK);
    host.c->par_work = 0;
    ASSERT_EQ(kvp_prefill(host.c, 0, 50, nullptr, q.data(), k.data(), v.data(), o.data(), nullptr), KVP_OK);
    EXPECT_EQ(hp.calls.load(), 2u);
}
#endif

TEST(Threads, SetParallelRefusals) {
    EXPECT_EQ(kvp_set_parallel(nullptr, host_reverse, nullptr), KVP_ERR_ARG);
    const kvp_model m = ref::model(1, 4, 2, 32);
    kvp_config cfg;
    ASSERT_EQ(kvp_config_default(&cfg, &m), KVP_OK);
    char err[256];
    EXPECT_EQ(kvp_config_apply(&cfg, "thread_pool=theirs", err, sizeof err), KVP_ERR_CONFIG);
    EXPECT_NE(std::string(err).find("own|host"), std::string::npos) << err;
    EXPECT_EQ(cfg.thread_pool, uint32_t(KVP_THREAD_POOL_OWN));
    ASSERT_EQ(kvp_config_apply(&cfg, "thread_pool=host threads=2", err, sizeof err), KVP_OK) << err;
    std::vector<uint8_t> arena(kvp_arena_size(&cfg) + 64);
    void *a = reinterpret_cast<void *>((reinterpret_cast<uintptr_t>(arena.data()) + 63) / 64 * 64);
    kvp_cache *c = nullptr;
    ASSERT_EQ(kvp_create(&cfg, a, kvp_arena_size(&cfg), &c), KVP_OK);
    EXPECT_EQ(kvp_set_parallel(c, host_reverse, nullptr), KVP_OK);
    kvp_destroy(c);
    EXPECT_EQ(kvp_set_parallel(c, host_reverse, nullptr), KVP_ERR_STATE);  // destroyed, memory still ours
}
#endif  // KVP_THREADS

// A decode over several split-K chunks (MQA, 32 query heads on one KV head, 1100 tokens = 5
// chunks at head_dim 128) against the double-precision reference, with 1 and 3 threads, for
// f32, f16 and q8 storage.
TEST(Threads, LongMqaDecodeMatchesReference) {
    const uint32_t nq = 32, hd = 128, T = 1100;
    const kvp_model m = ref::model(1, nq, 1, hd, KVP_ROPE_NEOX);
    std::vector<float> q(size_t(T) * nq * hd), k(size_t(T) * hd), v(size_t(T) * hd), out(size_t(nq) * hd);
    ref::Rng rng(11);
    rng.fill(q, -1.0f, 1.0f);
    rng.fill(k, -1.0f, 1.0f);
    rng.fill(v);
    std::vector<uint32_t> idx(T);
    std::vector<int64_t> kpos(T);
    for (uint32_t j = 0; j < T; ++j) idx[j] = j, kpos[j] = j;
    std::vector<double> expect;
    ref::attend(m, &q[size_t(T - 1) * nq * hd], T - 1, k.data(), v.data(), idx, kpos, expect);
    // Formatted storage too: split-K chunks through the stored-format kernels (one thread runs
    // them), within the bounds test_quant states per kv_dtype.
    const struct {
        const char *dtype;
        double bound;
    } fmts[] = {{"f32", 1e-5}, {"f16", 5e-4}, {"q8", 6e-3}};
    for (const auto &f : fmts)
    for (uint32_t threads : {1u, 3u}) {
        SCOPED_TRACE(f.dtype);
        ref::ForceParallel fp(threads > 1);
        ref::Cache c(m, std::string("policy=full capacity=1200 kv_dtype=") + f.dtype + " threads=" + std::to_string(threads));
        ASSERT_EQ(kvp_append(c.c, 0, T - 1, nullptr, k.data(), v.data()), KVP_OK);
        ASSERT_EQ(kvp_decode(c.c, 0, &q[size_t(T - 1) * nq * hd], &k[size_t(T - 1) * hd], &v[size_t(T - 1) * hd],
                             out.data()),
                  KVP_OK);
        double worst = 0;
        for (size_t i = 0; i < expect.size(); ++i) worst = std::max(worst, fabs(expect[i] - double(out[i])));
        EXPECT_LT(worst, f.bound) << "threads=" << threads;
    }
}

// The split-K granule depends on the row stride only (never on the thread count).
TEST(Threads, GranuleFromGeometry) {
    EXPECT_EQ(kvp::decode_granule(128), 256u);
    EXPECT_EQ(kvp::decode_granule(64), 512u);
    EXPECT_EQ(kvp::decode_granule(32), 1024u);
    EXPECT_EQ(kvp::decode_granule(16), 2048u);
    EXPECT_EQ(kvp::decode_granule(1024), 64u);
}

}  // namespace
