// Optimizer construction and access to the optimizer state (for checkpoint checksums).
#include "runtime/exec/optim.h"

#include <cmath>
#include <sstream>
#include <type_traits>

#include <fmt/ranges.h>

#include "support/error.h"

namespace gp::runtime {

namespace {

/// The parameters of `group` that have a gradient, and those gradients.
struct WithGrad {
  std::vector<torch::Tensor> params, grads;
};
WithGrad with_grad(torch::optim::OptimizerParamGroup& group) {
  WithGrad w;
  for (auto& p : group.params())
    if (p.grad().defined()) {
      GP_ASSERT(!p.grad().is_sparse(), "optimizer: sparse gradient of a {} parameter", p.sizes());
      w.params.push_back(p);
      w.grads.push_back(p.grad());
    }
  return w;
}

/// One step() of a multi-tensor optimizer: the closure's loss (computed with gradients on; undefined
/// without a closure), then `update(options, params and gradients)` without gradients for each group
/// that has a parameter with a gradient.
template <class Options, class Update>
torch::Tensor step_groups(std::vector<torch::optim::OptimizerParamGroup>& groups,
                          const torch::optim::Optimizer::LossClosure& closure, Update update) {
  torch::NoGradGuard no_grad;
  torch::Tensor loss;
  if (closure) {
    at::AutoGradMode enable_grad(true);
    loss = closure();
  }
  for (auto& group : groups) {
    WithGrad w = with_grad(group);
    if (!w.params.empty()) update(static_cast<const Options&>(group.options()), w);
  }
  return loss;
}

template <class State>
State& state_of(ska::flat_hash_map<void*, std::unique_ptr<torch::optim::OptimizerParamState>>& states,
                const torch::Tensor& p) {
  return static_cast<State&>(*states.at(p.unsafeGetTensorImpl()));
}

/// torch::optim::SGD (momentum, no dampening, weight decay or Nesterov) with the update of all
/// parameters in a few multi-tensor (_foreach_) ops: on a GPU a handful of fused kernels where
/// LibTorch's loop launches three per parameter (PyTorch's Python SGD does the same on a GPU by
/// default). The same arithmetic in the same order: on the CPU, where _foreach_ ops loop over the
/// tensors, the results are LibTorch's bit for bit (runtime_exec_test checks). The state is
/// LibTorch's (SGDParamState), so checkpoints and optimizer_kind do not change.
class ForeachSgd final : public torch::optim::SGD {
 public:
  using SGD::SGD;
  torch::Tensor step(LossClosure closure) override {
    return step_groups<torch::optim::SGDOptions>(param_groups_, closure, [&](const auto& o, const WithGrad& w) {
      GP_ASSERT(o.dampening() == 0 && o.weight_decay() == 0 && !o.nesterov(), "ForeachSgd: unsupported options");
      std::vector<torch::Tensor> steps = w.grads, bufs, buf_grads;
      if (o.momentum() != 0) {
        for (size_t i = 0; i < w.params.size(); ++i) {
          void* key = w.params[i].unsafeGetTensorImpl();
          if (state_.find(key) == state_.end()) {  // the first step: the buffer is the gradient
            auto st = std::make_unique<torch::optim::SGDParamState>();
            st->momentum_buffer(torch::clone(w.grads[i]).detach());
            state_[key] = std::move(st);
          } else {
            bufs.push_back(state_of<torch::optim::SGDParamState>(state_, w.params[i]).momentum_buffer());
            buf_grads.push_back(w.grads[i]);
          }
          steps[i] = state_of<torch::optim::SGDParamState>(state_, w.params[i]).momentum_buffer();
        }
        if (!bufs.empty()) {
          torch::_foreach_mul_(bufs, o.momentum());
          torch::_foreach_add_(bufs, buf_grads, 1 - o.dampening());
        }
      }
      torch::_foreach_add_(w.params, steps, -1 * o.lr());
    });
  }
};

/// torch::optim::Adam (no weight decay, no AMSGrad) in multi-tensor ops, as ForeachSgd: LibTorch's
/// arithmetic and state (AdamParamState), about eight fused kernels a step on a GPU where the loop
/// launches eight per parameter.
class ForeachAdam final : public torch::optim::Adam {
 public:
  using Adam::Adam;
  torch::Tensor step(LossClosure closure) override {
    return step_groups<torch::optim::AdamOptions>(param_groups_, closure, [&](const auto& o, const WithGrad& w) {
      GP_ASSERT(o.weight_decay() == 0 && !o.amsgrad(), "ForeachAdam: unsupported options");
      const auto [beta1, beta2] = o.betas();
      std::vector<torch::Tensor> avgs, sqs;
      std::vector<at::Scalar> sqrt_bc2, step_sizes;  // per parameter: their step counts may differ
      for (const auto& p : w.params) {
        void* key = p.unsafeGetTensorImpl();
        if (state_.find(key) == state_.end()) {
          auto st = std::make_unique<torch::optim::AdamParamState>();
          st->step(0);
          st->exp_avg(torch::zeros_like(p, torch::MemoryFormat::Preserve));
          st->exp_avg_sq(torch::zeros_like(p, torch::MemoryFormat::Preserve));
          state_[key] = std::move(st);
        }
        auto& st = state_of<torch::optim::AdamParamState>(state_, p);
        st.step(st.step() + 1);
        const double bc1 = 1 - std::pow(beta1, static_cast<double>(st.step()));
        const double bc2 = 1 - std::pow(beta2, static_cast<double>(st.step()));
        avgs.push_back(st.exp_avg());
        sqs.push_back(st.exp_avg_sq());
        sqrt_bc2.emplace_back(std::sqrt(bc2));
        step_sizes.emplace_back(-(o.lr() / bc1));
      }
      torch::_foreach_mul_(avgs, beta1);
      torch::_foreach_add_(avgs, w.grads, 1 - beta1);
      torch::_foreach_mul_(sqs, beta2);
      torch::_foreach_addcmul_(sqs, w.grads, w.grads, 1 - beta2);
      std::vector<torch::Tensor> denoms = torch::_foreach_sqrt(sqs);
      torch::_foreach_div_(denoms, sqrt_bc2);
      torch::_foreach_add_(denoms, o.eps());
      torch::_foreach_addcdiv_(w.params, avgs, denoms, step_sizes);
    });
  }
};

}  // namespace

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const std::string& name, std::vector<torch::Tensor> params,
                                                        double lr, double momentum) {
  GP_CHECK(std::isfinite(lr) && lr > 0, "--lr must be a positive finite number, found {}", lr);
  if (name == "sgd") {
    GP_CHECK(momentum >= 0 && momentum < 1, "--momentum must be in [0, 1), found {}", momentum);
    return std::make_unique<ForeachSgd>(std::move(params), torch::optim::SGDOptions(lr).momentum(momentum));
  }
  if (name == "adam") return std::make_unique<ForeachAdam>(std::move(params), torch::optim::AdamOptions(lr));
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
