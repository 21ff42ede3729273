// Pipeline equivalence: every rank of a plan runs as a thread in one process (HashStore rendezvous);
// per-step losses and final weights must equal the single-process reference.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <future>
#include <map>
#include <set>

#include "runtime/comm/comm.h"
#include "runtime/pipeline/pipeline.h"
#include "runtime/tests/dist_plans.h"
#include "support/json.h"

namespace gp::runtime {
namespace {

using testing::expect_equivalent;
using testing::make_plan;
using testing::options;
using testing::run_threads;
using testing::StageSpec;

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

// GP_HOST_STAGING=1: activations, gradients and the replicas' all-reduce all travel through host
// copies, as they do from a GPU, and training still equals --single.
TEST(DistPipeline, HostStagedTransfersEqualSingle) {
  ASSERT_EQ(::setenv("GP_HOST_STAGING", "1", 1), 0);
  const int64_t before = detail::host_staged_bytes().load();
  expect_equivalent(make_plan(kMmt, 8, {{{"m0."}, {0}, 2}, {{"m1."}, {1, 2}, 4}, {{}, {3}, 2}}), 2, "sgd", 0.05);
  ::unsetenv("GP_HOST_STAGING");
  EXPECT_GT(detail::host_staged_bytes().load(), before);
}

// --comm gloo-pairs: NCCL's way (one channel per directed pair of ranks, messages matched by order and
// checked by their header) over Gloo. Replicas, per-stage micro-batch sizes (pieces regrouped between
// stages) and a skip edge: every pair of ranks must send in the order its peer receives.
TEST(DistPipeline, PairwiseChannelsInOrderEqualSingle) {
  expect_equivalent(make_plan(kMmt, 8, {{{"m0."}, {0}, 2}, {{"m1."}, {1, 2}, 4}, {{}, {3}, 2}}), 2, "sgd", 0.05,
                    "gloo-pairs");
  expect_equivalent(make_plan(kGpt, 8, {{{"l0."}, {0}, 4}, {{"l1.attn"}, {1, 2}, 4}, {{}, {3}, 2}}), 3, "sgd", 0.05,
                    "gloo-pairs");
}

// Per-step statistics (pipeline/step_stats.h): over Gloo the other ranks send their rows to rank 0 and
// get every step's figures in one all-reduce at the end; over gloo-pairs (messages in order, no tags) one
// all-reduce per step. Either way every rank ends with rank 0's losses, step times and data times, bit
// for bit, the two ways give the same losses, and rank 0's --log has each step once, in order.
TEST(DistPipeline, StepStatisticsReachEveryRankAlike) {
  const PreparedRun run = prepare_run(make_plan(kMmt, 8, {{{"m0."}, {0}, 2}, {{"m1."}, {1, 2}, 4}, {{}, {3}, 2}}),
                                      "1f1b");
  const int steps = 4;
  std::map<std::string, std::vector<double>> losses;
  for (std::string comm : {"gloo", "gloo-pairs"}) {
    TrainOptions opt = options(steps, "sgd", 0.05);
    opt.comm = comm;
    opt.log_path = ::testing::TempDir() + "gp_step_stats_" + comm + ".jsonl";
    auto results = run_threads(run, opt);
    ASSERT_EQ(results[0].step_losses.size(), size_t(steps)) << comm;
    for (size_t r = 1; r < results.size(); ++r) {
      EXPECT_EQ(results[r].step_losses, results[0].step_losses) << comm << " rank " << r;
      EXPECT_EQ(results[r].step_times_s, results[0].step_times_s) << comm << " rank " << r;
      EXPECT_EQ(results[r].step_data_s, results[0].step_data_s) << comm << " rank " << r;
    }
    std::ifstream log(opt.log_path);
    std::string line;
    int k = 0;
    for (; std::getline(log, line); ++k) {
      ASSERT_LT(k, steps) << comm << ": " << line;
      Json j = Json::parse(line);
      EXPECT_EQ(j["step"].get<int>(), k) << comm;
      EXPECT_EQ(j["loss"].get<double>(), results[0].step_losses[size_t(k)]) << comm << " step " << k;
    }
    EXPECT_EQ(k, steps) << comm;
    std::remove(opt.log_path.c_str());
    losses[comm] = results[0].step_losses;
  }
  EXPECT_EQ(losses["gloo"], losses["gloo-pairs"]);
}

// A plan that leaves a device idle (the planner may: one stage on device 0 of 2). The idle rank has no
// step to time; its loop ran ahead of rank 0 by up to four steps and its start counted as the step's
// first, so each step read as 3-7 of rank 0's (0.084 s against a pace of 0.012 s, issue 35). Rank 0's
// steps are disjoint spans of the run: their times cannot add up to more than the run's wall time.
TEST(DistPipeline, AnIdleDeviceDoesNotStretchTheMeasuredStep) {
  const PreparedRun run = prepare_run(make_plan(kMmt, 8, {{{}, {0}, 8}}, /*num_devices=*/2), "1f1b");
  const int steps = 8;
  auto t0 = std::chrono::steady_clock::now();
  auto results = run_threads(run, options(steps, "sgd", 0.05));
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_EQ(results[0].step_times_s.size(), size_t(steps));
  double sum = 0;
  for (double t : results[0].step_times_s) {
    EXPECT_TRUE(std::isfinite(t) && t > 0) << t;
    sum += t;
  }
  EXPECT_LE(sum, wall);
}

// Ranks that load different plans (a stale plan.json on one node) stop before connecting, every one of
// them with the same one-line UserError naming how many differ, instead of exchanging tensors of other
// shapes (a message more than 4 KiB too long makes Gloo abort the process).
TEST(DistPipeline, RanksWithDifferentPlansStopBeforeConnecting) {
  const PreparedRun a = prepare_run(make_plan(kMmt, 8, {{{"m0."}, {0}, 4}, {{}, {1}, 4}}), "1f1b");
  const PreparedRun b = prepare_run(make_plan(kMmt, 8, {{{"m0."}, {0}, 2}, {{}, {1}, 2}}), "1f1b");
  auto store = c10::make_intrusive<c10d::HashStore>();
  const TrainOptions opt = options(2, "sgd", 0.05);
  std::vector<std::future<std::string>> fs;
  for (int r = 0; r < 2; ++r)
    fs.push_back(std::async(std::launch::async, [&, r] {
      WorkerIo io;
      io.rank = r;
      io.world = 2;
      io.store = store;
      io.print = false;
      try {
        execute_worker(opt, r == 0 ? a : b, io);
      } catch (const UserError& e) {
        return std::string(e.what());
      }
      return std::string("no error");
    }));
  const std::string e0 = fs[0].get(), e1 = fs[1].get();
  EXPECT_NE(e0.find("1 of 2 ranks run another plan, model or --schedule than rank 0 (rank 0 runs rank 0's)"),
            std::string::npos)
      << e0;
  EXPECT_NE(e1.find("1 of 2 ranks run another plan, model or --schedule than rank 0 (rank 1: sha256 "),
            std::string::npos)
      << e1;
}

TEST(DistPipeline, SkipEdgeBetweenNonAdjacentStages) {
  // l0's output feeds both l1.attn (s1) and the residual add l1.add1 (s2): a skip edge s0 -> s2.
  auto p = make_plan(kGpt, 8, {{{"l0."}, {0}, 4}, {{"l1.attn"}, {1, 2}, 4}, {{}, {3}, 2}});
  ASSERT_EQ(p.stages[0].outputs_to, (std::vector<int>{1, 2}));
  expect_equivalent(p, 3, "sgd", 0.05);
}

/// Adds the stage edge from -> to (no op tensor crosses it) and recomputes in-flight counts.
plan::Plan with_ordering_edge(plan::Plan p, int from, int to) {
  auto add = [](std::vector<int>& v, int x) {
    v.push_back(x);
    std::sort(v.begin(), v.end());
  };
  add(p.stages[from].outputs_to, to);
  add(p.stages[to].inputs_from, from);
  plan::assign_min_in_flight(p);
  return p;
}

TEST(DistPipeline, OrderingEdgeWithoutTensorsChainsParallelBranches) {
  // The two branches are independent; the declared edge s0 -> s1 makes them a chain (as the
  // PipeDream/Piper baselines declare), carried by tokens, with replicas and regrouping on s1.
  auto p = with_ordering_edge(make_plan(kMmt, 8, {{{"m0."}, {0}, 4}, {{"m1."}, {1, 2}, 4}, {{}, {3}, 2}}), 0, 1);
  ASSERT_EQ(p.stages[1].inputs_from, (std::vector<int>{0}));
  expect_equivalent(p, 3, "sgd", 0.05);
  // Different micro-batch sizes across the token edge (tokens per regrouped piece), Adam.
  expect_equivalent(
      with_ordering_edge(make_plan(kUno, 8, {{{"tower0."}, {0}, 2}, {{"tower1."}, {1}, 4}, {{}, {2}, 8}}), 0, 1), 2);
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
  std::set<std::string> tracks;
  for (auto& e : j["traceEvents"]) {
    if (e["ph"] == "X") {
      ++slices;
      EXPECT_GE(e["ts"].get<double>(), 0.0);
      saw_forward = saw_forward || (e["name"] == "s1 F mb0" && e["cat"] == "forward" && e["tid"] == 0);
      if (e["cat"] == "send") {
        EXPECT_EQ(e["tid"], 1) << e.dump();
      }
    }
    if (e["ph"] == "M" && e["name"] == "thread_name") tracks.insert(e["args"]["name"].get<std::string>());
  }
  EXPECT_EQ(slices, expected);
  EXPECT_TRUE(saw_forward);
  // The simulator's track names and format (schedule::TraceWriter writes both).
  EXPECT_EQ(tracks, (std::set<std::string>{"compute", "send"}));
  EXPECT_EQ(j["otherData"]["format"], "graphpipe.trace/1");
  std::filesystem::remove(trace);
}

TEST(DistPipeline, TraceStepsCoversTheLastStepsEachSliceNamingItsStep) {
  auto p = make_plan(kMmt, 8, {{{"m0."}, {0}, 4}, {{}, {1}, 4}});
  PreparedRun run = prepare_run(p, "1f1b");
  auto trace = std::filesystem::temp_directory_path() / ("gp_dist_trace3_" + std::to_string(::getpid()) + ".json");
  TrainOptions o = options(5, "adam", 1e-3);
  o.trace_path = trace.string();
  o.trace_steps = 3;
  run_threads(run, o);
  Json j = read_json_file(trace.string());
  size_t per_step = 0;
  for (auto& st : run.schedule.stages) per_step += st.actions.size();
  std::map<int64_t, size_t> slices;  // step -> slices
  double last_end_of_step2 = 0, first_start_of_step4 = 1e300;
  for (auto& e : j["traceEvents"])
    if (e["ph"] == "X") {
      const int64_t step = e["args"]["step"].get<int64_t>();
      ++slices[step];
      const double ts = e["ts"].get<double>(), end = ts + e["dur"].get<double>();
      if (step == 2) last_end_of_step2 = std::max(last_end_of_step2, end);
      if (step == 4) first_start_of_step4 = std::min(first_start_of_step4, ts);
    }
  EXPECT_EQ(slices, (std::map<int64_t, size_t>{{2, per_step}, {3, per_step}, {4, per_step}}));
  EXPECT_LT(last_end_of_step2, first_start_of_step4);  // one timeline, steps in order
  std::filesystem::remove(trace);
}

TEST(DistPipeline, PlanForAnotherModelIsRejectedBeforeTraining) {
  auto p = make_plan(kMmt, 8, {{{"m0."}, {0}, 4}, {{}, {1}, 4}});
  p.stages[0].ops.pop_back();  // an op in no stage
  EXPECT_THROW(prepare_run(p, "1f1b"), UserError);
}

}  // namespace
}  // namespace gp::runtime
