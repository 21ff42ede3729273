// Stage inputs from a Dataset and the evaluation sums (see data_feed.h).
#include "runtime/data/data_feed.h"

#include <algorithm>
#include <utility>

#include "ir/attrs.h"
#include "runtime/exec/device.h"
#include "runtime/exec/synthetic.h"
#include "support/error.h"

namespace gp::runtime {

RunData open_run_data(const TrainOptions& opt, const ir::Graph& g, bool check_values) {
  GP_CHECK(!opt.shuffle || !opt.data_dir.empty(), "--shuffle needs --data DIR");
  GP_CHECK(opt.eval_every >= 0, "--eval-every must be >= 0, found {}", opt.eval_every);
  GP_CHECK(opt.eval_data_dir.empty() || opt.eval_every > 0, "--eval-data needs --eval-every K (K >= 1)");
  GP_CHECK(opt.eval_every == 0 || !opt.eval_data_dir.empty(), "--eval-every needs --eval-data DIR");
  RunData d;
  if (!opt.data_dir.empty()) d.train = Dataset::open(opt.data_dir, g, "--data", check_values, opt.shuffle, opt.seed);
  if (!opt.eval_data_dir.empty()) d.eval = Dataset::open(opt.eval_data_dir, g, "--eval-data", check_values);
  return d;
}

namespace {

/// stage_inputs on the host: pinned where the stage is on a GPU (for a DeviceUpload).
TensorMap host_inputs(const StageModule& m, const MicroBatchInfo& info, const Dataset* data) {
  if (!data) return synthetic_external_inputs(m, info, /*on_host=*/true);
  TensorMap out;
  const auto& inputs = m.graph().model().inputs;
  const int64_t first = info.step * info.mini_batch + info.sample_begin;
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!std::binary_search(m.external_inputs().begin(), m.external_inputs().end(), inputs[i].name)) continue;
    std::vector<int64_t> shape(inputs[i].shape.begin(), inputs[i].shape.end());
    shape[0] = info.count;
    bool index = inputs[i].dtype == ir::DType::i64;
    torch::Tensor t = torch::empty(
        shape, torch::TensorOptions(index ? torch::kLong : torch::kFloat32).pinned_memory(m.device().is_cuda()));
    data->gather(static_cast<int>(i), first, info.count, t.data_ptr());
    out.emplace(inputs[i].name, t);
  }
  return out;
}

}  // namespace

TensorMap stage_inputs(const StageModule& m, const MicroBatchInfo& info, const Dataset* data) {
  return detail::DeviceUpload(host_inputs(m, info, data), m.device()).take();
}

namespace {

bool same_samples(const MicroBatchInfo& a, const MicroBatchInfo& b) {
  return a.sample_begin == b.sample_begin && a.count == b.count && a.mini_batch == b.mini_batch && a.step == b.step;
}

}  // namespace

InputPrefetcher::~InputPrefetcher() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void InputPrefetcher::serve(int threads) {
  // A new thread starts with OpenMP's default of one thread per core: LibTorch's ops here (synthetic
  // inputs' randn, matmul) ran on every core and their pool spun between calls (two workers on two
  // cores took 2x as long). It keeps the stage's count. A failure here (a device that cannot be made
  // current) fails every read and take() rethrows it, as std::async's future did; escaping the thread
  // it would end the process (std::terminate).
  std::exception_ptr setup_failed;
  try {
    torch::set_num_threads(threads);
    detail::make_current(m_.device());
  } catch (...) {
    setup_failed = std::current_exception();
  }
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return stop_ || request_.has_value(); });
    if (stop_) return;
    const MicroBatchInfo info = *request_;
    request_.reset();
    lock.unlock();
    std::optional<detail::DeviceUpload> got;
    std::exception_ptr failed;
    try {
      if (setup_failed) std::rethrow_exception(setup_failed);
      got.emplace(host_inputs(m_, info, data_), m_.device());
    } catch (...) {
      failed = std::current_exception();
    }
    lock.lock();
    ready_ = std::move(got);
    failed_ = failed;
    cv_.notify_all();
  }
}

TensorMap InputPrefetcher::take(const MicroBatchInfo& info, const std::optional<MicroBatchInfo>& next) {
  if (!ahead_) return stage_inputs(m_, info, data_);
  TensorMap out;
  bool hit = false;
  if (pending_info_) {  // the thread reads or has read pending_info_: wait for it
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return ready_.has_value() || failed_; });
    std::optional<detail::DeviceUpload> got = std::move(ready_);
    ready_.reset();
    const MicroBatchInfo asked = *std::exchange(pending_info_, std::nullopt);
    if (std::exception_ptr f = std::exchange(failed_, nullptr)) std::rethrow_exception(f);  // a failed read
    hit = same_samples(asked, info);
    if (hit) out = got->take();
  }
  if (!hit) out = stage_inputs(m_, info, data_);
  if (next) {
    if (!thread_.joinable()) thread_ = std::thread([this, threads = torch::get_num_threads()] { serve(threads); });
    {
      std::lock_guard<std::mutex> lock(mu_);
      request_ = *next;
    }
    pending_info_ = next;
    cv_.notify_all();
  }
  return out;
}

