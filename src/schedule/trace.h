// Chrome/Perfetto trace-event JSON (graphpipe.trace/1): the one writer of the simulator's traces
// and (see docs/schedule.md) the runtime's measured ones, so both draw the same tracks.
#pragma once
#include <string>

#include "schedule/schedule.h"
#include "support/json.h"

namespace gp::schedule {

inline constexpr const char* kTraceFormat = "graphpipe.trace/1";
/// A device's two tracks: compute (forward, backward, all-reduce, optimizer, receives) and sends,
/// which run beside compute.
inline constexpr int kComputeTrack = 0;
inline constexpr int kSendTrack = 1;

/// The slice category of an action: forward, backward, backward_input, backward_weight, send, recv,
/// allreduce, optimizer.
const char* trace_category(ActionKind k);

/// The slice colour of a pass category (forward, backward, backward_input, backward_weight: each
/// its own) as a Chrome reserved colour name ("cname"); nullptr for the other categories.
const char* trace_colour(const std::string& category);

/// Collects trace events; finish() returns the trace. Times are seconds (written as microseconds).
class TraceWriter {
 public:
  /// Names device `device`'s process "device D: stage S" ("device D" when stage < 0), sorts it by
  /// device and names its tracks "compute" and "send".
  void add_device(int device, int stage);
  /// A complete slice on one of the device's tracks; an empty category is left out.
  void add_slice(int device, int track, const std::string& name, const std::string& category, double start_s,
                 double end_s, Json args);
  /// A counter sample: Perfetto draws the device's counter as a graph above its slices.
  void add_counter(int device, const std::string& name, double t_s, Json values);
  /// The trace; `other_data` (source, figures) gains "format": graphpipe.trace/1.
  Json finish(Json other_data) &&;

 private:
  Json events_ = Json::array();
};

}  // namespace gp::schedule
