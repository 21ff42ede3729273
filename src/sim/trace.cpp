// graphpipe.sim/1 results and the simulator's Chrome trace (schedule::TraceWriter, graphpipe.trace/1).
#include "schedule/trace.h"
#include "sim/sim.h"

namespace gp::sim {

Json sim_result_to_json(const SimResult& r) {
  return {{"format", "graphpipe.sim/1"},
          {"iteration_time_s", r.iteration_time_s},
          {"throughput_samples_per_s", r.throughput_samples_per_s},
          {"peak_memory_bytes", r.peak_memory_bytes},
          {"bubble_fraction", r.bubble_fraction},
          {"busy_s", r.busy_s},
          {"peak_in_flight", r.peak_in_flight}};
}

Json chrome_trace(const plan::Plan& p, const SimResult& r) {
  schedule::TraceWriter w;
  for (const plan::Stage& st : p.stages)
    for (int d : st.devices) w.add_device(d, st.id);
  for (const Event& e : r.events) {
    Json args = {{"stage", e.stage}, {"action", e.action}};
    if (e.micro_batch >= 0) args["micro_batch"] = e.micro_batch;
    w.add_slice(e.device, e.track, e.name, schedule::trace_category(e.kind), e.start_s, e.end_s, std::move(args));
  }
  return std::move(w).finish(
      {{"source", "simulator"}, {"iteration_time_s", r.iteration_time_s}, {"bubble_fraction", r.bubble_fraction}});
}

}  // namespace gp::sim
