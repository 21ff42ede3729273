// Measured vs predicted memory per rank (memory_report.h).
#include "runtime/exec/memory_report.h"

#include <cstdio>

#include "cost/cost_model.h"
#include "plan/plan.h"
#include "support/error.h"

namespace gp::runtime {
namespace {

double mb(double b) { return b / 1e6; }

MemoryBreakdown from_parts(const cost::StageMemory& m) {
  return {m.weights, m.gradients, m.optimizer, m.activations, m.transient};
}

/// The cluster the plan was made on (recorded in it), else its cluster spec, else this machine.
cost::Cluster plan_cluster(const plan::Plan& p) {
  if (p.costs.recorded()) return cost::cluster_from_json(JsonAt(p.costs.cluster, "plan costs.cluster"));
  try {
    return cost::load_cluster(p.cluster_spec.empty() ? "cpu" : p.cluster_spec, p.num_devices);
  } catch (const UserError&) {
    return cost::load_cluster("cpu", p.num_devices);
  }
}

}  // namespace

Json MemoryBreakdown::to_json() const {
  return Json{{"parameters_bytes", parameters},
              {"gradients_bytes", gradients},
              {"optimizer_state_bytes", optimizer_state},
              {"activations_bytes", activations},
              {"transient_bytes", transient}};
}

MemoryBreakdown MemoryBreakdown::from_json(const Json& j) {
  return {j.at("parameters_bytes").get<double>(), j.at("gradients_bytes").get<double>(),
          j.at("optimizer_state_bytes").get<double>(), j.at("activations_bytes").get<double>(),
          j.at("transient_bytes").get<double>()};
}

std::string MemoryBreakdown::describe() const {
  return fmt::format(
      "params {:.3f} MB, grads {:.3f} MB, optimizer {:.3f} MB, activations {:.3f} MB, transient "
      "{:.3f} MB",
      mb(parameters), mb(gradients), mb(optimizer_state), mb(activations), mb(transient));
}

Json RankMemory::to_json() const {
  return Json{{"rank", rank},
              {"stage", stage},
              {"peak_memory_bytes", peak_bytes},
              {"predicted_memory_bytes", predicted_bytes},
              {"peak_step", peak_step},
              {"in_flight", in_flight},
              {"resident_peak_bytes", resident_peak_bytes},
              {"measured", measured.to_json()},
              {"predicted", predicted.to_json()}};
}

RankMemory RankMemory::from_json(const Json& j) {
  RankMemory r;
  r.rank = j.at("rank").get<int>();
  r.stage = j.at("stage").get<int>();
  r.peak_bytes = j.at("peak_memory_bytes").get<double>();
  r.predicted_bytes = j.at("predicted_memory_bytes").get<double>();
  r.peak_step = j.at("peak_step").get<int64_t>();
  r.in_flight = j.at("in_flight").get<int>();
  r.resident_peak_bytes = j.at("resident_peak_bytes").get<double>();
  r.measured = MemoryBreakdown::from_json(j.at("measured"));
  r.predicted = MemoryBreakdown::from_json(j.at("predicted"));
  return r;
}

MemoryBreakdown predicted_stage_memory(const plan::Plan& p, const ir::Graph& g, int stage, const std::string& optimizer,
                                       int in_flight) {
  cost::CostModel cm(g, plan_cluster(p), cost::optimizer_from_string(optimizer));
  const plan::Stage& st = p.stages.at(static_cast<size_t>(stage));
  std::vector<OpId> ops;
  std::vector<char> mask(g.num_ops(), 0);
  for (const auto& name : st.ops) {
    ops.push_back(g.find(name));
    mask[ops.back().v] = 1;
  }
  cost::StageCost c = cost::stage_cost(cm, ops, mask, static_cast<int>(st.devices.size()), st.micro_batch_size,
                                       p.mini_batch_size, /*same_node=*/true);
  return from_parts(cost::stage_memory_parts(c, in_flight));
}

MemoryBreakdown predicted_single_memory(const ir::Graph& g, int64_t batch, const std::string& optimizer) {
  cost::CostModel cm(g, cost::load_cluster("cpu", 1), cost::optimizer_from_string(optimizer));
  std::vector<char> mask(g.num_ops(), 1);
  cost::StageCost c = cost::stage_cost(cm, g.op_ids(), mask, 1, batch, batch, true);
  return from_parts(cost::stage_memory_parts(c, 1));
}

void print_memory_report(const std::vector<RankMemory>& ranks) {
  for (const RankMemory& r : ranks) {
    if (r.stage < 0 && r.peak_bytes == 0) continue;
    double d = r.predicted_bytes > 0 ? 100.0 * (r.peak_bytes - r.predicted_bytes) / r.predicted_bytes : 0;
    std::printf(
        "memory: rank %d stage %d: measured peak %.3f MB at step %lld, predicted %.3f MB (%+.1f%%, %d in "
        "flight); resident peak %.1f MB\n",
        r.rank, r.stage, mb(r.peak_bytes), static_cast<long long>(r.peak_step), mb(r.predicted_bytes), d, r.in_flight,
        mb(r.resident_peak_bytes));
    std::printf("  measured:  %s\n  predicted: %s\n", r.measured.describe().c_str(), r.predicted.describe().c_str());
  }
  std::fflush(stdout);
}

std::string memory_limit_failure(int rank, int stage, int64_t step, const std::string& action, double peak,
                                 const MemoryBreakdown& at_peak, double limit_bytes) {
  if (limit_bytes <= 0 || peak <= limit_bytes) return "";
  return fmt::format(
      "rank {} (stage {}) exceeded --memory-limit {:.3f} MB at step {}, action '{}': measured peak "
      "{:.3f} MB of tensors ({})",
      rank, stage, mb(limit_bytes), step, action, mb(peak), at_peak.describe());
}

Json train_summary_json(const std::vector<double>& losses, double iteration_time_s, double predicted_time_s,
                        const std::vector<RankMemory>& ranks) {
  Json rs = Json::array();
  for (const RankMemory& r : ranks) rs.push_back(r.to_json());
  return Json{{"format", "graphpipe.train/1"},
              {"steps", losses.size()},
              {"losses", losses},
              {"final_loss", losses.empty() ? 0.0 : losses.back()},
              {"iteration_time_s", iteration_time_s},
              {"predicted_iteration_time_s", predicted_time_s},
              {"ranks", rs}};
}

double training_bytes_estimate(const ir::Graph& g, const std::vector<OpId>& ops, double samples,
                               const std::string& optimizer) {
  double copies = optimizer == "sgd" ? 3 : 4;  // value, gradient, optimizer state
  double bytes = 0;
  for (OpId id : ops) {
    const ir::OpCosts& c = g.costs(id);
    bytes += copies * static_cast<double>(c.param_bytes) + samples * (c.output_bytes + c.saved_bytes);
  }
  return bytes;
}

}  // namespace gp::runtime
