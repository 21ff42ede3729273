// Measuring the links between local worker processes for `graphpipe profile --links`: point-to-point
// (ping-pong) and 2-rank all-reduce over c10d Gloo between two spawned processes. Torch-free.
#pragma once
#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

namespace gp::runtime {

struct LinkBenchOptions {
  std::vector<int64_t> sizes_bytes{4096, 65536, 262144, 1 << 20, 4 << 20, 16 << 20};  // multiples of 4
  int warmup = 2;
  int repeats = 7;             // per size; the median is kept
  int lockstep_rounds = 1000;  // rounds of the lockstep measurement, ~10 ms each (0: skip it)
  double timeout_s = 60;       // a worker that does not answer within this fails the measurement
  /// Instead of ping-pong and all-reduce: what a message and an all-reduce cost a step in which both
  /// ranks compute (their threads wait for a core): rounds of ~2 ms of GEMMs on both ranks, in turn
  /// without communicating, with a message each way, and followed by an all-reduce; p2p_s and
  /// allreduce_s are the mean extra times of a round with them. Then hand-off rounds, as two pipeline
  /// stages pass a micro-batch: one rank computes and sends while the other waits in its receive,
  /// then the other way round; send_cpu_s and recv_cpu_s are what the messages cost in CPU time.
  bool busy = false;
};

/// One measured message size: one-way p2p time (half the median round trip) and the median 2-rank
/// all-reduce time (what a training step meets; the prediction is of the median iteration).
struct LinkSample {
  int64_t bytes = 0;
  double p2p_s = 0;
  double allreduce_s = 0;
  double p2p_fastest_s = 0;        // the fastest repeats: the fallback when the medians do not grow
  double allreduce_fastest_s = 0;  // with the size (a burst of other jobs at the small sizes)
  // LinkBenchOptions::busy only, from the hand-off rounds (0 otherwise): the CPU time a message costs
  // its sender's thread in send() (packing included), and the rest of the CPU time the process spent
  // on sending and receiving it (Gloo's threads, the wait): medians over the rounds.
  double send_cpu_s = 0;
  double recv_cpu_s = 0;
};

struct LinkBenchResult {
  std::vector<LinkSample> samples;  // in the order of LinkBenchOptions::sizes_bytes
  /// Two cores computing in lockstep: the mean of the slower core's time per round over the mean of
  /// both cores' (>= 1); 0 when not measured.
  double lockstep_factor = 0;
};

/// Spawns two hidden `graphpipe link-worker` processes (posix_spawn of this executable, a TCPStore
/// rendezvous on 127.0.0.1) and returns their measurements. Writes one progress line per size to
/// `progress` when not null. RuntimeFailure when a worker fails.
LinkBenchResult run_link_bench(const LinkBenchOptions& o, std::ostream* progress);

/// The hidden subcommand's body: rank and store address from the environment the launcher sets.
int run_link_worker(const LinkBenchOptions& o);

/// The arguments of `graphpipe link-worker` that reproduce `o` (without program and subcommand).
std::vector<std::string> link_worker_args(const LinkBenchOptions& o);

}  // namespace gp::runtime
