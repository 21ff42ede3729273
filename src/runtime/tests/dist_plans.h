// Hand-built plans, the single-process reference, and the threads-as-ranks equivalence check
// shared by the pipeline runtime tests.
#pragma once
#include <gtest/gtest.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <future>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "importers/resolve.h"
#include "plan/plan.h"
#include "runtime/exec/synthetic.h"
#include "runtime/exec/optim.h"
#include "runtime/pipeline/pipeline.h"

namespace gp::runtime::testing {

/// A stage: ops whose names start with one of `prefixes` (the last stage may list none: it takes
/// every op left), its devices and its micro-batch size.
struct StageSpec {
  std::vector<std::string> prefixes;
  std::vector<int> devices;
  int micro_batch = 1;
};

inline plan::Plan make_plan(const std::string& spec, int batch, const std::vector<StageSpec>& stages,
                            int num_devices = 0) {
  ir::Graph g = importers::load_graph(spec);
  plan::Plan p;
  p.planner = "manual";
  p.model_name = g.name();
  p.num_ops = static_cast<int>(g.num_ops());
  p.model_spec = spec;
  p.cluster_name = "cpu";
  p.cluster_spec = "cpu";
  p.mini_batch_size = batch;
  for (size_t s = 0; s < stages.size(); ++s) {
    plan::Stage st;
    st.id = static_cast<int>(s);
    st.devices = stages[s].devices;
    st.micro_batch_size = stages[s].micro_batch;
    p.stages.push_back(st);
    for (int d : st.devices) num_devices = std::max(num_devices, d + 1);
  }
  p.num_devices = num_devices;
  for (size_t i = 0; i < g.num_ops(); ++i) {
    const std::string& n = g.op(OpId(static_cast<int32_t>(i))).name;
    size_t s = 0;
    for (; s < stages.size(); ++s) {
      bool hit = stages[s].prefixes.empty();
      for (const auto& pre : stages[s].prefixes) hit = hit || n.rfind(pre, 0) == 0;
      if (hit) break;
    }
    p.stages.at(s).ops.push_back(n);
  }
  plan::derive_stage_edges(p, g);
  plan::assign_min_in_flight(p);
  return p;
}

struct Reference {
  std::vector<double> losses;
  std::vector<std::pair<std::string, torch::Tensor>> params;
};

/// What `train --single` computes: the whole model, one micro-batch = the mini-batch.
inline Reference single_reference(const std::string& spec, int batch, int steps, const std::string& optimizer,
                                  double lr, uint64_t seed = 1) {
  ir::Graph g = importers::load_graph(spec);
  StageModule m(g, g.op_ids(), seed, importers::load_weights(spec));  // the file's weights, as run_single
  auto opt = make_optimizer(optimizer, m.parameters(), lr, 0.9);
  Reference r;
  for (int step = 0; step < steps; ++step) {
    opt->zero_grad();
    MicroBatchInfo info{0, batch, batch, step};
    auto loss = m.scaled_loss(m.forward(synthetic_external_inputs(m, info), info), info);
    loss.backward();
    opt->step();
    r.losses.push_back(loss.item<double>());
  }
  for (auto& [n, t] : m.named_parameters()) r.params.emplace_back(n, t.detach().clone());
  return r;
}

/// Runs every rank of `run` on its own thread; fails (and aborts) when one exceeds 60 s.
inline std::vector<WorkerResult> run_threads(const PreparedRun& run, const TrainOptions& opt) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  int world = run.plan.num_devices;
  std::vector<std::future<WorkerResult>> fs;
  for (int r = 0; r < world; ++r)
    fs.push_back(std::async(std::launch::async, [&, r] {
      WorkerIo io;
      io.rank = r;
      io.world = world;
      io.store = store;
      io.print = false;
      return execute_worker(opt, run, io);
    }));
  std::vector<WorkerResult> out;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  for (auto& f : fs) {
    if (f.wait_until(deadline) != std::future_status::ready) {
      ADD_FAILURE() << "a rank thread hung";
      std::abort();  // the hung threads cannot be joined
    }
    out.push_back(f.get());
  }
  return out;
}

inline TrainOptions options(int steps, const std::string& optimizer, double lr) {
  TrainOptions o;
  o.steps = steps;
  o.optimizer = optimizer;
  o.lr = lr;
  o.timeout_s = 30;
  return o;
}

/// Trains `p` with every rank as a thread and compares with the single-process reference:
/// per-step losses within 1e-5 relative, every final weight within 1e-5. `comm`: --comm; `schedule`:
/// --schedule.
inline void expect_equivalent(const plan::Plan& p, int steps, const std::string& optimizer = "adam", double lr = 1e-2,
                              const std::string& comm = "auto", const std::string& schedule = "1f1b") {
  PreparedRun run = prepare_run(p, schedule);
  TrainOptions opt = options(steps, optimizer, lr);
  opt.comm = comm;
  auto results = run_threads(run, opt);
  auto ref = single_reference(p.model_spec, p.mini_batch_size, steps, optimizer, lr);
  for (size_t r = 0; r < results.size(); ++r) {
    ASSERT_EQ(results[r].step_losses.size(), size_t(steps)) << "rank " << r;
    for (int s = 0; s < steps; ++s)
      EXPECT_NEAR(results[r].step_losses[s], ref.losses[s], 1e-5 * std::abs(ref.losses[s]))
          << "rank " << r << " step " << s;
  }
  // Every parameter is held by the replicas of exactly one stage, all with the reference value.
  std::map<std::string, int> seen;
  for (size_t r = 0; r < results.size(); ++r)
    for (auto& [n, t] : results[r].final_params) {
      ++seen[n];
      auto it = std::find_if(ref.params.begin(), ref.params.end(), [&](auto& kv) { return kv.first == n; });
      ASSERT_NE(it, ref.params.end()) << n;
      double diff = (t - it->second).abs().max().item<double>();
      EXPECT_LT(diff, 1e-5) << n << " on rank " << r;
    }
  for (auto& [n, t] : ref.params) EXPECT_GE(seen[n], 1) << n << " held by no rank";
}

}  // namespace gp::runtime::testing
