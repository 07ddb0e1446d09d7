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
    const char *c_str() const { return cap_ ? buf_ : ""; }

private:
    void put(char ch) {
        if (len_ + 1 < cap_) { buf_[len_++] = ch; buf_[len_] = '\0'; }
    }
    char *buf_;
    size_t cap_;
    size_t len_ = 0;
};

}  // namespace kvp
