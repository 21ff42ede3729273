// How much memory this machine (or its container) gives a process: the guard that turns a request
// for terabytes (an absurd --batch, a model with 2^40-wide layers) into a clear error instead of an
// allocation failure or the OOM killer.
#pragma once
#include <string>

namespace gp {

/// Physical memory in bytes, capped by the cgroup limit (v2 memory.max, v1 limit_in_bytes) when
/// one is set.
double machine_memory_bytes();

/// UserError "WHAT needs about X GB (DETAIL) but this machine has Y GB of memory" when
/// `bytes` exceeds machine_memory_bytes().
void check_fits_in_memory(double bytes, const std::string& what, const std::string& detail);

}  // namespace gp
