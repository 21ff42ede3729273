// ONNX import: reads a model exported by torch.onnx.export (opsets 7-21; 18-21 read as 17, onnx_opset.cpp) into the IR, with a symbolic
// batch dimension and a loss appended. Supported operators and the mapping are listed in docs/onnx.md.
#pragma once
#include <optional>
#include <string>
#include <vector>

#include "ir/model.h"

namespace gp::importers {

/// One initializer whose sharing the file may not state exactly, and what the importer made of it
/// (docs/onnx.md, "Default exports and ties").
struct OnnxSharedNote {
  std::string initializer;         // the tensor in the file
  std::vector<std::string> names;  // the other names it stands for (Identity outputs, a folded copy)
  std::string kind;                // "tie" | "merged" (Identity) | "transposed copy" | "named tie" (graphpipe.export)
  bool trained_as_one = false;     // the decision
};

/// An in-place dropout in training mode that the dynamo exporter wrote as x * bernoulli(1 - p) / (1 - p),
/// read back as dropout(p) (docs/onnx.md, "torch 2.x's default exporter").
struct RecoveredDropout {
  std::string op;      // the IR op ("/4/node_mul_31": the Mul it was written as)
  std::string module;  // the module it ran in ("4"; empty at the top)
  double p = 0;        // the drop probability
};

/// What the importer recovered from a torch 2.x dynamo export's metadata (docs/onnx.md, "Default
/// exports and ties"): each entry a PyTorch parameter name (folded values: "name [shape]").
struct DynamoRecovery {
  std::vector<std::string> restored_biases;   // all-zero biases the optimizer dropped: zero parameters again
  std::vector<std::string> unfolded_weights;  // weights it stored transposed, read back in PyTorch's layout
  std::vector<std::string> folded_values;     // values computed from parameters, trained as parameters
  // tables whose lookup by a constant index it folded (Swin's relative-position bias), read back
  std::vector<std::string> ungathered_tables;
  std::vector<RecoveredDropout> recovered_dropouts;
};

/// What `import_onnx` decided about parameters: how ties were read (GRAPHPIPE_ONNX_TIES / --ties, or
/// "exact" for a file graphpipe.export wrote), every shared initializer, and the parameters that
/// arrive as graph inputs without values (export_params=False).
struct OnnxImportReport {
  std::string ties_mode;
  std::vector<OnnxSharedNote> shared;
  std::vector<std::string> without_values;
  std::optional<DynamoRecovery> dynamo;  // set for a dynamo export
};

/// Imports `path`. Throws UserError naming the file for a missing, corrupt, truncated or cyclic model,
/// and one listing every unsupported operator (with counts) when any node cannot be mapped: never a
/// partial graph. The result passes ir::validate; its outputs are the appended loss op(s).
ir::Model import_onnx(const std::string& path, OnnxImportReport* report = nullptr);

}  // namespace gp::importers
