// Initial parameter values taken from a model file (torch-free): the ONNX importer maps the file's
// initializers to the IR ops' parameters (names, shapes and order as the runtime's param_specs:
// linear weight [out, in] + bias, conv2d weight [co, ci, k, k] + bias, layernorm / batchnorm weight +
// bias, attention wq, bq, wk, bk, wv, bv, wo, bo). See docs/onnx.md ("Weights").
#pragma once
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

namespace gp::ir {
struct Model;
}

namespace gp::importers {

/// A dense float32 tensor, row-major.
struct ParamValue {
  std::vector<int64_t> shape;
  std::vector<float> data;
};

/// Key "op/param", e.g. "head_3/weight" (the runtime's StageModule::named_parameters names).
using ParamValues = std::unordered_map<std::string, ParamValue>;

/// The parameter values of `path` (an ONNX file), keyed by IR op / parameter name, for every IR
/// parameter whose source tensors are initializers (a model exported with export_params=False has
/// none: the result is empty). Float16, bfloat16 and double initializers are converted to float;
/// raw_data and the typed fields are both read. UserError naming the file, initializer and op when an
/// initializer's size does not fit the parameter or its values cannot be read. With `model`, also
/// returns the imported model (import_onnx's result) from the same pass over the file.
ParamValues import_onnx_weights(const std::string& path, ir::Model* model = nullptr);

}  // namespace gp::importers
