#include "runtime/exec/stable_hash.h"

#include <cstddef>

namespace gp::runtime {

namespace {
constexpr uint64_t kFnvOffset = 1469598103934665603ULL;
constexpr uint64_t kFnvPrime = 1099511628211ULL;

uint64_t fnv_bytes(uint64_t h, const void* data, size_t n) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * kFnvPrime;
  return h;
}

}  // namespace

uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

uint64_t stable_hash(std::initializer_list<std::string_view> parts, uint64_t seed) {
  uint64_t h = fnv_bytes(kFnvOffset, &seed, sizeof seed);
  for (std::string_view p : parts) {
    uint64_t n = p.size();
    h = fnv_bytes(h, &n, sizeof n);  // length-prefixed: ("ab","c") != ("a","bc")
    h = fnv_bytes(h, p.data(), p.size());
  }
  return splitmix64(h);
}

uint64_t stable_hash_ints(uint64_t h, std::initializer_list<int64_t> values) {
  for (int64_t v : values) h = splitmix64(h ^ splitmix64(static_cast<uint64_t>(v)));
  return h;
}

}  // namespace gp::runtime
