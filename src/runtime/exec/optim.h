// Optimizers (SGD with momentum, Adam), shared by run_single and the pipeline workers; the
// checkpoint functions live in checkpoint/checkpoint.h.
#pragma once
#include <torch/torch.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

namespace gp::runtime {

/// "sgd" (momentum, no dampening) or "adam" (betas 0.9/0.999, eps 1e-8); UserError otherwise.
std::unique_ptr<torch::optim::Optimizer> make_optimizer(const std::string& name, std::vector<torch::Tensor> params,
                                                        double lr, double momentum);

/// "adam" or "sgd" for an optimizer make_optimizer built ("" for any other).
std::string optimizer_kind(const torch::optim::Optimizer& opt);

/// The optimizer state a checkpoint restores, as named tensors in a fixed order (for checkpoint
/// checksums): per parameter (Adam: step, exp_avg, exp_avg_sq[, max_exp_avg_sq]; SGD:
/// momentum_buffer), named "<param name>#<field>" after `param_names`; parameters without state
/// yet are skipped. (Hyper-parameters are saved too but LibTorch does not load them: this run's
/// --lr etc. apply.)
std::vector<std::pair<std::string, torch::Tensor>> optimizer_state_tensors(const torch::optim::Optimizer& opt,
                                                                           const std::vector<std::string>& param_names);

/// The reverse of optimizer_state_tensors: gives each parameter of `opt` (named `param_names`, in
/// order) the state `state` holds under "<param name>#<field>" (copied to the parameter's device),
/// for loading a checkpoint by parameter name (resharding). A parameter without entries keeps no
/// state (no step taken yet). UserError naming `source` and the tensor when one is missing or its
/// shape differs from the parameter's.
void set_optimizer_state(torch::optim::Optimizer& opt, const std::vector<std::string>& param_names,
                         const std::map<std::string, torch::Tensor>& state, const std::string& source);

}  // namespace gp::runtime
