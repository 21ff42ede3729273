// `graphpipe train`: real training with LibTorch, either pipelined from a plan (one worker process
// per device, spawned locally or started by torchrun/mpirun/srun) or as the single-process
// reference (--single). Also the hidden `graphpipe worker` subcommand the local launcher spawns.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>

#include "cli/command.h"
#include "runtime/launch/launcher.h"
#include "runtime/base/train.h"
#include "support/error.h"

namespace gp::cli {
namespace {

void add_train_options(CLI::App* c, runtime::TrainOptions& o) {
  c->add_option("--plan", o.plan_path, "Plan file (graphpipe.plan/1) to train with");
  c->add_option("--model", o.model_spec, "Model spec (with --single; overrides the plan's model_spec otherwise)");
  c->add_option("--batch", o.batch, "Mini-batch size (with --single)");
  c->add_option("--steps", o.steps, "Optimizer steps to run (in total, counting resumed ones)")->required();
  c->add_option("--seed", o.seed, "Seed of weights, data and dropout masks")
      ->check(CLI::Validator(
          [](std::string& v) { return v.rfind('-', 0) == 0 ? "must be >= 0, found " + v : std::string(); }, "S"))
      ->capture_default_str();
  c->add_option("--optimizer", o.optimizer, "adam | sgd (with momentum)")->capture_default_str();
  c->add_option("--lr", o.lr, "Learning rate")->capture_default_str();
  c->add_option("--momentum", o.momentum, "SGD momentum")->capture_default_str();
  // --log-file: the same, for launchers whose own options --log would abbreviate (torchrun: --log-dir).
  c->add_option("--log,--log-file", o.log_path, "Write one JSON object per step to this .jsonl file");
  c->add_option("--trace", o.trace_path,
                "Write the measured timeline (Chrome trace JSON) of the last step (--trace-steps: the last N)");
  c->add_option("--trace-steps", o.trace_steps, "Steps --trace covers, the last ones (their spread shows in Perfetto)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  c->add_option("--checkpoint-dir", o.checkpoint_dir, "Directory of per-worker checkpoints");
  c->add_option("--checkpoint-every", o.checkpoint_every, "Save every K steps (and at the end)")->capture_default_str();
  c->add_flag("--resume", o.resume, "Continue from the checkpoints in --checkpoint-dir");
  c->add_option("--timeout", o.timeout_s, "Seconds a worker waits for a peer before giving up")->capture_default_str();
  c->add_option("--schedule", o.schedule,
                "1f1b | gpipe | zb (zero bubble: split backward, deferred weight gradients); default: the plan's "
                "own schedule (1f1b for plans that record none)");
  c->add_option("--threads", o.threads, "Intra-op threads per worker")->capture_default_str();
  c->add_option("--device", o.device,
                "cpu, or cuda: each worker on GPU LOCAL_RANK % GPUs (one GPU shared by all when there is one)")
      ->capture_default_str();
  c->add_option("--comm", o.comm,
                "How stages exchange tensors: auto (NCCL when every rank has a GPU of its own, else Gloo), gloo "
                "(host memory; tags), nccl (GPU to GPU), gloo-pairs (NCCL's channels and message order over "
                "Gloo: tests that path on CPUs)")
      ->capture_default_str();
  c->add_option("--local-all-reduce", o.local_all_reduce,
                "How the Gloo ranks of a data-parallel stage on one host add their gradients: shm (through "
                "shared memory; Gloo where a group spans hosts) or gloo (loopback TCP, as before; 2.4 MB took "
                "5-10x longer on a 2-core VM). `graphpipe calibrate` measures shm")
      ->check(CLI::IsMember({"shm", "gloo"}))
      ->capture_default_str();
  c->add_option("--pin-cores", o.pin_cores,
                "auto: where every core of a host has a CPU worker with a stage, each worker runs on a core of "
                "its own (with Gloo's threads); off: the OS places them")
      ->check(CLI::IsMember({"auto", "off"}))
      ->capture_default_str();
  c->add_flag("--seeded-weights", o.seeded_weights,
              "Start every parameter from --seed, ignoring the weights stored in an ONNX model file");
  c->add_flag("--allow-nonfinite", o.allow_nonfinite,
              "Train on through a nan/inf loss or gradient (by default it stops with exit 1 naming the step, "
              "stage and op)");
  c->add_flag("--json", o.json, "Print a graphpipe.train/1 summary (losses, time, per-rank memory) on stdout");
  c->add_option("--memory-limit", o.memory_limit_gb,
                "Stop with exit 1 when a rank's measured tensor memory exceeds this many GB (0: no limit)")
      ->check(CLI::Validator(
          [](std::string& v) {
            try {
              double x = std::stod(v);
              return std::isfinite(x) && x >= 0 ? std::string() : "must be a finite number >= 0 GB, found " + v;
            } catch (const std::exception&) {
              return "must be a number of GB, found " + v;
            }
          },
          "GB"));
  c->add_option("--data", o.data_dir,
                "Train on NumPy data: DIR holds <input>.npy per model input (label.npy / target.npy for the "
                "appended loss), first dimension = sample");
  c->add_flag("--shuffle", o.shuffle, "With --data: visit the samples in a seeded random order, new each epoch");
  c->add_option("--eval-data", o.eval_data_dir, "Held-out NumPy data (as --data) for a forward-only loss/accuracy");
  c->add_option("--eval-every", o.eval_every, "Evaluate on --eval-data after every K-th step")->capture_default_str();
}

/// Exits with a worker's non-zero code without running static destructors under live threads.
void finish(int code) {
  if (code == 0) return;
  std::fflush(nullptr);
  std::_Exit(code);
}

Registrar reg(60, [](CLI::App& root) {
  auto opt = std::make_shared<runtime::TrainOptions>();
  auto* train = root.add_subcommand(
      "train",
      "Train with real tensors: --plan P spawns one local worker per device (or runs as one worker\n"
      "under torchrun/mpirun/srun); --single --model M --batch B is the one-process reference");
  add_train_options(train, *opt);
  train->add_flag("--single", opt->single, "One process, whole model, no pipeline (the reference)");
  train->callback([opt] {
    if (opt->single) {
      GP_CHECK(opt->plan_path.empty(), "train: --single and --plan exclude each other");
      finish(runtime::run_single(*opt));
      return;
    }
    GP_CHECK(!opt->plan_path.empty(), "train: needs --plan FILE, or --single --model SPEC --batch B");
    finish(runtime::run_pipeline(*opt));
  });

  auto wopt = std::make_shared<runtime::TrainOptions>();
  auto* worker = root.add_subcommand("worker", "");  // hidden: one pipeline worker (spawned by train)
  worker->group("");
  add_train_options(worker, *wopt);
  worker->callback([wopt] { finish(runtime::run_worker(*wopt)); });
});

}  // namespace
}  // namespace gp::cli
