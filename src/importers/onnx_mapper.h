// Internal to the ONNX importer: the state of mapping a loaded Net to IR ops (onnx_import.cpp maps
// single nodes, onnx_patterns.cpp the multi-node patterns: attention blocks, layer norm, GELU, linear).
#pragma once
#include <map>
#include <optional>
#include <unordered_map>
#include <unordered_set>

#include "importers/onnx_graph.h"
#include "importers/onnx_import.h"

namespace gp::importers::onnx_detail {

/// Where an IR parameter's value comes from, recorded while mapping (cheap: names only); read by
/// import_onnx_weights, never while planning.
struct ParamSource {
  std::string op, param;        // IR op name and parameter name (runtime param_specs)
  std::string tensor;           // ONNX tensor in the weight slot: an initializer, possibly behind Transpose
  bool transpose = false;       // a 2-d [in, out] weight (MatMul, Gemm transB=0) -> [out, in]
  int64_t part = 0, parts = 1;  // rows [part*n/parts, (part+1)*n/parts) of dim 0 (packed Q/K/V in_proj)
  std::vector<int64_t> shape;   // the IR parameter's shape
  bool reshape = false;         // the same values read in the IR's shape (Conv1d's [co, ci, k] as [co, ci, 1, k])
  std::string error;            // set when the source is unknown; loading weights then fails with it
};

/// A parameter used as an operand (add / mul / concat): its tensor (an initializer or weight input;
/// behind an Expand over the batch for a class token) and the IR's per-sample shape, right-aligned
/// to the activation's rank.
struct ParamOperand {
  std::string tensor;
  ir::Shape shape;
};

struct Mapper {
  const Net& net;
  ir::Model model;
  std::unordered_map<std::string, std::string> producer_of;  // tensor -> IR op name
  std::unordered_map<std::string, std::string> alias;        // tensor -> tensor it equals (Identity)
  std::unordered_set<std::string> used_names;
  std::map<std::string, int> unsupported_ops;  // op type -> count
  std::vector<std::string> reasons;            // supported op types used in an unsupported way
  std::vector<std::string> shape_unknown;      // nodes whose output shape inference could not give
  std::vector<ParamSource> param_sources;      // every IR parameter, in op order then param_specs order
  // Graph outputs that are a loss the model computes itself (match_own_loss): ONNX tensor -> IR loss op.
  // No loss is appended for them, nor for the other outputs when there are any.
  std::map<std::string, std::string> own_losses;

  ir::Shape ir_shape(const std::string& tensor) const;
  /// True when the tensor's dim 0 is the batch and no other dim depends on the batch.
  bool batch_first(const std::string& tensor) const;
  /// Adds an op whose inputs are tensor names (resolved to IR names by finish()). The output shape is
  /// the tensor's inferred shape unless `shape` is given. Returns the IR op name.
  std::string emit(const std::string& name_hint, ir::OpKind kind, std::vector<std::string> in_tensors,
                   const std::string& out_tensor, Json attrs = Json::object(), const ir::Shape* shape = nullptr);
  void unsupported(const onnx::NodeProto& n, const std::string& why);
  void add_param(const std::string& op, const std::string& param, const std::string& tensor, std::vector<int64_t> shape,
                 bool transpose = false, int64_t part = 0, int64_t parts = 1);
  /// Q, K, V and output projections of an attention region (nodes), input x of width h.
  void attention_params(const std::string& op, const std::vector<int>& nodes, int64_t h);

  void match_patterns(std::vector<bool>& claimed);
  void map_node(int i);
  void map_slice(int i);
  void map_conv(int i);
  void map_conv1d(int i);
  void map_reduce(int i);
  void map_pad(int i);
  void map_clip(int i);
  void map_elementwise(int i);
  void map_concat(int i);
  /// `tensor` as a parameter operand of an op whose result has rank `rank`, or nothing.
  std::optional<ParamOperand> param_operand(const std::string& tensor, size_t rank) const;
  /// Add(token embedding, P) at node i (input `act` the embedding) with P a parameter [1, seq, dim]
  /// or [seq, dim], or Gather(table [max_len, dim], arange(seq)): learned positions, folded into
  /// the embedding op (`pos` parameter). False when it is not that.
  bool learned_positions(int i, int act);
  ir::Model finish();
};

/// Parameters read by several IR ops (one initializer behind several weight slots) become
/// model.shared_params (onnx_shared.cpp); UserError when the ops use it in different layouts.
/// Merges and folded copies are read as --ties / GRAPHPIPE_ONNX_TIES says; `report` (optional) gets
/// every decision.
void tie_shared_params(const Net& net, const std::vector<ParamSource>& sources, ir::Model& model,
                       OnnxImportReport* report = nullptr);

/// Prints "graphpipe: warning: PATH: TEXT" once per (path, what) and process, from rank 0 only.
void warn_once(const std::string& path, const std::string& what, const std::string& text);

/// Maps a loaded net to the IR (import_onnx); `sources`, when given, receives every IR parameter's source.
ir::Model map_net(const Net& net, std::vector<ParamSource>* sources, OnnxImportReport* report = nullptr);

}  // namespace gp::importers::onnx_detail
