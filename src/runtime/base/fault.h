// Fault injection for tests (GP_FAULT), read by the launch layer (worker, --single) and by the
// checkpoint layer (kind=enospc). Torch-free.
#pragma once
#include <optional>
#include <string>

namespace gp::runtime {

/// Parsed GP_FAULT ("rank=1,action=5,kind=crash|hang|error|size|nan[,step=0]"): fault injection for
/// tests. Before action `action` (index in the rank's stage schedule) of step `step`, rank `rank`
/// crashes (SIGKILL), hangs, throws, (size, a send action only) sends one element too many, or
/// (nan) puts a NaN into its first parameter gradient. "rank=R,kind=enospc,step=S" (no action):
/// the checkpoint save after step S of rank R (0 for --single) fails with ENOSPC after 4 KiB.
struct FaultSpec {
  int rank = -1, action = -1;
  long step = 0;
  std::string kind;
};
std::optional<FaultSpec> parse_fault(const std::string& spec);

}  // namespace gp::runtime
