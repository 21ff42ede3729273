// xxh64 against the reference implementation's values (computed with libxxhash 0.8.1's XXH64):
// every code path (empty, < 4, < 8, exactly one stripe, many stripes plus every tail) and a seed.
#include <gtest/gtest.h>

#include <string>

#include "support/checksum.h"

namespace gp {
namespace {

std::string bytes_0_255_x4_xyz1234() {
  std::string s;
  for (int r = 0; r < 4; ++r)
    for (int i = 0; i < 256; ++i) s.push_back(static_cast<char>(i));
  return s + "xyz1234";
}

TEST(Checksum, Xxh64MatchesTheReferenceImplementation) {
  const uint64_t seed = 2654435761u;
  EXPECT_EQ(xxh64_text(""), 0xef46db3751d8e999ULL);
  EXPECT_EQ(xxh64_text("", seed), 0xac75fda2929b17efULL);
  EXPECT_EQ(xxh64_text("a"), 0xd24ec4f1a98c6e5bULL);
  EXPECT_EQ(xxh64_text("a", seed), 0x393da8b78992279bULL);
  EXPECT_EQ(xxh64_text("abc"), 0x44bc2cf5ad770999ULL);
  EXPECT_EQ(xxh64_text("abc", seed), 0x1318df30094a85fdULL);
  EXPECT_EQ(xxh64_text("graphpipe"), 0x6b0ee66430df27ceULL);
  EXPECT_EQ(xxh64_text("graphpipe", seed), 0xe55a23d7c3c45dfULL);
  EXPECT_EQ(xxh64_text("0123456789abcdef0123456789abcdef"), 0x642a94958e71e6c5ULL);
  EXPECT_EQ(xxh64_text("0123456789abcdef0123456789abcdef", seed), 0xdfad85ccf8285222ULL);
  std::string long_input = bytes_0_255_x4_xyz1234();
  ASSERT_EQ(long_input.size(), 1031u);
  EXPECT_EQ(xxh64_text(long_input), 0x2adf0fd0c00e492dULL);
  EXPECT_EQ(xxh64_text(long_input, seed), 0x7ccbd3348a6d1b11ULL);
}

TEST(Checksum, OneFlippedBitChangesTheHash) {
  std::string s = bytes_0_255_x4_xyz1234();
  uint64_t h = xxh64_text(s);
  for (size_t i : {size_t{0}, size_t{31}, size_t{32}, size_t{517}, s.size() - 1}) {
    std::string t = s;
    t[i] = static_cast<char>(t[i] ^ 0x10);
    EXPECT_NE(xxh64_text(t), h) << "byte " << i;
  }
}

TEST(Checksum, Hex64IsSixteenLowercaseDigits) {
  EXPECT_EQ(hex64(0), "0000000000000000");
  EXPECT_EQ(hex64(0xef46db3751d8e999ULL), "ef46db3751d8e999");
}

}  // namespace
}  // namespace gp
