// `graphpipe train --single`: the single-process reference (whole model, one micro-batch per step).
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>

#include "importers/resolve.h"
#include "runtime/checkpoint_manifest.h"
#include "runtime/detail/data_feed.h"
#include "runtime/detail/divergence.h"
#include "runtime/detail/executor.h"
#include "runtime/detail/optim.h"
#include "runtime/launcher.h"
#include "runtime/train.h"
#include "support/error.h"
#include "support/json.h"
#include "support/memory.h"

namespace gp::runtime {

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

namespace {

/// One optimizer step of the whole model on mini-batch `step`; returns the loss and sets
/// `data_s` to the seconds the step waited for its batch.
double train_step(const TrainOptions& opt, StageModule& m, torch::optim::Optimizer& optim, InputPrefetcher& feed,
                  int64_t step, double& data_s) {
  optim.zero_grad();
  MicroBatchInfo info{0, opt.batch, opt.batch, step};
  std::optional<MicroBatchInfo> next;
  if (step + 1 < opt.steps) next = MicroBatchInfo{0, opt.batch, opt.batch, step + 1};
  auto t0 = std::chrono::steady_clock::now();
  TensorMap ins = feed.take(info, next);  // and starts reading the next step's batch
  data_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  TensorMap outs = m.forward(ins, info);
  torch::Tensor loss = m.scaled_loss(outs, info);
  GP_CHECK(loss.defined(), "{}: the model has no loss output", opt.model_spec);
  double loss_v = loss.item<double>();
  if (!opt.allow_nonfinite) check_loss_finite(loss_v, m, ins, outs, {step, -1});
  loss.backward();
  if (!opt.allow_nonfinite) check_gradients_finite(m, {step, -1});
  optim.step();
  return loss_v;
}

}  // namespace

int run_single(const TrainOptions& opt) {
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
  torch::set_num_threads(opt.threads);

  // Weights stored in the model file (ONNX initializers) when it has them, else seeded.
  importers::ParamValues weights;
  ir::Graph g = importers::load_graph(opt.model_spec, weights);
  if (opt.seeded_weights) weights.clear();
  check_initial_values(g, weights);
  const RunData data = open_run_data(opt, g, /*check_values=*/true);
  check_fits_in_memory(training_bytes_estimate(g, g.op_ids(), opt.batch, opt.optimizer),
                       fmt::format("train --single of {} with --batch {}", g.name(), opt.batch),
                       "parameters, gradients, optimizer state and one batch of activations");
  StageModule m(g, g.op_ids(), opt.seed, weights);
  auto optim = make_optimizer(opt.optimizer, m.parameters(), opt.lr, opt.momentum);
  InputPrefetcher feed(m, data.train.get());

  const std::string ckpt = opt.checkpoint_dir.empty() ? "" : checkpoint_path(opt.checkpoint_dir, -1, 0);
  const Json identity = single_identity(g, opt.batch, opt.optimizer);
  int64_t first = 0;
  if (opt.resume) {
    first = load_checkpoint(ckpt, m, *optim, identity);
    std::printf("resumed from %s after %lld steps\n", ckpt.c_str(), static_cast<long long>(first));
  }
  std::ofstream log;
  if (!opt.log_path.empty()) {
    log.open(opt.log_path, opt.resume ? std::ios::app : std::ios::trunc);
    GP_CHECK(log.good(), "--log: cannot open {} for writing", opt.log_path);
  }

  const int64_t b = opt.batch;
  for (int64_t step = first; step < opt.steps; ++step) {
    auto t0 = std::chrono::steady_clock::now();
    double data_s = 0;
    double loss_v = train_step(opt, m, *optim, feed, step, data_s);
    double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    StepReport rep{step, loss_v, dt, data.train.get(), b, data_s, nullptr};
    std::printf("%s\n", step_text(rep).c_str());
    EvalSums ev;
    if (data.eval && (step + 1) % opt.eval_every == 0) {
      ev = evaluate_module(m, *data.eval, b);
      rep.eval = &ev;
      std::printf("%s\n", eval_line(step, ev).c_str());
    }
    std::fflush(stdout);
    if (log.is_open()) {
      log << step_json(rep).dump() << "\n";
      log.flush();
    }
    bool last = step + 1 == opt.steps;
    if (!ckpt.empty() && (last || (opt.checkpoint_every > 0 && (step + 1) % opt.checkpoint_every == 0)))
      save_checkpoint(ckpt, m, *optim, step + 1, identity);
  }
  return 0;
}

}  // namespace gp::runtime
