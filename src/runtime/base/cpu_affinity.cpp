#include "runtime/base/cpu_affinity.h"

#include <sched.h>
#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <thread>

#include <fmt/format.h>

namespace gp::runtime {

std::vector<int> usable_cpus() {
  std::vector<int> cpus;
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof(set), &set) == 0)
    for (int c = 0; c < CPU_SETSIZE; ++c)
      if (CPU_ISSET(c, &set)) cpus.push_back(c);
  if (cpus.empty())
    for (unsigned c = 0; c < std::max(1u, std::thread::hardware_concurrency()); ++c)
      cpus.push_back(static_cast<int>(c));
  return cpus;
}

std::string pin_process_to_cpu(int cpu) {
  if (cpu < 0 || cpu >= CPU_SETSIZE) return fmt::format("CPU {} is out of range", cpu);
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  // This thread first: threads it starts from now on inherit its mask.
  if (::sched_setaffinity(0, sizeof(set), &set) != 0) return fmt::format("CPU {}: {}", cpu, std::strerror(errno));
  std::error_code ec;
  for (const auto& task : std::filesystem::directory_iterator("/proc/self/task", ec)) {
    const pid_t tid = static_cast<pid_t>(std::atoi(task.path().filename().c_str()));
    if (tid > 0 && ::sched_setaffinity(tid, sizeof(set), &set) != 0 && errno != ESRCH)
      return fmt::format("CPU {}, thread {}: {}", cpu, tid, std::strerror(errno));
  }
  return ec ? fmt::format("/proc/self/task: {}", ec.message()) : std::string();
}

}  // namespace gp::runtime
