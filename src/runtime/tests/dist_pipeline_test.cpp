// Pipeline equivalence: every rank of a plan runs as a thread in one process (HashStore rendezvous);
// per-step losses and final weights must equal the single-process reference.
#include <gtest/gtest.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <chrono>
#include <filesystem>
#include <future>
#include <map>

#include "runtime/detail/pipeline.h"
#include "runtime/tests/dist_plans.h"
#include "support/json.h"

namespace gp::runtime {
namespace {

using testing::make_plan;
using testing::StageSpec;
using namespace std::chrono_literals;

/// Runs every rank of `run` on its own thread; fails (and detaches) when one exceeds 60 s.
std::vector<WorkerResult> run_threads(const PreparedRun& run, const TrainOptions& opt) {
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
  auto deadline = std::chrono::steady_clock::now() + 60s;
  for (auto& f : fs) {
    if (f.wait_until(deadline) != std::future_status::ready) {
      ADD_FAILURE() << "a rank thread hung";
      std::abort();  // the hung threads cannot be joined
    }
    out.push_back(f.get());
  }
  return out;
}

TrainOptions options(int steps, const std::string& optimizer, double lr) {
  TrainOptions o;
  o.steps = steps;
  o.optimizer = optimizer;
  o.lr = lr;
  o.timeout_s = 30;
  return o;
}

/// Trains `p` with every rank as a thread and compares with the single-process reference.
void expect_equivalent(const plan::Plan& p, int steps, const std::string& optimizer = "adam", double lr = 1e-2) {
  PreparedRun run = prepare_run(p, "1f1b");
  auto results = run_threads(run, options(steps, optimizer, lr));
  auto ref = testing::single_reference(p.model_spec, p.mini_batch_size, steps, optimizer, lr);
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
  for (auto& [n, t] : ref.params) {
    EXPECT_GE(seen[n], 1) << n << " held by no rank";
  }
}

const char* kMmt = "mmt:branches=2,layers=1,hidden=32,seq=8,heads=2,ffn=64";
const char* kGpt = "gpt:layers=2,seq=8,hidden=32,heads=2,ffn=64,vocab=16";
const char* kDlrm = "dlrm:dense_branches=1,embedding_branches=2,layers=1,hidden=16,rows=50,dim=8,bag=4";
const char* kUno = "candle-uno:branches=2,layers=1,hidden=16";

// The transformer cases use SGD: attention's key bias has an exactly zero gradient, and Adam
// (m / sqrt(v)) turns float rounding noise in such a gradient into lr-sized steps, so weights
// could not be compared at 1e-5 (losses still are). The MLP models below use Adam.
TEST(DistPipeline, TwoBranchesOnTwoWorkers) {
  expect_equivalent(make_plan(kMmt, 8, {{{"m0."}, {0}, 4}, {{}, {1}, 4}}), 4, "sgd", 0.05);
}

TEST(DistPipeline, ParallelBranchesDataParallelStageAndRegroupingOnFourWorkers) {
  // s0 = branch 0, s1 = branch 1 on two replicas, s2 = fusion head with smaller micro-batches.
  expect_equivalent(make_plan(kMmt, 8, {{{"m0."}, {0}, 2}, {{"m1."}, {1, 2}, 4}, {{}, {3}, 2}}), 3, "sgd", 0.05);
}

TEST(DistPipeline, SkipEdgeBetweenNonAdjacentStages) {
  // l0's output feeds both l1.attn (s1) and the residual add l1.add1 (s2): a skip edge s0 -> s2.
  auto p = make_plan(kGpt, 8, {{{"l0."}, {0}, 4}, {{"l1.attn"}, {1, 2}, 4}, {{}, {3}, 2}});
  ASSERT_EQ(p.stages[0].outputs_to, (std::vector<int>{1, 2}));
  expect_equivalent(p, 3, "sgd", 0.05);
}

TEST(DistPipeline, DlrmEmbeddingBranchesAndReplicatedTop) {
  expect_equivalent(make_plan(kDlrm, 8, {{{"dense0."}, {0}, 4}, {{"emb"}, {1}, 8}, {{}, {2, 3}, 4}}), 3);
}

TEST(DistPipeline, CandleUnoOnSixWorkersAllStagesReplicated) {
  expect_equivalent(make_plan(kUno, 8, {{{"tower0."}, {0, 1}, 4}, {{"tower1."}, {2, 3}, 2}, {{}, {4, 5}, 8}}), 3);
}

TEST(DistPipeline, ResumeContinuesExactly) {
  auto p = make_plan(kMmt, 8, {{{"m0."}, {0}, 4}, {{}, {1}, 4}});
  PreparedRun run = prepare_run(p, "1f1b");
  auto dir = std::filesystem::temp_directory_path() / ("gp_dist_resume_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  TrainOptions o = options(4, "adam", 1e-2);
  auto full = run_threads(run, o);
  o.checkpoint_dir = dir.string();
  o.steps = 2;
  run_threads(run, o);
  o.steps = 4;
  o.resume = true;
  auto resumed = run_threads(run, o);
  for (size_t r = 0; r < full.size(); ++r) {
    ASSERT_EQ(resumed[r].step_losses.size(), 2u);
    EXPECT_EQ(resumed[r].step_losses[1], full[r].step_losses[3]);
    ASSERT_EQ(full[r].final_params.size(), resumed[r].final_params.size());
    for (size_t i = 0; i < full[r].final_params.size(); ++i)
      EXPECT_TRUE(torch::equal(full[r].final_params[i].second, resumed[r].final_params[i].second))
          << full[r].final_params[i].first;
  }
  std::filesystem::remove_all(dir);
}

TEST(DistPipeline, MeasuredTraceHasOneSlicePerActionOnEachDevice) {
  auto p = make_plan(kMmt, 8, {{{"m0."}, {0}, 4}, {{}, {1}, 4}});
  PreparedRun run = prepare_run(p, "1f1b");
  auto trace = std::filesystem::temp_directory_path() / ("gp_dist_trace_" + std::to_string(::getpid()) + ".json");
  TrainOptions o = options(2, "adam", 1e-3);
  o.trace_path = trace.string();
  run_threads(run, o);
  Json j = read_json_file(trace.string());
  size_t slices = 0, expected = 0;
  for (auto& st : run.schedule.stages) expected += st.actions.size();
  bool saw_forward = false;
  for (auto& e : j["traceEvents"])
    if (e["ph"] == "X") {
      ++slices;
      EXPECT_GE(e["ts"].get<double>(), 0.0);
      saw_forward = saw_forward || e["name"] == "s1 F mb0";
    }
  EXPECT_EQ(slices, expected);
  EXPECT_TRUE(saw_forward);
  std::filesystem::remove(trace);
}

TEST(DistPipeline, PlanForAnotherModelIsRejectedBeforeTraining) {
  auto p = make_plan(kMmt, 8, {{{"m0."}, {0}, 4}, {{}, {1}, 4}});
  p.stages[0].ops.pop_back();  // an op in no stage
  EXPECT_THROW(prepare_run(p, "1f1b"), UserError);
}

}  // namespace
}  // namespace gp::runtime
