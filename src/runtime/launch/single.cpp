// `graphpipe train --single`: the single-process reference (whole model, one micro-batch per step).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>

#include "importers/resolve.h"
#include "runtime/base/cpu_affinity.h"
#include "runtime/checkpoint/checkpoint_manifest.h"
#include "runtime/exec/op_timing.h"
#include "runtime/checkpoint/checkpoint_set.h"
#include "runtime/data/data_feed.h"
#include "runtime/exec/device.h"
#include "runtime/exec/divergence.h"
#include "runtime/exec/params.h"
#include "runtime/exec/stage_module.h"
#include "runtime/exec/memory_meter.h"
#include "runtime/exec/memory_report.h"
#include "runtime/exec/optim.h"
#include "runtime/base/fault.h"
#include "runtime/launch/launcher.h"
#include "runtime/base/train.h"
#include "support/error.h"
#include "support/json.h"
#include "support/memory.h"

namespace gp::runtime {

namespace {

/// Runs one phase of a step as a metered action (checked against --memory-limit).
using Metered = std::function<void(const char* phase, const std::function<void()>& f)>;

/// One optimizer step of the whole model on mini-batch `step`; returns the loss and sets
/// `data_s` to the seconds the step waited for its batch. The step reads from the device once, after
/// the backward pass is queued: the loss and the gradients' finiteness probe together (on a GPU a read
/// is a sync, and one before the backward would leave the GPU idle while it is queued). A non-finite
/// loss stops the step before the optimizer, as a non-finite gradient does; to name the op that made
/// it, the forward pass runs again without gradients on the same inputs (not kept otherwise).
double train_step(const TrainOptions& opt, StageModule& m, torch::optim::Optimizer& optim, InputPrefetcher& feed,
                  int64_t step, double& data_s, const Metered& metered) {
  optim.zero_grad();
  MicroBatchInfo info{0, opt.batch, opt.batch, step};
  std::optional<MicroBatchInfo> next;
  if (step + 1 < opt.steps) next = MicroBatchInfo{0, opt.batch, opt.batch, step + 1};
  auto t0 = std::chrono::steady_clock::now();
  TensorMap ins = feed.take(info, next);  // and starts reading the next step's batch
  data_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  torch::Tensor loss;
  metered("forward", [&] {
    TensorMap outs = m.forward(ins, info);  // every op output: released before backward, as a stage does
    loss = m.scaled_loss(outs, info, ins);
    GP_CHECK(loss.defined(), "{}: the model has no loss output", opt.model_spec);
  });
  torch::Tensor read = loss.detach().reshape({1}).to(torch::kFloat64);
  metered("backward", [&] {
    loss.backward();
    loss = torch::Tensor();
  });
  torch::Tensor probe = opt.allow_nonfinite ? torch::Tensor() : gradient_probe(m);
  if (probe.defined()) read = torch::cat({read, probe.reshape({1}).to(torch::kFloat64)});
  read = read.to(torch::kCPU);
  const double loss_v = read[0].item<double>();
  if (!opt.allow_nonfinite && !std::isfinite(loss_v)) {
    torch::NoGradGuard no_grad;
    check_loss_finite(loss_v, m, ins, m.forward(ins, info), {step, -1});
  }
  ins.clear();
  if (probe.defined()) check_gradients_finite(m, {step, -1}, read[1].item<double>());
  metered("optimizer step", [&] { optim.step(); });
  return loss_v;
}

void check_single_options(const TrainOptions& opt) {
  GP_CHECK(!opt.model_spec.empty(), "train --single needs --model SPEC");
  GP_CHECK(opt.batch >= 1, "--batch must be >= 1, found {}", opt.batch);
  GP_CHECK(opt.steps >= 1, "--steps must be >= 1, found {}", opt.steps);
  GP_CHECK(opt.checkpoint_every >= 0, "--checkpoint-every must be >= 0, found {}", opt.checkpoint_every);
  GP_CHECK(!opt.resume || !opt.checkpoint_dir.empty(), "--resume needs --checkpoint-dir");
  GP_CHECK(opt.checkpoint_every == 0 || !opt.checkpoint_dir.empty(), "--checkpoint-every needs --checkpoint-dir");
  GP_CHECK(opt.threads >= 1 && opt.threads <= kMaxThreads, "--threads must be in [1, {}], found {}", kMaxThreads,
           opt.threads);
  GP_CHECK(std::isfinite(opt.lr) && opt.lr > 0, "--lr must be a positive finite number, found {}", opt.lr);
  if (const char* f = std::getenv("GP_FAULT"); f && *f) parse_fault(f);  // bad specs fail before training
}

/// The run's memory figure for the report: the meter's peak against the single-process prediction.
RankMemory single_memory(const detail::MemoryMeter& meter, const ir::Graph& g, int64_t batch,
                         const std::string& optimizer) {
  RankMemory mem;
  mem.rank = mem.stage = 0;
  mem.peak_bytes = meter.peak_bytes();
  mem.peak_step = meter.peak_step();
  mem.measured = meter.at_peak();
  mem.in_flight = 1;
  mem.predicted = predicted_single_memory(g, batch, optimizer);
  mem.predicted_bytes = mem.predicted.total();
  mem.resident_peak_bytes = detail::resident_memory().peak_bytes;
  return mem;
}

}  // namespace

int run_single(const TrainOptions& opt) {
  check_single_options(opt);
  const torch::Device device = detail::select_device(opt.device, 0);
  set_torch_threads(opt.threads);
  detail::install_counting_allocator();  // before the parameters exist

  // Weights stored in the model file (ONNX initializers) when it has them, else seeded.
  importers::ParamValues weights;
  ir::Graph g = importers::load_graph(opt.model_spec, weights);
  if (opt.seeded_weights) weights.clear();
  check_initial_values(g, weights);
  const RunData data = open_run_data(opt, g, /*check_values=*/true);
  check_fits_in_memory(training_bytes_estimate(g, g.op_ids(), opt.batch, opt.optimizer),
                       fmt::format("train --single of {} with --batch {}", g.name(), opt.batch),
                       "parameters, gradients, optimizer state and one batch of activations");
  StageModule m(g, g.op_ids(), opt.seed, weights, device);
  auto optim = make_optimizer(opt.optimizer, m.parameters(), opt.lr, opt.momentum);
  InputPrefetcher feed(m, data.train.get(), /*spare_core=*/usable_cpus().size() > 1);

  // Checkpoint generations (checkpoint/checkpoint_set.h), the folder locked while we run.
  CheckpointLock lock;
  CheckpointSaver ckpt;
  if (!opt.checkpoint_dir.empty()) {
    if (opt.resume) check_resumable(opt.checkpoint_dir, single_set_identity(opt, g));  // before the lock creates it
    lock = CheckpointLock(opt.checkpoint_dir);
    ckpt = single_saver(opt, g, m, *optim);
  }
  int64_t first = 0;
  if (opt.resume) {
    first = resume_generation(ckpt);
    std::printf("resumed from %s after %lld steps\n", opt.checkpoint_dir.c_str(), static_cast<long long>(first));
  }
  std::ofstream log;
  if (!opt.log_path.empty()) {
    log.open(opt.log_path, opt.resume ? std::ios::app : std::ios::trunc);
    GP_CHECK(log.good(), "--log: cannot open {} for writing", opt.log_path);
  }

  const int64_t b = opt.batch;
  detail::MemoryMeter meter(m.parameters(), optim.get(), m.device());
  // Each phase is one metered action, checked against --memory-limit.
  auto metered = [&](int64_t step, const char* phase, const std::function<void()>& f) {
    meter.begin_action();
    f();
    double peak = meter.end_action(step, 0, false);
    std::string over = memory_limit_failure(0, 0, step, phase, peak, meter.at_peak(), opt.memory_limit_gb * 1e9);
    if (!over.empty()) throw RuntimeFailure(over);
  };
  std::vector<double> losses, times;
  for (int64_t step = first; step < opt.steps; ++step) {
    auto t0 = std::chrono::steady_clock::now();
    double data_s = 0;
    const double loss_v = train_step(
        opt, m, *optim, feed, step, data_s,
        [&](const char* phase, const std::function<void()>& f) { metered(step, phase, f); });
    double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    losses.push_back(loss_v);
    times.push_back(dt);
    StepReport rep{step, loss_v, dt, data.train.get(), b, data_s, nullptr};
    if (!opt.json) std::printf("%s\n", step_text(rep).c_str());
    EvalSums ev;
    if (data.eval && (step + 1) % opt.eval_every == 0) {
      ev = evaluate_module(m, *data.eval, b);
      rep.eval = &ev;
      if (!opt.json) std::printf("%s\n", eval_line(step, ev).c_str());
    }
    std::fflush(stdout);
    if (log.is_open()) {
      log << step_json(rep).dump() << "\n";
      log.flush();
      check_written(log, "--log", opt.log_path);
    }
    bool last = step + 1 == opt.steps;
    if (!opt.checkpoint_dir.empty() && (last || (opt.checkpoint_every > 0 && (step + 1) % opt.checkpoint_every == 0)))
      save_generation(ckpt, step + 1);
  }
  const RankMemory mem = single_memory(meter, g, b, opt.optimizer);
  if (opt.json) {
    if (times.size() > 1) times.erase(times.begin());  // the first step pays one-time costs
    std::sort(times.begin(), times.end());
    double median = times.empty() ? 0 : times[times.size() / 2];
    std::printf("%s\n", train_summary_json(losses, median, 0, {mem}).dump(2).c_str());
  } else {
    print_memory_report({mem});
  }
  check_stdout_written();  // train --json > FILE on a full disk is a failure, not an empty file
  return 0;
}

}  // namespace gp::runtime
