#include "runtime/base/fault.h"

#include <cstdlib>

#include "support/error.h"

namespace gp::runtime {
namespace {

int fault_int(const char* name, const char* v) {
  char* end = nullptr;
  long x = std::strtol(v, &end, 10);
  GP_CHECK(end && *end == '\0' && x >= 0 && x < (1L << 30), "environment: {}={} is not a valid number", name, v);
  return static_cast<int>(x);
}

}  // namespace

std::optional<FaultSpec> parse_fault(const std::string& spec) {
  if (spec.empty()) return std::nullopt;
  FaultSpec f;
  size_t pos = 0;
  while (pos <= spec.size()) {
    size_t comma = spec.find(',', pos);
    std::string kv = spec.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    size_t eq = kv.find('=');
    GP_CHECK(eq != std::string::npos, "GP_FAULT: expected key=value, found '{}'", kv);
    std::string k = kv.substr(0, eq), v = kv.substr(eq + 1);
    if (k == "rank") f.rank = fault_int("GP_FAULT rank", v.c_str());
    else if (k == "action") f.action = fault_int("GP_FAULT action", v.c_str());
    else if (k == "step") f.step = fault_int("GP_FAULT step", v.c_str());
    else if (k == "kind") f.kind = v;
    else GP_CHECK(false, "GP_FAULT: unknown key '{}' (valid: rank, action, step, kind)", k);
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  GP_CHECK(f.kind == "crash" || f.kind == "hang" || f.kind == "error" || f.kind == "size" || f.kind == "nan" ||
               f.kind == "enospc",
           "GP_FAULT: kind '{}' is not one of crash, hang, error, size, nan, enospc", f.kind);
  GP_CHECK(f.rank >= 0 && (f.action >= 0 || f.kind == "enospc"),
           "GP_FAULT: needs rank= and action= (kind=enospc: rank= and step=)");
  return f;
}

}  // namespace gp::runtime
