#include "support/memory.h"

#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <string>

#include "support/error.h"

namespace gp {
namespace {

double cgroup_limit(const char* file) {
  std::ifstream f(file);
  std::string v;
  if (!(f >> v) || v.empty() || v == "max") return 0;
  try {
    return std::stod(v);
  } catch (const std::exception&) {
    return 0;
  }
}

}  // namespace

double machine_memory_bytes() {
  double phys = static_cast<double>(::sysconf(_SC_PHYS_PAGES)) * static_cast<double>(::sysconf(_SC_PAGE_SIZE));
  for (const char* f : {"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"})
    if (double lim = cgroup_limit(f); lim > 0) phys = std::min(phys, lim);
  return phys;
}

void check_fits_in_memory(double bytes, const std::string& what, const std::string& detail) {
  double have = machine_memory_bytes();
  GP_CHECK(!(bytes > have), "{} needs about {:.3g} GB ({}) but this machine has {:.3g} GB of memory", what, bytes / 1e9,
           detail, have / 1e9);
}

}  // namespace gp
