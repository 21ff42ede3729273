// Torch-free: the CPUs this process may run on, and pinning the whole process to one of them. A
// worker on a host where every core has a worker pins itself to its own core (pipeline.cpp,
// `train --pin-cores`): Gloo's threads then wake on their worker's core, which is idle while the
// worker waits for them, and not on a core where another worker computes (issue 35).
#pragma once
#include <string>
#include <vector>

namespace gp::runtime {

/// The CPUs this thread may run on (sched_getaffinity: taskset, cgroups), ascending; never empty
/// (the online CPU count's first CPUs if the call fails).
std::vector<int> usable_cpus();

/// Restricts every thread of this process (and the threads it starts later) to `cpu`. Returns "" on
/// success, else why not (a thread that exited while it ran is not a failure).
std::string pin_process_to_cpu(int cpu);

}  // namespace gp::runtime
