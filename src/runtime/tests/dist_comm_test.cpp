// Communicator tests: many ranks as threads in one process over a c10d HashStore.
#include <gtest/gtest.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/torch.h>

#include <chrono>
#include <future>
#include <thread>

#include "runtime/comm/comm.h"

namespace gp::runtime::detail {
namespace {

using namespace std::chrono_literals;

// Runs fn(rank) on `n` threads sharing one HashStore; fails the test if any thread takes longer
// than `limit` (the threads are then detached so the test binary can still end).
// With `staging`, every tensor goes through a host copy as a GPU tensor would (force_host_staging).
// `kind`: the communicator (comm_select.h); gloo-pairs is NCCL's pairwise logic over Gloo.
template <class F>
void run_ranks(int n, std::chrono::milliseconds comm_timeout, F fn, std::chrono::seconds limit = 30s,
               bool staging = false, CommKind kind = CommKind::gloo) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  std::vector<std::future<void>> done;
  for (int r = 0; r < n; ++r) {
    done.push_back(std::async(std::launch::async, [=] {
      CommOptions o;
      o.timeout = comm_timeout;
      o.force_host_staging = staging;
      auto comm = make_communicator(kind, store, r, n, o, torch::kCPU);
      EXPECT_EQ(comm->kind(), kind);
      fn(r, *comm);
    }));
  }
  auto deadline = std::chrono::steady_clock::now() + limit;
  for (auto& f : done) {
    ASSERT_EQ(f.wait_until(deadline), std::future_status::ready) << "rank thread hung";
    f.get();
  }
}

// Rank 0 -> 1 -> 2 and a skip edge 0 -> 2; rank 2 receives in the opposite order of arrival (tags
// keep the two messages apart on Gloo; on the pairwise communicator each pair is its own channel).
void chain_and_skip_edge(int r, Communicator& c) {
  EXPECT_EQ(c.rank(), r);
  EXPECT_EQ(c.size(), 3);
  c.connect({{0, 1}, {0, 2}, {1, 2}});
  if (r == 0) {
    auto p1 = c.send(torch::arange(6, torch::kFloat32).reshape({2, 3}), 1, 5);
    auto p2 = c.send(torch::full({4}, 7.0), 2, 9);  // skip edge 0 -> 2
    p1.wait();
    p2.wait();
  } else if (r == 1) {
    auto t = torch::empty({2, 3});
    c.recv(t, 0, 5);
    EXPECT_TRUE(torch::equal(t, torch::arange(6, torch::kFloat32).reshape({2, 3})));
    c.send(t * 2, 2, 5).wait();
  } else {
    auto from1 = torch::empty({2, 3});
    auto from0 = torch::empty({4});
    c.recv(from1, 1, 5);
    c.recv(from0, 0, 9);
    EXPECT_FLOAT_EQ(from1[1][2].item<float>(), 10.0f);
    EXPECT_TRUE(torch::equal(from0, torch::full({4}, 7.0)));
  }
}

TEST(DistComm, SendRecvAlongAChainAndASkipEdge) { run_ranks(3, 10s, chain_and_skip_edge); }

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
          // Waited for only once rank 1 gave up on tag 7: a send timing out first could close the
          // connection under rank 1's wait (seen under load: "Connection closed by peer").
          auto sent = c.send(torch::arange(10, torch::kFloat32), 1, 4);
          finished_f.wait();  // stay connected but silent until rank 1 gave up on tag 7
          try {
            sent.wait();
          } catch (const CommError&) {  // the receiver rejected it: the payload is never taken
          }
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

// --- Receives posted ahead (post_recv): one one-way latency per transfer, the size header still checked ---

// A receive posted before the send lets the send complete while the receiver has not yet asked for the
// tensor (Gloo had the receiver's announcement already): with recv() the sender's wait would block
// until the receiver called it, and this test would time out. Small (copied) and large (a view of the
// receive buffer) tensors.
TEST(DistComm, PostedRecvLetsTheSendCompleteBeforeTheReceiverWaits) {
  auto sent = std::make_shared<std::promise<void>>();
  auto sent_f = sent->get_future().share();
  auto posted = std::make_shared<std::promise<void>>();
  auto posted_f = posted->get_future().share();
  run_ranks(2, 5s, [=](int r, Communicator& c) {
    const auto big = torch::arange(300000, torch::kFloat32).reshape({1000, 300});
    if (r == 0) {
      posted_f.wait();
      c.send(torch::arange(6, torch::kFloat32).reshape({2, 3}), 1, 5).wait();
      c.send(big, 1, 6).wait();
      sent->set_value();
      return;
    }
    PostedRecv small = c.post_recv({2, 3}, torch::kFloat32, 0, 5);
    PostedRecv large = c.post_recv({1000, 300}, torch::kFloat32, 0, 6);
    posted->set_value();
    ASSERT_EQ(sent_f.wait_for(4s), std::future_status::ready) << "the sends waited for the receiver";
    EXPECT_TRUE(torch::equal(small.wait(), torch::arange(6, torch::kFloat32).reshape({2, 3})));
    EXPECT_TRUE(torch::equal(large.wait(), big));
  });
}

// A posted receive refuses a message of the wrong size by its header, naming the peer and both sizes,
// and the pair keeps working: the next message arrives.
TEST(DistComm, PostedRecvRefusesAWrongSizedMessageAndThePairGoesOn) {
  for (int64_t sent : {10, 6}) {
    run_ranks(2, 3s, [=](int r, Communicator& c) {
      if (r == 0) {
        c.send(torch::arange(sent, torch::kFloat32), 1, 4).wait();
        c.send(torch::full({3}, 2.0), 1, 8).wait();
        return;
      }
      PostedRecv p = c.post_recv({8}, torch::kFloat32, 0, 4);
      try {
        auto t = p.wait();
        ADD_FAILURE() << "a posted receive of 8 floats took " << sent << ": " << t;
      } catch (const CommError& e) {
        EXPECT_EQ(e.peer(), 0);
        EXPECT_TRUE(e.rejected());
        std::string what = e.what();
        EXPECT_NE(what.find("recv from rank 0 (tag 4)"), std::string::npos) << what;
        EXPECT_NE(what.find(std::to_string(sent * 4) + " bytes of Float, expected 32 bytes"), std::string::npos)
            << what;
      }
      EXPECT_TRUE(torch::equal(c.post_recv({3}, torch::kFloat32, 0, 8).wait(), torch::full({3}, 2.0)));
    });
  }
}

// Host staging (the GPU path): a posted receive's bytes come back through one counted copy.
TEST(DistComm, PostedRecvWithHostStagingCopiesOnce) {
  const int64_t before = host_staged_bytes().load();
  run_ranks(
      2, 10s,
      [](int r, Communicator& c) {
        if (r == 0) return c.send(torch::arange(6, torch::kFloat32), 1, 5).wait();
        EXPECT_TRUE(torch::equal(c.post_recv({6}, torch::kFloat32, 0, 5).wait(), torch::arange(6, torch::kFloat32)));
      },
      30s, /*staging=*/true);
  EXPECT_EQ(host_staged_bytes().load() - before, 2 * 24);
}

// --- The pairwise communicator (NCCL's logic) over Gloo, and the choice of backend ---

template <class F>
void run_pairs(int n, std::chrono::milliseconds comm_timeout, F fn) {
  run_ranks(n, comm_timeout, fn, 30s, false, CommKind::gloo_pairs);
}

// Gloo communicators of `n` ranks (threads) that all-reduce through shared memory or not.
template <class F>
void run_gloo_ranks(int n, bool shm, F fn) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  std::vector<std::future<void>> done;
  for (int r = 0; r < n; ++r)
    done.push_back(std::async(std::launch::async, [=] {
      CommOptions o;
      o.timeout = 10s;
      o.shm_all_reduce = shm;
      auto comm = make_gloo_communicator(store, r, n, o);
      fn(r, *comm);
    }));
  const auto deadline = std::chrono::steady_clock::now() + 60s;
  for (auto& f : done) ASSERT_EQ(f.wait_until(deadline), std::future_status::ready) << "rank thread hung";
  for (auto& f : done) f.get();
}

