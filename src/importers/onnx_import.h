// ONNX import: reads a model exported by torch.onnx.export (opsets 7-17) into the IR, with a symbolic
// batch dimension and a loss appended. Supported operators and the mapping are listed in docs/onnx.md.
#pragma once
#include <string>

#include "ir/model.h"

namespace gp::importers {

/// Imports `path`. Throws UserError naming the file for a missing, corrupt, truncated or cyclic model,
/// and one listing every unsupported operator (with counts) when any node cannot be mapped: never a
/// partial graph. The result passes ir::validate; its outputs are the appended loss op(s).
ir::Model import_onnx(const std::string& path);

}  // namespace gp::importers
