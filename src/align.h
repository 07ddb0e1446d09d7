// Arena alignment (shared by the core's plans and the policies' state regions).
#pragma once
#include <stddef.h>

namespace kvp {

constexpr size_t kAlign = 64;
inline size_t align_up(size_t x, size_t a) { return (x + a - 1) / a * a; }

}  // namespace kvp