// 3 MB over 3 ranks: three of the segment's 1 MiB chunks; in shared memory every rank ends with the
// same bits, and Gloo's sum (another order) agrees to rounding.
TEST(DistComm, SharedMemoryAllReduceAgreesWithGloosOnEveryRank) {
  const int n = 3;
  auto data = [](int r) {
    return std::vector<torch::Tensor>{torch::sin(torch::arange(750000, torch::kFloat32) * float(r + 1)),
                                      torch::full({5}, int64_t{r}, torch::kInt64)};
  };
  std::vector<std::vector<torch::Tensor>> shm(n), gloo(n);
  for (bool use_shm : {true, false}) {
    const int64_t before = shm_reduced_bytes();
    run_gloo_ranks(n, use_shm, [&](int r, Communicator& c) {
      auto ts = data(r);
      c.all_reduce(ts, Reduce::sum).wait();
      (use_shm ? shm : gloo)[static_cast<size_t>(r)] = ts;
    });
    // Joined into one float32 buffer (join_for_reduce): 750005 floats per rank, through shared memory.
    EXPECT_EQ(shm_reduced_bytes() - before, use_shm ? int64_t{n} * 750005 * 4 : 0);
  }
  for (int r = 0; r < n; ++r) {
    EXPECT_TRUE(torch::equal(shm[static_cast<size_t>(r)][0], shm[0][0])) << "rank " << r;
    EXPECT_TRUE(torch::allclose(shm[static_cast<size_t>(r)][0], gloo[static_cast<size_t>(r)][0], 1e-5, 1e-6));
    EXPECT_TRUE(torch::equal(shm[static_cast<size_t>(r)][1], torch::full({5}, int64_t{3}, torch::kInt64)));
  }
  EXPECT_TRUE(torch::equal(shm[0][0], (data(0)[0] + data(1)[0]) + data(2)[0]));  // rank order
}

