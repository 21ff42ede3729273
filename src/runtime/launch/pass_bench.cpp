// time_stage_passes (pass_bench.h): a one-stage plan of the model, trained by execute_worker.
#include "runtime/launch/pass_bench.h"

#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <vector>

#include "cost/calibration.h"
#include "cost/cost_model.h"
#include "plan/plan.h"
#include "runtime/base/train.h"
#include "runtime/pipeline/pipeline.h"
#include "schedule/schedule.h"
#include "support/error.h"
#include "support/stats.h"

namespace gp::runtime {

PassTiming time_stage_passes(const ir::Graph& g, int64_t micro_batch, int64_t mini_batch, int steps, int timed) {
  GP_CHECK(micro_batch >= 1 && mini_batch % micro_batch == 0 && steps >= timed && timed >= 1,
           "time_stage_passes: micro-batch {} must divide mini-batch {}, timed steps {} within {}", micro_batch,
           mini_batch, timed, steps);
  plan::Plan p;
  p.planner = "manual";
  p.model_name = g.name();
  p.num_ops = static_cast<int>(g.num_ops());
  p.num_devices = 1;
  p.mini_batch_size = static_cast<int>(mini_batch);
  plan::Stage s;
  for (OpId id : g.op_ids()) s.ops.push_back(g.op(id).name);
  s.devices = {0};
  s.micro_batch_size = static_cast<int>(micro_batch);
  p.stages = {s};
  // The cpu preset's fixed figures, recorded as the plan's cluster: the worker's memory report costs
  // the plan on it, and loading the calibrated preset here, while `plan --cluster cpu` calibrates on
  // first use, would ask for the calibration being measured (a recursive static initialisation).
  p.costs.cluster = cost::cluster_to_json(cost::cpu_preset(1, nullptr));
  plan::validate_plan(p, g, "calibration");
  schedule::Schedule sch = schedule::build_schedule(p, "1f1b");
  const PreparedRun run{std::move(p), g, std::move(sch), {}, nullptr, nullptr};
  TrainOptions opt;
  opt.steps = steps;
  opt.record_events = true;
  opt.trace_steps = timed;
  WorkerIo io;
  io.store = c10::make_intrusive<c10d::HashStore>();
  io.print = false;
  const WorkerResult r = execute_worker(opt, run, io);
  std::vector<double> fwd, bwd;
  for (const MeasuredEvent& e : r.events) {
    if (e.category == "forward") fwd.push_back(e.thread_cpu_s);
    if (e.category == "backward") bwd.push_back(e.thread_cpu_s);
  }
  return {median(fwd), median(bwd)};
}

}  // namespace gp::runtime
