// Internal (LibTorch): the parameters of each op kind (names, shapes) and their initial values: the
// model file's when given, else deterministic ones that depend only on (seed, op name, parameter
// name), so any plan and the single-process reference start alike. Include only from runtime .cpp files.
#pragma once
#include <torch/torch.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "importers/weights.h"
#include "ir/model.h"

namespace gp::runtime {

/// The parameters of one op kind: names in a fixed order and their shapes given the op's input
/// shapes (per-sample dims with the batch dim). Empty for parameter-free ops.
std::vector<std::pair<std::string, std::vector<int64_t>>> param_specs(const ir::Graph& g, OpId op);

/// The deterministic initial value of parameter `param` of op `op` (depends on seed, op name,
/// param name only). Linear/conv/attention weights: uniform(+-1/sqrt(fan_in)); biases likewise;
/// norm weights 1 and biases 0; embedding rows uniform(+-1/sqrt(dim)).
torch::Tensor init_parameter(const ir::Graph& g, OpId op, const std::string& param, const std::vector<int64_t>& shape,
                             uint64_t seed);

/// The initial value of parameter `param` of op `id`: the model file's (`initial`, key "op/param"; UserError
/// when its shape or size differs from `shape`), else init_parameter(seed).
torch::Tensor initial_value(const ir::Graph& g, OpId id, const std::string& param, const std::vector<int64_t>& shape,
                            uint64_t seed, const importers::ParamValues& initial);

/// UserError when a key of `initial` names no parameter of the graph (e.g. values for another model).
void check_initial_values(const ir::Graph& g, const importers::ParamValues& initial);

}  // namespace gp::runtime
