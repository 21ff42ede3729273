// Checksums of raw bytes for detecting corruption (checkpoint tensors, manifests): XXH64, the
// 64-bit xxHash (same results as the reference implementation, e.g. libxxhash's XXH64), in our
// own code so the support library needs nothing new. Not a cryptographic hash.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace gp {

/// XXH64 of `size` bytes at `data` (little-endian reads, as the reference on x86/ARM).
uint64_t xxh64(const void* data, size_t size, uint64_t seed = 0);
/// XXH64 of a string's bytes (a separate name: a string literal and a seed would otherwise pick the
/// pointer + size overload).
inline uint64_t xxh64_text(std::string_view s, uint64_t seed = 0) { return xxh64(s.data(), s.size(), seed); }

/// 16 lowercase hex digits, zero-padded ("00ab..."), the form checkpoints store.
std::string hex64(uint64_t v);

}  // namespace gp