namespace {

const torch::Tensor& lookup(const TensorMap& outs, const TensorMap& ext, const std::string& name) {
  auto it = outs.find(name);
  if (it != outs.end()) return it->second;
  auto jt = ext.find(name);
  GP_ASSERT(jt != ext.end(), "evaluation: no tensor \"{}\" on this stage", name);
  return jt->second;
}

}  // namespace

void add_eval_sums(const StageModule& m, const TensorMap& ext, const TensorMap& outs, const MicroBatchInfo& info,
                   int64_t n_eval, EvalSums& sums) {
  if (m.loss_ops().empty()) return;
  torch::NoGradGuard no_grad;
  const ir::Graph& g = m.graph();
  const int64_t first = info.step * info.mini_batch + info.sample_begin;
  const int64_t counted = std::clamp<int64_t>(n_eval - first, 0, info.count);
  if (counted == 0) return;
  sums.samples += static_cast<double>(counted);
  for (const std::string& name : m.loss_ops()) {
    const ir::Op& op = g.op(g.find(name));
    torch::Tensor pred = lookup(outs, ext, op.inputs.at(0)).narrow(0, 0, counted);
    torch::Tensor target = lookup(outs, ext, op.inputs.at(1)).narrow(0, 0, counted);
    if (op.kind == ir::OpKind::cross_entropy) {
      // Per sample: the mean over its positions (one for [B, C] logits), as the training loss.
      const double positions = static_cast<double>(target.numel()) / static_cast<double>(counted);
      sums.loss += torch::nn::functional::cross_entropy(
                       pred, target,
                       torch::nn::functional::CrossEntropyFuncOptions()
                           .reduction(torch::kSum)
                           .ignore_index(ir::attr_int(op, "ignore_index", -100, g.name()))
                           .label_smoothing(ir::attr_num(op, "label_smoothing", 0.0, g.name())))
                       .item<double>() /
                   positions;
      sums.correct += pred.argmax(1).eq(target).sum().item<double>() / positions;
      sums.classified += static_cast<double>(counted);
    } else if (op.kind == ir::OpKind::mse_loss) {
      sums.loss += (pred - target).pow(2).reshape({counted, -1}).mean(1).sum().item<double>();
    } else if (op.kind == ir::OpKind::bce_with_logits) {
      sums.loss += torch::binary_cross_entropy_with_logits(pred, target, {}, {}, at::Reduction::None)
                       .reshape({counted, -1})
                       .mean(1)
                       .sum()
                       .item<double>();
    } else {
      throw UserError(fmt::format("--eval-data: loss op \"{}\" of kind {} has no per-sample loss to evaluate", name,
                                  ir::to_string(op.kind)));
    }
  }
}

std::string eval_line(int64_t step, const EvalSums& s) {
  std::string acc = s.classified > 0 ? fmt::format(" accuracy {:.4f}", s.correct / s.classified) : "";
  return fmt::format("eval after step {}: loss {:.6f}{} ({} samples)", step, s.loss / s.samples, acc,
                     static_cast<int64_t>(s.samples));
}

EvalSums evaluate_module(const StageModule& m, const Dataset& eval, int64_t batch) {
  torch::NoGradGuard no_grad;
  EvalSums s;
  for (int64_t j = 0; j < eval_batches(eval.size(), batch); ++j) {
    MicroBatchInfo info{0, batch, batch, j, /*train=*/false};
    TensorMap ext = stage_inputs(m, info, &eval);
    add_eval_sums(m, ext, m.forward(ext, info), info, eval.size(), s);
  }
  return s;
}

std::string step_text(const StepReport& r) {
  std::string s = fmt::format("step {} loss {:.6f} time {:.3f} s", r.step, r.loss, r.time_s);
  if (r.data) s += fmt::format(" epoch {} data {:.4f} s", r.data->epoch_of(r.step * r.batch), r.data_s);
  return s;
}

Json step_json(const StepReport& r) {
  Json j{{"step", r.step}, {"loss", r.loss}, {"step_time_s", r.time_s}};
  if (r.data) {
    j["epoch"] = r.data->epoch_of(r.step * r.batch);
    j["data_time_s"] = r.data_s;
  }
  if (r.eval) {
    j["eval_loss"] = r.eval->loss / r.eval->samples;
    if (r.eval->classified > 0) j["eval_accuracy"] = r.eval->correct / r.eval->classified;
  }
  return j;
}

}  // namespace gp::runtime
