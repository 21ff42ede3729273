// Communicator tests: many ranks as threads in one process over a c10d HashStore.
#include <gtest/gtest.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/torch.h>

#include <chrono>
#include <future>
#include <thread>

#include "runtime/detail/comm.h"

namespace gp::runtime::detail {
namespace {

using namespace std::chrono_literals;

// Runs fn(rank) on `n` threads sharing one HashStore; fails the test if any thread takes longer
// than `limit` (the threads are then detached so the test binary can still end).
// With `staging`, every tensor goes through a host copy as a GPU tensor would (force_host_staging).
template <class F>
void run_ranks(int n, std::chrono::milliseconds comm_timeout, F fn,
               std::chrono::seconds limit = 30s, bool staging = false) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  std::vector<std::future<void>> done;
  for (int r = 0; r < n; ++r) {
    done.push_back(std::async(std::launch::async, [=] {
      CommOptions o;
      o.timeout = comm_timeout;
      o.force_host_staging = staging;
      auto comm = make_gloo_communicator(store, r, n, o);
      fn(r, *comm);
    }));
  }
  auto deadline = std::chrono::steady_clock::now() + limit;
  for (auto& f : done) {
    ASSERT_EQ(f.wait_until(deadline), std::future_status::ready) << "rank thread hung";
    f.get();
  }
}

TEST(DistComm, SendRecvAlongAChainAndASkipEdge) {
  run_ranks(3, 10s, [](int r, Communicator& c) {
    EXPECT_EQ(c.rank(), r);
    EXPECT_EQ(c.size(), 3);
    if (r == 0) {
      auto a = torch::arange(6, torch::kFloat32).reshape({2, 3});
      auto b = torch::full({4}, 7.0);
      auto p1 = c.send(a, 1, 5);
      auto p2 = c.send(b, 2, 9);  // skip edge 0 -> 2
      p1.wait();
      p2.wait();
    } else if (r == 1) {
      auto t = torch::empty({2, 3});
      c.recv(t, 0, 5);
      EXPECT_TRUE(torch::equal(t, torch::arange(6, torch::kFloat32).reshape({2, 3})));
      auto p = c.send(t * 2, 2, 5);
      p.wait();
    } else {
      // Receive in the opposite order of arrival: tags keep the two messages apart.
      auto from1 = torch::empty({2, 3});
      auto from0 = torch::empty({4});
      c.recv(from1, 1, 5);
      c.recv(from0, 0, 9);
      EXPECT_FLOAT_EQ(from1[1][2].item<float>(), 10.0f);
      EXPECT_TRUE(torch::equal(from0, torch::full({4}, 7.0)));
    }
  });
}

TEST(DistComm, SameTagMessagesArriveInOrder) {
  run_ranks(2, 10s, [](int r, Communicator& c) {
    if (r == 0) {
      std::vector<Pending> ps;
      for (int i = 0; i < 5; ++i) ps.push_back(c.send(torch::full({3}, double(i)), 1, 1));
      for (auto& p : ps) p.wait();
    } else {
      for (int i = 0; i < 5; ++i) {
        auto t = torch::empty({3});
        c.recv(t, 0, 1);
        EXPECT_EQ(t[0].item<float>(), float(i));
      }
    }
  });
}

TEST(DistComm, AllReduceInSubGroups) {
  // 4 ranks: groups {0,2} and {1,3} reduce independently; then a world max.
  run_ranks(4, 10s, [](int r, Communicator& c) {
    std::vector<int> members = r % 2 == 0 ? std::vector<int>{0, 2} : std::vector<int>{1, 3};
    auto g = c.subgroup(members, r % 2 == 0 ? "even" : "odd");
    EXPECT_EQ(g->size(), 2);
    EXPECT_EQ(g->rank(), r / 2);
    std::vector<torch::Tensor> ts{torch::full({2}, double(r + 1)), torch::full({1}, 10.0 * r)};
    g->all_reduce(ts, Reduce::sum).wait();
    double expect0 = r % 2 == 0 ? 1 + 3 : 2 + 4;
    EXPECT_EQ(ts[0][1].item<float>(), expect0);
    EXPECT_EQ(ts[1][0].item<float>(), r % 2 == 0 ? 20.0f : 40.0f);
    std::vector<torch::Tensor> m{torch::full({1}, double(r))};
    c.all_reduce(m, Reduce::max).wait();
    EXPECT_EQ(m[0].item<float>(), 3.0f);
  });
}

TEST(DistComm, RecvFromSilentPeerTimesOutNamingThePeer) {
  auto t0 = std::chrono::steady_clock::now();
  auto finished = std::make_shared<std::promise<void>>();
  auto finished_f = finished->get_future().share();
  run_ranks(2, 500ms, [=](int r, Communicator& c) {
    if (r == 0) finished_f.wait();  // stay connected but silent until rank 1 gave up
    if (r == 1) {
      auto t = torch::empty({1});
      try {
        c.recv(t, 0, 3);
        ADD_FAILURE() << "recv returned without a sender";
      } catch (const CommError& e) {
        EXPECT_EQ(e.peer(), 0);
        EXPECT_TRUE(e.timed_out()) << e.what();
        EXPECT_NE(std::string(e.what()).find("recv from rank 0"), std::string::npos) << e.what();
      }
      finished->set_value();
    }
  });
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 10s);
}

