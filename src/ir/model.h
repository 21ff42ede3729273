// The operator-graph IR: a model is a DAG of operators over tensors with a symbolic batch dimension.
// Every cost-relevant number (parameters, FLOPs, activation bytes) is derived from kind + shapes here,
// never typed in per model. The planner, cost model, simulator and runtime all read this one IR.
#pragma once
#include <cstdint>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "support/ids.h"
#include "support/json.h"

namespace gp::ir {

/// A shape; dimension 0 is the batch dimension and is stored as kBatch (-1) for batched tensors.
/// A tensor without a batch dimension (the reduced loss) has shape {} (a scalar).
using Shape = std::vector<int64_t>;
inline constexpr int64_t kBatch = -1;
/// Sanity limits that keep every size computation inside int64: a dimension or size attribute is
/// at most kMaxExtent, a tensor at most kMaxExtent elements per sample, an op at most
/// kMaxParamsPerOp parameters. Larger values are reported as errors, never wrapped around.
inline constexpr int64_t kMaxExtent = int64_t{1} << 40;
inline constexpr double kMaxParamsPerOp = 17592186044416.0;  // 2^44

enum class DType { f32, f16, bf16, i64 };
int64_t dtype_bytes(DType t);
const char* to_string(DType t);
DType dtype_from_string(const std::string& s);  // throws UserError listing valid names

/// Operator kinds and their exact semantics (the runtime implements exactly this; "x" is input 0).
/// Shapes below include the batch dimension B as dim 0. Axis attributes index the full shape
/// (so axis 0 is the batch; concat/slice/softmax/mean/sum never use axis 0); negative axes count
/// from the end.
enum class OpKind {
  linear,  // y = x W^T + b over the last dim. attrs: out_features, bias (bool, default true)
  matmul,  // y = a @ b, batched over leading dims: a [B,..,m,k], b [B,..,k,n] -> [B,..,m,n]
  add,     // elementwise sum of the inputs, broadcast NumPy-style over the per-sample dims
           // (ranks equal, each dim equal or 1 in all but one operand: [B,C,H,W] * [B,C,1,1]);
           // attrs.param (optional per-sample shape, e.g. [C,1,1]): a learned parameter "param"
           // of that shape is one more operand (a bias/position table); 1+ inputs with it, else 2+
  mul,     // elementwise product, the same broadcasting and optional attrs.param (a layer scale)
  concat,  // concatenation along attrs.axis (>= 1); attrs.param (optional per-sample shape): a
           // learned parameter "param" broadcast over the batch is one more operand, at position
           // attrs.param_at (default 0) among them (ViT's class token)
  slice,   // x[..., start:end, ...] along attrs.axis; attrs: axis, start, end; step (default 1:
           // every step-th element from start, PyTorch's x[..., start:end:step])
  gather,  // x.index_select(attrs.axis, attrs.indices): positions of a non-batch axis picked by a
           // constant index list (each in [0, dim), repeats allowed), e.g. DLRM's upper triangle
           // Z[:, li, lj] of a flattened [B, F*F] interaction
  relu,
  gelu,
  sigmoid,
  tanh,              // elementwise; gelu is the exact (erf) form
  clip,              // elementwise clamp to [attrs.min, attrs.max] (each optional; ReLU6 is 0, 6)
  hardsigmoid,       // max(0, min(1, alpha x + beta)); attrs alpha (default 1/6), beta (default 0.5)
  hardswish,         // x * hardsigmoid(x) with alpha 1/6, beta 0.5
  pad,               // constant padding; attrs.pads: 2 x (rank-1) non-negative counts over the per-sample
                     // dims, all begins then all ends (ONNX order without the batch); attrs.value (0)
  softmax,           // along attrs.axis (default -1)
  layernorm,         // over the last dim, with affine weight and bias; attrs: eps (default 1e-5)
  dropout,           // attrs: p (default 0.1); identity at p = 0
  embedding_bag,     // x: i64 indices [B, bag] in [0, rows); y [B, dim] = sum of rows. attrs: rows, dim
  embedding,         // x: i64 indices [B, ...] in [0, rows); y [B, ..., dim] = the rows (a lookup table,
                     // nn.Embedding). attrs.offsets (optional constant integers, one per position of
                     // x's last dim, or one for all): added to the indices first (TabTransformer's
                     // columns sharing one table). attrs: rows, dim, positions (default false: true adds rows
                     // [0, seq) of a learned [position_rows, dim] table to every sample; x must be
                     // [B, seq]), position_rows (default seq; >= seq: a max_len-row table)
  attention,         // multi-head self-attention incl. Q,K,V and output projections (with biases),
                     // x [B, seq, hidden] -> same; attrs: heads. Softmax(QK^T/sqrt(d_head) + M) V.
                     // attrs.cross (default false): cross-attention, Q from x and K, V from input 1,
                     // mem [B, seq_kv, hidden] (a decoder reading its encoder; the padding mask, if
                     // any, is then input 2 and has seq_kv values; causal needs seq_kv == seq).
                     // M masks keys (-inf: weight 0): attrs.causal (default false): key j > query i
                     // (a decoder); an optional input 1, a padding mask m [B, seq] (i64 or f32, values
                     // 0 / 1) over the keys: attrs.mask "keep" (default: keys with m != 0 take part,
                     // HF's attention_mask, SDPA's bool attn_mask) or "ignore" (keys with m != 0 are
                     // masked: PyTorch's key_padding_mask); masked keys get attrs.mask_fill added
                     // (default -inf; e.g. -10000 as BERT adds (1 - m) * -10000). A row whose keys
                     // are all masked is NaN with -inf, as PyTorch's exported graph computes it.
  window_attention,  // Swin's (shifted) window attention, torchvision's shifted_window_attention:
                     // x [B, H, W, C] -> same. attrs: heads, window [wh, ww], shift [sh, sw]
                     // (default [0, 0]). x is zero-padded to multiples of the window, rolled by
                     // -shift, split into wh x ww windows; in each, multi-head attention with a
                     // packed QKV projection (wqkv [3C, C], bqkv [3C]), scores q k^T / sqrt(C/heads)
                     // + a learned relative-position bias (rel_bias [(2wh-1)(2ww-1), heads], read
                     // through Swin's relative_position_index) + (shift != 0) -100 between tokens
                     // from different regions of the rolled map; output projection (wo [C, C],
                     // bo [C]); windows merged, rolled back by +shift, cropped to H x W.
  conv2d,            // x [B,C,H,W]; attrs: out_channels, kernel, stride (1), padding (0), bias (true),
                     // dilation (1), groups (1; divides C and out_channels; depthwise: groups = C).
                     // kernel, stride, dilation: an integer or [h, w]; padding: an integer, [h, w] or
                     // [top, left, bottom, right] (asymmetric, ONNX order)
  conv_transpose2d,  // x [B,C,H,W] -> [B,out_channels,H',W'], PyTorch's ConvTranspose2d (weight
                     // [C, out_channels/groups, kh, kw]); the conv2d attrs (padding may be
                     // asymmetric: rows/cols cropped from the full output) plus output_padding (0;
                     // an integer or [h, w]: rows/cols added at the bottom/right).
                     // H' = (H-1) stride - top - bottom + dilation (kh-1) + 1 + output_padding
  batchnorm,         // 2d batch norm over channel dim 1, affine; statistics of the (micro-)batch
  maxpool,
  avgpool,         // 2d; attrs: kernel, stride (= kernel), padding (0), each an integer or [h, w]
                   // (padding symmetric, at most half the window); dilation (1, maxpool only);
                   // ceil_mode (default false; true rounds the output size up as PyTorch does:
                   // the last window may overhang the bottom/right edge, but never starts in the
                   // padding); count_include_pad (avgpool, default true: PyTorch's default;
                   // false divides by the window's cells inside the input)
  resize,          // x [B,C,H,W] -> [B,C,size[0],size[1]]: attrs size [h, w], mode "nearest"
                   // (PyTorch's 'nearest': source = floor(dst / scale)) or "linear" (bilinear;
                   // align_corners, default false: half-pixel centres), scales (optional [sh, sw]:
                   // the scale factors the coordinates use, as interpolate(scale_factor=...) does;
                   // without them in/out)
  global_avgpool,  // [B,C,H,W] -> [B,C]
  flatten,         // [B, ...] -> [B, prod(...)]
  reshape,         // attrs: shape (per-sample dims, without the batch dim)
  transpose,       // attrs: perm over all dims, perm[0] == 0
  mean,
  sum,              // reduce along attrs.axis; attrs: keepdim (default false)
  mse_loss,         // inputs (pred, target) of equal shape -> scalar: mean over all elements
  bce_with_logits,  // inputs (logits, target in [0, 1]) of equal shape -> scalar: mean over all elements
                    // of F.binary_cross_entropy_with_logits (a click / multi-label output)
  cross_entropy,    // inputs (logits [B, C], labels i64 [B]) -> scalar: mean over the batch; or
                    // per position (segmentation, next-token): logits [B, C, d1, ...], labels [B, d1, ...]
                    // -> mean over the batch and every position. attrs: ignore_index (optional: labels
                    // equal to it count for nothing, the mean is over the others), label_smoothing
                    // (default 0), as F.cross_entropy
};
const char* to_string(OpKind k);
OpKind op_kind_from_string(const std::string& s);  // throws UserError listing valid names
bool is_loss(OpKind k);

/// A graph input (features or targets), not an op.
struct Input {
  std::string name;
  Shape shape;
  DType dtype = DType::f32;
  bool operator==(const Input&) const = default;
};

struct Op {
  std::string name;
  OpKind kind = OpKind::relu;
  std::vector<std::string> inputs;  // names of graph inputs or other ops
  Shape output_shape;
  DType dtype = DType::f32;
  Json attrs = Json::object();
  bool operator==(const Op&) const = default;
};

/// Quantities derived from kind + shapes by derive_costs(); all per sample unless named otherwise.
struct OpCosts {
  int64_t params = 0;             // trainable parameter count
  int64_t param_bytes = 0;        // params x dtype bytes
  double fwd_flops = 0;           // forward FLOPs per sample (multiply-add = 2 FLOPs)
  double bwd_flops = 0;           // backward FLOPs per sample (input + weight gradients)
  double input_bytes = 0;         // bytes read per sample: all activation inputs, plus the
                                  // embedding rows gathered by an embedding(_bag)
  int64_t weight_read_bytes = 0;  // weight bytes read once per kernel call (independent of the
                                  // batch; embedding tables are not: their reads are per sample)
  double output_bytes = 0;        // bytes of the output per sample
  double saved_bytes = 0;         // activation bytes kept for backward per sample
  int param_tensors = 0;          // trainable parameter tensors (an optimizer step pays per tensor too)
  bool operator==(const OpCosts&) const = default;
};

/// One parameter tensor used by several ops (tied weights: GPT-2's LM head reuses the token
/// embedding's table). `uses` are "op/param" names (the runtime's parameter names, e.g.
/// "wte/weight"), of distinct ops, all of `shape`. The first use is canonical: the parameter is
/// counted with that op (the other users' OpCosts exclude it), it names the parameter in checkpoints,
/// and its initial value (seeded or from the model file) is every copy's. A stage holding any user
/// holds the parameter once; stages holding different users keep identical copies whose gradients
/// are summed every iteration (docs/graph.md, "Shared parameters").
struct SharedParam {
  std::string name;               // a label: the ONNX initializer, "tied.wte"
  Shape shape;                    // the parameter's shape (no batch dimension)
  std::vector<std::string> uses;  // >= 2 "op/param", distinct ops
  bool operator==(const SharedParam&) const = default;
};

/// A model as written in a file or built by the zoo: plain value, no derived state.
struct Model {
  std::string name;
  std::vector<Input> inputs;
  std::vector<Op> ops;
  std::vector<std::string> outputs;        // the loss op(s)
  std::vector<SharedParam> shared_params;  // tied parameters; empty for most models
  bool operator==(const Model&) const = default;
};

/// Splits a shared parameter use "op/param" at its last '/' (op names may contain '/').
std::pair<std::string, std::string> split_use(const std::string& use);

/// A validated model with dense ids and derived costs. Ops are stored in a topological order;
/// OpId(i) is ops()[i]. preds/succs are op-to-op edges only (graph inputs are not nodes).
class Graph {
 public:
  /// Validates the model (see validate()) and derives costs. Throws UserError with `where`
  /// (a file name or model spec) prefixed to the message.
  static Graph build(Model model, const std::string& where = "model");

