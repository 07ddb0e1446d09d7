// GGUF models in the harness (issue 20): the reader against an independent writer
// (tests/gguf_writer.h) and malformed files, dequantization against references written from the
// block formats, tiny llama / qwen2 / qwen3 models of every weight type against a plain
// double-precision forward written here from the definitions, the bundled enbytes-1m.bin
// written as GGUF, and the tokenizers.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "checkpoint.h"
#include "gguf.h"
#include "gguf_writer.h"
#include "llama2c_vocab.h"
#include "qmatmul.h"
#include "session.h"
#include "tasks.h"
#include "tokenizer.h"

#ifndef KVP_HARNESS_MODELS_DIR
#error "KVP_HARNESS_MODELS_DIR must point at the repository's models/"
#endif
#ifndef KVP_SHARED_MODELS_DIR
#define KVP_SHARED_MODELS_DIR ""
#endif

namespace {

using namespace kvh;
using gguftest::Writer;

std::string tmp(const std::string &name) {
    const char *d = getenv("TMPDIR");
    return std::string(d && *d ? d : "/tmp") + "/kvh-gguf-" + std::to_string(getpid()) + "-" + name;
}

struct TmpFile {
    std::string path;
    explicit TmpFile(const std::string &n) : path(tmp(n)) {}
    ~TmpFile() { std::remove(path.c_str()); }
};

bool write_bytes(const std::string &path, const std::string &b) {
    std::ofstream f(path, std::ios::binary);
    f.write(b.data(), (std::streamsize)b.size());
    return (bool)f;
}

// ---------------------------------------------------------------- reader

Writer small_file() {
    Writer w;
    w.str("general.architecture", "llama");
    w.u32("a.u32", 7);
    w.i32("a.i32", -3);
    w.u64("a.u64", 1ull << 40);
    w.f32("a.f32", 0.5f);
    w.f64("a.f64", -2.25);
    w.boolean("a.bool", true);
    w.str_arr("a.strs", {"x", "", "h\xC3\xA9llo"});
    w.f32_arr("a.f32s", {1.5f, -2.0f});
    w.i32_arr("a.i32s", {4, -5, 6});
    std::vector<float> v(64);
    for (int i = 0; i < 64; i++) v[(size_t)i] = (float)i * 0.25f;
    w.tensor_f32("t.a", {32, 2}, v.data(), 64);
    w.tensor_f32("t.b", {3}, v.data(), 3);
    return w;
}

TEST(GgufReader, ReadsWhatTheWriterWrote) {
    for (uint32_t ver : {2u, 3u}) {
        Writer w = small_file();
        w.version = ver;
        std::string b = w.bytes();
        GgufFile f;
        std::string err;
        ASSERT_TRUE(f.parse(reinterpret_cast<const uint8_t *>(b.data()), b.size(), "mem", &err)) << err;
        EXPECT_EQ(f.version(), ver);
        std::string s;
        int64_t i;
        double d;
        bool bo;
        EXPECT_TRUE(f.get_str("general.architecture", &s));
        EXPECT_EQ(s, "llama");
        EXPECT_TRUE(f.get_int("a.u32", &i));
        EXPECT_EQ(i, 7);
        EXPECT_TRUE(f.get_int("a.i32", &i));
        EXPECT_EQ(i, -3);
        EXPECT_TRUE(f.get_int("a.u64", &i));
        EXPECT_EQ(i, 1ll << 40);
        EXPECT_TRUE(f.get_float("a.f32", &d));
        EXPECT_EQ(d, 0.5);
        EXPECT_TRUE(f.get_float("a.f64", &d));
        EXPECT_EQ(d, -2.25);
        EXPECT_TRUE(f.get_bool("a.bool", &bo));
        EXPECT_TRUE(bo);
        EXPECT_FALSE(f.get_int("a.f32", &i));  // wrong type
        EXPECT_FALSE(f.get_str("nope", &s));
        std::vector<std::string> strs;
        EXPECT_TRUE(f.get_str_array("a.strs", &strs));
        EXPECT_EQ(strs, (std::vector<std::string>{"x", "", "h\xC3\xA9llo"}));
        std::vector<float> fs;
        EXPECT_TRUE(f.get_f32_array("a.f32s", &fs));
        EXPECT_EQ(fs, (std::vector<float>{1.5f, -2.0f}));
        std::vector<int32_t> is;
        EXPECT_TRUE(f.get_i32_array("a.i32s", &is));
        EXPECT_EQ(is, (std::vector<int32_t>{4, -5, 6}));
        ASSERT_EQ(f.tensors().size(), 2u);
        const GgufTensor *t = f.tensor("t.a");
        ASSERT_NE(t, nullptr);
        EXPECT_EQ(t->ne[0], 32u);
        EXPECT_EQ(t->ne[1], 2u);
        EXPECT_EQ(t->nbytes, 256u);
        EXPECT_EQ((size_t)(t->data - reinterpret_cast<const uint8_t *>(b.data())) % 32, 0u);
        float x;
        std::memcpy(&x, t->data + 4 * 63, 4);
        EXPECT_EQ(x, 63 * 0.25f);
        const GgufTensor *tb = f.tensor("t.b");
        ASSERT_NE(tb, nullptr);
        std::memcpy(&x, tb->data + 8, 4);
        EXPECT_EQ(x, 0.5f);
    }
}

TEST(GgufReader, OpenMapsAFileAndHonoursAlignment) {
    Writer w = small_file();
    w.align = 64;
    w.u32("general.alignment", 64);
    TmpFile t("align.gguf");
    ASSERT_TRUE(w.write(t.path));
    GgufFile f;
    std::string err;
    ASSERT_TRUE(f.open(t.path, &err)) << err;
    EXPECT_EQ(f.alignment(), 64u);
    float x;
    std::memcpy(&x, f.tensor("t.b")->data + 4, 4);
    EXPECT_EQ(x, 0.25f);
}

void expect_bad(const std::string &bytes, const std::string &needle) {
    GgufFile f;
    std::string err;
    EXPECT_FALSE(f.parse(reinterpret_cast<const uint8_t *>(bytes.data()), bytes.size(), "bad", &err)) << needle;
    EXPECT_NE(err.find(needle), std::string::npos) << "message: " << err << "\nexpected: " << needle;
    EXPECT_EQ(err.find('\n'), std::string::npos) << err;  // one line
}

TEST(GgufReader, EveryTruncationFailsWithOneLine) {
    const std::string b = small_file().bytes();
    size_t fails = 0;
    for (size_t n = 0; n < b.size(); n++) {
        // Only the zero padding after the last tensor may be cut without loss.
        GgufFile f;
        std::string err;
        std::string cut = b.substr(0, n);
        bool ok = f.parse(reinterpret_cast<const uint8_t *>(cut.data()), cut.size(), "cut", &err);
        if (!ok) {
            fails++;
            EXPECT_FALSE(err.empty());
            EXPECT_EQ(err.find('\n'), std::string::npos);
        }
    }
    EXPECT_GE(fails, b.size() - 32);
}

std::string header(uint32_t ver, uint64_t nt, uint64_t nkv) {
    std::string o = "GGUF";
    gguftest::put32(o, ver);
    gguftest::put64(o, nt);
    gguftest::put64(o, nkv);
    return o;
}

TEST(GgufReader, MalformedFiles) {
    expect_bad("", "not a GGUF file (bad magic): it starts with '', a GGUF file with 'GGUF'");
    expect_bad("GGML1234", "not a GGUF file (bad magic): it starts with 'GGML'");
    expect_bad(header(1, 0, 0), "version 1 is not supported");
    expect_bad(header(4, 0, 0), "version 4 is not supported");
    expect_bad(header(3, 0, 1ull << 62), "metadata count");
    expect_bad(header(3, 1ull << 60, 0), "tensor count");
    {  // a key whose length runs past the end
        std::string o = header(3, 0, 1);
        gguftest::put64(o, 1ull << 50);
        o += "abcdefghijklmnop";
        expect_bad(o, "truncated");
    }
    {  // a string array longer than the file could hold
        std::string o = header(3, 0, 1);
        gguftest::putstr(o, "k");
        gguftest::put32(o, 9);
        gguftest::put32(o, 8);
        gguftest::put64(o, 1ull << 40);
        o += std::string(32, '\0');
        expect_bad(o, "cannot fit");
    }
    {  // an f32 array longer than the file
        std::string o = header(3, 0, 1);
        gguftest::putstr(o, "k");
        gguftest::put32(o, 9);
        gguftest::put32(o, 6);
        gguftest::put64(o, 1000);
        o += std::string(32, '\0');
        expect_bad(o, "cannot fit");
    }
    {  // nested array, unknown value type
        std::string o = header(3, 0, 1);
        gguftest::putstr(o, "k");
        gguftest::put32(o, 9);
        gguftest::put32(o, 9);
        gguftest::put64(o, 1);
        o += std::string(32, '\0');
        expect_bad(o, "nested arrays");
        std::string p = header(3, 0, 1);
        gguftest::putstr(p, "k");
        gguftest::put32(p, 13);
        p += std::string(32, '\0');
        expect_bad(p, "unknown type 13");
    }
    {
        Writer w;
        w.u32("k", 1);
        w.u32("k", 2);
        expect_bad(w.bytes(), "appears twice");
    }
    {
        Writer w;
        w.u32("general.alignment", 24);
        expect_bad(w.bytes(), "power of two");
    }
    {  // tensor extents
        Writer w = small_file();
        w.tensors[1].ne = {100000};  // 400000 bytes past the end
        expect_bad(w.bytes(), "extends past the end");
        Writer z = small_file();
        z.tensors[0].ne = {0, 2};
        expect_bad(z.bytes(), "zero or absurd dimension");
        Writer h = small_file();
        h.tensors[0].ne = {1ull << 30, 1ull << 30};
        expect_bad(h.bytes(), "zero or absurd dimension");
        Writer d = small_file();
        d.tensors[0].ne = {2, 2, 2, 2, 2};
        expect_bad(d.bytes(), "5 dimensions");
        Writer q = small_file();
        q.tensors[0].type = GGML_Q8_0;
        q.tensors[0].ne = {16, 2};
        expect_bad(q.bytes(), "not a multiple of its block of 32");
    }
    {  // misaligned offset: a hand-made tensor info
        std::string o = header(3, 1, 0);
        gguftest::putstr(o, "t");
        gguftest::put32(o, 1);
        gguftest::put64(o, 4);
        gguftest::put32(o, 0);
        gguftest::put64(o, 4);
        o += std::string(64, '\0');
        expect_bad(o, "not a multiple of the alignment");
    }
}

TEST(GgufReader, OpenErrors) {
    GgufFile f;
    std::string err;
    EXPECT_FALSE(f.open(tmp("no-such-file.gguf"), &err));
    EXPECT_NE(err.find("cannot open"), std::string::npos) << err;
    EXPECT_FALSE(f.open("/tmp", &err));
    EXPECT_NE(err.find("a directory"), std::string::npos) << err;
    TmpFile e("empty.gguf");
    ASSERT_TRUE(write_bytes(e.path, ""));
    EXPECT_FALSE(f.open(e.path, &err));
    EXPECT_NE(err.find("empty file"), std::string::npos) << err;
}

// A text file named x.gguf is "not a GGUF file (bad magic)" with what it starts with, not "truncated"
// (issue 29); a short file of another name says both readings.
TEST(GgufReader, NotAGgufFileSaysBadMagicAndWhatWasFound) {
    TmpFile t("x.gguf");
    ASSERT_TRUE(write_bytes(t.path, "hello\n"));
    Checkpoint ck;
    std::string err;
    EXPECT_FALSE(load_model(t.path, &ck, &err));
    EXPECT_NE(err.find("not a GGUF file (bad magic): it starts with 'hell' (68 65 6c 6c), a GGUF file with 'GGUF'"),
              std::string::npos)
        << err;
    EXPECT_EQ(err.find("truncated"), std::string::npos) << err;
    TmpFile b("x.bin");
    ASSERT_TRUE(write_bytes(b.path, "hello\n"));
    EXPECT_FALSE(load_model(b.path, &ck, &err));
    EXPECT_NE(err.find("truncated: 6 bytes, smaller than the 28-byte header of a llama2.c checkpoint (nor a GGUF file: it starts "
                       "with 'hell' (68 65 6c 6c), not 'GGUF')"),
              std::string::npos)
        << err;
}

// Every ggml type number has its name in messages (issue 29: "type type 20" was iq4_nl); a number
// no ggml version used is called unknown or corrupt.
TEST(GgufReader, EveryGgmlTypeIsNamed) {
    const std::pair<uint32_t, const char *> names[] = {
        {0, "f32"},     {1, "f16"},      {2, "q4_0"},     {4, "q4_2"},        {10, "q2_K"},  {11, "q3_K"},  {15, "q8_K"},
        {16, "iq2_xxs"}, {17, "iq2_xs"}, {18, "iq3_xxs"}, {19, "iq1_s"},      {20, "iq4_nl"}, {21, "iq3_s"}, {22, "iq2_s"},
        {23, "iq4_xs"}, {24, "i8"},      {28, "f64"},     {29, "iq1_m"},      {30, "bf16"},  {34, "tq1_0"}, {35, "tq2_0"},
        {36, "iq4_nl_4_4"}, {39, "mxfp4"}};
    for (const auto &n : names) {
        EXPECT_EQ(ggml_type_name(n.first), n.second);
        EXPECT_TRUE(ggml_type_known(n.first));
        EXPECT_EQ(ggml_type_phrase(n.first), std::string("type ") + n.second);
    }
    for (uint32_t t = 0; t < 64; t++)
        EXPECT_EQ(ggml_type_name(t).find("type "), ggml_type_known(t) ? std::string::npos : 8u) << t;
    EXPECT_EQ(ggml_type_name(16777216), "unknown type 16777216");
    EXPECT_EQ(ggml_type_phrase(16777216), "an unknown or corrupt type number 16777216 (no ggml type has it)");
    for (uint32_t t : kGgmlSupported) {  // every supported type has a block and dequantizes
        uint64_t be = 0, bb = 0;
        EXPECT_TRUE(ggml_block(t, &be, &bb)) << ggml_type_name(t);
    }
}

// ---------------------------------------------------------------- dequantization

// References written from the block layouts (element index -> value), not from the loops of
// gguf.cpp. Blocks: q8_0 = f16 d, 32 x i8; q4_0 = f16 d, 16 bytes (element j < 16: low nibble of
// byte j, else high nibble of byte j - 16), value (q - 8) d; q4_K = f16 d, f16 dmin, 12 bytes of
// 6-bit scales/mins for 8 sub-blocks of 32, 128 bytes of nibbles (sub-block s uses bytes
// 32 (s / 2) .. + 31, low nibble when s is even), value d sc q - dmin m; q6_K = 128 bytes low
// nibbles, 64 bytes high 2-bit pairs, 16 i8 scales, f16 d, value d sc (q - 32).
// q8_1 = f16 d, f16 s (unused), 32 x i8, value d q; q4_1 = f16 d, f16 m, q4_0's nibbles, value d q + m;
// q5_0 = f16 d, u32 of fifth bits (bit j is bit 4 of element j), q4_0's nibbles, value d (q - 16);
// q5_1 = f16 d, f16 m, the u32, the nibbles, value d q + m; q5_K = q4_K's d, dmin and scales, 32
// bytes of fifth bits (bit s of byte l for element l of sub-block s), q4_K's 128 bytes of nibbles.
double ref_elem(uint32_t type, const uint8_t *blk, int j) {
    auto h = [&](int off) { return gguftest::from_f16((uint16_t)(blk[off] | blk[off + 1] << 8)); };
    auto nib32 = [&](const uint8_t *qs) { return j < 16 ? (qs[j] & 15) : (qs[j - 16] >> 4); };
    auto bit = [&](const uint8_t *u) { return (int)((u[j / 8] >> (j % 8)) & 1); };  // bit j of a LE u32
    auto k_scale_min = [](const uint8_t *sc, int s, int *scale, int *mn) {
        if (s < 4) {
            *scale = sc[s] & 63;
            *mn = sc[s + 4] & 63;
        } else {
            *scale = (sc[s + 4] & 15) | ((sc[s - 4] >> 6) << 4);
            *mn = (sc[s + 4] >> 4) | ((sc[s] >> 6) << 4);
        }
    };
    switch (type) {
        case GGML_Q8_0: return h(0) * (int8_t)blk[2 + j];
        case GGML_Q8_1: return h(0) * (int8_t)blk[4 + j];
        case GGML_Q4_1: return h(0) * nib32(blk + 4) + h(2);
        case GGML_Q5_0: return h(0) * ((nib32(blk + 6) | bit(blk + 2) << 4) - 16);
        case GGML_Q5_1: return h(0) * (nib32(blk + 8) | bit(blk + 4) << 4) + h(2);
        case GGML_Q5_K: {
            const int s = j / 32, pos = j % 32;
            const uint8_t byte = blk[48 + (s / 2) * 32 + pos];
            const int q = (s % 2 == 0 ? (byte & 15) : (byte >> 4)) | ((blk[16 + pos] >> s) & 1) << 4;
            int scale, mn;
            k_scale_min(blk + 4, s, &scale, &mn);
            return h(0) * scale * q - h(2) * mn;
        }
        case GGML_Q4_0: {
            const int q = j < 16 ? (blk[2 + j] & 15) : (blk[2 + j - 16] >> 4);
            return h(0) * (q - 8);
        }
        case GGML_Q4_K: {
            const uint8_t *sc = blk + 4, *qs = blk + 16;
            const int s = j / 32, pos = j % 32;
            const uint8_t byte = qs[(s / 2) * 32 + pos];
            const int q = s % 2 == 0 ? (byte & 15) : (byte >> 4);
            int scale, mn;
            if (s < 4) {
                scale = sc[s] & 63;
                mn = sc[s + 4] & 63;
            } else {
                scale = (sc[s + 4] & 15) | ((sc[s - 4] >> 6) << 4);
                mn = (sc[s + 4] >> 4) | ((sc[s] >> 6) << 4);
            }
            return h(0) * scale * q - h(2) * mn;
        }
        case GGML_Q6_K: {
            const uint8_t *ql = blk, *qh = blk + 128;
            const int8_t *sc = reinterpret_cast<const int8_t *>(blk + 192);
            const int half = j / 128, r = j % 128, g = r / 32, l = r % 32;
            const uint8_t lo = ql[64 * half + l + 32 * (g & 1)];
            const int low = g >= 2 ? (lo >> 4) : (lo & 15);
            const int high = (qh[32 * half + l] >> (2 * g)) & 3;
            return h(208) * sc[8 * half + l / 16 + 2 * g] * ((low | high << 4) - 32);
        }
        // q2_K / q3_K (issue 29): 16 sub-blocks of 16; element j sits in half j / 128, 2-bit group
        // g = (j % 128) / 32 (bits 2g of its byte), column sub = (j % 32) / 16, lane l = j % 16; its
        // scale is number 8 half + 2 g + sub.
        case GGML_Q2_K: {  // scales[16] (low nibble scale, high nibble min), qs[64], f16 d, f16 dmin
            const int half = j / 128, g = (j % 128) / 32, sub = (j % 32) / 16, l = j % 16;
            const int sc = blk[8 * half + 2 * g + sub];
            const int q = (blk[16 + 32 * half + 16 * sub + l] >> (2 * g)) & 3;
            return h(80) * (sc & 15) * q - h(82) * (sc >> 4);
        }
        case GGML_Q3_K: {  // hmask[32], qs[64], scales[12] (sixteen 6-bit values), f16 d
            const int half = j / 128, g = (j % 128) / 32, sub = (j % 32) / 16, l = j % 16, is = 8 * half + 2 * g + sub;
            // The 12 bytes as three little-endian words a0 a1 a2: scales 0..3 = a0's low nibbles with 2
            // bits of a2 (bits 0..1 of each byte) on top, 4..7 = a1's low nibbles with a2's bits 2..3,
            // 8..11 = a0's high nibbles with a2's bits 4..5, 12..15 = a1's high nibbles with bits 6..7.
            uint32_t a[3];
            std::memcpy(a, blk + 96, 12);
            const uint32_t m4 = 0x0f0f0f0f, m2 = 0x03030303;
            const uint32_t w[4] = {(a[0] & m4) | (a[2] & m2) << 4, (a[1] & m4) | ((a[2] >> 2) & m2) << 4,
                                   ((a[0] >> 4) & m4) | ((a[2] >> 4) & m2) << 4, ((a[1] >> 4) & m4) | ((a[2] >> 6) & m2) << 4};
            const int sc = (int)((w[is / 4] >> (8 * (is % 4))) & 0xff) - 32;
            const int lo = (blk[32 + 32 * half + 16 * sub + l] >> (2 * g)) & 3;
            const bool high = (blk[16 * sub + l] >> (4 * half + g)) & 1;
            return h(108) * sc * (lo - (high ? 0 : 4));
        }
        case GGML_IQ4_NL:  // f16 d, q4_0's nibble order, value d grid[index]
            return h(0) * gguftest::kIq4Grid[nib32(blk + 2)];
        case GGML_IQ4_XS: {  // f16 d, u16 scales_h, u8 scales_l[4], qs[128]: 8 sub-blocks of 32
            const int s = j / 32, i = j % 32;
            const int sh = blk[2] | blk[3] << 8;
            const int ls = ((blk[4 + s / 2] >> (4 * (s % 2))) & 15) | ((sh >> (2 * s)) & 3) << 4;
            const uint8_t *qs = blk + 8 + 16 * s;
            const int idx = i < 16 ? (qs[i] & 15) : (qs[i - 16] >> 4);
            return h(0) * (ls - 32) * gguftest::kIq4Grid[idx];
        }
        default: return NAN;
    }
}

void check_blocks(uint32_t type, const std::string &blocks) {
    uint64_t be, bb;
    ASSERT_TRUE(ggml_block(type, &be, &bb));
    ASSERT_EQ(blocks.size() % bb, 0u);
    const uint64_t n = blocks.size() / bb * be;
    std::vector<float> out(n);
    ASSERT_TRUE(dequantize(type, blocks.data(), out.data(), n));
    for (uint64_t i = 0; i < n; i++) {
        const double want = ref_elem(type, reinterpret_cast<const uint8_t *>(blocks.data()) + i / be * bb, (int)(i % be));
        EXPECT_NEAR(out[i], want, 1e-6 * std::fabs(want) + 1e-30) << ggml_type_name(type) << " element " << i;
    }
}

std::string rand_bytes(std::mt19937 &rng, size_t n) {
    std::string s(n, '\0');
    for (auto &c : s) c = (char)(rng() & 255);
    return s;
}

void set16(std::string &b, size_t off, uint16_t v) {
    b[off] = (char)(v & 255);
    b[off + 1] = (char)(v >> 8);
}

TEST(GgufDequant, HandMadeBlocksMatchTheFormatReference) {
    std::mt19937 rng(7);
    const uint16_t zero = 0, neg = gguftest::to_f16(-0.03125f), pos = gguftest::to_f16(0.0078125f),
                   sub = 0x0003 /* subnormal */, negzero = 0x8000;
    for (uint32_t type : {GGML_Q8_0, GGML_Q4_0}) {
        uint64_t be, bb;
        ggml_block(type, &be, &bb);
        std::string all;
        for (uint16_t d : {zero, neg, pos, sub, negzero}) {
            std::string b = rand_bytes(rng, bb);
            set16(b, 0, d);
            all += b;
        }
        std::string extreme(bb, (char)0xFF);  // q = -1 (q8_0) / nibble 15 (q4_0)
        set16(extreme, 0, neg);
        all += extreme;
        std::string low(bb, (char)0x80);  // q = -128 / nibbles 0 and 8
        set16(low, 0, pos);
        all += low;
        check_blocks(type, all);
    }
    {  // q4_K: zero / negative d and dmin, all scales and mins at 63, at 0
        std::string all;
        const uint16_t ds[][2] = {{pos, pos}, {zero, pos}, {pos, zero}, {neg, pos}, {pos, neg}, {neg, neg}};
        for (auto &d : ds) {
            std::string b = rand_bytes(rng, 144);
            set16(b, 0, d[0]);
            set16(b, 2, d[1]);
            all += b;
        }
        std::string maxed = rand_bytes(rng, 144);
        set16(maxed, 0, pos);
        set16(maxed, 2, neg);
        for (int i = 4; i < 16; i++) maxed[(size_t)i] = (char)0xFF;
        all += maxed;
        std::string zs = rand_bytes(rng, 144);
        set16(zs, 0, pos);
        set16(zs, 2, pos);
        for (int i = 4; i < 16; i++) zs[(size_t)i] = 0;
        all += zs;
        check_blocks(GGML_Q4_K, all);
    }
    {  // q6_K: negative scales (i8), zero d, negative d, extreme quants
        std::string all;
        for (uint16_t d : {pos, zero, neg, sub}) {
            std::string b = rand_bytes(rng, 210);
            set16(b, 208, d);
            all += b;
        }
        std::string ext(210, (char)0xFF);
        set16(ext, 208, pos);
        for (int i = 192; i < 208; i++) ext[(size_t)i] = (char)(i % 2 ? -128 : 127);
        all += ext;
        std::string lo(210, '\0');
        set16(lo, 208, neg);
        for (int i = 192; i < 208; i++) lo[(size_t)i] = (char)-1;
        all += lo;
        check_blocks(GGML_Q6_K, all);
    }
}

TEST(GgufDequant, Q41Q50Q51Q81Q5KBlocksMatchTheFormatReference) {
    std::mt19937 rng(11);
    const uint16_t zero = 0, neg = gguftest::to_f16(-0.03125f), pos = gguftest::to_f16(0.0078125f), sub = 0x0003,
                   negzero = 0x8000, mneg = gguftest::to_f16(-0.75f), mpos = gguftest::to_f16(0.5f);
    for (uint32_t type : {GGML_Q4_1, GGML_Q5_0, GGML_Q5_1, GGML_Q8_1}) {
        uint64_t be, bb;
        ggml_block(type, &be, &bb);
        const bool has_m = type == GGML_Q4_1 || type == GGML_Q5_1;
        const size_t hoff = type == GGML_Q5_0 ? 2 : 4;  // the q5 fifth bits
        std::string all;
        // zero, negative, positive, subnormal and negative-zero d; with a min: negative, zero, positive m
        for (uint16_t d : {zero, neg, pos, sub, negzero})
            for (uint16_t m : {mneg, zero, mpos}) {
                std::string b = rand_bytes(rng, bb);
                set16(b, 0, d);
                if (has_m) set16(b, 2, m);
                all += b;
                if (!has_m) break;
            }
        std::string ones(bb, (char)0xFF);  // every nibble 15, every fifth bit set: q = 31 (q5), 15 (q4_1), -1 (q8_1)
        set16(ones, 0, neg);
        if (has_m) set16(ones, 2, mneg);
        all += ones;
        std::string zeros(bb, '\0');  // q = 0 (value -16 d for q5_0, m for q4_1 / q5_1)
        set16(zeros, 0, pos);
        if (has_m) set16(zeros, 2, mpos);
        all += zeros;
        if (type == GGML_Q5_0 || type == GGML_Q5_1) {
            for (uint32_t hb : {0x55555555u, 0xAAAAAAAAu, 0x0000FFFFu, 0xFFFF0000u, 0x80000001u}) {  // which fifth bits
                std::string b(bb, (char)0x0F);  // low nibbles 15, high nibbles 0
                set16(b, 0, pos);
                if (has_m) set16(b, 2, mneg);
                std::memcpy(&b[hoff], &hb, 4);
                all += b;
            }
        }
        check_blocks(type, all);
    }
    {  // q5_K: q4_K's edge cases plus the fifth bits all set, none, one sub-block's alone
        std::string all;
        const uint16_t ds[][2] = {{pos, pos}, {zero, pos}, {pos, zero}, {neg, pos}, {pos, neg}, {neg, neg}, {sub, pos}};
        for (auto &d : ds) {
            std::string b = rand_bytes(rng, 176);
            set16(b, 0, d[0]);
            set16(b, 2, d[1]);
            all += b;
        }
        for (int s = -2; s < 8; s++) {  // -2: no fifth bits, -1: all, s: only sub-block s's
            std::string b = rand_bytes(rng, 176);
            set16(b, 0, pos);
            set16(b, 2, neg);
            for (int l = 0; l < 32; l++) b[16 + (size_t)l] = (char)(s == -2 ? 0 : s == -1 ? 0xFF : 1 << s);
            all += b;
        }
        std::string maxed(176, (char)0xFF);  // scales and mins 63, q = 31
        set16(maxed, 0, pos);
        set16(maxed, 2, pos);
        all += maxed;
        std::string zs(176, '\0');  // scales and mins 0
        set16(zs, 0, neg);
        set16(zs, 2, neg);
        all += zs;
        check_blocks(GGML_Q5_K, all);
    }
}

// The writer's quantizers (written from the format description, independent of the reader) round
// trip through the reader within half a quantization step, so the writer makes these types for tests.
TEST(GgufDequant, WriterQuantizersRoundTripThroughTheReader) {
    std::mt19937 rng(5);
    std::uniform_real_distribution<float> u(-0.4f, 0.3f);
    std::vector<float> x(1024);
    for (auto &v : x) v = u(rng);
    for (int i = 0; i < 32; i++) x[(size_t)(64 + i)] = 0.0f;  // an all-zero block
    for (int i = 0; i < 32; i++) x[(size_t)(128 + i)] = 0.01f * (float)i;  // an all-positive block
    struct Case {
        uint32_t type;
        std::string bytes;
        double bound;  // |x - dequantized| allowed (half a step of the widest block, scales rounded)
    } cases[] = {{GGML_Q8_1, gguftest::quant_q8_1(x.data(), x.size()), 0.4 / 127 * 0.51 + 1e-4},
                 {GGML_Q4_1, gguftest::quant_q4_1(x.data(), x.size()), 0.7 / 15 * 0.51 + 1e-3},
                 {GGML_Q5_0, gguftest::quant_q5_0(x.data(), x.size()), 0.4 / 16 * 0.51 + 1e-3},
                 {GGML_Q5_1, gguftest::quant_q5_1(x.data(), x.size()), 0.7 / 31 * 0.51 + 1e-3},
                 {GGML_Q5_K, gguftest::quant_q5_K(x.data(), x.size()), 0.7 / 31 * 1.2 + 5e-3}};
    for (const Case &c : cases) {
        uint64_t be, bb;
        ASSERT_TRUE(ggml_block(c.type, &be, &bb));
        ASSERT_EQ(c.bytes.size(), x.size() / be * bb) << ggml_type_name(c.type);
        std::vector<float> y(x.size());
        ASSERT_TRUE(dequantize(c.type, c.bytes.data(), y.data(), x.size()));
        double worst = 0;
        for (size_t i = 0; i < x.size(); i++) worst = std::max(worst, std::fabs((double)y[i] - x[i]));
        EXPECT_LT(worst, c.bound) << ggml_type_name(c.type);
        EXPECT_GT(worst, 0.0) << ggml_type_name(c.type);  // it did quantize
        for (int i = 0; i < 32; i++) EXPECT_EQ(y[(size_t)(64 + i)], 0.0f) << ggml_type_name(c.type) << " zero block";
        if (c.type == GGML_Q8_1) {  // s = d * sum(q)
            const uint8_t *b0 = reinterpret_cast<const uint8_t *>(c.bytes.data());
            long sum = 0;
            for (int i = 0; i < 32; i++) sum += (int8_t)b0[4 + i];
            EXPECT_NEAR(gguftest::from_f16((uint16_t)(b0[2] | b0[3] << 8)), gguftest::from_f16((uint16_t)(b0[0] | b0[1] << 8)) * sum,
                        1e-3 * std::fabs((double)sum) * 0.01 + 1e-6);
        }
    }
}

// q2_K, q3_K, iq4_nl, iq4_xs (issue 29): random blocks and edge cases (zero / negative /
// subnormal scales, every scale and index extreme) dequantize as the format reference above says.
TEST(GgufDequant, Q2KQ3KIq4BlocksMatchTheFormatReference) {
    std::mt19937 rng(29);
    const uint16_t zero = 0, neg = gguftest::to_f16(-0.03125f), pos = gguftest::to_f16(0.0078125f), sub = 0x0003,
                   negzero = 0x8000;
    for (uint32_t type : {GGML_Q2_K, GGML_Q3_K, GGML_IQ4_NL, GGML_IQ4_XS}) {
        uint64_t be, bb;
        ASSERT_TRUE(ggml_block(type, &be, &bb)) << ggml_type_name(type);
        const size_t doff = type == GGML_Q2_K ? 80 : type == GGML_Q3_K ? 108 : 0;
        std::string all;
        for (uint16_t d : {zero, neg, pos, sub, negzero})
            for (uint16_t m : {pos, neg, zero}) {  // q2_K's dmin
                std::string b = rand_bytes(rng, bb);
                set16(b, doff, d);
                if (type == GGML_Q2_K) set16(b, 82, m);
                all += b;
                if (type != GGML_Q2_K) break;
            }
        for (char fill : {(char)0xFF, (char)0x00, (char)0x55, (char)0xAA, (char)0x0F}) {  // scales, mins, indices, high bits
            std::string b(bb, fill);
            set16(b, doff, neg);
            if (type == GGML_Q2_K) set16(b, 82, pos);
            all += b;
        }
        check_blocks(type, all);
    }
}

// The writer's quantizers for these types on known data: the dequantized values (reader and format
// reference) are within a step of the input, and quantized products through matmul_q (the harness
// path for these types) equal a double product over the reference's values.
TEST(GgufDequant, Q2KQ3KIq4QuantizedDataThroughDequantAndMatmul) {
    std::mt19937 rng(2929);
    std::uniform_real_distribution<float> u(-0.4f, 0.3f);
    const int rows = 24, cols = 512;  // 2 super-blocks per row, rows in two row blocks
    std::vector<float> x((size_t)rows * cols);
    for (auto &v : x) v = u(rng);
    for (int i = 0; i < 256; i++) x[(size_t)(512 + i)] = 0.0f;          // an all-zero super-block
    for (int i = 0; i < 256; i++) x[(size_t)(1024 + i)] = 0.001f * (float)i;  // an all-positive one
    struct Case {
        uint32_t type;
        std::string bytes;
        double bound;  // |x - dequantized|: about a step of the coarsest sub-block (scales rounded)
    } cases[] = {{GGML_Q2_K, gguftest::quant_q2_K(x.data(), x.size()), 0.7 / 3 * 0.75},
                 // q3_K: q - 4 in -4..3 with the largest magnitude at -4, so the other sign clips at 3 (a step)
                 {GGML_Q3_K, gguftest::quant_q3_K(x.data(), x.size()), 0.4 / 4 * 1.2},
                 {GGML_IQ4_NL, gguftest::quant_iq4_nl(x.data(), x.size()), 0.4 / 127 * 14},
                 {GGML_IQ4_XS, gguftest::quant_iq4_xs(x.data(), x.size()), 0.4 / 127 * 16}};
    for (const Case &c : cases) {
        SCOPED_TRACE(ggml_type_name(c.type));
        uint64_t be, bb;
        ASSERT_TRUE(ggml_block(c.type, &be, &bb));
        ASSERT_EQ(c.bytes.size(), x.size() / be * bb);
        check_blocks(c.type, c.bytes);  // reader == format reference on the quantized data
        std::vector<float> y(x.size());
        ASSERT_TRUE(dequantize(c.type, c.bytes.data(), y.data(), x.size()));
        std::vector<double> ref(x.size());
        double worst = 0;
        for (size_t i = 0; i < x.size(); i++) {
            ref[i] = ref_elem(c.type, reinterpret_cast<const uint8_t *>(c.bytes.data()) + i / be * bb, (int)(i % be));
            worst = std::max(worst, std::fabs(ref[i] - x[i]));
        }
        EXPECT_LT(worst, c.bound);
        EXPECT_GT(worst, 0.0);  // it did quantize
        for (int i = 0; i < 256; i++) EXPECT_NEAR(y[(size_t)(512 + i)], 0.0f, 1e-7) << "zero super-block, element " << i;
        uint64_t bad = 1;
        EXPECT_TRUE(ggml_finite(c.type, c.bytes.data(), x.size(), &bad));
        // matmul_q: out[t][o] = W[o] . v[t], for 1, 5 (a tile of 4 and one) and 9 rows of v, 1 and 3 threads,
        // through the AVX2 kernel (where the CPU has it) and the portable one (KVPRUNE_NO_AVX2)
        QView W;
        W.type = c.type;
        W.data = reinterpret_cast<const uint8_t *>(c.bytes.data());
        W.row_bytes = c.bytes.size() / rows;
        for (int path = 0; path < 2; path++)
        for (int n : {1, 5, 9}) {
            SCOPED_TRACE(path ? "portable kernel" : "default kernel");
            if (path) setenv("KVPRUNE_NO_AVX2", "1", 1);
            else unsetenv("KVPRUNE_NO_AVX2");
            std::vector<float> v((size_t)n * cols);
            for (auto &e : v) e = u(rng);
            std::vector<float> out1((size_t)n * rows), out3((size_t)n * rows);
            matmul_q(out1.data(), v.data(), W, n, cols, rows, 1);
            matmul_q(out3.data(), v.data(), W, n, cols, rows, 3);
            EXPECT_EQ(std::memcmp(out1.data(), out3.data(), out1.size() * 4), 0) << n << " rows";
            for (int t = 0; t < n; t++)
                for (int o = 0; o < rows; o++) {
                    double want = 0, mag = 0;
                    for (int i = 0; i < cols; i++) {
                        want += ref[(size_t)o * cols + i] * v[(size_t)t * cols + i];
                        mag += std::fabs(ref[(size_t)o * cols + i] * v[(size_t)t * cols + i]);
                    }
                    EXPECT_NEAR(out1[(size_t)t * rows + o], want, 1e-5 * mag + 1e-6) << "row " << o << " of x row " << t;
                }
            unsetenv("KVPRUNE_NO_AVX2");
        }
        // a non-finite scale is found
        std::string broken = c.bytes;
        set16(broken, bb + (c.type == GGML_Q2_K ? 80 : c.type == GGML_Q3_K ? 108 : 0), 0x7C00);
        EXPECT_FALSE(ggml_finite(c.type, broken.data(), x.size(), &bad));
        EXPECT_EQ(bad, 1u);
    }
}

TEST(GgufDequant, HalfAndBfloat) {
    // f16: exact values, signs, subnormals, the largest finite, infinity.
    const std::pair<uint16_t, double> f16[] = {{0x3C00, 1.0},  {0xC000, -2.0},         {0x3555, 0.333251953125},
                                               {0x0001, 0x1p-24}, {0x03FF, 1023 * 0x1p-24}, {0x7BFF, 65504.0},
                                               {0x8000, -0.0}};
    for (auto &c : f16) EXPECT_EQ(fp16_to_f32(c.first), (float)c.second) << std::hex << c.first;
    EXPECT_TRUE(std::isinf(fp16_to_f32(0x7C00)));
    EXPECT_TRUE(std::isnan(fp16_to_f32(0x7E00)));
    // Every f16 bit pattern against the writer's decoder.
    for (uint32_t h = 0; h < 0x7C00; h++) {
        ASSERT_EQ(fp16_to_f32((uint16_t)h), (float)gguftest::from_f16((uint16_t)h)) << h;
        ASSERT_EQ(fp16_to_f32((uint16_t)(h | 0x8000)), (float)gguftest::from_f16((uint16_t)(h | 0x8000))) << h;
    }
    EXPECT_EQ(bf16_to_f32(0x3F80), 1.0f);
    EXPECT_EQ(bf16_to_f32(0xC040), -3.0f);
    EXPECT_EQ(bf16_to_f32(0x3E20), 0.15625f);
    float x[3];
    const uint16_t raw[3] = {0x3F80, 0x4000, 0xBF00};
    ASSERT_TRUE(dequantize(GGML_BF16, raw, x, 3));
    EXPECT_EQ(x[0], 1.0f);
    EXPECT_EQ(x[1], 2.0f);
    EXPECT_EQ(x[2], -0.5f);
    EXPECT_FALSE(dequantize(18 /* iq3_xxs */, raw, x, 256));
}

// ---------------------------------------------------------------- tiny models vs a double forward

struct Mat {
    int rows = 0, cols = 0;
    uint32_t type = 0;
    std::string bytes;       // rows in order
    std::vector<double> v;   // [rows][cols] as the reference reads them
};

// A random matrix of `type`: random valid blocks (magnitudes ~0.1), values from ref_elem.
Mat rand_mat(std::mt19937 &rng, int rows, int cols, uint32_t type) {
    Mat m;
    m.rows = rows;
    m.cols = cols;
    m.type = type;
    std::uniform_real_distribution<float> u(-0.15f, 0.15f);
    for (int r = 0; r < rows; r++) {
        if (type == GGML_F32 || type == GGML_F16 || type == GGML_BF16) {
            for (int c = 0; c < cols; c++) {
                float x = u(rng);
                if (type == GGML_F32) {
                    gguftest::put(m.bytes, &x, 4);
                    m.v.push_back(x);
                } else if (type == GGML_F16) {
                    uint16_t h = gguftest::to_f16(x);
                    gguftest::put(m.bytes, &h, 2);
                    m.v.push_back(gguftest::from_f16(h));
                } else {
                    uint32_t b;
                    std::memcpy(&b, &x, 4);
                    uint16_t h = (uint16_t)(b >> 16);
                    gguftest::put(m.bytes, &h, 2);
                    uint32_t back = (uint32_t)h << 16;
                    float y;
                    std::memcpy(&y, &back, 4);
                    m.v.push_back(y);
                }
            }
            continue;
        }
        uint64_t be, bb;
        ggml_block(type, &be, &bb);
        for (int b = 0; b < cols / (int)be; b++) {
            std::string blk = rand_bytes(rng, bb);
            const float scale = type == GGML_Q8_0 || type == GGML_Q8_1 ? 0.1f / 127
                                : type == GGML_Q4_0 || type == GGML_Q4_1   ? 0.02f
                                : type == GGML_Q5_0 || type == GGML_Q5_1   ? 0.01f
                                : type == GGML_Q4_K                        ? 0.0003f
                                : type == GGML_Q5_K                        ? 0.00015f
                                : type == GGML_Q2_K                        ? 0.002f
                                : type == GGML_Q3_K                        ? 0.0008f
                                : type == GGML_IQ4_NL                      ? 0.0008f
                                : type == GGML_IQ4_XS                      ? 0.000025f
                                                                           : 0.0001f;
            std::uniform_real_distribution<float> ud(0.3f * scale, scale);
            const uint16_t d = gguftest::to_f16((rng() & 1 ? 1 : -1) * ud(rng));
            if (type == GGML_Q6_K) {
                set16(blk, 208, d);
            } else if (type == GGML_Q2_K) {  // d and dmin at the end (dmin positive: d sc q - dmin m)
                set16(blk, 80, d);
                set16(blk, 82, gguftest::to_f16(ud(rng)));
            } else if (type == GGML_Q3_K) {
                set16(blk, 108, d);
            } else {
                set16(blk, 0, d);
                if (type == GGML_Q4_K || type == GGML_Q5_K) set16(blk, 2, gguftest::to_f16(ud(rng)));
                // q4_1 / q5_1: the minimum centres the values (d q + m, q in 0..15 / 0..31), either sign
                if (type == GGML_Q4_1) set16(blk, 2, gguftest::to_f16(-7.5f * std::fabs((float)gguftest::from_f16(d)) + 0.3f * ud(rng)));
                if (type == GGML_Q5_1) set16(blk, 2, gguftest::to_f16(-15.5f * std::fabs((float)gguftest::from_f16(d)) - 0.3f * ud(rng)));
            }
            m.bytes += blk;
            for (int j = 0; j < (int)be; j++) m.v.push_back(ref_elem(type, reinterpret_cast<const uint8_t *>(blk.data()), j));
        }
    }
    return m;
}

std::vector<float> rand_vec(std::mt19937 &rng, int n, float lo, float hi) {
    std::uniform_real_distribution<float> u(lo, hi);
    std::vector<float> v((size_t)n);
    for (auto &x : v) x = u(rng);
    return v;
}

struct Tiny {
    std::string arch;
    int D, F, L, H, KVH, hd, V, rope_dim;
    double theta, eps;
    bool tied;
    Mat emb, cls;
    std::vector<std::vector<float>> an, fn;  // norms per layer
    std::vector<float> on;
    std::vector<Mat> wq, wk, wv, wo, w1, w2, w3;  // HF row order
    std::vector<std::vector<float>> bq, bk, bv, qn, kn;
    // Scaled RoPE (issue 20 item 5): the reference's per-pair inverse frequencies (empty:
    // theta^(-2i/rope_dim)) and attention factor (logits times attn^2).
    std::vector<double> inv_freq;
    double attn = 1.0;
};

// mixed: the matrices cycle through every type (a Q4_K_M file mixes q4_K and q6_K with f32 norms;
// this also gives one matrix kind different types in different layers).
Tiny make_tiny(const std::string &arch, uint32_t type, bool tied, uint32_t seed, bool mixed = false) {
    std::mt19937 rng(seed);
    const uint32_t cycle[16] = {GGML_Q4_K, GGML_Q6_K, GGML_F32,  GGML_Q8_0, GGML_F16,  GGML_BF16,   GGML_Q4_0,  GGML_Q5_0,
                                GGML_Q5_K, GGML_Q4_1, GGML_Q5_1, GGML_Q8_1, GGML_Q2_K, GGML_IQ4_NL, GGML_Q3_K, GGML_IQ4_XS};
    int next = 0;
    auto rand_mat = [&](std::mt19937 &g, int rows, int cols, uint32_t ty) {
        return ::rand_mat(g, rows, cols, mixed ? cycle[next++ % 16] : ty);
    };
    Tiny t;
    t.arch = arch;
    t.D = 256;
    t.F = 512;
    t.L = 2;
    t.H = 4;
    t.KVH = 2;
    t.hd = arch == "qwen3" ? 128 : 64;  // qwen3: q_dim 512 != dim
    t.V = 96;
    t.rope_dim = t.hd;
    t.theta = arch == "llama" ? 10000.0 : 1000000.0;
    t.eps = arch == "llama" ? 1e-5 : 1e-6;
    t.tied = tied;
    const int QD = t.H * t.hd, KVD = t.KVH * t.hd;
    t.emb = rand_mat(rng, t.V, t.D, type);
    if (!tied) t.cls = rand_mat(rng, t.V, t.D, type);
    for (int l = 0; l < t.L; l++) {
        t.an.push_back(rand_vec(rng, t.D, 0.8f, 1.2f));
        t.fn.push_back(rand_vec(rng, t.D, 0.8f, 1.2f));
        t.wq.push_back(rand_mat(rng, QD, t.D, type));
        t.wk.push_back(rand_mat(rng, KVD, t.D, type));
        t.wv.push_back(rand_mat(rng, KVD, t.D, type));
        t.wo.push_back(rand_mat(rng, t.D, QD, type));
        t.w1.push_back(rand_mat(rng, t.F, t.D, type));
        t.w2.push_back(rand_mat(rng, t.D, t.F, type));
        t.w3.push_back(rand_mat(rng, t.F, t.D, type));
        if (arch == "qwen2") {
            t.bq.push_back(rand_vec(rng, QD, -0.5f, 0.5f));
            t.bk.push_back(rand_vec(rng, KVD, -0.5f, 0.5f));
            t.bv.push_back(rand_vec(rng, KVD, -0.5f, 0.5f));
        }
        if (arch == "qwen3") {
            t.qn.push_back(rand_vec(rng, t.hd, 0.5f, 1.5f));
            t.kn.push_back(rand_vec(rng, t.hd, 0.5f, 1.5f));
        }
    }
    t.on = rand_vec(rng, t.D, 0.8f, 1.2f);
    return t;
}

// The llama converter's q/k row order: within each head, rows (i, i + hd/2) of the rotate-half
// layout become rows (2i, 2i + 1).
std::string permute_rows(const Mat &m, int heads) {
    const size_t row = m.bytes.size() / (size_t)m.rows;
    const int hd = m.rows / heads;
    std::string o;
    for (int h = 0; h < heads; h++)
        for (int i = 0; i < hd / 2; i++)
            for (int s = 0; s < 2; s++) o += m.bytes.substr((size_t)(h * hd + s * hd / 2 + i) * row, row);
    return o;
}

Writer tiny_writer(const Tiny &t) {
    Writer w;
    const std::string a = t.arch + ".";
    w.str("general.architecture", t.arch);
    w.str("general.name", "tiny " + t.arch);
    w.u32(a + "block_count", (uint32_t)t.L);
    w.u32(a + "embedding_length", (uint32_t)t.D);
    w.u32(a + "feed_forward_length", (uint32_t)t.F);
    w.u32(a + "attention.head_count", (uint32_t)t.H);
    w.u32(a + "attention.head_count_kv", (uint32_t)t.KVH);
    w.u32(a + "context_length", 4096);
    w.u32(a + "rope.dimension_count", (uint32_t)t.rope_dim);
    w.f32(a + "rope.freq_base", (float)t.theta);
    w.f32(a + "attention.layer_norm_rms_epsilon", (float)t.eps);
    if (t.arch == "qwen3") {
        w.u32(a + "attention.key_length", (uint32_t)t.hd);
        w.u32(a + "attention.value_length", (uint32_t)t.hd);
    }
    auto mat = [&](const std::string &n, const Mat &m, const std::string *bytes = nullptr) {
        w.tensor(n, {(uint64_t)m.cols, (uint64_t)m.rows}, m.type, bytes ? *bytes : m.bytes);
    };
    mat("token_embd.weight", t.emb);
    if (!t.tied) mat("output.weight", t.cls);
    w.tensor_f32("output_norm.weight", {(uint64_t)t.D}, t.on.data(), t.on.size());
    for (int l = 0; l < t.L; l++) {
        const std::string b = "blk." + std::to_string(l) + ".";
        w.tensor_f32(b + "attn_norm.weight", {(uint64_t)t.D}, t.an[(size_t)l].data(), (size_t)t.D);
        w.tensor_f32(b + "ffn_norm.weight", {(uint64_t)t.D}, t.fn[(size_t)l].data(), (size_t)t.D);
        if (t.arch == "llama") {
            const std::string q = permute_rows(t.wq[(size_t)l], t.H), k = permute_rows(t.wk[(size_t)l], t.KVH);
            mat(b + "attn_q.weight", t.wq[(size_t)l], &q);
            mat(b + "attn_k.weight", t.wk[(size_t)l], &k);
        } else {
            mat(b + "attn_q.weight", t.wq[(size_t)l]);
            mat(b + "attn_k.weight", t.wk[(size_t)l]);
        }
        mat(b + "attn_v.weight", t.wv[(size_t)l]);
        mat(b + "attn_output.weight", t.wo[(size_t)l]);
        mat(b + "ffn_gate.weight", t.w1[(size_t)l]);
        mat(b + "ffn_down.weight", t.w2[(size_t)l]);
        mat(b + "ffn_up.weight", t.w3[(size_t)l]);
        if (t.arch == "qwen2") {
            w.tensor_f32(b + "attn_q.bias", {t.bq[(size_t)l].size()}, t.bq[(size_t)l].data(), t.bq[(size_t)l].size());
            w.tensor_f32(b + "attn_k.bias", {t.bk[(size_t)l].size()}, t.bk[(size_t)l].data(), t.bk[(size_t)l].size());
            w.tensor_f32(b + "attn_v.bias", {t.bv[(size_t)l].size()}, t.bv[(size_t)l].data(), t.bv[(size_t)l].size());
        }
        if (t.arch == "qwen3") {
            w.tensor_f32(b + "attn_q_norm.weight", {(uint64_t)t.hd}, t.qn[(size_t)l].data(), (size_t)t.hd);
            w.tensor_f32(b + "attn_k_norm.weight", {(uint64_t)t.hd}, t.kn[(size_t)l].data(), (size_t)t.hd);
        }
    }
    return w;
}

// Plain double forward from the definitions (Hugging Face semantics: rotate-half RoPE on the
// unpermuted rows, causal softmax attention with 1/sqrt(hd), GQA, SwiGLU, RMSNorm).
std::vector<std::vector<double>> ref_forward(const Tiny &t, const std::vector<int32_t> &toks) {
    const int D = t.D, QD = t.H * t.hd, KVD = t.KVH * t.hd, n = (int)toks.size();
    auto mv = [](const Mat &m, const std::vector<double> &x) {
        std::vector<double> y((size_t)m.rows, 0.0);
        for (int r = 0; r < m.rows; r++)
            for (int c = 0; c < m.cols; c++) y[(size_t)r] += m.v[(size_t)r * m.cols + c] * x[(size_t)c];
        return y;
    };
    auto norm = [&](const std::vector<double> &x, const float *w, size_t off, int len) {
        std::vector<double> y(x.size());
        for (size_t s = 0; s < x.size(); s += (size_t)len) {
            double ss = 0;
            for (int i = 0; i < len; i++) ss += x[s + (size_t)i] * x[s + (size_t)i];
            const double inv = 1.0 / std::sqrt(ss / len + t.eps);
            for (int i = 0; i < len; i++) y[s + (size_t)i] = x[s + (size_t)i] * inv * w[off + (size_t)i];
        }
        return y;
    };
    auto rope = [&](std::vector<double> &v, int heads, int p) {
        const int half = t.rope_dim / 2;
        for (int h = 0; h < heads; h++)
            for (int i = 0; i < half; i++) {
                const double ang = p * (t.inv_freq.empty() ? std::pow(t.theta, -2.0 * i / t.rope_dim) : t.inv_freq[(size_t)i]);
                double &a = v[(size_t)(h * t.hd + i)], &b = v[(size_t)(h * t.hd + i + half)];
                const double x = a, y = b;
                a = x * std::cos(ang) - y * std::sin(ang);
                b = y * std::cos(ang) + x * std::sin(ang);
            }
    };
    std::vector<std::vector<double>> x((size_t)n), logits((size_t)n);
    for (int p = 0; p < n; p++)
        x[(size_t)p].assign(t.emb.v.begin() + (long)toks[(size_t)p] * D, t.emb.v.begin() + (long)(toks[(size_t)p] + 1) * D);
    for (int l = 0; l < t.L; l++) {
        std::vector<std::vector<double>> K((size_t)n), Vv((size_t)n), Q((size_t)n);
        for (int p = 0; p < n; p++) {
            auto xn = norm(x[(size_t)p], t.an[(size_t)l].data(), 0, D);
            Q[(size_t)p] = mv(t.wq[(size_t)l], xn);
            K[(size_t)p] = mv(t.wk[(size_t)l], xn);
            Vv[(size_t)p] = mv(t.wv[(size_t)l], xn);
            if (!t.bq.empty()) {
                for (int i = 0; i < QD; i++) Q[(size_t)p][(size_t)i] += t.bq[(size_t)l][(size_t)i];
                for (int i = 0; i < KVD; i++) K[(size_t)p][(size_t)i] += t.bk[(size_t)l][(size_t)i];
                for (int i = 0; i < KVD; i++) Vv[(size_t)p][(size_t)i] += t.bv[(size_t)l][(size_t)i];
            }
            if (!t.qn.empty()) {
                Q[(size_t)p] = norm(Q[(size_t)p], t.qn[(size_t)l].data(), 0, t.hd);
                K[(size_t)p] = norm(K[(size_t)p], t.kn[(size_t)l].data(), 0, t.hd);
            }
            rope(Q[(size_t)p], t.H, p);
            rope(K[(size_t)p], t.KVH, p);
        }
        for (int p = 0; p < n; p++) {
            std::vector<double> att((size_t)QD, 0.0);
            for (int h = 0; h < t.H; h++) {
                const int kh = h / (t.H / t.KVH);
                std::vector<double> s((size_t)p + 1);
                double mx = -1e300;
                for (int j = 0; j <= p; j++) {
                    double d = 0;
                    for (int i = 0; i < t.hd; i++) d += Q[(size_t)p][(size_t)(h * t.hd + i)] * K[(size_t)j][(size_t)(kh * t.hd + i)];
                    s[(size_t)j] = d / std::sqrt((double)t.hd) * t.attn * t.attn;
                    mx = std::max(mx, s[(size_t)j]);
                }
                double z = 0;
                for (auto &e : s) z += e = std::exp(e - mx);
                for (int j = 0; j <= p; j++)
                    for (int i = 0; i < t.hd; i++)
                        att[(size_t)(h * t.hd + i)] += s[(size_t)j] / z * Vv[(size_t)j][(size_t)(kh * t.hd + i)];
            }
            auto o = mv(t.wo[(size_t)l], att);
            for (int i = 0; i < D; i++) x[(size_t)p][(size_t)i] += o[(size_t)i];
            auto xn = norm(x[(size_t)p], t.fn[(size_t)l].data(), 0, D);
            auto g = mv(t.w1[(size_t)l], xn), u = mv(t.w3[(size_t)l], xn);
            for (size_t i = 0; i < g.size(); i++) g[i] = g[i] / (1 + std::exp(-g[i])) * u[i];
            auto dn = mv(t.w2[(size_t)l], g);
            for (int i = 0; i < D; i++) x[(size_t)p][(size_t)i] += dn[(size_t)i];
        }
    }
    for (int p = 0; p < n; p++) logits[(size_t)p] = mv(t.tied ? t.emb : t.cls, norm(x[(size_t)p], t.on.data(), 0, D));
    return logits;
}

void check_tiny(const std::string &arch, uint32_t type, bool tied, bool mixed = false) {
    SCOPED_TRACE(arch + " " + (mixed ? std::string("mixed") : ggml_type_name(type)) + (tied ? " tied" : " separate"));
    Tiny t = make_tiny(arch, type, tied, 1234 + type * 7 + (tied ? 1 : 0), mixed);
    TmpFile f("tiny-" + arch + ".gguf");
    ASSERT_TRUE(tiny_writer(t).write(f.path));
    Checkpoint ck;
    std::string err;
    ASSERT_TRUE(load_model(f.path, &ck, &err)) << err;
    EXPECT_EQ(ck.format, "gguf");
    EXPECT_EQ(ck.arch, arch);
    EXPECT_EQ(ck.cfg.head_dim(), t.hd);
    EXPECT_EQ(ck.cfg.rope, arch == "llama" ? KVP_ROPE_GPTJ : KVP_ROPE_NEOX);
    const std::vector<int32_t> toks = {3, 17, 95, 0, 42, 42, 7, 60};
    auto ref = ref_forward(t, toks);
    Session s;
    ASSERT_TRUE(s.init(ck, "policy=full capacity=64", &err)) << err;
    const int P = 5, V = t.V;
    std::vector<float> lg((size_t)P * V);
    ASSERT_TRUE(s.prefill(toks.data(), P, lg.data(), true, &err)) << err;
    double worst = 0, scale = 0;
    for (int p = 0; p < (int)toks.size(); p++) {
        std::vector<float> row((size_t)V);
        if (p < P) {
            std::copy(lg.begin() + (long)p * V, lg.begin() + (long)(p + 1) * V, row.begin());
        } else {
            ASSERT_TRUE(s.decode(toks[(size_t)p], row.data(), &err)) << err;
        }
        for (int v = 0; v < V; v++) {
            worst = std::max(worst, std::fabs(row[(size_t)v] - ref[(size_t)p][(size_t)v]));
            scale = std::max(scale, std::fabs(ref[(size_t)p][(size_t)v]));
        }
    }
    EXPECT_GT(scale, 0.1);  // the logits are not degenerate
    EXPECT_LT(worst, 2e-4 * scale + 1e-5) << "max |logit - reference| " << worst << " of scale " << scale;
}

TEST(GgufModel, LlamaEveryWeightTypeMatchesTheDoubleReference) {
    for (uint32_t type : {GGML_F32, GGML_F16, GGML_BF16, GGML_Q8_0, GGML_Q4_0, GGML_Q4_K, GGML_Q6_K})
        check_tiny("llama", type, type != GGML_F16);
}

TEST(GgufModel, Q41Q50Q51Q81Q5KMatchTheDoubleReference) {
    for (uint32_t type : {GGML_Q4_1, GGML_Q5_0, GGML_Q5_1, GGML_Q8_1, GGML_Q5_K})
        check_tiny("llama", type, type != GGML_Q5_0);
    check_tiny("qwen2", GGML_Q5_0, true);
    check_tiny("qwen3", GGML_Q5_K, false);
}

// llama-quantize's Q2_K, Q3_K_S/M, IQ4_NL and IQ4_XS types (issue 29) in a GGUF file through the
// writer: loaded, read in place, the forward pass equal to the double reference.
TEST(GgufModel, Q2KQ3KIq4NlIq4XsMatchTheDoubleReference) {
    for (uint32_t type : {GGML_Q2_K, GGML_Q3_K, GGML_IQ4_NL, GGML_IQ4_XS}) check_tiny("llama", type, type != GGML_Q3_K);
    check_tiny("qwen2", GGML_IQ4_NL, false);
    check_tiny("qwen3", GGML_Q3_K, true);
}

TEST(GgufModel, Qwen2BiasesAndQwen3QkNormMatchTheDoubleReference) {
    check_tiny("qwen2", GGML_F32, true);
    check_tiny("qwen2", GGML_Q8_0, false);
    check_tiny("qwen2", GGML_Q4_K, true);
    check_tiny("qwen3", GGML_F32, true);
    check_tiny("qwen3", GGML_BF16, false);
    check_tiny("qwen3", GGML_Q6_K, true);
}

TEST(GgufModel, MixedTypesPerMatrixAndLayer) {
    check_tiny("llama", 0, false, true);
    check_tiny("qwen2", 0, true, true);
}

// The quantized products: the same bits for 1, 2 and 3 threads, and prefill of all tokens equal
// to prefill of one then decode of the rest (the f32 path's property, kept by the kernels).
TEST(GgufModel, QuantizedProductsIndependentOfThreadsAndOfPrefillSplit) {
    for (uint32_t type : {GGML_Q8_0, GGML_Q4_K, GGML_Q5_0, GGML_Q4_1, GGML_Q5_1, GGML_Q8_1, GGML_Q5_K, GGML_Q2_K, GGML_Q3_K,
                          GGML_IQ4_NL, GGML_IQ4_XS}) {
        SCOPED_TRACE(ggml_type_name(type));
        Tiny t = make_tiny("qwen2", type, false, 77);
        TmpFile f("threads.gguf");
        ASSERT_TRUE(tiny_writer(t).write(f.path));
        Checkpoint ck;
        std::string err;
        ASSERT_TRUE(load_model(f.path, &ck, &err)) << err;
        ASSERT_FALSE(ck.qmat.empty());
        EXPECT_EQ(ck.wq, nullptr);  // read from the mapping
        const std::vector<int32_t> toks = {5, 9, 11, 2, 80, 81, 3};
        const int n = (int)toks.size(), V = t.V;
        std::vector<float> first;
        for (int th : {1, 2, 3}) {
            Session s;
            ASSERT_TRUE(s.init(ck, "policy=full capacity=16", &err)) << err;
            s.set_threads(th);
            std::vector<float> lg((size_t)n * V);
            ASSERT_TRUE(s.prefill(toks.data(), n, lg.data(), true, &err)) << err;
            if (first.empty()) first = lg;
            else EXPECT_EQ(std::memcmp(first.data(), lg.data(), lg.size() * 4), 0) << th << " threads";
        }
        Session s;
        ASSERT_TRUE(s.init(ck, "policy=full capacity=16", &err)) << err;
        std::vector<float> row((size_t)V);
        ASSERT_TRUE(s.prefill(toks.data(), 1, row.data(), false, &err)) << err;
        EXPECT_EQ(std::memcmp(row.data(), first.data(), (size_t)V * 4), 0);
        for (int p = 1; p < n; p++) {
            ASSERT_TRUE(s.decode(toks[(size_t)p], row.data(), &err)) << err;
            EXPECT_EQ(std::memcmp(row.data(), first.data() + (size_t)p * V, (size_t)V * 4), 0) << "position " << p;
        }
    }
}

TEST(GgufModel, TheRopeConventionMatters) {
    // The same llama file read as NeoX (unpermuted) would not match: the test above can fail.
    Tiny t = make_tiny("llama", GGML_F32, true, 99);
    TmpFile f("rope.gguf");
    ASSERT_TRUE(tiny_writer(t).write(f.path));
    Checkpoint ck;
    std::string err;
    ASSERT_TRUE(load_model(f.path, &ck, &err)) << err;
    ck.cfg.rope = KVP_ROPE_NEOX;
    const std::vector<int32_t> toks = {1, 2, 3, 4, 5, 6};
    auto ref = ref_forward(t, toks);
    Session s;
    ASSERT_TRUE(s.init(ck, "policy=full capacity=16", &err)) << err;
    std::vector<float> lg(6 * (size_t)t.V);
    ASSERT_TRUE(s.prefill(toks.data(), 6, lg.data(), true, &err)) << err;
    double worst = 0;
    for (int v = 0; v < t.V; v++) worst = std::max(worst, std::fabs(lg[5 * (size_t)t.V + (size_t)v] - ref[5][(size_t)v]));
    EXPECT_GT(worst, 1e-3);
}

// A tiny llama file with a modification, loaded: false and the message.
std::string refusal(void (*edit)(Writer &)) {
    Tiny t = make_tiny("llama", GGML_F32, true, 5);
    Writer w = tiny_writer(t);
    edit(w);
    TmpFile f("refuse.gguf");
    EXPECT_TRUE(w.write(f.path));
    Checkpoint ck;
    std::string err;
    EXPECT_FALSE(load_model(f.path, &ck, &err));
    EXPECT_EQ(err.find('\n'), std::string::npos) << err;
    return err;
}

TEST(GgufModel, RefusalsNameWhatIsNotSupported) {
    auto has = [](const std::string &e, const std::string &n) {
        EXPECT_NE(e.find(n), std::string::npos) << "message: " << e << "\nexpected: " << n;
    };
    has(refusal([](Writer &w) {
            w = Writer();
            w.str("general.architecture", "gemma2");
        }),
        "architecture 'gemma2' is not supported (supported: llama, qwen2, qwen3)");
    has(refusal([](Writer &w) { w.str("llama.rope.scaling.type", "longrope"); }),
        "RoPE scaling type 'longrope' is not supported (supported: none, linear, yarn, and llama3-style rope_freqs.weight");
    has(refusal([](Writer &w) {
            w.str("llama.rope.scaling.type", "yarn");
            w.f32("llama.rope.scaling.factor", 4.0f);
        }),
        "yarn RoPE scaling needs llama.rope.scaling.original_context_length");
    has(refusal([](Writer &w) {
            w.str("llama.rope.scaling.type", "linear");
            w.f32("llama.rope.scaling.factor", 0.5f);
        }),
        "rope.scaling.factor 0.500000 is out of range 1..1e6 (linear)");
    has(refusal([](Writer &w) {
            std::vector<float> ff(16, 1.0f);
            w.tensor_f32("rope_freqs.weight", {16}, ff.data(), 16);
        }),
        "tensor rope_freqs.weight must be f32 with rope.dimension_count/2 = 32 elements (it has 16");
    has(refusal([](Writer &w) {
            std::vector<float> ff(32, 1.0f);
            ff[7] = 0.0f;
            w.tensor_f32("rope_freqs.weight", {32}, ff.data(), 32);
        }),
        "rope_freqs.weight: KVP_ERR_CONFIG: invalid configuration: divisors[7]=0 must be finite and > 0");
    has(refusal([](Writer &w) {
            std::vector<float> ff(32, 1.0f);
            w.tensor_f32("rope_freqs.weight", {32}, ff.data(), 32);
            w.str("llama.rope.scaling.type", "linear");
            w.f32("llama.rope.scaling.factor", 2.0f);
        }),
        "rope_freqs.weight together with rope.scaling.type linear is not supported");
    has(refusal([](Writer &w) { w.u32("llama.attention.sliding_window", 4096); }), "sliding-window");
    has(refusal([](Writer &w) { w.tensors[0].type = 18; }), "has type iq3_xxs, not supported (supported: f32, f16, bf16");
    has(refusal([](Writer &w) { w.tensors[0].type = 15; }), "has type q8_K, not supported");
    has(refusal([](Writer &w) { w.tensors[0].type = 16777216; }),
        "has an unknown or corrupt type number 16777216 (no ggml type has it), not supported");
    has(refusal([](Writer &w) { w.tensors.pop_back(); }), "missing tensor blk.1.ffn_up.weight");
    has(refusal([](Writer &w) {
            w.u32("llama.attention.key_length", 64);
            w.u32("llama.attention.value_length", 32);
        }),
        "differs from value_length");
    has(refusal([](Writer &w) { w.tensors[3].ne = {128, 256}; }), "has shape [128, 256], expected");
    has(refusal([](Writer &w) {
            w.str("tokenizer.ggml.model", "bert");
            w.str_arr("tokenizer.ggml.tokens", {"a"});
        }),
        "tokenizer model 'bert' is not supported (supported: llama, gpt2)");
    has(refusal([](Writer &w) {
            w.str("tokenizer.ggml.model", "gpt2");
            w.str_arr("tokenizer.ggml.tokens", {"a"});
            w.str_arr("tokenizer.ggml.merges", {});
            w.str("tokenizer.ggml.pre", "deepseek-llm");
        }),
        "pre-tokenizer 'deepseek-llm' is not supported");
    has(refusal([](Writer &w) {
            std::vector<float> bad(256, NAN);
            w.tensors[2].bytes.replace(0, 1024, std::string(reinterpret_cast<const char *>(bad.data()), 1024));
        }),
        "non-finite");
}

// ---------------------------------------------------------------- enbytes-1m as GGUF

Writer enbytes_writer(const Checkpoint &ck, bool q8) {
    const ModelConfig &c = ck.cfg;
    Writer w;
    w.str("general.architecture", "llama");
    w.u32("llama.block_count", (uint32_t)c.n_layers);
    w.u32("llama.embedding_length", (uint32_t)c.dim);
    w.u32("llama.feed_forward_length", (uint32_t)c.hidden_dim);
    w.u32("llama.attention.head_count", (uint32_t)c.n_heads);
    w.u32("llama.attention.head_count_kv", (uint32_t)c.n_kv_heads);
    w.u32("llama.context_length", (uint32_t)c.seq_len);
    w.f32("llama.rope.freq_base", 10000.0f);
    w.f32("llama.attention.layer_norm_rms_epsilon", 1e-5f);
    auto m = [&](const std::string &n, const float *p, int rows, int cols) {
        const size_t k = (size_t)rows * cols;
        if (q8) w.tensor(n, {(uint64_t)cols, (uint64_t)rows}, GGML_Q8_0, gguftest::quant_q8_0(p, k));
        else w.tensor_f32(n, {(uint64_t)cols, (uint64_t)rows}, p, k);
    };
    const int D = c.dim, Q = c.q_dim(), KV = c.kv_dim(), F = c.hidden_dim;
    m("token_embd.weight", ck.tok_emb, c.vocab, D);
    if (!c.shared_classifier) m("output.weight", ck.wcls, c.vocab, D);
    w.tensor_f32("output_norm.weight", {(uint64_t)D}, ck.rms_final, (size_t)D);
    for (int l = 0; l < c.n_layers; l++) {
        const std::string b = "blk." + std::to_string(l) + ".";
        // llama2.c files already hold q/k rows in the interleaved order GGUF llama files use.
        w.tensor_f32(b + "attn_norm.weight", {(uint64_t)D}, ck.rms_att + (size_t)l * D, (size_t)D);
        w.tensor_f32(b + "ffn_norm.weight", {(uint64_t)D}, ck.rms_ffn + (size_t)l * D, (size_t)D);
        m(b + "attn_q.weight", ck.wq + (size_t)l * Q * D, Q, D);
        m(b + "attn_k.weight", ck.wk + (size_t)l * KV * D, KV, D);
        m(b + "attn_v.weight", ck.wv + (size_t)l * KV * D, KV, D);
        m(b + "attn_output.weight", ck.wo + (size_t)l * D * Q, D, Q);
        m(b + "ffn_gate.weight", ck.w1 + (size_t)l * F * D, F, D);
        m(b + "ffn_down.weight", ck.w2 + (size_t)l * D * F, D, F);
        m(b + "ffn_up.weight", ck.w3 + (size_t)l * F * D, F, D);
    }
    return w;
}

void enbytes_logits(const Checkpoint &ck, const std::vector<int32_t> &toks, std::vector<float> *out) {
    Session s;
    std::string err;
    ASSERT_TRUE(s.init(ck, "policy=full capacity=" + std::to_string(toks.size()), &err)) << err;
    const int P = (int)toks.size() / 2, V = ck.cfg.vocab;
    out->assign(toks.size() * (size_t)V, 0.f);
    ASSERT_TRUE(s.prefill(toks.data(), P, out->data(), true, &err)) << err;
    for (size_t p = (size_t)P; p < toks.size(); p++) ASSERT_TRUE(s.decode(toks[p], out->data() + p * (size_t)V, &err)) << err;
}

TEST(GgufModel, EnbytesAsGgufF32IsBitIdenticalAndQ8IsClose) {
    Checkpoint bin;
    std::string err;
    ASSERT_TRUE(load_checkpoint(std::string(KVP_HARNESS_MODELS_DIR) + "/enbytes-1m.bin", &bin, &err)) << err;
    std::ifstream tf(std::string(KVP_HARNESS_MODELS_DIR) + "/enbytes-1m.eval.txt", std::ios::binary);
    std::string text((std::istreambuf_iterator<char>(tf)), std::istreambuf_iterator<char>());
    ASSERT_GE(text.size(), 96u);
    std::vector<int32_t> toks;
    for (size_t i = 0; i < 96; i++) toks.push_back((unsigned char)text[i]);
    std::vector<float> want, got, q;
    enbytes_logits(bin, toks, &want);
    {
        TmpFile f("enbytes-f32.gguf");
        ASSERT_TRUE(enbytes_writer(bin, false).write(f.path));
        Checkpoint g;
        ASSERT_TRUE(load_model(f.path, &g, &err)) << err;
        enbytes_logits(g, toks, &got);
        ASSERT_EQ(got.size(), want.size());
        EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * 4), 0) << "f32 GGUF logits differ from the .bin";
    }
    {
        TmpFile f("enbytes-q8.gguf");
        ASSERT_TRUE(enbytes_writer(bin, true).write(f.path));
        Checkpoint g;
        ASSERT_TRUE(load_model(f.path, &g, &err)) << err;
        EXPECT_EQ(g.weight_types["q8_0"], 1 + 7 * bin.cfg.n_layers);
        enbytes_logits(g, toks, &q);
        double worst = 0, nll_bin = 0, nll_q = 0;
        const int V = bin.cfg.vocab;
        for (size_t p = 0; p + 1 < toks.size(); p++) {
            auto nll = [&](const std::vector<float> &lg) {
                double m = -1e30, z = 0;
                for (int v = 0; v < V; v++) m = std::max(m, (double)lg[p * V + (size_t)v]);
                for (int v = 0; v < V; v++) z += std::exp(lg[p * V + (size_t)v] - m);
                return std::log(z) + m - lg[p * V + (size_t)toks[p + 1]];
            };
            nll_bin += nll(want);
            nll_q += nll(q);
            for (int v = 0; v < V; v++) worst = std::max(worst, (double)std::fabs(q[p * V + (size_t)v] - want[p * V + (size_t)v]));
        }
        // The stated bound (docs/harness.md): |logit difference| < 0.25 and mean NLL within 0.01 nats.
        EXPECT_LT(worst, 0.25);
        EXPECT_LT(std::fabs(nll_q - nll_bin) / (double)(toks.size() - 1), 0.01);
        std::printf("enbytes q8_0 vs f32: max |logit diff| %.4f, mean NLL %.5f vs %.5f\n", worst,
                    nll_q / (double)(toks.size() - 1), nll_bin / (double)(toks.size() - 1));
    }
}

