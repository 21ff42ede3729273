// `graphpipe profile --links`: two local processes (spawned like pipeline workers) measure
// point-to-point ping-pong and 2-rank all-reduce over c10d Gloo for several message sizes.
#include "runtime/launch/link_bench.h"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <numeric>
#include <thread>

#include "runtime/base/cpu_affinity.h"
#include "runtime/comm/comm.h"
#include "runtime/launch/launcher.h"
#include "runtime/exec/device.h"
#include "runtime/exec/op_timing.h"
#include "support/error.h"
#include "support/json.h"

namespace gp::runtime {
namespace {

const char* kResultKey = "gp/links/result";

// The median repeat: what a training step meets, and the prediction is of the median iteration.
// The fastest repeat (kept until 2026-12-01) was the uncontended cost, 2-3x below the median for a
// 3 MiB all-reduce on the 2-core VM (1.7 vs 5.2 ms): data-parallel plans were predicted that much
// short on every step. A size slower than a larger one (a burst of other jobs) is capped by the
// fit's caller (profiler::profile_links).
double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

int env_int(const char* name) {
  const char* v = std::getenv(name);
  GP_CHECK(v && *v, "link-worker: {} is not set (this subcommand is started by `graphpipe profile --links`)", name);
  return std::atoi(v);
}

double mean(const std::vector<double>& v) { return std::accumulate(v.begin(), v.end(), 0.0) / v.size(); }

/// LinkBenchOptions::busy: both ranks compute ~2 ms of GEMMs per round, in turn without communicating,
/// with a message of `bytes` each way (its receive and its send posted before computing, the receive
/// awaited after it: two pipeline stages exchanging micro-batches while both compute, their receives
/// posted ahead as StageRunner posts them; until calibration method 4 the receive was posted after
/// computing, which costs Gloo's rendezvous a round trip more), and followed by an all-reduce of `bytes` (the
/// end of a data-parallel step). The mean extra time of a round with the message (first) and with
/// the all-reduce (second) over the rounds without: what each costs a step in which every core
/// computes (their threads wait for a core; what they copy is taken from the computation).
std::pair<double, double> exchange_while_computing(detail::Communicator& c, detail::Communicator& reduce, int64_t bytes,
                                                   const LinkBenchOptions& o, int* tag) {
  auto out = torch::zeros({bytes / 4}, torch::kFloat32);
  auto a = torch::randn({128, 256}), b = torch::randn({256, 256}), prod = torch::empty({128, 256});
  auto compute = [&] {
    for (int k = 0; k < 12; ++k) torch::mm_out(prod, a, b);
  };
  const int peer = 1 - c.rank();
  std::vector<double> with, without, reduced;
  for (int i = 0; i < o.warmup + o.repeats; ++i) {
    const bool keep = i >= o.warmup;
    std::vector<torch::Tensor> sync{torch::zeros({1})};  // start each round together
    c.all_reduce(sync, detail::Reduce::sum).wait();
    auto t0 = std::chrono::steady_clock::now();
    compute();
    if (keep) without.push_back(seconds_since(t0));
    c.all_reduce(sync, detail::Reduce::sum).wait();
    const int t = (*tag)++;
    t0 = std::chrono::steady_clock::now();
    detail::PostedRecv posted = c.post_recv(out.sizes(), out.options(), peer, t);  // as StageRunner::post_ahead
    auto sent = c.send(out, peer, t);
    compute();
    posted.wait();
    sent.wait();
    if (keep) with.push_back(seconds_since(t0));
    c.all_reduce(sync, detail::Reduce::sum).wait();
    t0 = std::chrono::steady_clock::now();
    compute();
    std::vector<torch::Tensor> v{out};
    reduce.all_reduce(v, detail::Reduce::sum).wait();
    if (keep) reduced.push_back(seconds_since(t0));
  }
  return {std::max(0.0, mean(with) - mean(without)), std::max(0.0, mean(reduced) - mean(without))};
}

/// LinkBenchOptions::busy, after exchange_while_computing: a chain of rounds in which rank 0 runs a small
/// training step (forward and backward of 16 residual blocks, ~1 ms) and sends a message of `bytes`
/// while rank 1 waits in its receive (posted ahead), then rank 1 does the same while rank 0 waits: two
/// pipeline stages handing a micro-batch to each other, each step right after a receive. The message
/// is packed as StageRunner packs one (a new buffer, a copy) before send(). Per round each rank sends
/// one message and receives one; returns the medians over the rounds of the CPU time of the sender's
/// thread from the packing to send()'s return, and of the rest of the process's CPU time in the round
/// beyond the same step run back to back (receiving, Gloo's threads writing and reading, waking, and
/// the step's own slowdown after them: its code and data out of the caches). Between real steps a
/// message costs about three times what it costs between GEMM loops (2-core VM, issue 35: 1 KB,
/// 90 us sending + 115 us more against 31 + 54; a 2-stage pipeline's send_grad of 1 KB held its thread
/// 85-105 us); counting the step's slowdown (calibration method 10) the rest went from 104 to 210 us
/// (2026-12-05), where a pipeline's stage computed 55 us more per micro-batch than the same ops alone
/// in one process and lost 145 us more to Gloo's threads on its core (`train --trace`, thread_cpu_us).
std::pair<double, double> hand_off(detail::Communicator& c, int64_t bytes, const LinkBenchOptions& o, int* tag) {
  auto out = torch::zeros({bytes / 4}, torch::kFloat32);
  // A small training step: 16 residual blocks (linear, gelu, layer norm) forward and backward.
  std::vector<torch::Tensor> weights;
  for (int k = 0; k < 16; ++k) weights.push_back(torch::randn({64, 64}).mul_(0.1).requires_grad_());
  auto x = torch::randn({32, 64});
  auto step = [&] {
    torch::Tensor h = x;
    for (const torch::Tensor& w : weights) h = torch::layer_norm(h + torch::gelu(torch::mm(h, w)), {64});
    h.sum().backward();
  };
  const int peer = 1 - c.rank();
  // The step back to back, no message between: what it costs with its code and data in the caches.
  std::vector<double> alone;
  for (int i = 0; i < o.warmup + o.repeats; ++i) {
    const double c0 = detail::cpu_time_s();
    step();
    if (i >= o.warmup) alone.push_back(detail::cpu_time_s() - c0);
  }
  const double warm = median(alone);
  std::vector<double> sends, rest;
  std::vector<torch::Tensor> sync{torch::zeros({1})};
  c.all_reduce(sync, detail::Reduce::sum).wait();  // start together; then a chain of hand-offs
  for (int i = 0; i < o.warmup + o.repeats; ++i) {
    const int t = (*tag)++;
    detail::PostedRecv posted = c.post_recv(out.sizes(), out.options(), peer, t);
    const double p0 = detail::cpu_time_s(/*process=*/true);
    double send = 0;
    auto turn = [&] {
      step();
      const double c1 = detail::cpu_time_s();
      torch::Tensor packed = torch::empty_like(out);
      packed.copy_(out);
      detail::Pending sent = c.send(packed, peer, t);
      send += detail::cpu_time_s() - c1;
      return sent;
    };
    detail::Pending sent;
    if (c.rank() == 0) {
      sent = turn();
      posted.wait();
    } else {
      posted.wait();
      sent = turn();
    }
    sent.wait();
    const double p1 = detail::cpu_time_s(/*process=*/true);
    if (i >= o.warmup) {
      sends.push_back(send);
      rest.push_back(std::max(0.0, p1 - p0 - warm - send));
    }
  }
  return {median(sends), median(rest)};
}

/// One size: ping-pong (rank 0 sends, rank 1 echoes) and all-reduce, `warmup` + `repeats` times;
/// with LinkBenchOptions::busy, exchange_while_computing instead.
LinkSample measure(detail::Communicator& c, detail::Communicator& reduce, int64_t bytes, const LinkBenchOptions& o,
                   int* tag) {
  if (o.busy) {  // the costs to a busy step only
    const auto [p2p, ar] = exchange_while_computing(c, reduce, bytes, o, tag);
    const auto [send_cpu, recv_cpu] = hand_off(c, bytes, o, tag);
    return {bytes, p2p, ar, p2p, ar, send_cpu, recv_cpu};
  }
  auto buf = torch::zeros({bytes / 4}, torch::kFloat32);
  std::vector<double> rtt, ar;
  for (int i = 0; i < o.warmup + o.repeats; ++i) {
    bool keep = i >= o.warmup;
    int t = (*tag)++;
    auto t0 = std::chrono::steady_clock::now();
    if (c.rank() == 0) {
      c.send(buf, 1, t).wait();
      c.recv(buf, 1, t);
    } else {
      c.recv(buf, 0, t);
      c.send(buf, 0, t).wait();
    }
    if (keep) rtt.push_back(seconds_since(t0));
    std::vector<torch::Tensor> sync{torch::zeros({1})};  // start the all-reduce together
    c.all_reduce(sync, detail::Reduce::sum).wait();
    std::vector<torch::Tensor> v{buf};
    t0 = std::chrono::steady_clock::now();
    reduce.all_reduce(v, detail::Reduce::sum).wait();
    if (keep) ar.push_back(seconds_since(t0));
  }
  return {bytes, median(rtt) / 2, median(ar), *std::min_element(rtt.begin(), rtt.end()) / 2,
          *std::min_element(ar.begin(), ar.end())};
}

/// Both ranks run the same GEMMs (~10 ms a round on one core), each round started together (a
/// 1-element all-reduce), and time their own rounds; rank 0 gets rank 1's times and returns the
/// lockstep factor: mean over rounds of the slower rank's time / mean of all rounds' times. A
/// data-parallel pair (or any two stages handing micro-batches to each other) waits for the slower
/// core every step; on a VM whose cores slow down independently for seconds at a time (another
/// tenant on the host core) that is slower than one core alone. Means, not medians: a long run pays
/// every slow round in proportion, and the mean of the slower is never below the mean of all.
/// Rank 1 returns 0.
double lockstep_factor(detail::Communicator& c, int rounds, int* tag) {
  torch::manual_seed(0);
  auto a = torch::randn({256, 512}), b = torch::randn({512, 512}), out = torch::empty({256, 512});
  std::vector<double> mine;
  for (int i = 0; i < rounds + 2; ++i) {
    std::vector<torch::Tensor> sync{torch::zeros({1})};
    c.all_reduce(sync, detail::Reduce::sum).wait();
    auto t0 = std::chrono::steady_clock::now();
    for (int k = 0; k < 4; ++k) torch::mm_out(out, a, b);
    if (i >= 2) mine.push_back(seconds_since(t0));  // two rounds of warm-up
  }
  auto t = torch::tensor(mine, torch::kFloat64);
  const int t_tag = (*tag)++;
  if (c.rank() == 1) {
    c.send(t, 0, t_tag).wait();
    return 0;
  }
  auto theirs = torch::empty_like(t);
  c.recv(theirs, 1, t_tag);
  std::vector<double> slower, all = mine;
  for (int i = 0; i < rounds; ++i) {
    slower.push_back(std::max(mine[i], theirs[i].item<double>()));
    all.push_back(theirs[i].item<double>());
  }
  return mean(slower) / mean(all);
}

}  // namespace

std::vector<std::string> link_worker_args(const LinkBenchOptions& o) {
  std::string sizes;
  for (int64_t s : o.sizes_bytes) sizes += fmt::format("{}{}", sizes.empty() ? "" : ",", s);
  return {"--sizes",
          sizes,
          "--warmup",
          std::to_string(o.warmup),
          "--repeats",
          std::to_string(o.repeats),
          "--lockstep-rounds",
          std::to_string(o.lockstep_rounds),
          "--timeout",
          fmt::format("{}", o.timeout_s),
          "--busy",
          o.busy ? "1" : "0"};
}

int run_link_worker(const LinkBenchOptions& o) {
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // die with the launcher
  int rank = env_int("RANK"), port = env_int("MASTER_PORT");
  set_torch_threads(1);
  // Between computing cores (busy), as `train --pin-cores auto` places two workers on a host of at most
  // 2 usable cores: one core each, with their Gloo threads (started below). Idle, unpinned: the link
  // of workers with a spare core, whom training does not pin.
  if (const std::vector<int> cpus = usable_cpus(); o.busy && cpus.size() <= 2) {
    const std::string why = pin_process_to_cpu(cpus[static_cast<size_t>(rank) % cpus.size()]);
    if (!why.empty()) std::fprintf(stderr, "[links] rank %d: not pinned to a core (%s)\n", rank, why.c_str());
  }
  c10d::TCPStoreOptions so;
  so.port = static_cast<uint16_t>(port);
  so.isServer = false;
  so.timeout = std::chrono::milliseconds(static_cast<int64_t>(o.timeout_s * 1000));
  auto store = c10::make_intrusive<c10d::TCPStore>("127.0.0.1", so);
  detail::CommOptions co;
  co.timeout = so.timeout;
  // The all-reduce measured as training runs it (through shared memory); the messages and the
  // rounds' 1-element starts over Gloo alone: after a shared-memory start, a message between
  // computing cores measured 3.2-4.4 ms where it took 0.5-0.65 after a Gloo one (the gradient
  // all-reduce of a training step is followed by its optimizer step, not by a message).
  auto reduce = detail::make_gloo_communicator(c10::make_intrusive<c10d::PrefixStore>("reduce", store), rank, 2, co);
  co.shm_all_reduce = false;
  auto comm = detail::make_gloo_communicator(store, rank, 2, co);
  Json out = Json::array();
  int tag = 0;
  for (int64_t bytes : o.sizes_bytes) {
    LinkSample s = measure(*comm, *reduce, bytes, o, &tag);
    if (rank == 0) {
      if (o.busy)
        std::fprintf(stderr,
                     "[links] %lld bytes between computing cores: p2p %.3f ms, all-reduce %.3f ms more per round; "
                     "handed off, a message's CPU time %.1f us sending + %.1f us more\n",
                     static_cast<long long>(bytes), s.p2p_s * 1e3, s.allreduce_s * 1e3, s.send_cpu_s * 1e6,
                     s.recv_cpu_s * 1e6);
      else
        std::fprintf(stderr, "[links] %lld bytes: p2p %.3f ms, all-reduce %.3f ms\n", static_cast<long long>(bytes),
                     s.p2p_s * 1e3, s.allreduce_s * 1e3);
      out.push_back(
          {s.bytes, s.p2p_s, s.allreduce_s, s.p2p_fastest_s, s.allreduce_fastest_s, s.send_cpu_s, s.recv_cpu_s});
    }
  }
  double lockstep = o.lockstep_rounds > 0 ? lockstep_factor(*comm, o.lockstep_rounds, &tag) : 0;
  if (rank == 0) {
    if (lockstep > 0)
      std::fprintf(stderr,
                   "[links] lockstep: %d rounds of GEMMs on both cores, the slower "
                   "one's mean / one core's: %.3f\n",
                   o.lockstep_rounds, lockstep);
    std::string text = Json{{"sizes", out}, {"lockstep", lockstep}}.dump();
    store->set(kResultKey, std::vector<uint8_t>(text.begin(), text.end()));
  }
  std::vector<torch::Tensor> done{torch::zeros({1})};
  comm->all_reduce(done, detail::Reduce::sum).wait();
  return 0;
}

LinkBenchResult run_link_bench(const LinkBenchOptions& o, std::ostream* progress) {
  GP_CHECK(!o.sizes_bytes.empty(), "--link-sizes: need at least one message size");
  for (int64_t s : o.sizes_bytes)
    GP_CHECK(s >= 4 && s % 4 == 0, "--link-sizes: {} is not a positive multiple of 4 bytes", s);
  GP_CHECK(o.repeats >= 1 && o.warmup >= 0, "--repeats must be >= 1 and --warmup >= 0");
  c10d::TCPStoreOptions so;
  so.port = 0;
  so.isServer = true;
  so.waitWorkers = false;
  so.timeout = std::chrono::milliseconds(static_cast<int64_t>(o.timeout_s * 1000));
  auto store = c10::make_intrusive<c10d::TCPStore>("127.0.0.1", so);
  namespace fs = std::filesystem;
  fs::path dir = fs::temp_directory_path() / fmt::format("graphpipe-links-{}-{}", ::getpid(), store->getPort());
  fs::create_directories(dir);
  if (progress)
    *progress << fmt::format(
                     "[links] measuring p2p and all-reduce over c10d Gloo between 2 local processes, "
                     "{} sizes\n",
                     o.sizes_bytes.size())
              << std::flush;
  std::vector<std::string> args = {"link-worker"};
  for (auto& a : link_worker_args(o)) args.push_back(a);
  std::vector<int> pids = spawn_local_workers(args, 2, store->getPort(), dir.string());
  // Wait for both; a failing or overdue worker takes the other down.
  auto deadline = std::chrono::steady_clock::now() +
                  std::chrono::milliseconds(static_cast<int64_t>(o.timeout_s * 1000 * 2));
  std::string failure;
  int alive = 2;
  while (alive > 0) {
    int st = 0;
    pid_t pid = ::waitpid(-pids[0], &st, WNOHANG);
    if (pid > 0) {
      --alive;
      int rank = pid == pids[0] ? 0 : 1;
      if (WIFSIGNALED(st)) failure = fmt::format("link worker {} was killed by signal {}", rank, WTERMSIG(st));
      else if (WEXITSTATUS(st) != 0) failure = fmt::format("link worker {} exited with code {}", rank, WEXITSTATUS(st));
      if (!failure.empty()) break;
      continue;
    }
    if (pid < 0 && errno != EINTR) break;
    if (std::chrono::steady_clock::now() > deadline) {
      failure = fmt::format("link workers did not finish within {} s", o.timeout_s * 2);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (alive > 0 && !failure.empty()) {
    ::kill(-pids[0], SIGKILL);
    while (::waitpid(-pids[0], nullptr, 0) > 0) {
    }
  }
  std::error_code ec;
  fs::remove_all(dir, ec);
  if (!failure.empty()) throw RuntimeFailure("profile --links: " + failure);
  auto raw = store->get(kResultKey);
  Json j = Json::parse(std::string(raw.begin(), raw.end()));
  LinkBenchResult out;
  for (const auto& e : j["sizes"])
    out.samples.push_back({e[0].get<int64_t>(), e[1].get<double>(), e[2].get<double>(), e[3].get<double>(),
                           e[4].get<double>(), e[5].get<double>(), e[6].get<double>()});
  GP_ASSERT(out.samples.size() == o.sizes_bytes.size(), "link bench returned {} of {} sizes", out.samples.size(),
            o.sizes_bytes.size());
  out.lockstep_factor = j["lockstep"].get<double>();
  return out;
}

}  // namespace gp::runtime
