// Optimizer construction and access to the optimizer state (for checkpoint checksums).
#include "runtime/exec/optim.h"

#include <cmath>
#include <sstream>
#include <type_traits>

#include <fmt/ranges.h>

#include "support/error.h"

namespace gp::runtime {

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const std::string& name, std::vector<torch::Tensor> params,
                                                        double lr, double momentum) {
  GP_CHECK(std::isfinite(lr) && lr > 0, "--lr must be a positive finite number, found {}", lr);
  if (name == "sgd") {
    GP_CHECK(momentum >= 0 && momentum < 1, "--momentum must be in [0, 1), found {}", momentum);
    return std::make_unique<torch::optim::SGD>(std::move(params), torch::optim::SGDOptions(lr).momentum(momentum));
  }
  if (name == "adam") return std::make_unique<torch::optim::Adam>(std::move(params), torch::optim::AdamOptions(lr));
  throw UserError(fmt::format("--optimizer: unknown optimizer \"{}\" (valid: sgd, adam)", name));
}

std::string optimizer_kind(const torch::optim::Optimizer& opt) {
  if (dynamic_cast<const torch::optim::Adam*>(&opt)) return "adam";
  if (dynamic_cast<const torch::optim::SGD*>(&opt)) return "sgd";
  return "";
}

namespace {

/// The state of parameter `p`. LibTorch keys it by the parameter's TensorImpl: its address printed
/// to a string up to 1.13 (torch/optim/serialize.h), the pointer itself in 2.x.
template <class Map>
auto find_state(const Map& state, const torch::Tensor& p) {
  if constexpr (std::is_same_v<typename Map::key_type, std::string>) {
    std::ostringstream key;  // what c10::guts::to_string did
    key << p.unsafeGetTensorImpl();
    return state.find(key.str());
  } else {
    return state.find(static_cast<typename Map::key_type>(p.unsafeGetTensorImpl()));
  }
}

template <class Map>
void put_state(Map& state, const torch::Tensor& p, std::unique_ptr<torch::optim::OptimizerParamState> st) {
  if constexpr (std::is_same_v<typename Map::key_type, std::string>) {
    std::ostringstream key;
    key << p.unsafeGetTensorImpl();
    state[key.str()] = std::move(st);
  } else {
    state[static_cast<typename Map::key_type>(p.unsafeGetTensorImpl())] = std::move(st);
  }
}

}  // namespace

std::vector<std::pair<std::string, torch::Tensor>> optimizer_state_tensors(
    const torch::optim::Optimizer& opt, const std::vector<std::string>& param_names) {
  std::vector<std::pair<std::string, torch::Tensor>> out;
  size_t i = 0;
  for (const auto& group : opt.param_groups())
    for (const auto& p : group.params()) {
      std::string name = i < param_names.size() ? param_names[i] : fmt::format("param{}", i);
      ++i;
      auto it = find_state(opt.state(), p);
      if (it == opt.state().end()) continue;
      auto add = [&](const char* field, const torch::Tensor& t) {
        if (t.defined()) out.emplace_back(name + "#" + field, t);
      };
      if (const auto* a = dynamic_cast<const torch::optim::AdamParamState*>(it->second.get())) {
        add("step", torch::tensor({a->step()}, torch::kInt64));
        add("exp_avg", a->exp_avg());
        add("exp_avg_sq", a->exp_avg_sq());
        add("max_exp_avg_sq", a->max_exp_avg_sq());
      } else if (const auto* s = dynamic_cast<const torch::optim::SGDParamState*>(it->second.get())) {
        add("momentum_buffer", s->momentum_buffer());
      }
    }
  return out;
}

void set_optimizer_state(torch::optim::Optimizer& opt, const std::vector<std::string>& param_names,
                         const std::map<std::string, torch::Tensor>& state, const std::string& source) {
  const std::string kind = optimizer_kind(opt);
  size_t i = 0;
  for (auto& group : opt.param_groups())
    for (auto& p : group.params()) {
      GP_ASSERT(i < param_names.size(), "set_optimizer_state: {} names for more parameters", param_names.size());
      const std::string& name = param_names[i++];
      auto get = [&](const char* field, bool like_param) -> torch::Tensor {
        auto it = state.find(name + "#" + field);
        GP_CHECK(it != state.end(),
                 "{}: no optimizer state \"{}#{}\" for parameter {} (the checkpoint's other "
                 "parameters have state)",
                 source, name, field, name);
        GP_CHECK(!like_param || it->second.sizes() == p.sizes(),
                 "{}: optimizer state \"{}#{}\" has shape {} but the parameter has {}", source, name, field,
                 fmt::format("{}", fmt::join(it->second.sizes(), "x")), fmt::format("{}", fmt::join(p.sizes(), "x")));
        return it->second.detach().to(p.device(), it->second.scalar_type()).clone();
      };
      bool has = state.count(name + (kind == "adam" ? "#step" : "#momentum_buffer")) > 0;
      if (!has) continue;
      std::unique_ptr<torch::optim::OptimizerParamState> st;
      if (kind == "adam") {
        auto a = std::make_unique<torch::optim::AdamParamState>();
        a->step(get("step", false).to(torch::kCPU).item<int64_t>());
        a->exp_avg(get("exp_avg", true));
        a->exp_avg_sq(get("exp_avg_sq", true));
        if (state.count(name + "#max_exp_avg_sq")) a->max_exp_avg_sq(get("max_exp_avg_sq", true));
        st = std::move(a);
      } else {
        GP_ASSERT(kind == "sgd", "set_optimizer_state: unknown optimizer");
        auto s = std::make_unique<torch::optim::SGDParamState>();
        s->momentum_buffer(get("momentum_buffer", true));
        st = std::move(s);
      }
      put_state(opt.state(), p, std::move(st));
    }
}

}  // namespace gp::runtime
