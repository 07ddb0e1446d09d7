#include "spec.h"

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <set>
#include <sstream>
#include <vector>

#include "session.h"

namespace kvh {

namespace {

const char *policy_name(uint32_t p) {
    static const char *names[] = {"full", "window", "streaming", "h2o", "snapkv", "pyramidkv", "lethe",
                                  "simlayerkv", "asl", "think"};
    return p < 10 ? names[p] : "?";
}

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
        if (kvp_config_key(i, &k) != KVP_OK || kvp_config_key_used(&probe, k.name) != 1) continue;
        std::string &dst = k.policies == KVP_POLICY_ALL ? common : own;
        dst += (dst.empty() ? "" : ", ") + std::string(k.name);
    }
    return (own.empty() ? std::string("none of its own") : own) + "; common to all: " + common;
}

std::string compression_keys(const kvp_config &c, double r, int64_t L, std::string *err) {
    if (!(r >= 0 && r < 1)) {
        *err = "compression_ratio must be in [0, 1) (the fraction of the KV cache removed)";
        return "";
    }
    if (L <= 0) {
        *err = "compression_ratio needs the sequence length, which is not known here";
        return "";
    }
    const int64_t K = std::max<int64_t>(1, std::llround((1.0 - r) * (double)L));
    const std::string k = std::to_string(K);
    switch (c.policy) {
        case KVP_POLICY_WINDOW: return "window=" + k;
        case KVP_POLICY_STREAMING: {
            const int64_t w = K - (int64_t)c.sinks - (int64_t)c.extra;
            if (w < 1) {
                *err = "compression_ratio=" + std::to_string(r) + " keeps " + k + " of " + std::to_string(L) +
                       " tokens, not more than sinks+extra=" + std::to_string(c.sinks + c.extra);
                return "";
            }
            return "window=" + std::to_string(w);
        }
        case KVP_POLICY_H2O:
        case KVP_POLICY_SNAPKV:
        case KVP_POLICY_PYRAMIDKV:
        case KVP_POLICY_ASL: return "budget=" + k;
        case KVP_POLICY_LETHE: return "capacity=" + k;
        case KVP_POLICY_SIMLAYERKV: {
            const int64_t w = K - (int64_t)c.sinks;
            if (w < 1) {
                *err = "compression_ratio keeps " + k + " tokens, not more than sinks=" + std::to_string(c.sinks);
                return "";
            }
            // budget only where the nonlazy policy has one (full keeps every token of its layers)
            return "window=" + std::to_string(w) + (c.nonlazy == KVP_POLICY_FULL ? "" : " budget=" + k);
        }
        case KVP_POLICY_THINK: {
            char b[64];
            std::snprintf(b, sizeof b, "%.6g", std::min(r, 0.999));
            return std::string("key_channel_ratio=") + b + " value_channel_ratio=" + b;
        }
        default: break;
    }
    *err = std::string("compression_ratio does not apply to policy=") + policy_name((uint32_t)c.policy) +
           " (it keeps every token); use window, streaming, h2o, snapkv, pyramidkv, lethe, simlayerkv, asl or think";
    return "";
}

bool resolve_spec(const ModelConfig &mc, const std::string &spec, int64_t seq_len, std::string *resolved,
                  kvp_config *cfg, std::string *err) {
    std::istringstream is(spec);
    std::vector<std::string> toks, keys;
    std::string t, ratio_text;
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
        toks.push_back(t);
        keys.push_back(key);
    }
    if (toks.empty() && !has_ratio) {
        *err = "the policy spec is empty (e.g. \"policy=streaming sinks=4 window=60\"; `kvprune keys` lists the keys)";
        return false;
    }
    std::string base;
    for (const std::string &x : toks) base += (base.empty() ? "" : " ") + x;
    kvp_config c;
    if (!apply(mc, base, &c, err)) return false;
    for (const std::string &key : keys) {
        if (kvp_config_key_used(&c, key.c_str()) == 0) {
            *err = "key '" + key + "' has no effect under policy=" + policy_name((uint32_t)c.policy) +
                   " (its keys: " + policy_keys_text(c) + ")";
            return false;
        }
    }
    if (has_ratio) {
        char *end = nullptr;
        const double r = std::strtod(ratio_text.c_str(), &end);
        if (ratio_text.empty() || !end || *end || !std::isfinite(r)) {
            *err = "compression_ratio=" + ratio_text + ": not a number in [0, 1)";
            return false;
        }
        const std::string extra = compression_keys(c, r, seq_len, err);
        if (extra.empty()) return false;
        std::istringstream ks(extra);
        while (ks >> t) {
            const std::string key = t.substr(0, t.find('='));
            if (seen.count(key)) {
                *err = "compression_ratio sets " + key + " for policy=" + policy_name((uint32_t)c.policy) +
                       ": give one of them, not both";
                return false;
            }
        }
        base += (base.empty() ? "" : " ") + extra;
        if (!apply(mc, base, &c, err)) {
            *err = "compression_ratio=" + ratio_text + " (" + extra + "): " + *err;
            return false;
        }
    }
    *resolved = base;
    *cfg = c;
    return true;
}

}  // namespace kvh
