// The schedule kinds (issue 39 item 3): one table read by every --help text, by the validation of
// plan and schedule files and by schedule::build_schedule's dispatch. Here in plan/ (below
// schedule/ in the layering) because a plan records the schedule it was made for.
#pragma once
#include <array>
#include <optional>
#include <string>
#include <string_view>

namespace gp::plan {

enum class ScheduleKind { one_f_one_b, gpipe, zb };

struct ScheduleKindInfo {
  ScheduleKind kind;
  const char* name;  // as in files and on the command line
  const char* help;  // one line
};

/// Every kind, in the order help texts list them.
inline constexpr std::array<ScheduleKindInfo, 3> kScheduleKinds = {{
    {ScheduleKind::one_f_one_b, "1f1b",
     "1F1B: in_flight warm-up forwards, then one backward and one forward, then drain"},
    {ScheduleKind::gpipe, "gpipe", "GPipe: every forward, then every backward"},
    {ScheduleKind::zb, "zb",
     "zero-bubble ZB-H1 on the stage DAG: backward split into B (input gradients) and W (weight "
     "gradients), W deferred into 1F1B's bubbles under the same activation bound"},
}};

/// The kind named `name`, or nullopt.
inline std::optional<ScheduleKind> find_schedule_kind(std::string_view name) {
  for (const ScheduleKindInfo& k : kScheduleKinds)
    if (name == k.name) return k.kind;
  return std::nullopt;
}

inline const char* schedule_kind_name(ScheduleKind kind) {
  for (const ScheduleKindInfo& k : kScheduleKinds)
    if (k.kind == kind) return k.name;
  return "?";
}

/// The names joined by `sep`: "1f1b, gpipe, zb" (error messages), "1f1b | gpipe | zb" (help).
inline std::string schedule_kind_names(std::string_view sep = ", ") {
  std::string out;
  for (const ScheduleKindInfo& k : kScheduleKinds) {
    if (!out.empty()) out += sep;
    out += k.name;
  }
  return out;
}

/// An option's help text: "<what>: 1f1b | gpipe | zb" and one line per kind.
inline std::string schedule_kind_help(std::string_view what) {
  std::string out = std::string(what) + ": " + schedule_kind_names(" | ");
  for (const ScheduleKindInfo& k : kScheduleKinds) out += std::string("\n  ") + k.name + ": " + k.help;
  return out;
}

}  // namespace gp::plan
