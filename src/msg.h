// Tiny message builder for error text: no printf family (newlib's formats floats with malloc),
// no allocation; always NUL-terminated, silently truncated at the buffer's end.
#pragma once
#include <stddef.h>
#include <stdint.h>

namespace kvp {

class Msg {
public:
    Msg(char *buf, size_t cap) : buf_(cap ? buf : nullptr), cap_(buf ? cap : 0) { clear(); }
    void clear() {
        len_ = 0;
        if (cap_) buf_[0] = '\0';
    }
    Msg &s(const char *str) {
        for (; str && *str; ++str) put(*str);
        return *this;
    }
    // n bytes of str (for echoing a token of a spec)
    Msg &sn(const char *str, size_t n) {
        for (size_t i = 0; i < n && str[i]; ++i) put(str[i]);
        return *this;
    }
    Msg &u(uint64_t v) {
        char tmp[24];
        int n = 0;
        do { tmp[n++] = char('0' + v % 10); v /= 10; } while (v);
        while (n) put(tmp[--n]);
        return *this;
    }
    Msg &i(int64_t v) {
        if (v < 0) { put('-'); return u(uint64_t(0) - uint64_t(v)); }
        return u(uint64_t(v));
    }
    // A double, shortest of: plain decimal with up to 6 fractional digits (1e-4 <= |v| < 1e15),
    // else d.dddddde[-]N; "nan", "inf". For messages only (no printf: see the file comment).
    Msg &f(double v) {
        if (v != v) return s("nan");
        if (v < 0) { put('-'); v = -v; }
        if (v > 1.7976931348623157e308) return s("inf");
        if (v == 0) return s("0");
        if (v >= 1e-4 && v < 1e12) {
            const uint64_t scaled = uint64_t(v * 1e6 + 0.5);
            u(scaled / 1000000u);
            return frac(scaled % 1000000u, 6);
        }
        if (v >= 1e12 && v < 1e15) return u(uint64_t(v + 0.5));
        int e = 0;
        while (v >= 10) { v /= 10; ++e; }
        while (v < 1) { v *= 10; --e; }
        uint64_t m = uint64_t(v * 1e5 + 0.5);  // 6 significant digits
        if (m >= 1000000u) { m /= 10; ++e; }
        u(m / 100000u);
        frac(m % 100000u, 5);
        put('e');
        return i(e);
    }
    const char *c_str() const { return cap_ ? buf_ : ""; }

private:
    // ".ddd" of frac/10^digits without trailing zeros; nothing when frac is 0.
    Msg &frac(uint64_t fr, int digits) {
        if (!fr) return *this;
        char tmp[24];
        for (int k = digits - 1; k >= 0; --k) { tmp[k] = char('0' + fr % 10); fr /= 10; }
        int n = digits;
        while (n > 0 && tmp[n - 1] == '0') --n;
        put('.');
        for (int k = 0; k < n; ++k) put(tmp[k]);
        return *this;
    }
    void put(char ch) {
        if (len_ + 1 < cap_) { buf_[len_++] = ch; buf_[len_] = '\0'; }
    }
    char *buf_;
    size_t cap_;
    size_t len_ = 0;
};

}  // namespace kvp