// ---------------------------------------------------------------- tokenizers

// The cases file: [{"text": "...", "ids_with_bos": [..]}, ...] (a minimal reader for it).
std::vector<std::pair<std::string, std::vector<int32_t>>> read_cases(const std::string &path) {
    std::ifstream f(path, std::ios::binary);
    std::string s((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    std::vector<std::pair<std::string, std::vector<int32_t>>> out;
    size_t i = 0;
    while ((i = s.find("\"text\"", i)) != std::string::npos) {
        i = s.find('"', s.find(':', i) + 1) + 1;
        std::string t;
        for (; s[i] != '"'; i++) {
            if (s[i] != '\\') {
                t.push_back(s[i]);
                continue;
            }
            char e = s[++i];
            if (e == 'n') t.push_back('\n');
            else if (e == 't') t.push_back('\t');
            else if (e == 'u') {
                unsigned cp = (unsigned)std::stoul(s.substr(i + 1, 4), nullptr, 16);
                i += 4;
                if (cp < 0x80) t.push_back((char)cp);
                else if (cp < 0x800) {
                    t.push_back((char)(0xC0 | (cp >> 6)));
                    t.push_back((char)(0x80 | (cp & 63)));
                } else {
                    t.push_back((char)(0xE0 | (cp >> 12)));
                    t.push_back((char)(0x80 | ((cp >> 6) & 63)));
                    t.push_back((char)(0x80 | (cp & 63)));
                }
            } else t.push_back(e);
        }
        size_t a = s.find('[', i), b = s.find(']', a);
        std::vector<int32_t> ids;
        std::stringstream ss(s.substr(a + 1, b - a - 1));
        std::string tok;
        while (std::getline(ss, tok, ',')) ids.push_back(std::stoi(tok));
        out.push_back({t, ids});
        i = b;
    }
    return out;
}

TEST(GgufTokenizer, Llama2SentencePieceReproducesEveryCase) {
    const std::string dir = KVP_SHARED_MODELS_DIR;
    SpmVocab v;
    if (dir.empty() || !read_llama2c_vocab(dir + "/tokenizer-llama2.bin", &v)) GTEST_SKIP() << "no ../shared/models/tokenizer-llama2.bin";
    auto cases = read_cases(dir + "/tokenizer-llama2-cases.json");
    ASSERT_GE(cases.size(), 5u);
    // Into a GGUF (a one-layer llama of vocab 32000 would be 32000 x dim floats: use a tiny dim).
    Tiny t = make_tiny("llama", GGML_F32, true, 3);
    Writer w = tiny_writer(t);
    std::vector<float> emb((size_t)32000 * t.D, 0.01f);
    w.tensors[0].ne = {(uint64_t)t.D, 32000};
    w.tensors[0].bytes.assign(reinterpret_cast<const char *>(emb.data()), emb.size() * 4);
    w.str("tokenizer.ggml.model", "llama");
    w.str_arr("tokenizer.ggml.tokens", v.pieces);
    w.f32_arr("tokenizer.ggml.scores", v.scores);
    w.i32_arr("tokenizer.ggml.token_type", v.types);
    w.u32("tokenizer.ggml.bos_token_id", 1);
    w.u32("tokenizer.ggml.eos_token_id", 2);
    TmpFile f("llama2-tok.gguf");
    ASSERT_TRUE(w.write(f.path));
    Checkpoint ck;
    std::string err;
    ASSERT_TRUE(load_model(f.path, &ck, &err)) << err;
    ASSERT_TRUE(ck.tok);
    EXPECT_EQ(ck.tok->bos, 1);
    EXPECT_EQ(ck.tok->eos, 2);
    EXPECT_TRUE(ck.tok->add_bos);
    for (auto &c : cases) {
        EXPECT_EQ(ck.tok->encode(c.first, true), c.second) << "text: " << c.first;
        // decode gives the text back (the leading space of the first piece aside)
        std::vector<int32_t> ids(c.second.begin() + 1, c.second.end());
        std::string back = ck.tok->decode(ids);
        if (!back.empty() && back[0] == ' ') back.erase(0, 1);
        EXPECT_EQ(back, c.first);
    }
    // byte fallback for a character outside the vocabulary, and BOS as text
    auto ids = ck.tok->encode("\xF0\x9F\xA6\x99", false);
    EXPECT_EQ(ck.tok->decode(ids), " \xF0\x9F\xA6\x99");
    EXPECT_EQ(ck.tok->encode("<s>hi", false, true, /*parse_special=*/true).front(), 1);
    EXPECT_NE(ck.tok->encode("<s>hi", false).front(), 1);  // haystack text: "<s>" is text
    // A long text (the eval text, 200 KB) encodes in linear time and decodes back.
    std::ifstream tf(std::string(KVP_HARNESS_MODELS_DIR) + "/enbytes-1m.eval.txt", std::ios::binary);
    std::string big((std::istreambuf_iterator<char>(tf)), std::istreambuf_iterator<char>());
    ASSERT_GT(big.size(), 100000u);
    auto big_ids = ck.tok->encode(big, false);
    EXPECT_LT(big_ids.size(), big.size() / 2);
    EXPECT_EQ(ck.tok->decode(big_ids), " " + big);
    // tokenizer.ggml.add_space_prefix = false: no U+2581 in front ("I" alone, not "▁I" = 306)
    w.boolean("tokenizer.ggml.add_space_prefix", false);
    ASSERT_TRUE(w.write(f.path));
    Checkpoint ck2;
    ASSERT_TRUE(load_model(f.path, &ck2, &err)) << err;
    EXPECT_FALSE(ck2.tok->add_space_prefix);
    auto ids2 = ck2.tok->encode("I believe", false);
    ASSERT_FALSE(ids2.empty());
    EXPECT_NE(ids2.front(), 306);
    EXPECT_EQ(ck2.tok->decode(ids2), "I believe");
}

// A byte-level BPE on a hand-made vocabulary: every single byte character, plus merges.
std::shared_ptr<const Tokenizer> small_bpe(const std::string &pre) {
    std::vector<std::string> pieces;
    pieces.resize(256);
    {  // GPT-2's byte map, written out: printable bytes are themselves, the others 256 + n in order

        int n = 0;
        for (int b = 0; b < 256; b++) {
            const bool keep = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
            const unsigned cp = keep ? (unsigned)b : 256u + (unsigned)n++;
            std::string s;
            if (cp < 0x80) s.push_back((char)cp);
            else {
                s.push_back((char)(0xC0 | (cp >> 6)));
                s.push_back((char)(0x80 | (cp & 63)));
            }
            pieces[(size_t)b] = s;
        }
    }
    // Ġ = U+0120 (space), Ċ = U+010A (newline)
    const std::vector<std::string> merges = {"h e", "l l", "he ll", "hell o", "\xC4\xA0 w", "\xC4\xA0w o", "\xC4\xA0wo r",
                                             "\xC4\xA0wor l", "\xC4\xA0worl d", "1 2", "12 3", "' s", "\xC4\xA0 \xC4\xA0"};
    for (const std::string &m : merges) {
        std::string a = m.substr(0, m.find(' ')), b = m.substr(m.find(' ') + 1);
        pieces.push_back(a + b);
    }
    pieces.push_back("<|end|>");
    std::vector<int32_t> types(pieces.size(), 1);
    types.back() = 3;
    std::shared_ptr<const Tokenizer> t;
    std::string err;
    EXPECT_TRUE(Tokenizer::build(Tokenizer::kBpe, pre, pieces, {}, types, merges, &t, &err)) << err;
    return t;
}

std::vector<std::string> split(const std::string &pre, const std::string &text) { return small_bpe(pre)->pre_split(text); }

TEST(GgufTokenizer, BytePairPreTokenizers) {
    using V = std::vector<std::string>;
    // gpt-2: contractions (case-sensitive), " ?letters", " ?digits" (any run), spaces (default:
    // test_tokenizer.cpp)
    EXPECT_EQ(split("gpt-2", "Hello world's 12345  end\n\nx"),
              (V{"Hello", " world", "'s", " 12345", " ", " end", "\n", "\n", "x"}));
    EXPECT_EQ(split("gpt-2", "DON'T"), (V{"DON", "'", "T"}));
    // llama3: case-insensitive contractions, digits in threes, punctuation + newlines, \s*[\r\n]+
    EXPECT_EQ(split("llama3", "DON'T 1234567 ok!!\n\n  hi"),
              (V{"DON", "'T", " ", "123", "456", "7", " ok", "!!\n\n", " ", " hi"}));
    EXPECT_EQ(split("llama-bpe", "a  \n b"), (V{"a", "  \n", " b"}));
    EXPECT_EQ(split("llama3", "(x)"), (V{"(x", ")"}));
    // qwen2: single digits
    EXPECT_EQ(split("qwen2", "x=2024"), (V{"x", "=", "2", "0", "2", "4"}));
    // smollm: every digit alone, then the gpt2 rules
    EXPECT_EQ(split("smollm", "ab12 cd"), (V{"ab", "1", "2", " cd"}));
    // non-ASCII: letters (é, Cyrillic, CJK) stay in words, CJK punctuation and emoji do not
    EXPECT_EQ(split("llama3", "caf\xC3\xA9 \xD0\xBC\xD0\xB8\xD1\x80\xE3\x80\x82\xE4\xBD\xA0\xE5\xA5\xBD \xF0\x9F\x98\x80"),
              (V{"caf\xC3\xA9", " \xD0\xBC\xD0\xB8\xD1\x80", "\xE3\x80\x82\xE4\xBD\xA0\xE5\xA5\xBD", " \xF0\x9F\x98\x80"}));
}

TEST(GgufTokenizer, BytePairMergesAndRoundTrip) {
    auto t = small_bpe("llama3");
    const int base = 256;
    // "hello" -> h e -> he, l l -> ll, he ll -> hell, hell o -> hello; " world" by its chain
    EXPECT_EQ(t->encode("hello world", false), (std::vector<int32_t>{base + 3, base + 8}));
    // 123 merges (digits in threes), 4 alone; 's merges
    EXPECT_EQ(t->encode("1234's", false), (std::vector<int32_t>{base + 10, '4', base + 11}));
    // a control token written in the text, unmerged bytes for the rest (space = U+0120, id 288-256=32 -> byte 0x20)
    auto ids = t->encode("hi<|end|> \xC3\xA9", false, false, /*parse_special=*/true);
    EXPECT_EQ(ids, (std::vector<int32_t>{'h', 'i', base + 13, ' ', 0xC3, 0xA9}));
    EXPECT_EQ(t->decode(ids), "hi \xC3\xA9");
    const std::string text = "Hello, world!\n\tDON'T 3.14159 caf\xC3\xA9 \xE4\xBD\xA0\xE5\xA5\xBD  \xF0\x9F\x98\x80";
    for (const char *pre : {"default", "llama3", "qwen2", "smollm"}) {
        auto tk = small_bpe(pre);
        EXPECT_EQ(tk->decode(tk->encode(text, false)), text) << pre;
    }
}

// ---- Scaled RoPE from the file's metadata (issue 20 item 5, issue 21 item 3) ----
// Each file carries a scaling scheme; the reference forward rotates with a table computed here
// from the scheme's published formulas (not through the library's helpers), so the harness's
// mapping of the metadata to kvp_create_rope's table and rope_attn_factor is checked end to end.
namespace scaled {

const double kPi = 3.14159265358979323846;

std::vector<double> base(const Tiny &t) {
    std::vector<double> f((size_t)t.rope_dim / 2);
    for (size_t i = 0; i < f.size(); i++) f[i] = std::pow(t.theta, -2.0 * (double)i / t.rope_dim);
    return f;
}

// Llama 3.1: divisor per pair (1 for fast pairs, factor for slow ones, blended between).
std::vector<float> llama3_divisors(const Tiny &t, double s, double lo, double hi, double L) {
    std::vector<double> f = base(t);
    std::vector<float> d(f.size());
    for (size_t i = 0; i < f.size(); i++) {
        const double wl = 2 * kPi / f[i];
        double nf;
        if (wl < L / hi) nf = f[i];
        else if (wl > L / lo) nf = f[i] / s;
        else {
            const double sm = (L / wl - lo) / (hi - lo);
            nf = (1 - sm) * f[i] / s + sm * f[i];
        }
        d[i] = (float)(f[i] / nf);
    }
    return d;
}

// YaRN: ramp over the pairs between the ones turning beta_fast and beta_slow times over L.
std::vector<double> yarn(const Tiny &t, double s, double L, double bf, double bs) {
    std::vector<double> f = base(t);
    const double d = t.rope_dim;
    auto at = [&](double r) { return d * std::log(L / (r * 2 * kPi)) / (2 * std::log(t.theta)); };
    double lo = std::max(std::floor(at(bf)), 0.0), hi = std::min(std::ceil(at(bs)), d - 1);
    if (lo == hi) hi += 0.001;
    for (size_t i = 0; i < f.size(); i++) {
        const double g = std::min(std::max(((double)i - lo) / (hi - lo), 0.0), 1.0);
        f[i] = f[i] / s * g + f[i] * (1 - g);
    }
    return f;
}

// Loads t's file (with `meta` written into it), compares the harness's logits over toks with
// the reference; returns the worst |difference| relative to the logit scale. `plain`: drop the
// loaded table and attention factor before running (a harness that ignored the scaling).
double run(const Tiny &t, void (*meta)(Writer &), const std::vector<float> *divisors, bool plain, Checkpoint *ck_out = nullptr) {
    Writer w = tiny_writer(t);
    if (meta) meta(w);
    if (divisors) w.tensor_f32("rope_freqs.weight", {divisors->size()}, divisors->data(), divisors->size());
    TmpFile f("scaled-" + t.arch + ".gguf");
    EXPECT_TRUE(w.write(f.path));
    Checkpoint ck;
    std::string err;
    EXPECT_TRUE(load_model(f.path, &ck, &err)) << err;
    if (plain) {
        ck.cfg.rope_freqs.clear();
        ck.cfg.rope_attn_factor = 1.0f;
    }
    std::vector<int32_t> toks;
    for (int i = 0; i < 40; i++) toks.push_back((int32_t)((i * 37 + 11) % t.V));
    auto ref = ref_forward(t, toks);
    Session s;
    EXPECT_TRUE(s.init(ck, "policy=full capacity=64", &err)) << err;
    const int n = (int)toks.size(), V = t.V;
    std::vector<float> lg((size_t)n * V);
    EXPECT_TRUE(s.prefill(toks.data(), n, lg.data(), true, &err)) << err;
    double worst = 0, scale = 0;
    for (int p = 0; p < n; p++)
        for (int v = 0; v < V; v++) {
            worst = std::max(worst, std::fabs(lg[(size_t)p * V + (size_t)v] - ref[(size_t)p][(size_t)v]));
            scale = std::max(scale, std::fabs(ref[(size_t)p][(size_t)v]));
        }
    EXPECT_GT(scale, 0.1);
    if (ck_out) *ck_out = std::move(ck);
    return worst / scale;
}

}  // namespace scaled

TEST(GgufModel, Llama3RopeFreqsTensorMatchesTheDoubleReference) {
    Tiny t = make_tiny("llama", GGML_F32, true, 31);
    // Llama 3.1's scheme at a tiny original context (64) so all three bands occur over 32 pairs
    const std::vector<float> div = scaled::llama3_divisors(t, 8.0, 1.0, 4.0, 64.0);
    EXPECT_EQ(div.front(), 1.0f);
    EXPECT_EQ(div.back(), 8.0f);
    t.inv_freq = scaled::base(t);
    for (size_t i = 0; i < div.size(); i++) t.inv_freq[i] /= (double)div[i];
    Checkpoint ck;
    EXPECT_LT(scaled::run(t, nullptr, &div, false, &ck), 2e-4);
    EXPECT_EQ(ck.cfg.rope_scaling, "llama3 (rope_freqs)");
    EXPECT_EQ(ck.cfg.rope_freqs.size(), 32u);
    EXPECT_GT(scaled::run(t, nullptr, &div, true), 1e-3) << "the test cannot fail: theta alone differs";
}

TEST(GgufModel, LinearScalingMatchesTheDoubleReference) {
    Tiny t = make_tiny("qwen2", GGML_F32, true, 32);
    t.inv_freq = scaled::base(t);
    for (double &x : t.inv_freq) x /= 4.0;
    auto meta = [](Writer &w) {
        w.str("qwen2.rope.scaling.type", "linear");
        w.f32("qwen2.rope.scaling.factor", 4.0f);
    };
    EXPECT_LT(scaled::run(t, meta, nullptr, false), 2e-4);
    EXPECT_GT(scaled::run(t, meta, nullptr, true), 1e-3);
    // the older key rope.scale_linear means the same
    auto old = [](Writer &w) { w.f32("qwen2.rope.scale_linear", 4.0f); };
    EXPECT_LT(scaled::run(t, old, nullptr, false), 2e-4);
}

TEST(GgufModel, YarnScalingAndAttentionFactorMatchTheDoubleReference) {
    Tiny t = make_tiny("qwen3", GGML_F32, false, 33);
    // original context 16: the ramp lies inside the 64 pairs of head_dim 128 at theta 1e6
    t.inv_freq = scaled::yarn(t, 4.0, 16.0, 32.0, 1.0);
    t.attn = 0.1 * std::log(4.0) + 1.0;
    auto meta = [](Writer &w) {
        w.str("qwen3.rope.scaling.type", "yarn");
        w.f32("qwen3.rope.scaling.factor", 4.0f);
        w.u32("qwen3.rope.scaling.original_context_length", 16);
    };
    Checkpoint ck;
    EXPECT_LT(scaled::run(t, meta, nullptr, false, &ck), 2e-4);
    EXPECT_NEAR(ck.cfg.rope_attn_factor, t.attn, 1e-6);
    EXPECT_EQ(ck.cfg.rope_scaling, "yarn");
    EXPECT_GT(scaled::run(t, meta, nullptr, true), 1e-3);
    // explicit betas and llama.cpp's extra attention factor multiply in
    t.inv_freq = scaled::yarn(t, 4.0, 16.0, 16.0, 2.0);
    t.attn = 0.9 * (0.1 * std::log(4.0) + 1.0);
    auto meta2 = [](Writer &w) {
        w.str("qwen3.rope.scaling.type", "yarn");
        w.f32("qwen3.rope.scaling.factor", 4.0f);
        w.u32("qwen3.rope.scaling.original_context_length", 16);
        w.f32("qwen3.rope.scaling.yarn_beta_fast", 16.0f);
        w.f32("qwen3.rope.scaling.yarn_beta_slow", 2.0f);
        w.f32("qwen3.rope.scaling.attn_factor", 0.9f);
    };
    EXPECT_LT(scaled::run(t, meta2, nullptr, false), 2e-4);
}

}  // namespace

// ---------------------------------------------------------------- task prompts on token models

// A tiny random model (the answers are wrong: this tests the plumbing) with a tokenizer in its
// metadata: SentencePiece (byte fallback, a few merges) on llama, or byte-level BPE on qwen2.
// The tokenizer metadata of the task models: SentencePiece (byte fallback, a few merges) or
// byte-level BPE (GPT-2's byte map, a few merges, pre-tokenizer qwen2). Returns the vocabulary size.
size_t task_vocab(bool spm, Writer &w) {
    std::vector<std::string> pieces;
    std::vector<int32_t> types;
    std::vector<float> scores;
    std::vector<std::string> merges;
    if (spm) {
        pieces = {"<unk>", "<s>", "</s>"};
        types = {2, 3, 3};
        for (int b = 0; b < 256; b++) {
            char h[8];
            std::snprintf(h, sizeof h, "<0x%02X>", b);
            pieces.push_back(h);
            types.push_back(6);
        }
        const char *extra[] = {"\xE2\x96\x81", "\xE2\x96\x81t", "\xE2\x96\x81th", "\xE2\x96\x81the", "\xE2\x96\x81is",
                               "\xE2\x96\x81pass", "\xE2\x96\x81key", "e", "t", "h", "i", "s", "a", "p", "k", "y", "o", "n", "r",
                               "1", "2", "3", "4", "5", "6", "7", "8", "9", "0", "in", "er", "an"};
        for (const char *x : extra) {
            pieces.push_back(x);
            types.push_back(1);
        }
        scores.assign(pieces.size(), 0.0f);
        for (size_t i = 259; i < pieces.size(); i++) scores[i] = -(float)(i - 259) * 0.1f + (float)pieces[i].size();
    } else {
        int n = 0;
        for (int b = 0; b < 256; b++) {  // GPT-2's byte map
            const bool keep = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
            const unsigned cp = keep ? (unsigned)b : 256u + (unsigned)n++;
            std::string s;
            if (cp < 0x80) s.push_back((char)cp);
            else {
                s.push_back((char)(0xC0 | (cp >> 6)));
                s.push_back((char)(0x80 | (cp & 63)));
            }
            pieces.push_back(s);
        }
        merges = {"\xC4\xA0 t", "h e", "\xC4\xA0t he", "\xC4\xA0 a", "i s", "\xC4\xA0 is", "i n", "e r", "\xC4\xA0 p", "\xC4\xA0p a"};
        for (const std::string &m : merges) pieces.push_back(m.substr(0, m.find(' ')) + m.substr(m.find(' ') + 1));
        pieces.push_back("<|endoftext|>");
        types.assign(pieces.size(), 1);
        types.back() = 3;
    }
    w.str("tokenizer.ggml.model", spm ? "llama" : "gpt2");
    w.str_arr("tokenizer.ggml.tokens", pieces);
    w.i32_arr("tokenizer.ggml.token_type", types);
    if (spm) {
        w.f32_arr("tokenizer.ggml.scores", scores);
        w.u32("tokenizer.ggml.bos_token_id", 1);
        w.u32("tokenizer.ggml.eos_token_id", 2);
    } else {
        w.str("tokenizer.ggml.pre", "qwen2");
        w.str_arr("tokenizer.ggml.merges", merges);
        w.u32("tokenizer.ggml.eos_token_id", (uint32_t)pieces.size() - 1);
    }
    return pieces.size();
}

// A tiny random model (the answers are wrong: this tests the plumbing) with a tokenizer.
Writer task_model_writer(bool spm) {
    Tiny t = make_tiny(spm ? "llama" : "qwen2", GGML_F32, true, 21);
    Writer w = tiny_writer(t);
    const size_t V = task_vocab(spm, w);
    std::vector<float> emb(V * (size_t)t.D);
    std::mt19937 rng(9);
    std::uniform_real_distribution<float> u(-0.1f, 0.1f);
    for (float &x : emb) x = u(rng);
    w.tensors[0].ne = {(uint64_t)t.D, V};
    w.tensors[0].bytes.assign(reinterpret_cast<const char *>(emb.data()), emb.size() * 4);
    return w;
}

// The CLI test's model (bench/harness/tests/task-spm.gguf, 1 layer, width 64, q8_0 matrices,
// SentencePiece, context 512): made from a fixed LCG so that its bytes are the same with any
// standard library; GgufTasks.CliFixtureIsTheWritersFile checks the committed file against it.
Writer task_fixture_writer() {
    Writer w;
    w.str("general.architecture", "llama");
    w.str("general.name", "tiny task fixture");
    w.u32("llama.block_count", 1);
    w.u32("llama.embedding_length", 64);
    w.u32("llama.feed_forward_length", 128);
    w.u32("llama.attention.head_count", 2);
    w.u32("llama.attention.head_count_kv", 1);
    w.u32("llama.context_length", 512);
    w.u32("llama.rope.dimension_count", 32);
    w.f32("llama.rope.freq_base", 10000.0f);
    w.f32("llama.attention.layer_norm_rms_epsilon", 1e-5f);
    const size_t V = task_vocab(true, w);
    uint64_t st = 12345;
    auto vals = [&](size_t n, float scale) {
        std::vector<float> v(n);
        for (float &x : v) {
            st = st * 6364136223846793005ULL + 1442695040888963407ULL;
            x = scale * ((float)(st >> 40) / 16777216.0f * 2.0f - 1.0f);
        }
        return v;
    };
    auto q8 = [&](const std::string &name, uint64_t cols, uint64_t rows) {
        const std::vector<float> v = vals(cols * rows, 0.2f);
        w.tensor(name, {cols, rows}, GGML_Q8_0, gguftest::quant_q8_0(v.data(), v.size()));
    };
    const std::vector<float> ones(128, 1.0f);
    q8("token_embd.weight", 64, V);
    w.tensor_f32("output_norm.weight", {64}, ones.data(), 64);
    w.tensor_f32("blk.0.attn_norm.weight", {64}, ones.data(), 64);
    w.tensor_f32("blk.0.ffn_norm.weight", {64}, ones.data(), 64);
    q8("blk.0.attn_q.weight", 64, 64);
    q8("blk.0.attn_k.weight", 64, 32);
    q8("blk.0.attn_v.weight", 64, 32);
    q8("blk.0.attn_output.weight", 64, 64);
    q8("blk.0.ffn_gate.weight", 64, 128);
    q8("blk.0.ffn_down.weight", 128, 64);
    q8("blk.0.ffn_up.weight", 64, 128);
    return w;
}

TEST(GgufTasks, CliFixtureIsTheWritersFile) {
    const std::string path = std::string(KVP_HARNESS_TESTS_DIR) + "/task-spm.gguf";
    const std::string want = task_fixture_writer().bytes();
    if (std::getenv("KVH_WRITE_TASK_FIXTURE")) {
        ASSERT_TRUE(write_bytes(path, want));
    }
    std::ifstream f(path, std::ios::binary);
    std::stringstream ss;
    ss << f.rdbuf();
    EXPECT_TRUE(ss.str() == want) << path << " differs from task_fixture_writer() (KVH_WRITE_TASK_FIXTURE=1 rewrites it)";
    Checkpoint ck;
    std::string err;
    ASSERT_TRUE(load_model(path, &ck, &err)) << err;
    ASSERT_TRUE(ck.tok);
    EXPECT_EQ(ck.cfg.seq_len, 512);
}

std::string task_text() {
    std::ifstream f(std::string(KVP_HARNESS_MODELS_DIR) + "/enbytes-1m.eval.txt", std::ios::binary);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str().substr(0, 30000);
}

TEST(GgufTasks, TokenPromptsHaveExactLengthsAndPlaceTheNeedle) {
    const std::string text = task_text();
    ASSERT_GE(text.size(), 20000u);
    for (bool spm : {true, false}) {
        SCOPED_TRACE(spm ? "sentencepiece" : "byte-level bpe");
        TmpFile f(spm ? "task-spm.gguf" : "task-bpe.gguf");
        ASSERT_TRUE(task_model_writer(spm).write(f.path));
        Checkpoint ck;
        std::string err;
        ASSERT_TRUE(load_model(f.path, &ck, &err)) << err;
        ASSERT_TRUE(ck.tok);
        const Tokenizer &tok = *ck.tok;
        const std::vector<int32_t> ids = task_text_ids(tok, text);
        ASSERT_GT(ids.size(), 5000u);
        EXPECT_LT(ids.size(), text.size());  // the merges merged something
        const size_t bos = spm ? 1 : 0;
        for (const char *task : kTaskNames) {
            SCOPED_TRACE(task);
            const int L = std::string(task) == "niah-multikey" ? 720 : 300;
            std::string first_answer;
            for (double depth : {0.0, 0.37, 1.0}) {
                TaskPrompt p, again;
                ASSERT_TRUE(make_task_prompt_tokens(task, tok, ids, L, depth, 2, 5, &p, &err)) << err;
                ASSERT_TRUE(make_task_prompt_tokens(task, tok, ids, L, depth, 2, 5, &again, &err)) << err;
                EXPECT_EQ(p.context_ids, again.context_ids);  // deterministic
                EXPECT_EQ(p.question_ids, again.question_ids);
                EXPECT_EQ(p.context_ids.size() + p.question_ids.size(), (size_t)L);  // exact length in tokens
                if (bos) {
                    EXPECT_EQ(p.context_ids[0], tok.bos);
                }
                for (size_t i = bos; i < p.context_ids.size(); i++) ASSERT_NE(p.context_ids[i], tok.bos) << i;
                ASSERT_FALSE(p.answer_ids.empty());
                EXPECT_EQ(tok.decode(p.answer_ids), p.answer);
                // the asked block's tokens sit at needle_at, which is the depth's token
                const std::vector<int32_t> blk = std::string(task) == "recall" ? std::vector<int32_t>() : tok.encode(p.needle, false, false);
                const size_t B = blk.empty() ? 24 : blk.size();
                const size_t C = (size_t)L - bos - p.question_ids.size();
                EXPECT_EQ(p.needle_at, bos + (size_t)std::llround(depth * (double)(C - B)));
                if (!blk.empty()) {
                    ASSERT_LE(p.needle_at + blk.size(), p.context_ids.size());
                    EXPECT_TRUE(std::equal(blk.begin(), blk.end(), p.context_ids.begin() + (long)p.needle_at));
                    EXPECT_NE(p.needle.find(p.answer), std::string::npos);
                } else {  // recall: the cue and the answer are the passage's tokens 0..5 and 6..17
                    EXPECT_TRUE(std::equal(p.question_ids.begin(), p.question_ids.end(), p.context_ids.begin() + (long)p.needle_at));
                    EXPECT_TRUE(std::equal(p.answer_ids.begin(), p.answer_ids.end(), p.context_ids.begin() + (long)p.needle_at + 6));
                }
                for (size_t d : p.distractors_at) EXPECT_TRUE(d + B <= p.needle_at || d >= p.needle_at + B);
                if (first_answer.empty()) first_answer = p.answer;
                EXPECT_EQ(p.answer, first_answer);  // the key does not depend on the depth
            }
        }
        TaskPrompt p;
        EXPECT_FALSE(make_task_prompt_tokens("passkey", tok, ids, 40, 0.5, 0, 0, &p, &err));
        EXPECT_NE(err.find("too short for task passkey (at least"), std::string::npos) << err;
        EXPECT_NE(err.find("tokens)"), std::string::npos) << err;
        const std::vector<int32_t> few(ids.begin(), ids.begin() + 200);
        EXPECT_FALSE(make_task_prompt_tokens("passkey", tok, few, 300, 0.5, 0, 0, &p, &err));
        EXPECT_NE(err.find("the text has 200 tokens"), std::string::npos) << err;
    }
}

TEST(GgufTasks, GridRowsOnATokenModelAreDeterministicAndRoundTrip) {
    const std::string text = task_text();
    TmpFile f("task-grid.gguf");
    ASSERT_TRUE(task_model_writer(true).write(f.path));
    Checkpoint ck;
    std::string err;
    ASSERT_TRUE(load_model(f.path, &ck, &err)) << err;
    TaskGrid g;
    g.tasks = {"passkey", "niah", "recall"};
    g.specs = {"policy=full capacity=400", "policy=snapkv"};
    g.ratios = {0.5};
    g.settings = {kSettings[0], kSettings[1]};
    g.lengths = {300};
    g.depths = {0.0, 1.0};
    g.seed = 3;
    g.model_name = "task-grid.gguf";
    g.text_name = "eval.txt";
    std::vector<TaskResult> rows;
    ASSERT_TRUE(expand_task_grid(ck, text, g, &rows, &err)) << err;
    ASSERT_EQ(rows.size(), 2u * 2 * 3 * 2);
    std::vector<TaskResult> again = rows;
    ASSERT_TRUE(run_task_rows(ck, text, &rows, 1, &err)) << err;
    ASSERT_TRUE(run_task_rows(ck, text, &again, 2, &err)) << err;
    for (size_t i = 0; i < rows.size(); i++) {
        std::string d;
        EXPECT_TRUE(same_task_figures(rows[i], again[i], &d)) << i << ": " << d;  // threads do not matter
        EXPECT_EQ(rows[i].length, 300);
        EXPECT_FALSE(rows[i].answer.empty());
        EXPECT_GT(rows[i].answer_nll, 0.0);
        EXPECT_GT(rows[i].live_bytes, 0u);
        if (rows[i].task == "passkey") {
            EXPECT_EQ(rows[i].answer.size(), 5u);
        }
        if (rows[i].task == "niah") {
            EXPECT_EQ(rows[i].answer.size(), 7u);
        }
        // the score is that of the decoded text cut to the answer's bytes
        const TaskScore sc = score_answer(rows[i].answer, rows[i].generated.substr(0, rows[i].answer.size()));
        EXPECT_EQ(rows[i].correct, (int)sc.correct);
        EXPECT_DOUBLE_EQ(rows[i].byte_accuracy, sc.byte_accuracy);
    }
    // snapkv at ratio 0.5 keeps about half of the prompt's tokens: fewer bytes than full KV
    EXPECT_LT(rows.back().live_bytes, rows.front().live_bytes);
    std::vector<TaskResult> back;
    ASSERT_TRUE(parse_task_json(tasks_to_json(rows), &back, &err)) << err;
    ASSERT_EQ(back.size(), rows.size());
    for (size_t i = 0; i < rows.size(); i++) {
        std::string d;
        EXPECT_TRUE(same_task_figures(rows[i], back[i], &d)) << i << ": " << d;
    }
    // A model with neither a byte vocabulary nor a tokenizer is refused with the reason.
    Tiny t = make_tiny("llama", GGML_F32, true, 4);
    TmpFile f2("task-notok.gguf");
    ASSERT_TRUE(tiny_writer(t).write(f2.path));
    Checkpoint ck2;
    ASSERT_TRUE(load_model(f2.path, &ck2, &err)) << err;
    EXPECT_FALSE(expand_task_grid(ck2, text, g, &rows, &err));
    EXPECT_NE(err.find("has vocab 96 and no tokenizer"), std::string::npos) << err;
}
