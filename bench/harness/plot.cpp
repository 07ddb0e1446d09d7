#include "plot.h"

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <set>
#include <sstream>

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
                        *o += v < 0x100 ? (char)v : '?';  // our writers escape single bytes only (json_str)
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

// JSON number grammar: -?(0|[1-9]digits)(.digits)?([eE][+-]?digits)?  (no nan, inf, hex, '+').
bool is_json_number(const std::string &t) {
    size_t i = 0, n = t.size();
    auto digits = [&]() {
        size_t b = i;
        while (i < n && t[i] >= '0' && t[i] <= '9') i++;
        return i > b;
    };
    if (i < n && t[i] == '-') i++;
    if (i < n && t[i] == '0') i++;
    else if (!digits()) return false;
    if (i < n && t[i] == '.') {
        i++;
        if (!digits()) return false;
    }
    if (i < n && (t[i] == 'e' || t[i] == 'E')) {
        i++;
        if (i < n && (t[i] == '+' || t[i] == '-')) i++;
        if (!digits()) return false;
    }
    return i == n;
}

// A JSON number as a double (null = NaN); false when the text is not a number.
bool to_double(const std::string &t, double *v) {
    if (t == "null") {
        *v = NAN;
        return true;
    }
    if (!is_json_number(t)) return false;
    *v = std::strtod(t.c_str(), nullptr);  // may overflow to +-inf: the range checks reject it
    return true;
}

// An integer field, range-checked before the cast (a cast of an out-of-range double is UB).
bool to_int(const std::string &key, const std::string &text, double d, double hi, uint64_t *out, std::string *err) {
    if (!(d >= 0 && d <= hi) || std::floor(d) != d) {
        *err = "field " + key + ": " + text + " is not an integer in 0.." + strprintf("%.0f", hi);
        return false;
    }
    *out = (uint64_t)d;
    return true;
}

std::string gp_quote(const std::string &s) {  // gnuplot single-quoted string
    std::string o = "'";
    for (char c : s) o += c == '\'' ? std::string("''") : std::string(1, c);
    return o + "'";
}

std::string gp_dquote(const std::string &s) {  // gnuplot double-quoted string (escapes interpreted)
    std::string o = "\"";
    for (char c : s) {
        if (c == '"' || c == '\\') o += '\\';
        if (c == '\n') {
            o += "\\n";
            continue;
        }
        o += c;
    }
    return o + "\"";
}

bool is_exec(const std::string &p) {
    struct stat st;
    return stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode) && access(p.c_str(), X_OK) == 0;
}

}  // namespace

