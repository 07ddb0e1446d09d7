// GGUF reader (harness only; not part of the library ABI).
//
// GGUF v2/v3, little-endian: magic "GGUF", u32 version, u64 tensor count, u64 metadata count,
// the metadata (key string, u32 type, value), the tensor infos (name string, u32 n_dims, u64
// ne[n_dims], u32 type, u64 offset), padding to general.alignment (default 32), the tensor data.
// Strings are u64 length + bytes (no NUL). The file is memory-mapped read-only; every count,
// string length, array length, offset, alignment and tensor extent is checked against the file
// size before it is used, so a malformed file gives one line in *err, never a crash or an
// allocation larger than the file.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace kvh {

enum GgufValueType : uint32_t {
    GGUF_U8 = 0, GGUF_I8 = 1, GGUF_U16 = 2, GGUF_I16 = 3, GGUF_U32 = 4, GGUF_I32 = 5, GGUF_F32 = 6,
    GGUF_BOOL = 7, GGUF_STRING = 8, GGUF_ARRAY = 9, GGUF_U64 = 10, GGUF_I64 = 11, GGUF_F64 = 12
};

// ggml tensor types the harness dequantizes (numbers as in the GGUF format).
enum GgmlType : uint32_t {
    GGML_F32 = 0, GGML_F16 = 1, GGML_Q4_0 = 2, GGML_Q4_1 = 3, GGML_Q5_0 = 6, GGML_Q5_1 = 7, GGML_Q8_0 = 8,
    GGML_Q8_1 = 9, GGML_Q2_K = 10, GGML_Q3_K = 11, GGML_Q4_K = 12, GGML_Q5_K = 13, GGML_Q6_K = 14, GGML_IQ4_NL = 20,
    GGML_IQ4_XS = 23, GGML_BF16 = 30
};
// Every type above, in the order `kvprune info` and the error messages list them.
constexpr uint32_t kGgmlSupported[] = {GGML_F32, GGML_F16, GGML_BF16, GGML_Q8_0, GGML_Q8_1, GGML_Q4_0, GGML_Q4_1,
                                       GGML_Q5_0, GGML_Q5_1, GGML_Q2_K, GGML_Q3_K, GGML_Q4_K, GGML_Q5_K, GGML_Q6_K,
                                       GGML_IQ4_NL, GGML_IQ4_XS};

// Name of a ggml type number as ggml spells it ("q4_K", "iq3_xxs"; the retired numbers 4, 5, 31..33
// and 36..38 too); "unknown type N" for a number ggml never used (a corrupt file, or a newer format).
std::string ggml_type_name(uint32_t t);
// True when t is a type number ggml has defined (supported here or not).
bool ggml_type_known(uint32_t t);
// "type q3_K" / "an unknown or corrupt type number 16777216", for messages.
std::string ggml_type_phrase(uint32_t t);
// Elements per block and bytes per block of a supported type; false for others.
bool ggml_block(uint32_t t, uint64_t *block_elems, uint64_t *block_bytes);
// Dequantizes n elements (a multiple of the type's block) from src to dst; false for an
// unsupported type. src must hold n / block_elems * block_bytes bytes.
bool dequantize(uint32_t type, const void *src, float *dst, uint64_t n);
// True when every scale (quantized types) or element (f32/f16/bf16) of n elements is finite;
// else false with the index of the first bad block (element for float types) in *bad.
bool ggml_finite(uint32_t type, const void *src, uint64_t n, uint64_t *bad);
float fp16_to_f32(uint16_t h);
// The 16 values of an iq4_nl / iq4_xs 4-bit index (ggml's kvalues_iq4nl, a non-linear grid).
extern const int8_t kIq4Values[16];
// Scale s (0..15) of a q3_K super-block's 12 packed scale bytes, as stored (0..63; the value is s - 32).
int q3k_scale(int s, const uint8_t *scales12);
// A string from a file as shown in a one-line message: printable ASCII (others as \xNN), <= 64 bytes.
std::string gguf_shown(const std::string &s);
float bf16_to_f32(uint16_t h);

struct GgufKV {
    std::string key;
    uint32_t type = 0;       // GgufValueType
    uint32_t arr_type = 0;   // element type when type == GGUF_ARRAY
    uint64_t arr_n = 0;      // element count when type == GGUF_ARRAY
    uint64_t pos = 0;        // file offset of the value (of the first element for arrays)
};

struct GgufTensor {
    std::string name;
    uint32_t n_dims = 0;
    uint64_t ne[4] = {1, 1, 1, 1};  // ne[0] is the innermost (row length)
    uint32_t type = 0;
    uint64_t offset = 0;  // from the start of the data section
    uint64_t nbytes = 0;
    const uint8_t *data = nullptr;
    uint64_t n_elems() const { return ne[0] * ne[1] * ne[2] * ne[3]; }
};

class GgufFile {
public:
    GgufFile() = default;
    ~GgufFile();
    GgufFile(const GgufFile &) = delete;
    GgufFile &operator=(const GgufFile &) = delete;

    // Maps and parses `path`. On failure returns false with "gguf '<path>': <problem>" in *err.
    bool open(const std::string &path, std::string *err);
    // Parses a buffer the caller keeps alive (the fuzz target); same checks.
    bool parse(const uint8_t *data, size_t size, const std::string &name, std::string *err);

    uint32_t version() const { return version_; }
    uint64_t alignment() const { return align_; }
    const std::vector<GgufKV> &kvs() const { return kv_; }
    const std::vector<GgufTensor> &tensors() const { return tensors_; }
    const GgufKV *find(const std::string &key) const;
    const GgufTensor *tensor(const std::string &name) const;

    // Typed getters: false when the key is missing or of another type (integers of any width
    // convert when the value fits; floats accept f32/f64).
    bool get_str(const std::string &key, std::string *out) const;
    bool get_int(const std::string &key, int64_t *out) const;
    bool get_float(const std::string &key, double *out) const;
    bool get_bool(const std::string &key, bool *out) const;
    bool get_str_array(const std::string &key, std::vector<std::string> *out) const;
    bool get_f32_array(const std::string &key, std::vector<float> *out) const;
    bool get_i32_array(const std::string &key, std::vector<int32_t> *out) const;
    // Value as text for `kvprune info` (arrays: "[N x type]").
    std::string value_text(const GgufKV &kv) const;
    size_t file_size() const { return size_; }

private:
    void close();
    const uint8_t *base_ = nullptr;
    size_t size_ = 0;
    bool mapped_ = false;
    uint32_t version_ = 0;
    uint64_t align_ = 32;
    std::vector<GgufKV> kv_;
    std::vector<GgufTensor> tensors_;
};

}  // namespace kvh
