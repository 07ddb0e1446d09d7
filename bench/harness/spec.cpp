#include "spec.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <set>
#include <sstream>
#include <vector>

#include "session.h"

namespace kvh {

namespace {

bool apply(const ModelConfig &mc, const std::string &spec, kvp_config *cfg, std::string *err) {
    kvp_model m = model_geometry(mc);
    kvp_status st = kvp_config_default(cfg, &m);
    if (st != KVP_OK) {
        *err = std::string("model geometry rejected by kvprune: ") + kvp_status_str(st);
        return false;
    }
    char e[512] = {0};
    st = kvp_config_apply(cfg, spec.c_str(), e, sizeof e);
    if (st != KVP_OK) {
        *err = e[0] ? e : kvp_status_str(st);
        return false;
    }
    return true;
}

}  // namespace

std::string policy_keys_text(const kvp_config &cfg) {
    std::string own, common;
    kvp_config probe = cfg;
    for (uint32_t i = 0; i < kvp_config_key_count(); i++) {
        kvp_key_info k;
        k.struct_size = sizeof k;
        if (kvp_config_key(i, &k) != KVP_OK || k.config_size == 0 || kvp_config_key_used(&probe, k.name) != 1)
            continue;  // (apply-only keys such as compression_ratio: not a field of the policy)
        std::string &dst = k.policies == KVP_POLICY_ALL ? common : own;
        dst += (dst.empty() ? "" : ", ") + std::string(k.name);
    }
    return (own.empty() ? std::string("none of its own") : own) + "; common to all: " + common;
}

namespace {

// The library's compression_ratio spec for a sequence of L tokens (ratio_tokens=L).
bool ratio_spec(double r, int64_t L, std::string *out, std::string *err) {
    if (L <= 0) {
        *err = "compression_ratio needs the sequence length, which is not known here";
        return false;
    }
    if (L > (int64_t)UINT32_MAX) {
        *err = "compression_ratio: the sequence length " + std::to_string(L) + " exceeds ratio_tokens' range";
        return false;
    }
    char b[96];
    std::snprintf(b, sizeof b, "compression_ratio=%.17g ratio_tokens=%lld", r, (long long)L);
    *out = b;
    return true;
}

// "key=value ..." of the fields in which `to` differs from `from` (key table order).
std::string changed_keys(const kvp_config &from, const kvp_config &to) {
    std::string out;
    for (uint32_t i = 0; i < kvp_config_key_count(); i++) {
        kvp_key_info k;
        k.struct_size = sizeof k;
        if (kvp_config_key(i, &k) != KVP_OK || k.config_size == 0 || k.type == KVP_KEY_ENUM) continue;
        const size_t off = k.config_size - 4;
        if (std::memcmp(reinterpret_cast<const char *>(&from) + off, reinterpret_cast<const char *>(&to) + off, 4) == 0)
            continue;
        char b[64];
        if (k.type == KVP_KEY_FLOAT) {
            float f;
            std::memcpy(&f, reinterpret_cast<const char *>(&to) + off, 4);
            std::snprintf(b, sizeof b, "%.6g", (double)f);
        } else {
            uint32_t u;
            std::memcpy(&u, reinterpret_cast<const char *>(&to) + off, 4);
            std::snprintf(b, sizeof b, "%u", u);
        }
        out += (out.empty() ? "" : " ") + std::string(k.name) + "=" + b;
    }
    return out;
}

}  // namespace

// compression_ratio is resolved by the library (kvp_config_apply: compression_ratio and
// ratio_tokens); this returns the fields it changes as keys.
std::string compression_keys(const kvp_config &c, double r, int64_t L, std::string *err) {
    std::string rs;
    if (!ratio_spec(r, L, &rs, err)) return "";
    kvp_config to = c;
    char e[512] = {0};
    if (kvp_config_apply(&to, rs.c_str(), e, sizeof e) != KVP_OK) {
        *err = e;
        return "";
    }
    const std::string keys = changed_keys(c, to);
    if (keys.empty()) *err = "compression_ratio changes nothing here";
    return keys;
}

bool resolve_spec(const ModelConfig &mc, const std::string &spec, int64_t seq_len, std::string *resolved,
                  kvp_config *cfg, std::string *err) {
    std::istringstream is(spec);
    std::vector<std::string> toks, keys;
    std::string t, ratio_text, tokens_text;
    bool has_ratio = false;
    std::set<std::string> seen;
    while (is >> t) {
        const size_t eq = t.find('=');
        if (eq == std::string::npos || eq == 0) {
            *err = "expected key=value, got '" + t + "'";
            return false;
        }
        const std::string key = t.substr(0, eq);
        if (!seen.insert(key).second) {
            *err = "key '" + key + "' is given more than once";
            return false;
        }
        if (key == "compression_ratio") {
            has_ratio = true;
            ratio_text = t.substr(eq + 1);
            continue;
        }
        if (key == "ratio_tokens") {  // the CLI's default: the sequence length
            tokens_text = t.substr(eq + 1);
            continue;
        }
        toks.push_back(t);
        keys.push_back(key);
    }
    if (!tokens_text.empty() && !has_ratio) {  // the library's message
        toks.push_back("ratio_tokens=" + tokens_text);
        keys.push_back("ratio_tokens");
    }
    if (toks.empty() && !has_ratio) {
        *err = "the policy spec is empty (e.g. \"policy=streaming sinks=4 window=60\"; `kvprune keys` lists the keys)";
        return false;
    }
    std::string base;
    for (const std::string &x : toks) base += (base.empty() ? "" : " ") + x;
    // A key the policy ignores is refused by the library when the spec gives the policy (issue 28);
    // a CLI spec is whole, so it is applied with its policy (the default one, full, when not given).
    const bool has_policy = std::find(keys.begin(), keys.end(), "policy") != keys.end();
    const std::string lib = has_policy ? base : "policy=full" + std::string(base.empty() ? "" : " ") + base;
    kvp_config c;
    if (!apply(mc, lib, &c, err)) return false;
    if (has_ratio) {
        // The library resolves it (one spec, so the keys given and the defaults that follow them
        // are judged together); the resolved spec names the fields it changed.
        std::string rs;
        if (tokens_text.empty() && !ratio_spec(0, seq_len, &rs, err)) return false;
        rs = "compression_ratio=" + ratio_text + " ratio_tokens=" + (tokens_text.empty() ? std::to_string(seq_len) : tokens_text);
        kvp_config full;
        if (!apply(mc, lib + " " + rs, &full, err)) return false;
        const std::string extra = changed_keys(c, full);
        base += (extra.empty() || base.empty() ? "" : " ") + extra;
        c = full;
    }
    *resolved = base;
    *cfg = c;
    return true;
}

std::string arena_warning(const kvp_config &cfg, int64_t tokens) {
    const size_t have = kvp_arena_size(&cfg);
    if (have == 0 || tokens <= 0 || tokens > (int64_t)(1u << 28) - (int64_t)cfg.max_draft) return "";
    const std::string T = std::to_string(tokens);
    // What the run needs: a cache that keeps every one of its tokens (policy=full, capacity = the
    // tokens plus the drafts), the same geometry, dtype and engine keys.
    kvp_config need = cfg;
    char e[512];
    const std::string full = "policy=full capacity=" + std::to_string(tokens + (int64_t)cfg.max_draft) + " total_capacity=0";
    if (kvp_config_apply(&need, full.c_str(), e, sizeof e) != KVP_OK) return "";
    const size_t want = kvp_arena_size(&need);
    if (want == 0 || have <= 8 * want) return "";
    // The key to lower: of the policy's size keys, the one that shrinks the arena most when set to
    // the run's token count (a spec without policy=: the config's policy keeps its other keys).
    std::string key;
    size_t best = have;
    for (const char *k : {"capacity", "budget", "window", "prefill_stage"}) {
        if (kvp_config_key_used(&cfg, k) != 1) continue;
        kvp_config t = cfg;
        const std::string spec = std::string(k) + "=" + T;
        if (kvp_config_apply(&t, spec.c_str(), e, sizeof e) != KVP_OK) continue;
        const size_t n = kvp_arena_size(&t);
        if (n && n < best) {
            best = n;
            key = k;
        }
    }
    char b[512];
    std::snprintf(b, sizeof b, "warning: the arena is %.1f MB, %.0fx what this run needs (%.1f MB keeps all %lld of its tokens)",
                  have / 1e6, (double)have / (double)want, want / 1e6, (long long)tokens);
    std::string out = b;
    if (!key.empty()) {
        std::snprintf(b, sizeof b, "; lower %s (%s=%s: %.1f MB)", key.c_str(), key.c_str(), T.c_str(), best / 1e6);
        out += b;
    }
    return out;
}

}  // namespace kvh