bool parse_json_rows(const std::string &text, std::vector<JsonRow> *rows, std::string *err) {
    rows->clear();
    JsonReader r(text);
    if (!r.expect('[')) {
        *err = "invalid results JSON: " + r.err;
        return false;
    }
    r.ws();
    if (r.i < text.size() && text[r.i] == ']') return true;
    for (;;) {
        if (!r.expect('{')) break;
        JsonRow row;
        r.ws();
        bool empty = r.i < text.size() && text[r.i] == '}';
        if (empty) r.i++;
        while (!empty) {
            std::string key;
            JsonField f;
            if (!r.string(&key) || !r.expect(':') || !r.scalar(&f.text, &f.is_str)) break;
            row.emplace_back(key, f);
            r.ws();
            if (r.i < text.size() && text[r.i] == ',') {
                r.i++;
                continue;
            }
            r.expect('}');
            break;
        }
        if (!r.err.empty()) break;
        if (empty) return *err = "an entry is empty", false;
        rows->push_back(row);
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

bool json_field_number(const std::string &key, const JsonField &f, double *v, std::string *err) {
    if (f.is_str || !to_double(f.text, v)) return *err = "field " + key + " must be a number, got '" + f.text + "'", false;
    return true;
}

bool json_field_uint(const std::string &key, const JsonField &f, double hi, uint64_t *out, std::string *err) {
    double d = 0;
    return json_field_number(key, f, &d, err) && to_int(key, f.text, d, hi, out, err);
}

bool parse_results_json(const std::string &text, std::vector<EvalResult> *out, std::string *err) {
    out->clear();
    std::vector<JsonRow> rows;
    if (!parse_json_rows(text, &rows, err)) return false;
    for (const JsonRow &row : rows) {
        EvalResult e;
        std::set<std::string> seen;
        for (const auto &kv : row) {
            const std::string &key = kv.first, &val = kv.second.text;
            const bool is_str = kv.second.is_str;
            std::string *str_field = key == "policy" ? &e.policy : key == "spec" ? &e.spec : key == "model" ? &e.model
                                     : key == "text" ? &e.text : key == "version" ? &e.version : nullptr;
            double *real_field = key == "nll" ? &e.nll : key == "ppl" ? &e.ppl : key == "agreement" ? &e.agreement
                                 : key == "tok_per_s" ? &e.tok_per_s : key == "kv_ratio" ? &e.kv_ratio : nullptr;
            uint64_t *u64_field = key == "live_bytes" ? &e.live_bytes : key == "peak_live_bytes" ? &e.peak_live_bytes
                                  : key == "arena_bytes" ? &e.arena_bytes : key == "capacity" ? &e.capacity
                                  : key == "threads" ? &e.threads : nullptr;
            if (str_field) {
                if (!is_str) return *err = "field " + key + " must be a string", false;
                *str_field = val;
            } else if (real_field) {
                double d = 0;
                if (!json_field_number(key, kv.second, &d, err)) return false;
                if (std::isinf(d) || (key == "nll" && std::isnan(d)))
                    return *err = "field " + key + ": '" + val + "' is not a finite number", false;
                *real_field = d;
            } else if (u64_field) {
                if (!json_field_uint(key, kv.second, 9007199254740992.0, u64_field, err)) return false;
            } else if (key == "tokens" || key == "prefill") {
                uint64_t v = 0;
                if (!json_field_uint(key, kv.second, 2147483647.0, &v, err)) return false;
                (key == "tokens" ? e.tokens : e.prefill) = (int64_t)v;
            }
            seen.insert(key);
        }
        for (const char *k : {"policy", "nll", "live_bytes"})
            if (!seen.count(k)) return *err = std::string("an entry lacks the field ") + k, false;
        out->push_back(e);
    }
    return true;
}

std::string policy_family(const std::string &spec) {
    // The keys a budget curve moves along; every other key names a configuration of its own.
    static const char *const kAlong[] = {"compression_ratio", "budget", "window", "capacity", "extra",
                                         "key_channel_ratio", "value_channel_ratio"};
    std::string policy = "full", positions, rest;
    std::istringstream is(spec);
    std::string kv;
    while (is >> kv) {
        const size_t eq = kv.find('=');
        const std::string k = kv.substr(0, eq), v = eq == std::string::npos ? std::string() : kv.substr(eq + 1);
        if (k == "policy") {
            policy = v;
            continue;
        }
        if (k == "positions") {
            positions = v;
            continue;
        }
        bool along = false;
        for (const char *x : kAlong) along = along || k == x;
        if (!along) rest += " " + kv;
    }
    return policy + rest + (positions.empty() ? "" : ", " + positions + " positions");
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

std::string plot_x_axis(const std::vector<EvalResult> &rs, const PlotOptions &o) {
    if (o.x == "n" || o.x == "bytes") return o.x;
    std::set<int64_t> ns;
    std::map<std::pair<std::string, int64_t>, int> per;  // points per (family, N)
    for (const EvalResult &r : rs) {
        ns.insert(r.tokens);
        per[{policy_family(r.policy), r.tokens}]++;
    }
    bool one_each = true;
    for (const auto &p : per) one_each = one_each && p.second == 1;
    return ns.size() > 1 && one_each ? "n" : "bytes";
}

std::string plot_format(const std::string &out_path, const std::string &format) {
    if (!format.empty()) return format;
    const size_t n = out_path.size();
    if (n >= 4 && (out_path.compare(n - 4, 4, ".svg") == 0 || out_path.compare(n - 4, 4, ".SVG") == 0)) return "svg";
    return "png";
}

namespace {

std::string base_name(const std::string &p) {
    const size_t s = p.find_last_of('/');
    return s == std::string::npos ? p : p.substr(s + 1);
}

template <class T>
std::string join_set(const std::set<T> &xs) {
    std::string o;
    for (const T &x : xs) {
        std::ostringstream os;
        os << x;
        o += (o.empty() ? "" : ",") + os.str();
    }
    return o;
}

}  // namespace

std::string gnuplot_script(const std::vector<EvalResult> &rs, const std::string &out_path, const PlotOptions &o) {
    // Point types alternate filled and open, sizes shrink and dash types change from series to
    // series, and the first (largest) series are drawn first: series that coincide (window and
    // streaming often do) stay visible.
    static const int kPointTypes[8] = {7, 6, 5, 4, 9, 8, 13, 12};
    const bool by_n = plot_x_axis(rs, o) == "n";
    std::set<int64_t> ns, ps;
    std::set<std::string> models;
    for (const EvalResult &r : rs) {
        ns.insert(r.tokens);
        if (r.prefill > 0) ps.insert(r.prefill);
        if (!r.model.empty()) models.insert(base_name(r.model));
    }
    std::map<std::string, std::vector<const EvalResult *>> series;
    std::vector<std::string> order;
    for (const EvalResult &r : rs) {
        std::string name = policy_family(r.policy);
        if (!by_n && ns.size() > 1) name += " (N=" + std::to_string(r.tokens) + ")";
        if (!series.count(name)) order.push_back(name);
        series[name].push_back(&r);
    }
    std::string title = by_n ? "kvprune: teacher-forced NLL vs sequence length N" : "kvprune: teacher-forced NLL vs live KV bytes";
    std::string sub = "model " + (models.empty() ? std::string("?") : join_set(models)) + ", N=" + join_set(ns) +
                      ", P=" + (ps.empty() ? std::string("?") : join_set(ps));
    std::string s;
    if (!out_path.empty()) s += "set output " + gp_quote(out_path) + "\n";
    s += "set title " + gp_dquote(title + "\n" + sub) + " noenhanced\n";
    if (by_n) {
        s += "set xlabel 'N: tokens fed (prompt P by prefill, the rest by decode)'\n";
        s += "set logscale x 2\nset xtics (" ;
        bool first = true;
        for (int64_t n : ns) {
            s += (first ? "" : ", ") + std::string("'") + std::to_string(n) + "' " + std::to_string(n);
            first = false;
        }
        s += ")\n";
    } else {
        s += "set xlabel 'live KV bytes (after the last token)'\n";
        s += "set logscale x 2\nset format x '%.0b %BB'\n";
    }
    s += "set ylabel 'mean NLL (nats/token)'\n";
    // The legend beside the plot in a readable font (below it, it ran into the x-axis label).
    s += "set grid\nset key outside right top vertical Left reverse noenhanced font ',11' spacing 1.15 samplen 3\n"
         "set tics font ',11'\nset xlabel font ',12'\nset ylabel font ',12'\n";
    for (size_t i = 0; i < order.size(); i++) {
        auto pts = series[order[i]];
        std::stable_sort(pts.begin(), pts.end(), [by_n](const EvalResult *a, const EvalResult *c) {
            return by_n ? a->tokens < c->tokens : a->live_bytes < c->live_bytes;
        });
        s += "$d" + std::to_string(i) + " << EOD\n";
        for (const EvalResult *p : pts) {
            const unsigned long long x = by_n ? (unsigned long long)std::max<int64_t>(p->tokens, 1)
                                              : (unsigned long long)std::max<uint64_t>(p->live_bytes, 1);
            s += strprintf("%llu %.9g\n", x, p->nll);
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
        const double ps_size = 2.2 - 0.35 * (double)(i % 5);
        s += "$d" + std::to_string(i) + " using 1:2 with linespoints lw 2 dt " + std::to_string(i % 5 + 1) + " pt " +
             std::to_string(kPointTypes[i % 8]) + " ps " + strprintf("%.2f", ps_size) + " title " + gp_quote(order[i]);
    }
    s += "\n";
    return s;
}

bool check_writable(const std::string &path, std::string *err) {
    struct stat st;
    if (path.empty()) {
        *err = "empty output path";
        return false;
    }
    if (stat(path.c_str(), &st) == 0) {
        if (S_ISDIR(st.st_mode)) return *err = "cannot write '" + path + "': it is a directory", false;
        if (access(path.c_str(), W_OK) != 0)
            return *err = "cannot write '" + path + "': " + std::strerror(errno), false;
        return true;
    }
    const size_t slash = path.find_last_of('/');
    const std::string dir = slash == std::string::npos ? "." : (slash == 0 ? "/" : path.substr(0, slash));
    if (stat(dir.c_str(), &st) != 0) return *err = "cannot write '" + path + "': folder '" + dir + "' does not exist", false;
    if (!S_ISDIR(st.st_mode)) return *err = "cannot write '" + path + "': '" + dir + "' is not a folder", false;
    if (access(dir.c_str(), W_OK) != 0)
        return *err = "cannot write '" + path + "': folder '" + dir + "': " + std::strerror(errno), false;
    return true;
}

bool check_plot_output(const std::string &out_path, const std::string &format, bool stdout_is_tty, std::string *err) {
    if (format != "png" && format != "svg") return *err = "--format must be png or svg, not '" + format + "'", false;
    if (out_path == "-") {
        if (stdout_is_tty && format == "png")
            return *err = "refusing to write a PNG to a terminal: redirect stdout (> plot.png) or use --out FILE", false;
        return true;
    }
    return check_writable(out_path, err);
}

namespace {

// Runs gnuplot on `script` with each terminal in turn until `file` is non-empty.
bool render(const std::string &gp, const std::vector<std::string> &terms, const std::string &script,
            const std::string &file, std::string *err) {
    std::string last;
    for (size_t t = 0; t < terms.size(); t++) {
        std::remove(file.c_str());
        const bool last_try = t + 1 == terms.size();
        std::string cmd = "'" + gp + "'" + (last_try ? "" : " 2>/dev/null");
        std::FILE *p = popen(cmd.c_str(), "w");
        if (!p) return *err = "cannot run " + gp, false;
        const std::string full = terms[t] + script;
        std::fwrite(full.data(), 1, full.size(), p);
        const int st = pclose(p);
        struct stat sb;
        if (st == 0 && stat(file.c_str(), &sb) == 0 && sb.st_size > 0) return true;
    }
    std::remove(file.c_str());
    *err = "gnuplot failed to write '" + file + "'";
    return false;
}

}  // namespace

bool render_plot(const std::function<std::string(const std::string &)> &make_script, const std::string &out_path,
                 const std::string &format, int width, int height, std::string *err) {
    const std::string fmt = plot_format(out_path == "-" ? "" : out_path, format);
    if (!check_plot_output(out_path, fmt, isatty(1) != 0, err)) return false;
    std::string gp = find_gnuplot();
    if (gp.empty()) {
        *err = "gnuplot not found in PATH: `kvprune plot` needs it (Debian: apt-get install gnuplot-nox; or set "
               "KVPRUNE_GNUPLOT to its path)";
        return false;
    }
    if (gp.find('\'') != std::string::npos) return *err = "gnuplot path contains a quote: " + gp, false;
    const std::string size = std::to_string(width) + "," + std::to_string(height);
    std::vector<std::string> terms;
    if (fmt == "svg") terms = {"set terminal svg size " + size + " dynamic\n"};
    else terms = {"set terminal pngcairo size " + size + "\n", "set terminal png size " + size + "\n"};
    if (out_path != "-") return render(gp, terms, make_script(out_path), out_path, err);
    // stdout: render into a temporary file, then copy it out (a failed terminal leaves nothing half-written).
    const char *tmpdir = std::getenv("TMPDIR");
    std::string tmpl = std::string(tmpdir && *tmpdir ? tmpdir : "/tmp") + "/kvprune-plot-XXXXXX";
    std::vector<char> name(tmpl.begin(), tmpl.end());
    name.push_back('\0');
    const int fd = mkstemp(name.data());
    if (fd < 0) return *err = "cannot create a temporary file in " + tmpl, false;
    close(fd);
    const std::string tmp = name.data();
    bool ok = render(gp, terms, make_script(tmp), tmp, err);
    if (ok) {
        std::FILE *f = std::fopen(tmp.c_str(), "rb");
        char buf[65536];
        size_t n;
        while (f && (n = std::fread(buf, 1, sizeof buf, f)) > 0) ok = ok && std::fwrite(buf, 1, n, stdout) == n;
        if (f) std::fclose(f);
        ok = ok && std::fflush(stdout) == 0;
        if (!ok) *err = "cannot write the plot to stdout";
    }
    std::remove(tmp.c_str());
    return ok;
}

bool plot_results(const std::vector<EvalResult> &rs, const std::string &out_path, const PlotOptions &o,
                  std::string *err) {
    if (rs.empty()) return *err = "no results to plot", false;
    return render_plot([&](const std::string &file) { return gnuplot_script(rs, file, o); }, out_path, o.format, 1400, 720,
                       err);
}

}  // namespace kvh
