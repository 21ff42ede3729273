// The builtin model zoo: parametric multi-branch models (mmt, dlrm, candle-uno, inception) and a
// sequential one (gpt), built as ir::Model values from a spec like "mmt:branches=2,layers=2".
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "ir/model.h"

namespace gp::models {

struct ParamInfo {
  std::string name;
  int64_t default_value = 0;
  std::string help;
};

struct ModelInfo {
  std::string name;
  std::string description;
  std::vector<ParamInfo> params;
};

/// Every builtin with its parameters and defaults, in listing order.
const std::vector<ModelInfo>& builtin_models();

/// True when `name` (the part of a spec before ':') names a builtin.
bool is_builtin(const std::string& name);

/// A parsed builtin spec: the model name and every parameter (defaults filled in).
struct BuiltinSpec {
  std::string model;
  std::map<std::string, int64_t> params;
  /// "mmt" at defaults, else "mmt:k=v,..." listing the non-default parameters in declared order.
  std::string canonical() const;
  int64_t operator[](const std::string& p) const { return params.at(p); }
};

/// Parses "name" or "name:k=v,k=v". Unknown model or parameter, a repeated parameter, or a value
/// that is not a positive integer throws UserError listing the valid names.
BuiltinSpec parse_builtin_spec(const std::string& spec);

/// Builds a builtin from its spec; also checks cross-parameter constraints (heads | hidden, ...).
/// Every model ends in exactly one loss op (named "loss") whose target is a graph input.
ir::Model build_builtin(const std::string& spec);
ir::Model build_builtin(const BuiltinSpec& spec);

}  // namespace gp::models
