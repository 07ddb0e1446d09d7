#include "plot.h"

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <set>

namespace kvh {

namespace {

struct JsonReader {
    const std::string &s;
    size_t i = 0;
    std::string err;
    explicit JsonReader(const std::string &t) : s(t) {}
    void ws() {
        while (i < s.size() && std::isspace((unsigned char)s[i])) i++;
    }
    bool fail(const std::string &m) {
        if (err.empty()) err = m + " at offset " + std::to_string(i);
        return false;
    }
    bool expect(char c) {
        ws();
        if (i < s.size() && s[i] == c) {
            i++;
            return true;
        }
        return fail(std::string("expected '") + c + "'");
    }
    bool string(std::string *o) {
        ws();
        if (i >= s.size() || s[i] != '"') return fail("expected a string");
        i++;
        o->clear();
        while (i < s.size() && s[i] != '"') {
            char c = s[i++];
            if (c == '\\') {
                if (i >= s.size()) break;
                char e = s[i++];
                switch (e) {
                    case 'n': *o += '\n'; break;
                    case 't': *o += '\t'; break;
                    case 'r': *o += '\r'; break;
                    case 'b': *o += '\b'; break;
                    case 'f': *o += '\f'; break;
                    case 'u': {
                        if (i + 4 > s.size()) return fail("bad \\u escape");
                        unsigned v = (unsigned)std::strtoul(s.substr(i, 4).c_str(), nullptr, 16);
                        i += 4;
                        *o += v < 0x80 ? (char)v : '?';  // our writer only escapes control bytes
                        break;
                    }
                    default: *o += e;
                }
            } else {
                *o += c;
            }
        }
        if (i >= s.size()) return fail("unterminated string");
        i++;
        return true;
    }
    // A scalar: string, number, true/false/null. Numbers keep their text in *o.
    bool scalar(std::string *o, bool *is_str) {
        ws();
        if (i < s.size() && s[i] == '"') {
            *is_str = true;
            return string(o);
        }
        *is_str = false;
        size_t b = i;
        while (i < s.size() && (std::isalnum((unsigned char)s[i]) || s[i] == '-' || s[i] == '+' || s[i] == '.'))
            i++;
        if (b == i) return fail("expected a value");
        *o = s.substr(b, i - b);
        return true;
    }
};

bool to_double(const std::string &t, double *v) {
    if (t == "null") {
        *v = 0;
        return true;
    }
    char *end = nullptr;
    *v = std::strtod(t.c_str(), &end);
    return end && *end == '\0';
}

std::string gp_quote(const std::string &s) {  // gnuplot single-quoted string
    std::string o = "'";
    for (char c : s) o += c == '\'' ? std::string("''") : std::string(1, c);
    return o + "'";
}

bool is_exec(const std::string &p) {
    struct stat st;
    return stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode) && access(p.c_str(), X_OK) == 0;
}

}  // namespace

bool parse_results_json(const std::string &text, std::vector<EvalResult> *out, std::string *err) {
    out->clear();
    JsonReader r(text);
    if (!r.expect('[')) {
        *err = r.err;
        return false;
    }
    r.ws();
    if (r.i < text.size() && text[r.i] == ']') return true;
    for (;;) {
        if (!r.expect('{')) break;
        EvalResult e;
        std::set<std::string> seen;
        r.ws();
        bool empty = r.i < text.size() && text[r.i] == '}';
        if (empty) r.i++;
        while (!empty) {
            std::string key, val;
            bool is_str = false;
            if (!r.string(&key) || !r.expect(':') || !r.scalar(&val, &is_str)) break;
            double d = 0;
            bool num_ok = !is_str && to_double(val, &d);
            if (key == "policy") {
                if (!is_str) return *err = "field policy must be a string", false;
                e.policy = val;
            } else if (key == "nll" || key == "ppl" || key == "agreement" || key == "tok_per_s" ||
                       key == "live_bytes" || key == "peak_live_bytes" || key == "arena_bytes" ||
                       key == "tokens") {
                if (!num_ok) return *err = "field " + key + " must be a number", false;
                if (key == "nll") e.nll = d;
                if (key == "ppl") e.ppl = d;
                if (key == "agreement") e.agreement = d;
                if (key == "tok_per_s") e.tok_per_s = d;
                if (key == "live_bytes") e.live_bytes = (uint64_t)d;
                if (key == "peak_live_bytes") e.peak_live_bytes = (uint64_t)d;
                if (key == "arena_bytes") e.arena_bytes = (uint64_t)d;
                if (key == "tokens") e.tokens = (int64_t)d;
            }
            seen.insert(key);
            r.ws();
            if (r.i < text.size() && text[r.i] == ',') {
                r.i++;
                continue;
            }
            if (!r.expect('}')) break;
            break;
        }
        if (!r.err.empty()) break;
        for (const char *k : {"policy", "nll", "live_bytes"})
            if (!empty && !seen.count(k)) return *err = std::string("an entry lacks the field ") + k, false;
        if (empty) return *err = "an entry is empty", false;
        out->push_back(e);
        r.ws();
        if (r.i < text.size() && text[r.i] == ',') {
            r.i++;
            continue;
        }
        if (!r.expect(']')) break;
        r.ws();
        if (r.i != text.size()) r.fail("trailing characters after the array");
        break;
    }
    if (!r.err.empty()) {
        *err = "invalid results JSON: " + r.err;
        return false;
    }
    return true;
}

