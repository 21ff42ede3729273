// The shared-memory all-reduce (comm/shm_reduce.h): ranks as threads of one process (each maps the
// segment itself, as processes do), and a peer that is a forked process which exits.
#include "runtime/comm/shm_reduce.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <future>
#include <string>
#include <vector>

namespace gp::runtime::detail {
namespace {

using namespace std::chrono_literals;

// Rank 0 creates the segment (small slots, so that data spans several chunks); 1..n-1 open it.
std::vector<std::unique_ptr<ShmReducer>> group(int n, int64_t slot_bytes, uint64_t nonce) {
  std::vector<std::unique_ptr<ShmReducer>> g;
  std::string why;
  g.push_back(ShmReducer::create(n, nonce, slot_bytes, &why));
  EXPECT_NE(g[0], nullptr) << why;
  for (int r = 1; r < n; ++r) {
    g.push_back(ShmReducer::open(g[0]->name(), r, n, nonce, &why));
    EXPECT_NE(g.back(), nullptr) << why;
  }
  g[0]->unlink();
  return g;
}

TEST(ShmReduce, SumsAndMaxesOverChunksAlikeOnEveryRank) {
  const int n = 3;
  const int64_t count = 2600;  // 4096-byte slots hold 1024 floats: three chunks, the last one short
  auto g = group(n, 4096, 42);
  std::vector<std::vector<float>> f(n, std::vector<float>(count));
  std::vector<std::vector<int64_t>> m(n, std::vector<int64_t>(count));
  std::vector<std::vector<double>> d(n, std::vector<double>(7));
  for (int r = 0; r < n; ++r)
    for (int64_t i = 0; i < count; ++i) {
      f[r][i] = std::sin(static_cast<float>(i * (r + 1))) * 1e3f + 1e-3f * static_cast<float>(r);
      m[r][i] = (i * 7919 + r * 104729) % 1000 - 500;
      if (i < 7) d[r][i] = 0.1 * static_cast<double>(r + i);
    }
  const auto orig_f = f;
  const auto orig_m = m;
  std::vector<std::future<void>> ranks;
  for (int r = 0; r < n; ++r)
    ranks.push_back(std::async(std::launch::async, [&, r] {
      for (int rep = 0; rep < 2; ++rep) {  // the segment is reused call after call
        g[r]->all_reduce(f[r].data(), count, ShmDtype::f32, ShmOp::sum, 10s);
        g[r]->all_reduce(m[r].data(), count, ShmDtype::i64, ShmOp::max, 10s);
        g[r]->all_reduce(d[r].data(), 7, ShmDtype::f64, ShmOp::sum, 10s);
      }
    }));
  for (auto& x : ranks) ASSERT_EQ(x.wait_for(30s), std::future_status::ready);
  for (auto& x : ranks) x.get();
  for (int64_t i = 0; i < count; ++i) {
    // Twice summed: the first sum times n, in rank order (every rank holds the same bits).
    const float once = (orig_f[0][i] + orig_f[1][i]) + orig_f[2][i];
    const float twice = (once + once) + once;
    EXPECT_EQ(f[0][i], twice) << i;
    int64_t mx = std::max({orig_m[0][i], orig_m[1][i], orig_m[2][i]});
    EXPECT_EQ(m[0][i], mx) << i;
    for (int r = 1; r < n; ++r) {
      EXPECT_EQ(f[r][i], f[0][i]) << "rank " << r << " element " << i;
      EXPECT_EQ(m[r][i], m[0][i]);
    }
  }
  EXPECT_NEAR(d[2][6], 3 * (0.6 + 0.7 + 0.8), 1e-12);
}

TEST(ShmReduce, OpenRefusesAnotherNonceAndAMissingName) {
  std::string why;
  auto owner = ShmReducer::create(2, 7, 4096, &why);
  ASSERT_NE(owner, nullptr) << why;
  EXPECT_EQ(ShmReducer::open(owner->name(), 1, 2, 8, &why), nullptr);
  EXPECT_NE(why.find("not this group's segment"), std::string::npos) << why;
  EXPECT_EQ(ShmReducer::open(owner->name(), 1, 3, 7, &why), nullptr);
  owner->unlink();
  EXPECT_EQ(ShmReducer::open(owner->name(), 1, 2, 7, &why), nullptr);
  EXPECT_NE(why.find("No such file"), std::string::npos) << why;
}

TEST(ShmReduce, ASilentPeerTimesOutNamingIt) {
  auto g = group(2, 4096, 43);
  std::vector<float> v(10, 1.0f);
  const auto t0 = std::chrono::steady_clock::now();
  try {
    g[0]->all_reduce(v.data(), 10, ShmDtype::f32, ShmOp::sum, 300ms);
    FAIL() << "no error";
  } catch (const ShmError& e) {
    EXPECT_TRUE(e.timed_out());
    EXPECT_EQ(e.peer(), 1);
    EXPECT_NE(std::string(e.what()).find("timed out after 300 ms waiting for rank 1"), std::string::npos) << e.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 5s);
  EXPECT_THROW(g[0]->all_reduce(v.data(), 10, ShmDtype::f32, ShmOp::sum, 300ms), ShmError);  // broken for good
}

TEST(ShmReduce, APeerProcessThatExitedIsNamedLongBeforeTheTimeout) {
  std::string why;
  auto owner = ShmReducer::create(2, 44, 4096, &why);
  ASSERT_NE(owner, nullptr) << why;
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {  // maps the segment as rank 1, then exits without reducing
    auto peer = ShmReducer::open(owner->name(), 1, 2, 44, &why);
    ::_exit(peer ? 0 : 3);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_EQ(WEXITSTATUS(status), 0);
  owner->unlink();
  std::vector<double> v(3, 1.0);
  const auto t0 = std::chrono::steady_clock::now();
  try {
    owner->all_reduce(v.data(), 3, ShmDtype::f64, ShmOp::sum, 60s);
    FAIL() << "no error";
  } catch (const ShmError& e) {
    EXPECT_FALSE(e.timed_out());
    EXPECT_NE(std::string(e.what()).find("rank 1 (pid " + std::to_string(child) + ") exited"), std::string::npos)
        << e.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 5s);
}

}  // namespace
}  // namespace gp::runtime::detail
