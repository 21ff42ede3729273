// SHA-256 (FIPS 180-4) of a byte string, as 64 lowercase hex digits: the content hash a plan keeps
// of the profile it was made with (plan/costs.h).
#pragma once
#include <string>
#include <string_view>

namespace gp {

/// sha256_hex("abc") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad".
std::string sha256_hex(std::string_view bytes);

}  // namespace gp
