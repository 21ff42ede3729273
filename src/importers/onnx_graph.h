// Internal to the ONNX importer: a loaded ONNX graph with concrete shapes (batch = kProbeBatch),
// folded constant values and activation/parameter classification, shared by the loader and the mapper.
#pragma once
#include <onnx/onnx_pb.h>

#include <map>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "importers/onnx_import.h"
#include "ir/model.h"

namespace gp::importers::onnx_detail {

/// The batch size substituted for the symbolic batch dimension while shapes are inferred. A prime no
/// real dimension is a multiple of: a dim equal to k * kProbeBatch depends on the batch.
inline constexpr int64_t kProbeBatch = 999983;

struct TensorInfo {
  std::optional<std::vector<int64_t>> shape;  // concrete (batch = kProbeBatch); unset when unknown
  int elem_type = 0;                          // onnx::TensorProto_DataType
  bool activation = false;                    // depends on a data input's values
  bool param = false;                         // a trainable parameter (initializer or weight input)
  // Known values of a small constant or a folded shape computation (integers exact in `ints`).
  std::optional<std::vector<int64_t>> ints;
  std::optional<std::vector<double>> reals;
  std::vector<int64_t> value_shape;  // the shape of `ints` / `reals`
  int producer = -1;                 // node index, -1 for graph inputs and initializers
  std::vector<int> consumers;        // node indices (one entry per use)
};

struct Net {
  std::string path;
  int opset = 0;
  std::vector<onnx::NodeProto> nodes;  // topologically sorted, Constant nodes removed
  std::unordered_map<std::string, TensorInfo> t;
  std::vector<std::string> data_inputs;    // graph inputs that are data (not parameters)
  std::vector<std::string> weight_inputs;  // graph inputs that are parameters (export_params=False): no values
  std::vector<std::string> outputs;        // graph outputs
  std::vector<bool> folded;                // per node: computes shapes/constants only, no IR op
  std::vector<bool> has_schema;            // per node: libonnx knows the operator (else shapes past it are unknown)
  // Initializers and Constant-node values by tensor name, full size; filled only when load_net is
  // asked to keep them (import_onnx_weights), never for planning.
  std::unordered_map<std::string, onnx::TensorProto> values;
  // Provenance of initializers (onnx_shared.cpp), read while the file is loaded:
  // an anonymous ("onnx::...") 2-d initializer that constant folding made from a named one's transpose
  // (equal values, transposed, not all equal): copy -> the named original.
  std::unordered_map<std::string, std::string> transposed_copy_of;
  // The "graphpipe.export" metadata that graphpipe.export (python/) writes: initializer -> every
  // PyTorch parameter name bound to it. Set only for such a file: then nothing is guessed.
  std::optional<std::map<std::string, std::vector<std::string>>> export_names;

  // A dynamo export's recovered parameters (onnx_dynamo.cpp), for `model info`; unset for other files.
  std::optional<DynamoRecovery> dynamo;

  // nn.EmbeddingBag Loops rewritten as Gather + reduction (onnx_load.cpp): their index tensors,
  // checked to be [B, bag] once shapes are known.
  std::vector<std::string> bag_indices;

  // Said after a shape inference failure: how the file was likely made to fail (onnx_dynamo.cpp).
  std::string inference_hint;

  const TensorInfo& at(const std::string& name) const;
  /// Concrete shape of a tensor; throws UserError naming the tensor when inference could not give one.
  const std::vector<int64_t>& shape(const std::string& name) const;
};

/// Reads, checks, sorts and shape-infers an ONNX file (errors name the file). With `keep_values`,
/// Net::values holds every initializer and Constant value (for the weights).
Net load_net(const std::string& path, bool keep_values = false);

/// A tensor's value when it is computed from constants only (onnx_opset.cpp): initializers, Constant
/// nodes, Shape of an initializer, Identity, Cast, CastLike, Reshape, Expand, Squeeze, Unsqueeze, Concat
/// on the first axis; values as doubles, row-major. Nullopt for anything else or over 2^20 values.
struct ConstantValue {
  std::vector<int64_t> dims;
  std::vector<double> values;
  int elem_type = 0;  // onnx::TensorProto_DataType
};
std::optional<ConstantValue> evaluate_constant(const onnx::GraphProto& g, const std::string& name);

/// nn.EmbeddingBag (mode sum / mean, 2-d indices, no per-sample weights), which both of torch's
/// exporters write as a Loop over the bags, rewritten as Gather(table, indices) + ReduceSum / ReduceMean
/// over the bag axis (onnx_loops.cpp); returns the index tensors (Net::bag_indices). `opset` decides
/// whether the reductions take their axes as an input.
std::vector<std::string> rewrite_bag_loops(onnx::GraphProto& g, int opset);

/// Any Loop left: a UserError (the IR has no control flow) naming the tables it gathers, if any.
void refuse_loops(const std::string& path, const onnx::GraphProto& g);

/// Opsets 18-21 rewritten to their opset-17 form (onnx_opset.cpp); net.opset becomes 17.
void normalize_opset(onnx::ModelProto& model, Net& net);

/// Reads every initializer's external data (a file next to the model) into the initializer.
void inline_external_data(const std::string& path, onnx::ModelProto& model);

/// A file from torch.onnx.export's dynamo exporter: the parameters its optimizer dropped, merged or
/// folded into transposed copies made explicit again from the nodes' metadata, or a UserError naming
/// what cannot be (onnx_dynamo.cpp). Other files are left as they are.
void recover_dynamo_export(onnx::ModelProto& model, Net& net);

/// Reshape [B, h, S, d] -> [B*h, S, d], Transpose (0, 2, 1), Reshape -> [B, h, d, S] (how torch 2.x's
/// exporter writes k.transpose(-2, -1) of a 4-d k) becomes the one Transpose (0, 1, 3, 2) it is.
void merge_reshaped_transposes(Net& net);

/// Fills net.transposed_copy_of and net.export_names from the parsed file (onnx_shared.cpp).
void read_provenance(const onnx::ModelProto& model, Net& net);

// Attribute helpers over NodeProto.
const onnx::AttributeProto* find_attr(const onnx::NodeProto& n, const std::string& name);
int64_t attr_i(const onnx::NodeProto& n, const std::string& name, int64_t dflt);
float attr_f(const onnx::NodeProto& n, const std::string& name, float dflt);
std::vector<int64_t> attr_ints(const onnx::NodeProto& n, const std::string& name);
std::string node_label(const onnx::NodeProto& n);  // "name" (OpType)

}  // namespace gp::importers::onnx_detail