// A message of the wrong size (a bug or a corrupted peer) must fail the receiver cleanly: a
// CommError naming the peer and both sizes, never a crash or a silently short/long tensor.
TEST(DistComm, WrongSizedMessageFailsTheReceiverNamingBothSizes) {
  for (int64_t sent : {10, 6}) {
    run_ranks(2, 3s, [=](int r, Communicator& c) {
      if (r == 0) {
        try {
          c.send(torch::arange(sent, torch::kFloat32), 1, 4).wait();
        } catch (const CommError&) {  // the receiver may drop the connection first
        }
      } else {
        auto t = torch::zeros({8});
        try {
          c.recv(t, 0, 4);
          ADD_FAILURE() << "recv of " << sent << " floats into 8 returned " << t;
        } catch (const CommError& e) {
          EXPECT_EQ(e.peer(), 0);
          EXPECT_TRUE(e.rejected());
          EXPECT_FALSE(e.timed_out());
          std::string what = e.what();
          EXPECT_NE(what.find("recv from rank 0"), std::string::npos) << what;
          EXPECT_NE(what.find(std::to_string(sent * 4) + " bytes"), std::string::npos) << what;
          EXPECT_NE(what.find("expected 32 bytes"), std::string::npos) << what;
        }
      }
    });
  }
}

// Host staging (the path of GPU tensors, forced on CPU tensors here): p2p and all-reduce deliver the
// same values, and every byte goes through a separate CPU copy on the way out and back.
TEST(DistComm, HostStagingCarriesP2pAndAllReduceThroughCpuCopies) {
  const int64_t before = host_staged_bytes().load();
  run_ranks(
      3, 10s,
      [](int r, Communicator& c) {
        if (r == 0) {
          c.send(torch::arange(6, torch::kFloat32).reshape({2, 3}).t(), 1, 5).wait();  // non-contiguous
        } else if (r == 1) {
          auto t = torch::zeros({3, 2});
          c.recv(t, 0, 5);
          EXPECT_TRUE(torch::equal(t, torch::arange(6, torch::kFloat32).reshape({2, 3}).t().contiguous()));
        }
        std::vector<torch::Tensor> one{torch::full({4}, double(r + 1))};
        c.all_reduce(one, Reduce::sum).wait();
        EXPECT_TRUE(torch::equal(one[0], torch::full({4}, 6.0)));
        std::vector<torch::Tensor> two{torch::full({2, 2}, double(r)).t(), torch::full({1}, 10.0 * r)};
        c.all_reduce(two, Reduce::max).wait();
        EXPECT_TRUE(torch::equal(two[0], torch::full({2, 2}, 2.0)));
        EXPECT_EQ(two[1][0].item<float>(), 20.0f);
      },
      30s, /*staging=*/true);
  // p2p: 24 bytes out (rank 0) and back in (rank 1); all-reduces: 3 ranks x (16 + 20) bytes x 2 ways.
  EXPECT_EQ(host_staged_bytes().load() - before, 2 * 24 + 3 * (16 + 20) * 2);
}

TEST(DistComm, HostStagingKeepsTheSizeHeaderAndTimeouts) {
  auto finished = std::make_shared<std::promise<void>>();
  auto finished_f = finished->get_future().share();
  run_ranks(
      2, 500ms,
      [=](int r, Communicator& c) {
        if (r == 0) {
          try {
            c.send(torch::arange(10, torch::kFloat32), 1, 4).wait();
          } catch (const CommError&) {  // the receiver rejected it: the payload is never taken
          }
          finished_f.wait();  // stay connected but silent until rank 1 gave up on tag 7
          return;
        }
        auto t = torch::zeros({8});
        try {
          c.recv(t, 0, 4);
          ADD_FAILURE() << "a 10-float message was received into 8 floats";
        } catch (const CommError& e) {
          EXPECT_TRUE(e.rejected()) << e.what();
          EXPECT_NE(std::string(e.what()).find("expected 32 bytes"), std::string::npos) << e.what();
        }
        EXPECT_TRUE(torch::equal(t, torch::zeros({8})));  // nothing copied back from the host buffer
        try {
          c.recv(t, 0, 7);  // rank 0 sends nothing with tag 7
          ADD_FAILURE() << "recv returned without a sender";
        } catch (const CommError& e) {
          EXPECT_EQ(e.peer(), 0);
          EXPECT_TRUE(e.timed_out()) << e.what();
        }
        finished->set_value();
      },
      30s, /*staging=*/true);
}

}  // namespace
}  // namespace gp::runtime::detail
