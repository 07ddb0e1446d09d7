// C API contract: status codes and strings, config defaults/apply/check, arena sizing and
// creation, and bad input: every failed call returns its status, names the problem, and
// leaves the cache exactly as it was (length, positions, and the next valid call's output).
#include <gtest/gtest.h>
#include <math.h>
#include <string.h>

#include <functional>
#include <fstream>
#include <string>
#include <vector>
#if defined(__linux__)
#include <sys/mman.h>
#endif

#include "reference.h"

namespace {

kvp_config base_config(const char *spec = "") {
    const kvp_model m = ref::model(2, 4, 2, 32);
    kvp_config cfg;
    EXPECT_EQ(kvp_config_default(&cfg, &m), KVP_OK);
    char err[256];
    EXPECT_EQ(kvp_config_apply(&cfg, spec, err, sizeof err), KVP_OK) << err;
    return cfg;
}

TEST(Capi, VersionAndStatusStrings) {
    EXPECT_EQ(kvp_version(), uint32_t(KVP_VERSION));
    EXPECT_EQ(kvp_version() >> 16, uint32_t(KVP_VERSION_MAJOR));
    for (int s = 0; s <= 8; ++s) {
        const char *str = kvp_status_str(kvp_status(s));
        ASSERT_NE(str, nullptr);
        EXPECT_EQ(strncmp(str, "KVP_", 4), 0) << s;
    }
    EXPECT_NE(strstr(kvp_status_str(KVP_ERR_FULL), "FULL"), nullptr);
    EXPECT_NE(kvp_status_str(kvp_status(99)), nullptr);
}

TEST(Config, DefaultsAndGeometryErrors) {
    kvp_config cfg;
    kvp_model m = ref::model(2, 4, 2, 32);
    EXPECT_EQ(kvp_config_default(nullptr, &m), KVP_ERR_ARG);
    EXPECT_EQ(kvp_config_default(&cfg, nullptr), KVP_ERR_ARG);
    ASSERT_EQ(kvp_config_default(&cfg, &m), KVP_OK);
    EXPECT_EQ(cfg.struct_size, sizeof(kvp_config));
    EXPECT_EQ(cfg.policy, KVP_POLICY_FULL);
    EXPECT_EQ(cfg.threads, 1u);
    EXPECT_EQ(cfg.sinks, 4u);
    EXPECT_FLOAT_EQ(cfg.sparse_ratio, 400.0f);
    const kvp_config before = cfg;
    kvp_model bad[] = {ref::model(0, 4, 2, 32), ref::model(2, 4, 3, 32), ref::model(2, 4, 2, 0),
                       ref::model(2, 4, 2, 32, KVP_ROPE_NEOX, 33), ref::model(2, 4, 2, 32, KVP_ROPE_GPTJ, 64),
                       ref::model(2, 4, 2, 32, KVP_ROPE_GPTJ, 0, 0.5f), ref::model(2, 4, 2, 32, kvp_rope_style(7))};
    for (const kvp_model &b : bad) EXPECT_EQ(kvp_config_default(&cfg, &b), KVP_ERR_CONFIG);
    EXPECT_EQ(memcmp(&cfg, &before, sizeof cfg), 0);
}

TEST(Config, ApplyParsesAndRejectsAllOrNothing) {
    kvp_config cfg = base_config();
    char err[256];
    ASSERT_EQ(kvp_config_apply(&cfg, "  policy=streaming\tsinks=2 window=100 compress_every=16 ", err, sizeof err), KVP_OK) << err;
    EXPECT_EQ(cfg.policy, KVP_POLICY_STREAMING);
    EXPECT_EQ(cfg.sinks, 2u);
    EXPECT_EQ(cfg.window, 100u);
    EXPECT_EQ(cfg.compress_every, 16u);
    // keys streaming ignores: in a spec without policy= (one with it refuses them, issue 28)
    ASSERT_EQ(kvp_config_apply(&cfg, " decay=0.75\tpool=avg", err, sizeof err), KVP_OK) << err;
    EXPECT_FLOAT_EQ(cfg.decay, 0.75f);
    EXPECT_EQ(cfg.pool, KVP_POOL_AVG);
    EXPECT_STREQ(err, "");
    ASSERT_EQ(kvp_config_apply(&cfg, "recent_ratio=3e-1 beta=+2.5E1", err, sizeof err), KVP_OK) << err;
    EXPECT_FLOAT_EQ(cfg.recent_ratio, 0.3f);
    EXPECT_FLOAT_EQ(cfg.beta, 25.0f);

    const kvp_config before = cfg;
    struct Bad {
        const char *spec;
        kvp_status st;
        const char *needle;
    } bad[] = {
        {"bogus=1", KVP_ERR_CONFIG, "bogus"},
        {"sinks=8 window=", KVP_ERR_CONFIG, "window"},
        {"window=-3", KVP_ERR_CONFIG, "window"},
        {"threads=0", KVP_ERR_CONFIG, "threads"},
        {"threads=99999999999", KVP_ERR_CONFIG, "threads"},
        {"decay=1.5", KVP_ERR_CONFIG, "decay"},
        {"decay=nan", KVP_ERR_CONFIG, "decay"},
        {"positions=sideways", KVP_ERR_CONFIG, "positions"},
        {"sinks", KVP_ERR_CONFIG, "sinks"},
        {"=4", KVP_ERR_CONFIG, "=4"},
        {"nonlazy=window", KVP_ERR_CONFIG, "nonlazy"},
        {"policy=think token_policy=think", KVP_ERR_CONFIG, "token_policy"},
        {"kv_dtype=q5", KVP_ERR_CONFIG, "kv_dtype"},
        {"quant_group=0", KVP_ERR_CONFIG, "quant_group"},
        {"key_channel_ratio=1", KVP_ERR_CONFIG, "key_channel_ratio"},
    };
    for (const Bad &b : bad) {
        err[0] = 'x';
        EXPECT_EQ(kvp_config_apply(&cfg, b.spec, err, sizeof err), b.st) << b.spec;
        EXPECT_NE(strstr(err, b.needle), nullptr) << b.spec << " -> " << err;
        EXPECT_EQ(memcmp(&cfg, &before, sizeof cfg), 0) << b.spec;  // unchanged
    }
    EXPECT_EQ(kvp_config_apply(nullptr, "sinks=1", err, sizeof err), KVP_ERR_ARG);
    EXPECT_EQ(kvp_config_apply(&cfg, nullptr, err, sizeof err), KVP_ERR_ARG);
    // err may be NULL or tiny: still NUL-terminated, never overrun
    EXPECT_EQ(kvp_config_apply(&cfg, "bogus=1", nullptr, 0), KVP_ERR_CONFIG);
    char tiny[4] = {'a', 'b', 'c', 'd'};
    EXPECT_EQ(kvp_config_apply(&cfg, "bogus=1", tiny, 3), KVP_ERR_CONFIG);
    EXPECT_EQ(tiny[2], '\0');
    EXPECT_EQ(tiny[3], 'd');
}

TEST(Config, CheckCatchesContradictions) {
    char err[256];
    // Contradictions are set field by field: kvp_config_apply refuses to produce them.
    kvp_config cfg = base_config("policy=window window=64");
    cfg.capacity = 64;  // needs window+1
    EXPECT_EQ(kvp_config_check(&cfg, err, sizeof err), KVP_ERR_CONFIG);
    EXPECT_NE(strstr(err, "window"), nullptr) << err;
    EXPECT_EQ(kvp_arena_size(&cfg), 0u);
    kvp_cache *c = nullptr;
    EXPECT_EQ(kvp_create(&cfg, nullptr, 0, &c), KVP_ERR_CONFIG);
    EXPECT_EQ(c, nullptr);

    cfg = base_config("policy=window window=100");
    cfg.capacity = 50;  // window > capacity
    EXPECT_EQ(kvp_config_check(&cfg, err, sizeof err), KVP_ERR_CONFIG);

    cfg = base_config("policy=streaming sinks=4 window=60 compress_every=8");
    cfg.capacity = 70;  // < C+R = 72
    EXPECT_EQ(kvp_config_check(&cfg, err, sizeof err), KVP_ERR_CONFIG);
    EXPECT_NE(strstr(err, "72"), nullptr) << err;
    cfg = base_config("policy=streaming sinks=4 window=60 compress_every=8 slack=20");
    cfg.capacity = 80;  // < H = 84
    EXPECT_EQ(kvp_config_check(&cfg, err, sizeof err), KVP_ERR_CONFIG);
    cfg = base_config("policy=streaming");
    cfg.sinks = cfg.window = cfg.extra = 0;
    EXPECT_EQ(kvp_config_check(&cfg, err, sizeof err), KVP_ERR_CONFIG);

    cfg = base_config("policy=streaming sinks=4 window=60 compress_every=8");  // auto capacity = 72
    EXPECT_EQ(kvp_config_check(&cfg, err, sizeof err), KVP_OK) << err;
    cfg.struct_size = 12;
    EXPECT_EQ(kvp_config_check(&cfg, err, sizeof err), KVP_ERR_ARG);
    EXPECT_EQ(kvp_config_check(nullptr, err, sizeof err), KVP_ERR_ARG);
    EXPECT_EQ(kvp_arena_size(nullptr), 0u);
    cfg = base_config();
    cfg.policy = kvp_policy(42);
    EXPECT_EQ(kvp_config_check(&cfg, err, sizeof err), KVP_ERR_CONFIG);
    cfg = base_config();
    const uint32_t garbage = 9;  // a C caller can store any int in an enum field
    memcpy(&cfg.pool, &garbage, sizeof garbage);
    EXPECT_EQ(kvp_config_check(&cfg, err, sizeof err), KVP_ERR_CONFIG);
    EXPECT_NE(strstr(err, "pool"), nullptr) << err;
    EXPECT_EQ(kvp_config_apply(&cfg, "sinks=3", err, sizeof err), KVP_ERR_CONFIG);  // apply validates the result too
    cfg = base_config();
    cfg.policy = KVP_POLICY_ASL;
    cfg.kv_dtype = KVP_DTYPE_Q8;  // a prompt-staging policy over formatted storage composes
    EXPECT_EQ(kvp_config_check(&cfg, err, sizeof err), KVP_OK) << err;
}

#if defined(__linux__)
// THPeligible of the mapping that holds addr (/proc/self/smaps): 1 or 0; -1 where not reported.
int thp_eligible(const void *addr) {
    std::ifstream f("/proc/self/smaps");
    const uintptr_t a = reinterpret_cast<uintptr_t>(addr);
    std::string line;
    bool in = false;
    while (std::getline(f, line)) {
        unsigned long long lo = 0, hi = 0;
        if (sscanf(line.c_str(), "%llx-%llx ", &lo, &hi) == 2) {  // a mapping's line (fields: "Name:")
            in = a >= lo && a < hi;
            continue;
        }
        if (in && line.rfind("THPeligible:", 0) == 0) return atoi(line.c_str() + 12);
    }
    return -1;
}
std::string thp_mode() {  // the bracketed word of the kernel's setting, "" where unreadable
    std::ifstream f("/sys/kernel/mm/transparent_hugepage/enabled");
    std::string s;
    std::getline(f, s);
    const size_t a = s.find('['), b = s.find(']');
    return a != std::string::npos && b > a ? s.substr(a + 1, b - a - 1) : "";
}
#endif

// kvp_arena_advise: NULL refused; the arena's bytes unchanged and a cache in it decodes as one
// in plain memory; on Linux, the whole 2 MiB pages inside the range become eligible for huge
// pages (smaps THPeligible), the partial ones around it do not (in the kernel's madvise mode),
// an unmapped range is refused, and an arena kvp_create allocates itself (from 2 MiB on) is
// advised too. Where the kernel (or an emulator) does not report the advice a direct madvise
// of the test's own is the control: the Linux checks are skipped when it shows nothing.
TEST(Arena, AdviseAsksForHugePages) {
    EXPECT_EQ(kvp_arena_advise(nullptr, 1 << 22), KVP_ERR_ARG);
    kvp_config cfg = base_config("capacity=100");
    const size_t n = kvp_arena_size(&cfg);
    std::vector<float> out[2];
    for (int advised = 0; advised < 2; ++advised) {
        void *mem = aligned_alloc(64, (n + 63) / 64 * 64);
        ASSERT_NE(mem, nullptr);
        memset(mem, 0x5a, n);
        if (advised) {
#if defined(__linux__)
            EXPECT_EQ(kvp_arena_advise(mem, n), KVP_OK);  // no whole 2 MiB page: nothing to do
#else
            EXPECT_EQ(kvp_arena_advise(mem, n), KVP_ERR_UNSUPPORTED);
#endif
            for (size_t i = 0; i < n; ++i) ASSERT_EQ(static_cast<unsigned char *>(mem)[i], 0x5a) << i;
        }
        kvp_cache *c = nullptr;
        ASSERT_EQ(kvp_create(&cfg, mem, n, &c), KVP_OK);
        const ref::Inputs in(cfg.model, 20, 3, 1.0f);
        out[advised].resize(size_t(20) * in.nq);
        for (uint32_t l = 0; l < cfg.model.n_layers; ++l)
            ASSERT_EQ(kvp_prefill(c, l, 20, nullptr, in.q.data(), in.k.data(), in.v.data(), out[advised].data(), nullptr), KVP_OK);
        kvp_destroy(c);
        free(mem);
    }
    EXPECT_EQ(memcmp(out[0].data(), out[1].data(), out[0].size() * sizeof(float)), 0);
#if defined(__linux__)
    const size_t M = size_t(2) << 20;
    char *map = static_cast<char *>(mmap(nullptr, 16 * M, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
    ASSERT_NE(map, MAP_FAILED);
    char *lo = reinterpret_cast<char *>((reinterpret_cast<uintptr_t>(map) + M - 1) & ~uintptr_t(M - 1));
    // [lo, lo + 2M): the control; [lo + 4M - 100, lo + 10M + 123): kvp_arena_advise, whose whole
    // pages are [lo + 4M, lo + 10M); lo + 12M: never advised
    ASSERT_EQ(madvise(lo, M, MADV_HUGEPAGE), 0);
    char *arena = lo + 4 * M - 100;
    for (size_t i = 0; i < 6 * M + 223; i += 4096) arena[i] = char(i >> 12);
    ASSERT_EQ(kvp_arena_advise(arena, 6 * M + 223), KVP_OK);
    for (size_t i = 0; i < 6 * M + 223; i += 4096) ASSERT_EQ(arena[i], char(i >> 12)) << i;
    const int control = thp_eligible(lo);
    if (control != 1) {
        munmap(map, 16 * M);
        GTEST_SKIP() << "huge-page advice not reported here (THPeligible " << control << ", mode '" << thp_mode() << "')";
    }
    EXPECT_EQ(thp_eligible(lo + 4 * M), 1);
    EXPECT_EQ(thp_eligible(lo + 10 * M - 1), 1);
    if (thp_mode() == "madvise") {
        EXPECT_EQ(thp_eligible(lo + 4 * M - 1), 0) << "the partial page before the range";
        EXPECT_EQ(thp_eligible(lo + 10 * M), 0) << "the partial page after it";
        EXPECT_EQ(thp_eligible(lo + 12 * M), 0);
    }
    ASSERT_EQ(munmap(lo + 12 * M, 2 * M), 0);
    if (madvise(lo + 12 * M, 2 * M, MADV_HUGEPAGE) != 0) {  // else advice is ignored here (an emulator)
        EXPECT_EQ(kvp_arena_advise(lo + 12 * M, 2 * M), KVP_ERR_UNSUPPORTED) << "unmapped: refused";
    }
    munmap(map, 12 * M + (lo - map));
    // the library's own arena (kvp_create with NULL): 2 MiB boundaries, advised
    kvp_config big = base_config("capacity=8000");
    ASSERT_GE(kvp_arena_size(&big), 2 * M);
    kvp_cache *c = nullptr;
    ASSERT_EQ(kvp_create(&big, nullptr, 0, &c), KVP_OK);
    const uintptr_t at = reinterpret_cast<uintptr_t>(c) & ~uintptr_t(1);  // the handle: the arena, tagged
    EXPECT_EQ(at % M, 0u);
    EXPECT_EQ(thp_eligible(reinterpret_cast<void *>(at)), 1);
    kvp_destroy(c);
#endif
}

// tflite-micro style: the arena's size is pinned, so a layout change is a visible decision.
// 2 layers x 2 KV heads, head_dim 32 (stride 32), full policy, capacity 100, block 16:
//   each (layer, head) needs ceil(100/16) = 7 blocks, so each KV head's pool has 14 blocks = 224
//   slots: K+V 224 x 2 x 128 B = 57344, pos/rot/score 3 x 896 -> 60032 B per pool, 120064 for 2 (one slot space, pool.h);
//   fixed part: cache object 960, layer states 256, head stores 448, block tables 128, home
//   ranges + reservations 128, pool structs 256, pool free lists + dead counts + block
//   sequence numbers 512 (3 arrays over both pools' 28 blocks, 3 x 128, and per pool its
//   free-stack tops and held counts, 2 x 64), RoPE
//   frequencies 128, RoPE tables of a call's positions (original positions: min(capacity, 512)
//   tables of 16 pairs) 100 x 128 = 12800,
//   one RoPE memo 320: 15936 (threads=1: no worker threads, no pool region);
//   one thread's scratch: RoPE tables 32 x 32 floats = 4096, runs (100+7+1) x 24 -> 2624,
//   attention work = the prefill tile (8 rows: 2 x 256 + 1024 + 2 x 16 floats) 6272, decode
//   partials of one split-K chunk (granule 1024 tokens at stride 32; m, l, sumsq of 2 rows padded
//   to 16 floats + 2 x 32 output floats) 320, decode query rows 2 x 32 floats 256: 13568.
//   Total 120064 + 15936 + 13568 = 149568, plus 384 B of metadata in the cache object, layer
//   states and pool structs for prompt staging, fixed-point scores, the storage-format pointer,
//   live-byte counters and the owned-cache list, and (issue 9, layer-level policies) +64 B of
//   layer states (the first-decode observation flag) and +128 B of head stores (the per-head
//   values a policy hands to its layer phase), and (issue 28: kvp_config's max_new and
//   prompt_scores, 8 B more in the cache object, which its 64-byte rounding shows on 64-bit
//   targets only) +64 B: 150144 on 64-bit targets; on 32-bit ones, with smaller pointers in the
//   fixed part, 149632, and (issue 32: kvp_config's seed, keep_prompt, tri_mode and tri_stats,
//   16 B more in the cache object, whose 64-byte rounding shows on 32-bit targets only) +64 B:
//   149696; and (issue 32, the pools' one slot space, pool.h) each pool's first block id, which
//   fits the 64-bit pool struct's padding, +64 B of pool structs on 32-bit targets: 149760.
TEST(Arena, SizeIsExactAndPinned) {
    kvp_config cfg = base_config("capacity=100");
    const size_t n = kvp_arena_size(&cfg);
    EXPECT_EQ(n, sizeof(void *) == 8 ? 150144u : 149760u);  // 32-bit targets: smaller pointers in the fixed part
    kvp_config cfg2 = base_config("capacity=164");
    // 4 more blocks (64 slots) per (layer, head): 4 x 64 x (256 B of K+V + 4 B each of pos, rot,
    // score); the block tables (+64), the free-list links, dead counts and sequence numbers (one
    // array of each over both pools' 28 -> 44 blocks: 3 x (192 - 128)), the run list (+66 runs
    // x 24 -> +1600) and the RoPE call tables (+64 x 128) grow with them; the attention scratch
    // is unchanged.
    EXPECT_EQ(kvp_arena_size(&cfg2) - n, 4u * 64 * (256 + 12) + 64 + 3 * 64 + 1600 + 64 * 128);
    // Threads: each thread beyond the first adds its scratch (13568 B above), its RoPE memo and
    // a thread handle; from 2 threads on, the worker pool's object and one split area per KV head
    // (arena.h head_area_plan: runs 2624 + one split-K chunk's partials 320 = 2944 B, as a
    // decode's chunks may run on any thread; no logits there, as full does not score decode).
    kvp_config cfg2t = base_config("capacity=100 threads=2"), cfg3 = base_config("capacity=100 threads=3");
    const size_t t2 = kvp_arena_size(&cfg2t), t3 = kvp_arena_size(&cfg3);
    EXPECT_GT(t3, t2);
    const size_t once = (t2 - n) - (t3 - t2);  // what the second thread adds beyond what the third does
    if (sizeof(void *) == 8) {
        EXPECT_EQ(once, 2u * 2944 + 320);  // + the pool object, 320 B on 64-bit targets
    } else {
        EXPECT_GE(once, 2u * 2944);
        EXPECT_LT(once, 2u * 2944 + 512);
    }
    // A policy that scores decode (h2o) keeps each head's logits there too: 2 rows x 112 floats.
    kvp_config h1 = base_config("policy=h2o budget=90 capacity=100");
    kvp_config h2 = base_config("policy=h2o budget=90 capacity=100 threads=2");
    kvp_config h3 = base_config("policy=h2o budget=90 capacity=100 threads=3");
    const size_t s1 = kvp_arena_size(&h1), s2 = kvp_arena_size(&h2), s3 = kvp_arena_size(&h3);
    EXPECT_EQ(((s2 - s1) - (s3 - s2)) - once, 2u * 896);
    // thread_pool=host: no thread handles (the host's threads run the calls), the rest the same
    kvp_config x3 = base_config("capacity=100 threads=3 thread_pool=host");
    if (sizeof(void *) == 8) {
        EXPECT_EQ(t3 - kvp_arena_size(&x3), KVP_THREADS ? 64u : 0u);  // 2 x 8 B, 64-aligned
    }

    std::vector<char> mem(n + 128);
    char *aligned = mem.data() + (64 - reinterpret_cast<uintptr_t>(mem.data()) % 64) % 64;
    kvp_cache *c = nullptr;
    EXPECT_EQ(kvp_create(&cfg, aligned, n - 1, &c), KVP_ERR_ARENA);
    EXPECT_EQ(kvp_create(&cfg, aligned + 8, n, &c), KVP_ERR_ARENA);  // misaligned
    EXPECT_EQ(c, nullptr);
    EXPECT_EQ(kvp_create(nullptr, aligned, n, &c), KVP_ERR_ARG);
    EXPECT_EQ(kvp_create(&cfg, aligned, n, nullptr), KVP_ERR_ARG);
    ASSERT_EQ(kvp_create(&cfg, aligned, n, &c), KVP_OK);
    kvp_stats s;
    s.struct_size = sizeof s;
    ASSERT_EQ(kvp_get_stats(c, &s), KVP_OK);
    EXPECT_EQ(s.arena_bytes, n);
    EXPECT_EQ(s.live_bytes, 0u);
    kvp_destroy(c);
    // destroyed handle in still-readable caller memory
    EXPECT_EQ(kvp_reset(c), KVP_ERR_STATE);
    EXPECT_NE(strstr(kvp_last_error(c), "destroyed"), nullptr);
    kvp_destroy(nullptr);
}

TEST(Arena, NullArenaAllocatesOnce) {
    kvp_config cfg = base_config("policy=streaming sinks=4 window=28");
    kvp_cache *c = nullptr;
#if KVP_NO_HEAP
    EXPECT_EQ(kvp_create(&cfg, nullptr, 0, &c), KVP_ERR_UNSUPPORTED);
#else
    ASSERT_EQ(kvp_create(&cfg, nullptr, 0, &c), KVP_OK);
    std::vector<float> q(4 * 32, 0.5f), kv(2 * 32, 0.25f), o(q.size());
    for (int t = 0; t < 40; ++t) ASSERT_EQ(kvp_decode(c, 1, q.data(), kv.data(), kv.data(), o.data()), KVP_OK);
    EXPECT_EQ(kvp_layer_len(c, 1), 32u);
    kvp_destroy(c);
#endif
}

// Bad input on a live cache: each failing call gets its status and message, and afterwards the
// cache behaves bit for bit like a twin that never saw the failed calls.
TEST(BadInput, FailedCallsLeaveTheCacheUnchanged) {
    const kvp_model m = ref::model(2, 4, 2, 32);
    const std::string spec = "policy=streaming sinks=2 window=10 compress_every=3 capacity=16";
    ref::Cache a(m, spec), twin(m, spec);
    std::vector<float> q(4 * 32), k(2 * 32), v(2 * 32), o(4 * 32), o2(4 * 32);
    ref::Rng rng(5);
    auto step_both = [&]() {
        rng.fill(q);
        rng.fill(k);
        rng.fill(v);
        for (uint32_t l = 0; l < 2; ++l) {
            ASSERT_EQ(kvp_decode(a.c, l, q.data(), k.data(), v.data(), o.data()), KVP_OK);
            ASSERT_EQ(kvp_decode(twin.c, l, q.data(), k.data(), v.data(), o2.data()), KVP_OK);
            ASSERT_EQ(memcmp(o.data(), o2.data(), o.size() * sizeof(float)), 0);
        }
    };
    for (int t = 0; t < 16; ++t) step_both();  // C = 12, R = 3: pruned at 15 tokens, now 13 kept

    std::vector<float> bad = q;
    bad[17] = NAN;
    std::vector<float> inf = k;
    inf[3] = -INFINITY;
    const int32_t back[2] = {5, 6}, dup[2] = {20, 20}, neg[1] = {-1};
    int32_t pos_buf[64];
    uint32_t n = 0;
    kvp_stats st;
    st.struct_size = 4;
    struct Case {
        const char *what;
        std::function<kvp_status()> call;
        kvp_status want;
        const char *needle;
    } cases[] = {
        {"decode NULL cache", [&] { return kvp_decode(nullptr, 0, q.data(), k.data(), v.data(), o.data()); }, KVP_ERR_ARG, nullptr},
        {"decode NULL q", [&] { return kvp_decode(a.c, 0, nullptr, k.data(), v.data(), o.data()); }, KVP_ERR_ARG, "NULL"},
        {"decode NULL out", [&] { return kvp_decode(a.c, 0, q.data(), k.data(), v.data(), nullptr); }, KVP_ERR_ARG, "NULL"},
        {"decode NULL v", [&] { return kvp_decode(a.c, 0, q.data(), k.data(), nullptr, o.data()); }, KVP_ERR_ARG, "NULL"},
        {"decode bad layer", [&] { return kvp_decode(a.c, 2, q.data(), k.data(), v.data(), o.data()); }, KVP_ERR_LAYER, "layer 2"},
        {"decode NaN q", [&] { return kvp_decode(a.c, 0, bad.data(), k.data(), v.data(), o.data()); }, KVP_ERR_NONFINITE, "q[17]"},
        {"decode Inf k", [&] { return kvp_decode(a.c, 1, q.data(), inf.data(), v.data(), o.data()); }, KVP_ERR_NONFINITE, "k[3]"},
        {"decode Inf v", [&] { return kvp_decode(a.c, 1, q.data(), k.data(), inf.data(), o.data()); }, KVP_ERR_NONFINITE, "v[3]"},
        {"prefill zero tokens", [&] { return kvp_prefill(a.c, 0, 0, nullptr, q.data(), k.data(), v.data(), o.data(), nullptr); }, KVP_ERR_ARG, "n_tokens"},
        {"prefill out without q", [&] { return kvp_prefill(a.c, 0, 1, nullptr, nullptr, k.data(), v.data(), o.data(), nullptr); }, KVP_ERR_ARG, "q"},
        {"prefill positions backwards", [&] { return kvp_prefill(a.c, 0, 2, back, nullptr, k.data(), k.data(), nullptr, nullptr); }, KVP_ERR_ARG, "positions"},
        {"append duplicate positions", [&] { return kvp_append(a.c, 0, 2, dup, k.data(), k.data()); }, KVP_ERR_ARG, "positions[1]"},
        {"append negative position", [&] { return kvp_append(a.c, 1, 1, neg, k.data(), v.data()); }, KVP_ERR_ARG, "positions[0]"},
        {"append bad layer", [&] { return kvp_append(a.c, 7, 1, nullptr, k.data(), v.data()); }, KVP_ERR_LAYER, "layer 7"},
        {"prefill chunk larger than free slots", [&] { return kvp_prefill(a.c, 0, 6, nullptr, nullptr, std::vector<float>(6 * 64).data(), std::vector<float>(6 * 64).data(), nullptr, nullptr); }, KVP_ERR_FULL, "do not fit"},
        {"positions bad head", [&] { return kvp_layer_positions(a.c, 0, 2, pos_buf, 64, &n); }, KVP_ERR_LAYER, nullptr},
        {"positions bad layer", [&] { return kvp_layer_positions(a.c, 9, 0, pos_buf, 64, &n); }, KVP_ERR_LAYER, nullptr},
        {"positions NULL n", [&] { return kvp_layer_positions(a.c, 0, 0, pos_buf, 64, nullptr); }, KVP_ERR_ARG, nullptr},
        {"positions NULL out", [&] { return kvp_layer_positions(a.c, 0, 0, nullptr, 4, &n); }, KVP_ERR_ARG, nullptr},
        {"positions small buffer", [&] { return kvp_layer_positions(a.c, 0, 0, pos_buf, 2, &n); }, KVP_ERR_BUFFER, "cap=2"},
        {"stats small struct", [&] { return kvp_get_stats(a.c, &st); }, KVP_ERR_ARG, nullptr},
        {"stats NULL", [&] { return kvp_get_stats(a.c, nullptr); }, KVP_ERR_ARG, nullptr},
        {"reset NULL", [&] { return kvp_reset(nullptr); }, KVP_ERR_ARG, nullptr},
    };
    for (const Case &c : cases) {
        EXPECT_EQ(c.call(), c.want) << c.what;
        if (c.needle) {
            EXPECT_NE(strstr(kvp_last_error(a.c), c.needle), nullptr) << c.what << ": " << kvp_last_error(a.c);
        }
    }
    EXPECT_EQ(n, kvp_layer_len(a.c, 0));  // the small-buffer case still reports the length
    EXPECT_EQ(kvp_layer_len(nullptr, 0), 0u);
    EXPECT_EQ(kvp_layer_capacity(a.c, 1), 16u);
    EXPECT_EQ(kvp_layer_capacity(a.c, 2), 0u);
    EXPECT_EQ(kvp_layer_capacity(nullptr, 0), 0u);
    EXPECT_EQ(kvp_layer_len(a.c, 5), 0u);
    EXPECT_NE(kvp_last_error(nullptr), nullptr);

    for (uint32_t l = 0; l < 2; ++l) {
        EXPECT_EQ(kvp_layer_len(a.c, l), kvp_layer_len(twin.c, l));
        for (uint32_t h = 0; h < 2; ++h) EXPECT_EQ(a.positions(l, h), twin.positions(l, h));
    }
    kvp_stats sa, sb;
    sa.struct_size = sb.struct_size = sizeof sa;
    ASSERT_EQ(kvp_get_stats(a.c, &sa), KVP_OK);
    ASSERT_EQ(kvp_get_stats(twin.c, &sb), KVP_OK);
    EXPECT_EQ(memcmp(&sa, &sb, sizeof sa), 0);
    for (int t = 0; t < 9; ++t) step_both();  // identical outputs from here on
}

TEST(BadInput, FullPolicyAtCapacity) {
    const kvp_model m = ref::model(1, 2, 1, 8);
    ref::Cache c(m, "policy=full capacity=5");
    std::vector<float> q(16, 0.5f), kv(8 * 6, 0.25f), o(16 * 6);
    ASSERT_EQ(kvp_prefill(c.c, 0, 5, nullptr, q.data(), kv.data(), kv.data(), nullptr, nullptr), KVP_OK);
    EXPECT_EQ(kvp_decode(c.c, 0, q.data(), kv.data(), kv.data(), o.data()), KVP_ERR_FULL);
    EXPECT_NE(strstr(kvp_last_error(c.c), "KVP_ERR_FULL"), nullptr);
    EXPECT_EQ(kvp_layer_len(c.c, 0), 5u);
    ASSERT_EQ(kvp_reset(c.c), KVP_OK);
    EXPECT_EQ(kvp_layer_len(c.c, 0), 0u);
    kvp_stats s;
    s.struct_size = sizeof s;
    ASSERT_EQ(kvp_get_stats(c.c, &s), KVP_OK);
    EXPECT_EQ(s.tokens_seen, 0u);
    EXPECT_EQ(s.peak_live_bytes, 0u);
    EXPECT_EQ(kvp_decode(c.c, 0, q.data(), kv.data(), kv.data(), o.data()), KVP_OK);
    // a single token attends only to itself: out == v
    for (int i = 0; i < 16; ++i) EXPECT_FLOAT_EQ(o[i], 0.25f);
}

TEST(Prefill, SelectionIsEmptyForNonAslPolicies) {
    const kvp_model m = ref::model(1, 2, 1, 8);
    ref::Cache c(m, "policy=full capacity=8");
    std::vector<float> q(16 * 3, 0.5f), kv(8 * 3, 0.25f), o(q.size());
    int32_t idx[4];
    kvp_selection sel;
    sel.struct_size = sizeof sel;
    sel.capacity = 4;
    sel.indices = idx;
    sel.n = 77;
    sel.selected = 1;
    ASSERT_EQ(kvp_prefill(c.c, 0, 3, nullptr, q.data(), kv.data(), kv.data(), o.data(), &sel), KVP_OK);
    EXPECT_EQ(sel.n, 0u);
    EXPECT_EQ(sel.selected, 0);
    sel.struct_size = 3;
    EXPECT_EQ(kvp_prefill(c.c, 0, 1, nullptr, q.data(), kv.data(), kv.data(), o.data(), &sel), KVP_ERR_ARG);
    EXPECT_EQ(kvp_layer_len(c.c, 0), 3u);
}

}  // namespace
