// Config strings (targets.h): the bytes are a model (first 8 bytes) and a spec string.
#include <stdlib.h>
#include <string.h>

#include <string>

#include "kvprune/kvprune.h"
#include "targets.h"

namespace kvpfuzz {
namespace {

void check(bool ok, const char *what) {
    if (!ok) violation("config", what);
}

// A message buffer: NUL-terminated inside its length, the bytes after it untouched, and
// "<status text>: ..." when the status is not KVP_OK ("" when it is).
void check_message(const char *buf, size_t len, size_t cap, kvp_status st) {
    for (size_t i = len; i < cap; ++i) check(buf[i] == '#', "message written past err_len");
    if (len == 0) return;
    check(memchr(buf, '\0', len) != nullptr, "message not NUL-terminated within err_len");
    if (st == KVP_OK) {
        check(buf[0] == '\0', "message not empty on success");
    } else {
        const char *s = kvp_status_str(st);
        check(strncmp(buf, s, strnlen(buf, len)) == 0 || strncmp(buf, s, strlen(s)) == 0,
              "message does not start with the status text");
    }
}

}  // namespace

void config_target(const uint8_t *data, size_t size) {
    uint8_t h[8] = {0};
    memcpy(h, data, size < 8 ? size : 8);
    const kvp_model m = {1u + h[0] % 4, 0, 1u + h[1] % 4, 4u * (1 + h[2] % 8), kvp_rope_style(h[3] % 3),
                         (h[4] % 4 == 0) ? 2u * (h[4] % 3) : 0u, 10000.0f};
    kvp_model mm = m;
    mm.n_q_heads = m.n_kv_heads * (1 + h[5] % 3);
    const size_t err_len = h[6] % 5 == 0 ? h[7] % 16 : 320;
    const std::string spec(reinterpret_cast<const char *>(data) + (size < 8 ? size : 8), size < 8 ? 0 : size - 8);
    // the spec is a C string: stop at the first NUL
    const std::string cspec = spec.substr(0, strnlen(spec.c_str(), spec.size()));

    kvp_config cfg, plain;
    memset(&cfg, 0x5a, sizeof cfg);
    const kvp_config untouched = cfg;
    char derr[336];
    memset(derr, '#', sizeof derr);
    const kvp_status dst = kvp_config_default_ex(&cfg, &mm, derr, err_len);
    check_message(derr, err_len, sizeof derr, dst);
    check(dst == kvp_config_default(&plain, &mm), "kvp_config_default_ex and kvp_config_default disagree");
    if (dst != KVP_OK) {  // e.g. rope_dim > head_dim: fine, with the field named and cfg unchanged
        check(dst == KVP_ERR_CONFIG, "kvp_config_default_ex status");
        check(memcmp(&cfg, &untouched, sizeof cfg) == 0, "a failed kvp_config_default_ex changed the config");
        return;
    }
    check(memcmp(&cfg, &plain, sizeof cfg) == 0, "kvp_config_default_ex and kvp_config_default differ");
    // An older caller's struct now and then (the first released layout).
    if (h[7] % 7 == 0) check(kvp_config_init(&cfg, KVP_CONFIG_SIZE_0_1, &mm) == KVP_OK, "kvp_config_init 0.1 size");
    kvp_config before;
    memcpy(&before, &cfg, sizeof cfg);
    char err[336];
    memset(err, '#', sizeof err);
    const kvp_status st = kvp_config_apply(&cfg, cspec.c_str(), err, err_len);
    check(st == KVP_OK || st == KVP_ERR_CONFIG || st == KVP_ERR_UNSUPPORTED, "kvp_config_apply status");
    check_message(err, err_len, sizeof err, st);
    if (st != KVP_OK) {
        check(memcmp(&before, &cfg, sizeof cfg) == 0, "a failed kvp_config_apply changed the config");
        return;
    }
    memset(err, '#', sizeof err);
    const kvp_status cst = kvp_config_check(&cfg, err, sizeof err - 16);
    check(cst == KVP_OK, "kvp_config_apply succeeded but kvp_config_check fails");
    check_message(err, sizeof err - 16, sizeof err, cst);
    const size_t bytes = kvp_arena_size(&cfg);
    check(bytes > 0, "kvp_config_apply succeeded but kvp_arena_size is 0");
    // Applying the same spec again gives the same config (the spec is idempotent).
    kvp_config again;
    memcpy(&again, &cfg, sizeof cfg);
    check(kvp_config_apply(&again, cspec.c_str(), nullptr, 0) == KVP_OK, "re-applying an accepted spec fails");
    check(memcmp(&again, &cfg, sizeof cfg) == 0, "re-applying an accepted spec changes the config");
    for (uint32_t i = 0; i < kvp_config_key_count(); ++i) {
        kvp_key_info ki;
        ki.struct_size = sizeof ki;
        check(kvp_config_key(i, &ki) == KVP_OK, "kvp_config_key");
        const int used = kvp_config_key_used(&cfg, ki.name);
        check(used == 0 || used == 1, "kvp_config_key_used of a known key");
    }
    if (bytes > (8u << 20)) return;
    void *arena = aligned_alloc(64, (bytes + 63) / 64 * 64);
    kvp_cache *c = nullptr;
    check(kvp_create_ex(&cfg, arena, bytes, &c, err, sizeof err) == KVP_OK, "create of an accepted config");
    const size_t nq = size_t(mm.n_q_heads) * mm.head_dim, nkv = size_t(mm.n_kv_heads) * mm.head_dim;
    float *buf = static_cast<float *>(calloc(2 * nq + 2 * nkv, sizeof(float)));
    for (size_t i = 0; i < nq + 2 * nkv; ++i) buf[i] = float(int(i % 7) - 3) * 0.25f;
    for (uint32_t l = 0; l < mm.n_layers; ++l) {
        const kvp_status d = kvp_decode(c, l, buf, buf + nq, buf + nq + nkv, buf + nq + 2 * nkv);
        check(d == KVP_OK || d == KVP_ERR_FULL, "first decode of a fresh cache");
    }
    kvp_stats s;
    s.struct_size = sizeof s;
    check(kvp_get_stats(c, &s) == KVP_OK && s.live_bytes <= s.arena_bytes && s.arena_bytes == bytes, "stats");
    kvp_destroy(c);
    free(buf);
    free(arena);
}

}  // namespace kvpfuzz
