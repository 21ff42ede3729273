// Resolving a `--model SPEC`: a model file (*.json, *.onnx) or a builtin spec ("mmt:layers=2").
#pragma once
#include <string>

#include "importers/weights.h"
#include "ir/model.h"

namespace gp::importers {

/// `*.json` -> read_model_json; `*.onnx` -> the ONNX importer; anything else -> a builtin spec.
ir::Model load_model(const std::string& spec);

/// load_model + ir::Graph::build, with errors prefixed by the spec.
ir::Graph load_graph(const std::string& spec);

/// Initial parameter values stored in the model file: `*.onnx` -> import_onnx_weights (empty for a
/// file exported without weights); builtins and JSON models carry none (empty). Only the runtime asks
/// for them; planning never reads the weights.
ParamValues load_weights(const std::string& spec);

/// load_graph and load_weights in one pass over the file (what training needs).
ir::Graph load_graph(const std::string& spec, ParamValues& weights);

}  // namespace gp::importers
