// `graphpipe profile`: measures the forward/backward time of every distinct op signature of a model
// with LibTorch on this machine and returns a graphpipe.profile/1 Profile for the cost model.
#pragma once
#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "cost/profile.h"
#include "ir/model.h"

namespace gp::profiler {

struct ProfileOptions {
  std::vector<int64_t> batches{1, 2, 4, 8};  // per-device batch sizes (made ascending and unique)
  int warmup = 2;
  int repeats = 5;  // the median of these is recorded
  int threads = 1;  // LibTorch intra-op threads
};

/// A short description of one op for progress lines: "linear [B, 64, 256] -> [B, 64, 1024]".
std::string describe_op(const ir::Graph& g, OpId op);

/// "cpu: <model name from /proc/cpuinfo> (N thread(s))".
std::string describe_device(int threads);

/// Profiles each distinct cost::op_signature once (the first op with it), at every batch size.
/// Writes "[k/n] <op> b=<b> fwd .. bwd .." progress lines to `progress` when it is not null.
cost::Profile profile_graph(const ir::Graph& g, const ProfileOptions& opt, std::ostream* progress);

/// Parses "1,2,4,8" (positive integers); UserError naming `flag` otherwise.
std::vector<int64_t> parse_batches(const std::string& text, const std::string& flag);

}  // namespace gp::profiler