  const Model& model() const { return model_; }
  const std::string& name() const { return model_.name; }
  size_t num_ops() const { return model_.ops.size(); }
  /// Every op id, in the stored topological order (the ops of a whole-model stage).
  std::vector<OpId> op_ids() const {
    std::vector<OpId> ids;
    ids.reserve(num_ops());
    for (size_t i = 0; i < num_ops(); ++i) ids.emplace_back(static_cast<int32_t>(i));
    return ids;
  }
  const Op& op(OpId id) const { return model_.ops[id.v]; }
  const OpCosts& costs(OpId id) const { return costs_[id.v]; }
  const std::vector<OpId>& preds(OpId id) const { return preds_[id.v]; }
  const std::vector<OpId>& succs(OpId id) const { return succs_[id.v]; }
  /// Graph inputs read by op `id` (indices into model().inputs).
  const std::vector<int>& graph_inputs_of(OpId id) const { return graph_inputs_[id.v]; }
  OpId find(const std::string& op_name) const;  // invalid id when absent
  const Input* find_input(const std::string& name) const;
  /// The shape of a graph input or op output by name (throws when there is none).
  const Shape& shape_of(const std::string& name) const;
  /// An attention op's key count: its keys' source's dim 1 (input 1 with attrs.cross, else x's).
  int64_t attention_keys(OpId id) const;