// Posting an all-reduce never blocks the caller, as with Gloo: rank 0 posts it, then sends what rank 1
// must receive before rank 1 posts its own. A reduce done on the posting thread would deadlock here.
TEST(DistComm, SharedMemoryAllReducePostedBeforeASendThePeerNeedsFirst) {
  run_gloo_ranks(2, true, [](int r, Communicator& c) {
    std::vector<torch::Tensor> ts{torch::full({4}, double(r + 1))};
    if (r == 0) {
      Pending sum = c.all_reduce(ts, Reduce::sum);
      c.send(torch::ones({2}), 1, 3).wait();
      sum.wait();
    } else {
      auto t = torch::empty({2});
      c.recv(t, 0, 3);
      c.all_reduce(ts, Reduce::sum).wait();
    }
    EXPECT_EQ(ts[0][3].item<double>(), 3.0);
  });
}

TEST(PairwiseComm, ConnectThenSendAlongAChainAndASkipEdge) { run_pairs(3, 10s, chain_and_skip_edge); }

// Both directions of a pair at once (activations one way, gradients the other): separate channels.
TEST(PairwiseComm, BothDirectionsOfAPairAtOnce) {
  run_pairs(2, 10s, [](int r, Communicator& c) {
    c.connect({{0, 1}, {1, 0}});
    std::vector<Pending> ps;
    for (int i = 0; i < 4; ++i) ps.push_back(c.send(torch::full({1000}, double(10 * r + i)), 1 - r, i));
    for (int i = 0; i < 4; ++i) {
      auto t = torch::empty({1000});
      c.recv(t, 1 - r, i);
      EXPECT_EQ(t[999].item<float>(), float(10 * (1 - r) + i));
    }
    for (auto& p : ps) p.wait();
  });
}

