#include "schedule/trace.h"

#include <utility>

namespace gp::schedule {

const char* trace_category(ActionKind k) {
  switch (k) {
    case ActionKind::forward: return "forward";
    case ActionKind::backward: return "backward";
    case ActionKind::backward_input: return "backward_input";
    case ActionKind::backward_weight: return "backward_weight";
    case ActionKind::send_act:
    case ActionKind::send_grad: return "send";
    case ActionKind::recv_act:
    case ActionKind::recv_grad: return "recv";
    case ActionKind::allreduce: return "allreduce";
    case ActionKind::optimizer_step: return "optimizer";
  }
  return "other";
}

const char* trace_colour(const std::string& category) {
  // Chrome's reserved colour names (chrome://tracing honours "cname"; Perfetto colours slices by
  // name, and "F", "B", "BI" and "W" slices have distinct names).
  if (category == "forward") return "good";
  if (category == "backward") return "bad";
  if (category == "backward_input") return "rail_load";
  if (category == "backward_weight") return "olive";
  return nullptr;
}

void TraceWriter::add_device(int device, int stage) {
  const std::string name = stage >= 0 ? fmt::format("device {}: stage {}", device, stage)
                                      : fmt::format("device {}", device);
  auto meta = [&](const char* what, int tid, Json args) {
    events_.push_back({{"ph", "M"}, {"name", what}, {"pid", device}, {"tid", tid}, {"args", std::move(args)}});
  };
  meta("process_name", 0, {{"name", name}});
  meta("process_sort_index", 0, {{"sort_index", device}});
  meta("thread_name", kComputeTrack, {{"name", "compute"}});
  meta("thread_name", kSendTrack, {{"name", "send"}});
}

void TraceWriter::add_slice(int device, int track, const std::string& name, const std::string& category, double start_s,
                            double end_s, Json args) {
  Json e = {{"ph", "X"},
            {"name", name},
            {"pid", device},
            {"tid", track},
            {"ts", start_s * 1e6},
            {"dur", (end_s - start_s) * 1e6},
            {"args", std::move(args)}};
  if (!category.empty()) e["cat"] = category;
  if (const char* colour = trace_colour(category)) e["cname"] = colour;
  events_.push_back(std::move(e));
}

void TraceWriter::add_counter(int device, const std::string& name, double t_s, Json values) {
  events_.push_back(
      {{"ph", "C"}, {"name", name}, {"pid", device}, {"tid", 0}, {"ts", t_s * 1e6}, {"args", std::move(values)}});
}

Json TraceWriter::finish(Json other_data) && {
  other_data["format"] = kTraceFormat;
  return {{"traceEvents", std::move(events_)}, {"displayTimeUnit", "ms"}, {"otherData", std::move(other_data)}};
}

}  // namespace gp::schedule
