// StageModule: the parameters and forward of a set of ops.
#include "runtime/exec/stage_module.h"

#include "ir/attrs.h"

#include <fmt/ranges.h>

#include <algorithm>
#include <set>

#include "runtime/exec/params.h"
#include "support/error.h"

namespace gp::runtime {

StageModule::StageModule(const ir::Graph& g, std::vector<OpId> ops, uint64_t seed,
                         const importers::ParamValues& initial, torch::Device device)
    : g_(&g), ops_(std::move(ops)), seed_(seed), device_(device) {
  std::sort(ops_.begin(), ops_.end());  // OpIds are a topological order
  ops_.erase(std::unique(ops_.begin(), ops_.end()), ops_.end());
  std::set<std::string> inside, external;
  std::unordered_map<std::string, int> shared_index;  // "op/param" -> shared parameter
  for (size_t k = 0; k < g.model().shared_params.size(); ++k)
    for (const std::string& use : g.model().shared_params[k].uses) shared_index.emplace(use, static_cast<int>(k));
  for (OpId id : ops_) {
    GP_ASSERT(id.valid() && static_cast<size_t>(id.v) < g.num_ops(), "op id {} out of range", id.v);
    inside.insert(g.op(id).name);
  }
  for (OpId id : ops_) {
    const ir::Op& op = g.op(id);
    for (const std::string& in : op.inputs)
      if (!inside.count(in)) external.insert(in);
    std::vector<torch::Tensor> ps;
    std::vector<std::string> names;
    for (auto& [name, shape] : param_specs(g, id)) {
      ps.push_back(make_parameter(id, name, shape, initial, shared_index));
      names.push_back(name);
    }
    params_.push_back(std::move(ps));
    param_names_.push_back(std::move(names));
  }
  external_.assign(external.begin(), external.end());
  for (const std::string& out : g.model().outputs)
    if (inside.count(out)) losses_.push_back(out);
}

// A shared parameter is made once per stage, from its canonical use's initial value (the file's, or
// seeded by the canonical op and parameter names), so every holder starts from the same tensor.
torch::Tensor StageModule::make_parameter(OpId id, const std::string& name, const std::vector<int64_t>& shape,
                                          const importers::ParamValues& initial,
                                          const std::unordered_map<std::string, int>& shared_index) {
  const std::string key = g_->op(id).name + "/" + name;
  auto it = shared_index.find(key);
  if (it == shared_index.end()) {
    torch::Tensor t = initial_value(*g_, id, name, shape, seed_, initial).to(device_).requires_grad_(true);
    named_.emplace_back(key, t);
    return t;
  }
  const int k = it->second;
  const ir::SharedParam& sp = g_->model().shared_params[static_cast<size_t>(k)];
  GP_CHECK(shape == sp.shape, "{}: shared parameter \"{}\" has shape {}, but \"{}\" needs [{}]", g_->name(), sp.name,
           ir::shape_str(sp.shape), key, fmt::join(shape, ", "));
  for (auto& [idx, t] : shared_)
    if (idx == k) return t;
  const OpId canon = g_->shared_users(static_cast<size_t>(k)).front();
  torch::Tensor t = initial_value(*g_, canon, ir::split_use(sp.uses.front()).second, shape, seed_, initial)
                        .to(device_)
                        .requires_grad_(true);
  shared_.emplace_back(k, t);
  named_.emplace_back(sp.uses.front(), t);
  return t;
}

std::vector<torch::Tensor> StageModule::parameters() const {
  std::vector<torch::Tensor> out;
  for (const auto& [n, t] : named_) out.push_back(t);
  return out;
}

std::vector<std::pair<std::string, torch::Tensor>> StageModule::named_parameters() const { return named_; }

TensorMap StageModule::forward(const TensorMap& external, const MicroBatchInfo& info) const {
  TensorMap out;
  for (const std::string& name : external_) {
    auto it = external.find(name);
    if (it == external.end()) throw RuntimeFailure(fmt::format("stage forward: missing input tensor \"{}\"", name));
    if (it->second.dim() > 0 && it->second.size(0) != info.count)
      throw RuntimeFailure(fmt::format("stage forward: input \"{}\" has {} samples, micro-batch has {}", name,
                                       it->second.size(0), info.count));
  }
  std::vector<torch::Tensor> inputs;
  for (size_t i = 0; i < ops_.size(); ++i) {
    const ir::Op& op = g_->op(ops_[i]);
    inputs.clear();
    for (const std::string& in : op.inputs) {
      auto it = out.find(in);
      inputs.push_back(it != out.end() ? it->second : external.at(in));
    }
    out.emplace(op.name, run_op(*g_, ops_[i], inputs, params_[i], info, seed_));
  }
  return out;
}

std::vector<std::pair<std::string, int64_t>> StageModule::ignoring_labels() const {
  std::vector<std::pair<std::string, int64_t>> out;
  for (const std::string& l : losses_) {
    const ir::Op& op = g_->op(g_->find(l));
    if (op.kind == ir::OpKind::cross_entropy && op.attrs.is_object() && op.attrs.contains("ignore_index"))
      out.emplace_back(op.inputs.at(1), ir::attr_int(op, "ignore_index", std::nullopt, g_->name()));
  }
  return out;
}

torch::Tensor StageModule::scaled_loss(const TensorMap& outputs, const MicroBatchInfo& info,
                                       const TensorMap& external) const {
  torch::Tensor total;
  const double share = static_cast<double>(info.count) / static_cast<double>(info.mini_batch);
  for (const std::string& l : losses_) {
    double scale = share;
    const ir::Op& op = g_->op(g_->find(l));
    if (info.counted_labels && op.kind == ir::OpKind::cross_entropy && op.attrs.contains("ignore_index")) {
      auto it = info.counted_labels->find(op.inputs.at(1));
      auto labels = external.find(op.inputs.at(1));
      if (labels == external.end()) labels = outputs.find(op.inputs.at(1));
      if (it != info.counted_labels->end() && labels != outputs.end()) {
        const int64_t ignored = ir::attr_int(op, "ignore_index", std::nullopt, g_->name());
        const double mine = labels->second.ne(ignored).sum().item<double>();
        scale = it->second > 0 ? mine / static_cast<double>(it->second) : 0.0;
      }
    }
    torch::Tensor t = outputs.at(l) * scale;
    total = total.defined() ? total + t : t;
  }
  return total;
}

}  // namespace gp::runtime
