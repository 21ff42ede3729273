// Internal (LibTorch): feeding a stage from a Dataset (train --data) instead of synthetic data, and
// the forward-only evaluation sums (--eval-data). Shared by run_single and the pipeline workers.
#pragma once
#include <condition_variable>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "runtime/data/dataset.h"
#include "runtime/exec/device.h"
#include "runtime/exec/stage_module.h"
#include "runtime/base/train.h"
#include "support/json.h"

namespace gp::runtime {

/// The datasets of a run (null when synthetic / no evaluation), opened and checked from `opt`
/// (--data, --shuffle, --seed, --eval-data, --eval-every). `check_values` scans index and label
/// files for values outside their range (once per run: the launcher or --single does it).
struct RunData {
  std::shared_ptr<const Dataset> train, eval;
};
RunData open_run_data(const TrainOptions& opt, const ir::Graph& g, bool check_values);

/// Graph inputs the stage reads (external_inputs that are graph inputs), for one micro-batch:
/// rows of `data` at global positions info.step * info.mini_batch + [sample_begin, +count) when
/// `data` is given, else synthetic_external_inputs. Only this stage's inputs and this replica's
/// rows are read.
TensorMap stage_inputs(const StageModule& m, const MicroBatchInfo& info, const Dataset* data);

/// Reads a stage's data one micro-batch ahead on a background thread, so that reading overlaps the
/// previous micro-batch's compute: take(info, next) returns the inputs of `info` (prefetched when
/// the last call announced it, else read now) and starts reading `next`. Synthetic data (no
/// dataset) is made ahead the same way where `spare_core` (this host has more cores than ranks with
/// a stage), else on the spot: made ahead it sped a 1-worker step on 2 cores up by 5-8% and slowed
/// two workers on 2 cores by 7-12%, measured interleaved (issue 35). One thread serves the whole
/// run: a thread started per micro-batch (std::async until 2026-12-04) cost a 1-worker plan of
/// 2-sample micro-batches 8% of its step on a 2-core Xeon (45.7-46.0 ms against 42.0-42.4 made on the
/// spot).
class InputPrefetcher {
 public:
  InputPrefetcher(const StageModule& m, const Dataset* data, bool spare_core)
      : m_(m), data_(data), ahead_(data != nullptr || spare_core) {}
  ~InputPrefetcher();
  InputPrefetcher(const InputPrefetcher&) = delete;
  InputPrefetcher& operator=(const InputPrefetcher&) = delete;

  TensorMap take(const MicroBatchInfo& info, const std::optional<MicroBatchInfo>& next);

 private:
  void serve(int threads);  // the background thread: reads each request until stop_

  const StageModule& m_;
  const Dataset* data_;
  bool ahead_;
  std::optional<MicroBatchInfo> pending_info_;  // what the thread reads (or has read) ahead

  std::mutex mu_;
  std::condition_variable cv_;
  std::optional<MicroBatchInfo> request_;      // for the thread; cleared when it starts reading
  std::optional<detail::DeviceUpload> ready_;  // its result
  std::exception_ptr failed_;                  // or its failure, rethrown by take()
  bool stop_ = false;
  std::thread thread_;  // started by the first read ahead
};

/// Forward-only sums over evaluation samples: per-sample loss of every loss op (summed over loss
/// ops, as the training loss), and for cross_entropy losses the argmax hits.
struct EvalSums {
  double loss = 0;        // sum over counted samples of the per-sample loss
  double correct = 0;     // cross_entropy: samples whose argmax(logits) is the label (per position: the fraction)
  double samples = 0;     // counted samples
  double classified = 0;  // counted samples x cross_entropy ops (the accuracy's denominator)
};

/// Adds the sums of the stage's loss ops for one evaluation micro-batch: samples whose global
/// position (info.step * info.mini_batch + index) is below `n_eval` count, the wrapped padding
/// of the last batch does not. `ext` and `outs` are the stage's inputs and forward outputs.
void add_eval_sums(const StageModule& m, const TensorMap& ext, const TensorMap& outs, const MicroBatchInfo& info,
                   int64_t n_eval, EvalSums& sums);

/// Evaluation mini-batches for a set of `n_eval` samples with mini-batch `batch` (the last one is
/// padded with wrapped samples that do not count).
inline int64_t eval_batches(int64_t n_eval, int64_t batch) { return (n_eval + batch - 1) / batch; }

/// "eval after step K: loss L accuracy A (N samples)" (accuracy only for classifiers).
std::string eval_line(int64_t step, const EvalSums& s);

/// The evaluation of a whole stage module (--single) on `eval` in mini-batches of `batch`.
EvalSums evaluate_module(const StageModule& m, const Dataset& eval, int64_t batch);

/// What one step reports (the printed line and the --log record).
struct StepReport {
  int64_t step = 0;
  double loss = 0, time_s = 0;
  const Dataset* data = nullptr;  // with --data: the epoch and the data-loading time
  int64_t batch = 0;
  double data_s = 0;               // seconds spent reading data this step (max over ranks)
  const EvalSums* eval = nullptr;  // when the step ended with an evaluation
};
/// "step K loss L time T s" (+ " epoch E data D s" with --data).
std::string step_text(const StepReport& r);
/// {"step", "loss", "step_time_s"} (+ "epoch", "data_time_s"; + "eval_loss", "eval_accuracy").
Json step_json(const StepReport& r);

}  // namespace gp::runtime
