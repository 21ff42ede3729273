// A stable 64-bit hash for the runtime's deterministic randomness (parameters, synthetic data,
// dropout masks): identical across builds and platforms, unlike std::hash. Torch-free.
#pragma once
#include <cstdint>
#include <initializer_list>
#include <string_view>

namespace gp::runtime {

/// A stable 64-bit hash (FNV-1a over the parts, then a splitmix64 finaliser); identical across
/// builds and platforms, unlike std::hash.
uint64_t stable_hash(std::initializer_list<std::string_view> parts, uint64_t seed);
/// splitmix64's output function: a bijective 64-bit mix (after adding its increment).
uint64_t splitmix64(uint64_t x);
uint64_t stable_hash_ints(uint64_t h, std::initializer_list<int64_t> values);

}  // namespace gp::runtime