std::string policy_family(const std::string &spec) {
    std::string policy = "full", positions;
    size_t p = 0;
    while (p < spec.size()) {
        while (p < spec.size() && std::isspace((unsigned char)spec[p])) p++;
        size_t e = p;
        while (e < spec.size() && !std::isspace((unsigned char)spec[e])) e++;
        std::string kv = spec.substr(p, e - p);
        if (kv.compare(0, 7, "policy=") == 0) policy = kv.substr(7);
        if (kv.compare(0, 10, "positions=") == 0) positions = kv.substr(10);
        p = e;
    }
    return positions.empty() ? policy : policy + ", " + positions + " positions";
}

std::string find_gnuplot() {
    const char *env = std::getenv("KVPRUNE_GNUPLOT");
    if (env && *env) return is_exec(env) ? std::string(env) : std::string();
    const char *path = std::getenv("PATH");
    if (!path) return "";
    std::string ps(path);
    size_t b = 0;
    while (b <= ps.size()) {
        size_t e = ps.find(':', b);
        if (e == std::string::npos) e = ps.size();
        std::string dir = ps.substr(b, e - b);
        if (!dir.empty() && is_exec(dir + "/gnuplot")) return dir + "/gnuplot";
        b = e + 1;
    }
    return "";
}

std::string gnuplot_script(const std::vector<EvalResult> &rs, const std::string &png_path) {
    static const int kPointTypes[6] = {7, 5, 9, 11, 13, 4};
    std::set<int64_t> ns;
    for (const EvalResult &r : rs) ns.insert(r.tokens);
    // Series: policy family, split by token count when the file mixes several (long-context preset).
    std::map<std::string, std::vector<const EvalResult *>> series;
    std::vector<std::string> order;
    for (const EvalResult &r : rs) {
        std::string name = policy_family(r.policy);
        if (ns.size() > 1) name += " (N=" + std::to_string(r.tokens) + ")";
        if (!series.count(name)) order.push_back(name);
        series[name].push_back(&r);
    }
    std::string s;
    s += "set output " + gp_quote(png_path) + "\n";
    s += "set title 'kvprune: teacher-forced NLL vs live KV bytes'\n";
    s += "set xlabel 'live KV bytes (after the last token)'\n";
    s += "set ylabel 'mean NLL (nats/token)'\n";
    s += "set grid\nset key below\nset logscale x 2\nset format x '%.0b %BB'\n";
    char b[128];
    for (size_t i = 0; i < order.size(); i++) {
        auto pts = series[order[i]];
        std::stable_sort(pts.begin(), pts.end(),
                         [](const EvalResult *a, const EvalResult *c) { return a->live_bytes < c->live_bytes; });
        s += "$d" + std::to_string(i) + " << EOD\n";
        for (const EvalResult *p : pts) {
            std::snprintf(b, sizeof b, "%llu %.6f\n", (unsigned long long)std::max<uint64_t>(p->live_bytes, 1),
                          p->nll);
            s += b;
        }
        s += "EOD\n";
    }
    if (order.empty()) {
        s += "set xrange [1:2]\nplot NaN title 'no results'\n";
        return s;
    }
    s += "plot ";
    for (size_t i = 0; i < order.size(); i++) {
        if (i) s += ", \\\n     ";
        s += "$d" + std::to_string(i) + " using 1:2 with linespoints lw 2 pt " + std::to_string(kPointTypes[i % 6]) + " ps 1.5 title " + gp_quote(order[i]);
    }
    s += "\n";
    return s;
}

bool plot_results(const std::vector<EvalResult> &rs, const std::string &png_path, std::string *err) {
    std::string gp = find_gnuplot();
    if (gp.empty()) {
        *err = "gnuplot not found in PATH: `kvprune plot` needs it (Debian: apt-get install gnuplot-nox)";
        return false;
    }
    std::remove(png_path.c_str());
    std::string body = gnuplot_script(rs, png_path);
    if (gp.find('\'') != std::string::npos) {
        *err = "gnuplot path contains a quote: " + gp;
        return false;
    }
    // pngcairo when this gnuplot has it, else the libgd png terminal (its errors are shown).
    const char *terms[2] = {"set terminal pngcairo size 1000,700\n", "set terminal png size 1000,700\n"};
    for (int t = 0; t < 2; t++) {
        std::string cmd = "'" + gp + "'" + (t == 0 ? " 2>/dev/null" : "");
        std::FILE *p = popen(cmd.c_str(), "w");
        if (!p) {
            *err = "cannot run " + gp;
            return false;
        }
        std::string script = std::string(terms[t]) + body;
        std::fwrite(script.data(), 1, script.size(), p);
        int st = pclose(p);
        struct stat sb;
        if (st == 0 && stat(png_path.c_str(), &sb) == 0 && sb.st_size > 0) return true;
    }
    *err = "gnuplot failed to write '" + png_path + "'";
    return false;
}

}  // namespace kvh
