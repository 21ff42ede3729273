// Non-finite loss and gradient checks (see divergence.h).
#include "runtime/exec/divergence.h"

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "support/error.h"

namespace gp::runtime {
namespace {

std::string place(StepPlace w) {
  if (w.stage < 0) return fmt::format("step {}, stage 0 (--single: the whole model)", w.step);
  return fmt::format("step {}, stage {}", w.step, w.stage);
}

bool all_finite(const torch::Tensor& t) {
  if (!t.defined() || !torch::isFloatingType(t.scalar_type())) return true;
  return torch::isfinite(t.detach()).all().item<bool>();
}

constexpr const char* kHint = "; stopped (--allow-nonfinite trains on)";

}  // namespace

void check_loss_finite(double loss, const StageModule& m, const TensorMap& inputs, const TensorMap& outputs,
                       StepPlace where) {
  if (std::isfinite(loss)) return;
  const ir::Graph& g = m.graph();
  std::string losses;
  for (const std::string& l : m.loss_ops()) {
    auto it = outputs.find(l);
    if (it != outputs.end() && !all_finite(it->second)) losses += (losses.empty() ? "'" : ", '") + l + "'";
  }
  std::string origin;
  for (const std::string& name : m.external_inputs()) {
    auto it = inputs.find(name);
    if (it != inputs.end() && !all_finite(it->second)) {
      origin = fmt::format("; its input '{}' (received from another stage) is already non-finite", name);
      break;
    }
  }
  for (size_t i = 0; origin.empty() && i < m.ops().size(); ++i) {
    const std::string& name = g.op(m.ops()[i]).name;
    auto it = outputs.find(name);
    if (it != outputs.end() && !all_finite(it->second))
      origin = fmt::format("; the first non-finite value of the forward pass is the output of op '{}' ({})", name,
                           ir::to_string(g.op(m.ops()[i]).kind));
  }
  throw RuntimeFailure(fmt::format("non-finite loss ({}) at {}, loss op {}{}{}", loss, place(where),
                                   losses.empty() ? "?" : losses, origin, kHint));
}

torch::Tensor gradient_probe(const StageModule& m) {
  std::vector<torch::Tensor> grads;
  for (const auto& p : m.parameters())
    if (p.grad().defined()) grads.push_back(p.grad());
  if (grads.empty()) return {};
  torch::NoGradGuard no_grad;
  // On a GPU a handful of fused multi-tensor kernels, where a sum per parameter was one launch each.
  return torch::stack(torch::_foreach_norm(grads)).sum();
}

void check_gradients_finite(const StageModule& m, StepPlace where) {
  const torch::Tensor probe = gradient_probe(m);
  if (probe.defined()) check_gradients_finite(m, where, probe.item<double>());
}

void check_gradients_finite(const StageModule& m, StepPlace where, double probe) {
  if (std::isfinite(probe)) return;
  for (const auto& [n, p] : m.named_parameters()) {
    const torch::Tensor& gr = p.grad();
    if (!gr.defined() || all_finite(gr)) continue;
    int64_t nan = torch::isnan(gr).sum().item<int64_t>();
    int64_t inf = torch::isinf(gr).sum().item<int64_t>();
    auto slash = n.rfind('/');
    std::string op = slash == std::string::npos ? n : n.substr(0, slash);
    std::string param = slash == std::string::npos ? "" : n.substr(slash + 1);
    throw RuntimeFailure(
        fmt::format("non-finite gradient at {}, op '{}' parameter '{}': {} nan and {} inf of {} "
                    "values{}",
                    place(where), op, param, nan, inf, gr.numel(), kHint));
  }
}

void poison_first_gradient(const StageModule& m) {
  torch::NoGradGuard no_grad;
  for (auto p : m.parameters()) {
    if (!p.grad().defined()) p.mutable_grad() = torch::zeros_like(p);
    torch::Tensor& gr = p.mutable_grad();
    if (gr.is_contiguous() && gr.scalar_type() == torch::kFloat && gr.numel() > 0)
      gr.view({-1}).narrow(0, 0, 1).fill_(std::numeric_limits<float>::quiet_NaN());  // on any device
    else gr.fill_(std::numeric_limits<double>::quiet_NaN());
    return;
  }
}

}  // namespace gp::runtime