  /// The ops using shared parameter k (model().shared_params[k]), in its `uses` order; the first
  /// is the canonical user.
  const std::vector<OpId>& shared_users(size_t k) const { return shared_users_[k]; }
  /// Shared parameters whose users include an op of the stage `in_stage` (size num_ops), in
  /// model order: the stage holds one copy of each.
  std::vector<int> shared_held(const std::vector<char>& in_stage) const;
  /// Parameters (elements) of shared parameter k.
  int64_t shared_numel(size_t k) const;

  // Totals per sample over all ops (a shared parameter counts once).
  int64_t total_params() const;
  double total_fwd_flops() const;
  double total_bwd_flops() const;
  double total_saved_bytes() const;

 private:
  Model model_;
  std::vector<OpCosts> costs_;
  std::vector<std::vector<OpId>> preds_, succs_;
  std::vector<std::vector<int>> graph_inputs_;
  std::vector<std::vector<OpId>> shared_users_;
  std::unordered_map<std::string, int32_t> index_;

  void link_shared_params(const std::string& where);
};

/// Checks a model; throws UserError naming the problem: duplicate name, unknown input, a cycle
/// (naming the ops on it), a shape mismatch (naming the op and both shapes), bad attributes,
/// an op with no path to an output. Returns the ops in a topological order (indices into ops).
std::vector<int> validate(const Model& m, const std::string& where = "model");

/// Checks model().shared_params against the ops (validate() calls it): each has a name, a shape of
/// positive dims and >= 2 uses "op/param" naming distinct existing ops; a use appears in at most
/// one shared parameter. Whether the op really has that parameter with that shape is checked by the
/// runtime (it knows parameter names); the IR checks the op has at least that many parameters.
void validate_shared_params(const Model& m, const std::string& where);

/// Infers the output shape of an op from its input shapes and attrs (throws UserError on mismatch).
Shape infer_shape(const Op& op, const std::vector<Shape>& input_shapes, const std::string& where);

/// Derives parameters, FLOPs and bytes of one op from its kind, attrs and shapes.
OpCosts derive_costs(const Op& op, const std::vector<Shape>& input_shapes, const std::vector<DType>& input_dtypes);

/// Elements per sample of a shape (product of all dims except a leading kBatch).
int64_t per_sample_elems(const Shape& s);
std::string shape_str(const Shape& s);

/// Helper to build models in code: `b.linear("enc.fc1", x, 4096)` returns the new op's name.
class ModelBuilder {
 public:
  explicit ModelBuilder(std::string name) { m_.name = std::move(name); }
  std::string input(const std::string& name, Shape per_sample_shape, DType dt = DType::f32);
  /// Adds an op whose output shape is inferred; returns its name.
  std::string op(const std::string& name, OpKind kind, std::vector<std::string> inputs, Json attrs = Json::object());
  std::string linear(const std::string& name, const std::string& x, int64_t out, bool bias = true);
  std::string unary(const std::string& name, OpKind kind, const std::string& x) { return op(name, kind, {x}); }
  const Shape& shape_of(const std::string& name) const;
  void output(const std::string& name) { m_.outputs.push_back(name); }
  Model build() const { return m_; }

 private:
  Model m_;
  std::unordered_map<std::string, Shape> shapes_;
  std::unordered_map<std::string, DType> dtypes_;
};

}  // namespace gp::ir
