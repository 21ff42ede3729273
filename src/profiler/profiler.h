// `graphpipe profile`: measures the forward/backward time of every distinct op signature of a model
// with LibTorch on this machine and returns a graphpipe.profile/1 Profile for the cost model.
#pragma once
#include <cstdint>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "cost/profile.h"
#include "ir/model.h"

namespace gp::profiler {

struct ProfileOptions {
  std::vector<int64_t> batches{1, 2, 4, 8};  // per-device batch sizes (made ascending and unique)
  int warmup = 2;
  int repeats = 5;             // the median of these is recorded
  int threads = 1;             // LibTorch intra-op threads
  bool cpu_clock = false;      // the thread's CPU time instead of wall time (runtime::time_op)
  std::string device = "cpu";  // --device cpu|cuda (runtime::time_op)
  bool context = true;         // also time the whole model in sequence and the optimizer step (profile_context)
};

/// Timed calls of the whole model per batch in profile_context (after one untimed): at most this
/// many of `repeats`, since the whole model costs as much as all its ops, not one per signature.
constexpr int kContextRepeats = 5;

/// A short description of one op for progress lines: "linear [B, 64, 256] -> [B, 64, 1024]".
std::string describe_op(const ir::Graph& g, OpId op);

/// "cpu: <model name from /proc/cpuinfo> (N thread(s))"; with `device` "cuda",
/// "cuda: <GPU model> (device 0, LibTorch V)".
std::string describe_device(int threads, const std::string& device = "cpu");

/// Profiles each distinct cost::op_signature once (the first op with it), at every batch size.
/// Writes "[k/n] <op> b=<b> fwd .. bwd .." progress lines to `progress` when it is not null.
cost::Profile profile_graph(const ir::Graph& g, const ProfileOptions& opt, std::ostream* progress);

/// Sets p.context (the whole model at every batch of opt.batches, which must be ascending and
/// unique as profile_graph leaves them, forward and backward, against the sum of its ops' times in
/// `p`, which must hold every op's signature at those batches) and p.optimizer (one SGD and one Adam
/// step over every parameter). "[model]" and "[optimizer]" progress lines.
void profile_context(const ir::Graph& g, const ProfileOptions& opt, cost::Profile& p, std::ostream* progress);

/// Least-squares fit of seconds = latency + bytes / bandwidth over (bytes, seconds) points, on
/// relative error (weights 1/seconds^2), so small messages fix the latency. When
/// the intercept comes out negative (noise at small sizes) the line is refitted through the origin
/// (latency 0). UserError naming `what` when there are fewer than two sizes or the slope is not
/// positive (time does not grow with size: the measurement is useless).
cost::LinkFit fit_link(const std::vector<std::pair<double, double>>& bytes_seconds, const std::string& what);

/// Sorts (bytes, seconds) by size and caps each size's time at the next larger size's: a smaller
/// message is never slower, so a size whose median met a burst of other jobs takes the larger one's.
void cap_by_larger_sizes(std::vector<std::pair<double, double>>& bytes_seconds);

/// The link fit `profile --links` stores: fit_link of the per-size medians (what a training step
/// meets), each capped by the larger sizes; when even those do not grow with the size (other jobs
/// hit every small size), of the fastest repeats, which interference cannot raise, with a note.
cost::LinkFit fit_link_medians(std::vector<std::pair<double, double>> medians,
                               std::vector<std::pair<double, double>> fastest, const std::string& what,
                               std::ostream* progress);

struct LinkOptions {
  std::vector<int64_t> sizes_bytes{4096, 65536, 262144, 1 << 20, 4 << 20, 16 << 20};
  int warmup = 2;
  int repeats = 7;
  double timeout_s = 60;
};

/// Measures p2p and 2-rank all-reduce over c10d Gloo between two spawned local processes (the
/// executable's hidden `link-worker` subcommand) and sets p.p2p and p.allreduce to the fits.
/// Progress lines go to `progress` (and the workers' own lines to stderr).
void profile_links(cost::Profile& p, const LinkOptions& o, std::ostream* progress);

/// Parses "1,2,4,8" (positive integers); UserError naming `flag` otherwise.
std::vector<int64_t> parse_batches(const std::string& text, const std::string& flag);

}  // namespace gp::profiler