// A channel delivers in order: a receiver that expects another message than the next one refuses it,
// naming the tag it got, instead of reading one tensor's bytes into another.
TEST(PairwiseComm, MessageOutOfOrderIsRefusedNamingItsTag) {
  run_pairs(2, 3s, [](int r, Communicator& c) {
    c.connect({{0, 1}});
    if (r == 0) {
      try {
        c.send(torch::ones({4}), 1, 11).wait();
        c.send(torch::ones({4}), 1, 12).wait();
      } catch (const CommError&) {  // the receiver gave up on the channel
      }
      return;
    }
    auto t = torch::zeros({4});
    try {
      c.recv(t, 0, 12);
      ADD_FAILURE() << "received tag 12 before tag 11";
    } catch (const CommError& e) {
      EXPECT_TRUE(e.rejected()) << e.what();
      EXPECT_EQ(e.peer(), 0);
      EXPECT_NE(std::string(e.what()).find("carries tag 11"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("recv from rank 0 (tag 12, gloo-pairs)"), std::string::npos) << e.what();
    }
    EXPECT_TRUE(torch::equal(t, torch::zeros({4})));
  });
}

TEST(PairwiseComm, WrongSizedMessageIsRefused) {
  run_pairs(2, 3s, [](int r, Communicator& c) {
    c.connect({{0, 1}});
    if (r == 0) {
      try {
        c.send(torch::arange(10, torch::kFloat32), 1, 4).wait();
      } catch (const CommError&) {
      }
      return;
    }
    auto t = torch::zeros({8});
    try {
      c.recv(t, 0, 4);
      ADD_FAILURE() << "a 10-float message was received into 8 floats";
    } catch (const CommError& e) {
      EXPECT_TRUE(e.rejected());
      EXPECT_NE(std::string(e.what()).find("the peer sent 40 bytes of Float, expected 32 bytes"), std::string::npos)
          << e.what();
    }
  });
}

TEST(PairwiseComm, SilentPeerTimesOutNamingThePeer) {
  auto finished = std::make_shared<std::promise<void>>();
  auto finished_f = finished->get_future().share();
  run_pairs(2, 500ms, [=](int r, Communicator& c) {
    c.connect({{0, 1}});
    if (r == 0) return finished_f.wait();
    auto t = torch::empty({1});
    try {
      c.recv(t, 0, 3);
      ADD_FAILURE() << "recv returned without a sender";
    } catch (const CommError& e) {
      EXPECT_EQ(e.peer(), 0);
      EXPECT_TRUE(e.timed_out()) << e.what();
    }
    finished->set_value();
  });
}

TEST(PairwiseComm, AllReduceInSubGroupsAndTheWorld) {
  run_pairs(4, 10s, [](int r, Communicator& c) {
    std::vector<int> members = r % 2 == 0 ? std::vector<int>{0, 2} : std::vector<int>{1, 3};
    auto g = c.subgroup(members, r % 2 == 0 ? "even" : "odd");
    EXPECT_EQ(g->kind(), CommKind::gloo_pairs);
    std::vector<torch::Tensor> ts{torch::full({2}, double(r + 1)), torch::full({1}, 10.0 * r)};
    g->all_reduce(ts, Reduce::sum).wait();
    EXPECT_EQ(ts[0][1].item<float>(), r % 2 == 0 ? 4.0f : 6.0f);
    EXPECT_EQ(ts[1][0].item<float>(), r % 2 == 0 ? 20.0f : 40.0f);
    std::vector<torch::Tensor> m{torch::full({2, 2}, double(r)).t()};  // non-contiguous
    c.all_reduce(m, Reduce::max).wait();
    EXPECT_TRUE(torch::equal(m[0], torch::full({2, 2}, 3.0)));
  });
}

TEST(CommSelect, AutoPicksNcclOnlyWithAGpuPerRankAndNcclBuilt) {
  EXPECT_EQ(choose_comm("auto", "cpu", 4, 8, true).kind, CommKind::gloo);
  EXPECT_EQ(choose_comm("auto", "cpu", 4, 8, true).why, "CPU tensors");
  CommChoice eight = choose_comm("auto", "cuda", 8, 8, true);
  EXPECT_EQ(eight.kind, CommKind::nccl);
  EXPECT_TRUE(eight.nccl_possible);
  CommChoice shared = choose_comm("auto", "cuda", 4, 1, true);  // one GPU shared by four ranks
  EXPECT_EQ(shared.kind, CommKind::gloo);
  EXPECT_FALSE(shared.nccl_possible);
  EXPECT_NE(shared.why.find("4 ranks on this host share 1 GPU"), std::string::npos) << shared.why;
  EXPECT_EQ(choose_comm("auto", "cuda", 2, 2, false).kind, CommKind::gloo);  // a build without NCCL
  EXPECT_EQ(choose_comm("auto", "cuda", 0, 1, true).kind, CommKind::nccl);   // local size unknown: 1
  EXPECT_EQ(choose_comm("gloo", "cuda", 8, 8, true).kind, CommKind::gloo);
  EXPECT_EQ(choose_comm("gloo-pairs", "cpu", 2, 0, false).kind, CommKind::gloo_pairs);
}

TEST(CommSelect, ImpossibleRequestsAreUserErrors) {
  EXPECT_THROW(choose_comm("mpi", "cpu", 1, 0, true), UserError);
  try {
    choose_comm("nccl", "cpu", 1, 0, true);
    ADD_FAILURE();
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("needs --device cuda"), std::string::npos) << e.what();
  }
  try {
    choose_comm("nccl", "cuda", 1, 1, false);
    ADD_FAILURE();
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("built without NCCL"), std::string::npos) << e.what();
  }
}

TEST(CommSelect, EveryRankSettlesOnTheSameBackend) {
  CommChoice yes = choose_comm("auto", "cuda", 2, 2, true), no = choose_comm("auto", "cuda", 4, 2, true);
  EXPECT_EQ(settle_comm("auto", yes, 8, 8).kind, CommKind::nccl);
  // Two hosts, one short of GPUs: all eight fall back to Gloo, those that could use NCCL too.
  CommChoice fallback = settle_comm("auto", yes, 2, 8);
  EXPECT_EQ(fallback.kind, CommKind::gloo);
  EXPECT_NE(fallback.why.find("6 of 8 ranks have no GPU of their own"), std::string::npos) << fallback.why;
  EXPECT_EQ(settle_comm("auto", no, 2, 8).kind, CommKind::gloo);
  // --comm nccl: every rank fails alike, this one saying why it cannot.
  CommChoice asked = choose_comm("nccl", "cuda", 4, 2, true);
  try {
    settle_comm("nccl", asked, 2, 8);
    ADD_FAILURE();
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("6 of 8 ranks cannot use NCCL (this one: 4 ranks on this host share 2 GPUs"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(settle_comm("nccl", choose_comm("nccl", "cuda", 2, 2, true), 7, 8), UserError);
  EXPECT_EQ(settle_comm("gloo", choose_comm("gloo", "cuda", 2, 2, true), 0, 8).kind, CommKind::gloo);
}

}  // namespace
}  // namespace gp::runtime::detail
