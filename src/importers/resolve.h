// Resolving a `--model SPEC`: a model file (*.json, *.onnx) or a builtin spec ("mmt:layers=2").
#pragma once
#include <string>

#include "ir/model.h"

namespace gp::importers {

/// `*.json` -> read_model_json; `*.onnx` -> the ONNX importer; anything else -> a builtin spec.
ir::Model load_model(const std::string& spec);

/// load_model + ir::Graph::build, with errors prefixed by the spec.
ir::Graph load_graph(const std::string& spec);

}  // namespace gp::importers
