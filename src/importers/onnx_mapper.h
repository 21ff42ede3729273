// Internal to the ONNX importer: the state of mapping a loaded Net to IR ops (onnx_import.cpp maps
// single nodes, onnx_patterns.cpp the multi-node patterns: attention blocks, layer norm, GELU, linear).
#pragma once
#include <map>
#include <unordered_map>
#include <unordered_set>

#include "importers/onnx_graph.h"

namespace gp::importers::onnx_detail {

struct Mapper {
  const Net& net;
  ir::Model model;
  std::unordered_map<std::string, std::string> producer_of;  // tensor -> IR op name
  std::unordered_map<std::string, std::string> alias;        // tensor -> tensor it equals (Identity)
  std::unordered_set<std::string> used_names;
  std::map<std::string, int> unsupported_ops;  // op type -> count
  std::vector<std::string> reasons;            // supported op types used in an unsupported way
  std::vector<std::string> shape_unknown;      // nodes whose output shape inference could not give

  ir::Shape ir_shape(const std::string& tensor) const;
  /// True when the tensor's dim 0 is the batch and no other dim depends on the batch.
  bool batch_first(const std::string& tensor) const;
  /// Adds an op whose inputs are tensor names (resolved to IR names by finish()). The output shape is
  /// the tensor's inferred shape unless `shape` is given. Returns the IR op name.
  std::string emit(const std::string& name_hint, ir::OpKind kind, std::vector<std::string> in_tensors,
                   const std::string& out_tensor, Json attrs = Json::object(), const ir::Shape* shape = nullptr);
  void unsupported(const onnx::NodeProto& n, const std::string& why);

  void match_patterns(std::vector<bool>& claimed);
  void map_node(int i);
  void map_slice(int i);
  ir::Model finish();
};

}  // namespace gp::importers::onnx_detail
