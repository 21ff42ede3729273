// Parameters, FLOPs and bytes per op, derived from kind + shapes (never typed in per model).
// Conventions: a multiply-add is 2 FLOPs; backward of a weighted op costs 2x its forward (input and
// weight gradients); elementwise ops count a few FLOPs per element as noted.
#include "ir/attrs.h"
#include "ir/model.h"

namespace gp::ir {

namespace {

const std::string kWhere = "model";

// What every cost rule reads: the op, its input shapes and the per-sample sizes derived from them.
struct CostInput {
  const Op& op;
  const std::vector<Shape>& in;
  double eb;         // output element bytes
  double out_elems;  // output elements per sample
  double in_elems0;  // input 0's elements per sample
  double in0_bytes;  // input 0's bytes per sample
};

// Parameter counts in double (attributes and dims can be up to 2^40 each; the total is checked by
// derive_costs). Tables are read per gathered row (input_bytes), not per call.
struct ParamCount {
  double params = 0, table_params = 0;
  int tensors = 0;  // parameter tensors (the runtime's params.cpp: a linear's weight and bias are 2)
};

using CostRule = void (*)(const CostInput&, OpCosts&, ParamCount&);

// An elementwise op: `fwd` and `bwd` FLOPs per output element.
void per_element(const CostInput& x, OpCosts& c, double fwd, double bwd) {
  c.fwd_flops = fwd * x.out_elems;
  c.bwd_flops = bwd * x.out_elems;
}

void linear_cost(const CostInput& x, OpCosts& c, ParamCount& p) {
  double k = static_cast<double>(x.in[0].back()), n = static_cast<double>(x.op.output_shape.back());
  double rows = x.in_elems0 / k;
  p.params = k * n + (attr_bool(x.op, "bias", true, kWhere) ? n : 0);
  p.tensors = 1 + (attr_bool(x.op, "bias", true, kWhere) ? 1 : 0);
  c.fwd_flops = 2 * rows * k * n;
  c.bwd_flops = 2 * c.fwd_flops;
  c.saved_bytes = x.in0_bytes;
}

void matmul_cost(const CostInput& x, OpCosts& c, ParamCount&) {
  const Shape& a = x.in[0];
  double m = static_cast<double>(a[a.size() - 2]), k = static_cast<double>(a.back());
  double n = static_cast<double>(x.op.output_shape.back());
  double batch = x.in_elems0 / (m * k);
  c.fwd_flops = 2 * batch * m * k * n;
  c.bwd_flops = 2 * c.fwd_flops;
  c.saved_bytes = c.input_bytes;
}

// add, mul: n operands (a parameter operand counts): n-1 FLOPs per output element; a broadcast
// operand's gradient is the sum of the output gradient over its broadcast dims (one more pass each).
void elementwise_cost(const CostInput& x, OpCosts& c, ParamCount& p) {
  const std::optional<Shape> ps = param_shape(x.op, kWhere);
  const double n = static_cast<double>(x.in.size() + (ps ? 1 : 0));
  double broadcast_operands = ps ? 1 : 0;
  for (const Shape& s : x.in) broadcast_operands += s == x.op.output_shape ? 0 : 1;
  if (ps) {
    p.params = static_cast<double>(per_sample_elems(*ps));
    p.tensors = 1;
  }
  const bool mul = x.op.kind == OpKind::mul;
  c.fwd_flops = (n - 1) * x.out_elems;
  c.bwd_flops = (mul ? n * (n - 1) * x.out_elems : 0) + broadcast_operands * x.out_elems;
  if (mul) c.saved_bytes = c.input_bytes;
}

// Data movement only (the parameter's gradient sums over the batch: not counted).
void concat_cost(const CostInput& x, OpCosts&, ParamCount& p) {
  if (const std::optional<Shape> ps = param_shape(x.op, kWhere)) {
    p.params = static_cast<double>(per_sample_elems(*ps));
    p.tensors = 1;
  }
}

// pad, slice, flatten, reshape, transpose: data movement only: bytes, no FLOPs, nothing saved.
void movement_cost(const CostInput&, OpCosts&, ParamCount&) {}

void relu_cost(const CostInput& x, OpCosts& c, ParamCount&) {
  per_element(x, c, 1, 1);
  c.saved_bytes = c.output_bytes;
}

// erf form: ~8 FLOPs forward, ~12 backward per element.
void gelu_cost(const CostInput& x, OpCosts& c, ParamCount&) {
  per_element(x, c, 8, 12);
  c.saved_bytes = x.in0_bytes;
}

// clip: a clamp; hardsigmoid: a multiply-add and a clamp; backward masks the gradient.
void clamp_cost(const CostInput& x, OpCosts& c, ParamCount&) {
  per_element(x, c, x.op.kind == OpKind::clip ? 1 : 3, 1);
  c.saved_bytes = x.in0_bytes;
}

void hardswish_cost(const CostInput& x, OpCosts& c, ParamCount&) {
  per_element(x, c, 4, 4);
  c.saved_bytes = x.in0_bytes;
}

// sigmoid, tanh.
void squash_cost(const CostInput& x, OpCosts& c, ParamCount&) {
  per_element(x, c, 4, 3);
  c.saved_bytes = c.output_bytes;
}

void softmax_cost(const CostInput& x, OpCosts& c, ParamCount&) {
  per_element(x, c, 5, 4);
  c.saved_bytes = c.output_bytes;
}

void layernorm_cost(const CostInput& x, OpCosts& c, ParamCount& p) {
  double h = static_cast<double>(x.in[0].back());
  p.params = 2 * h;
  p.tensors = 2;
  per_element(x, c, 8, 14);
  c.saved_bytes = x.in0_bytes + 2 * (x.out_elems / h) * 4;  // input + mean and rstd per row
}

void dropout_cost(const CostInput& x, OpCosts& c, ParamCount&) {
  per_element(x, c, 2, 1);
  c.saved_bytes = attr_num(x.op, "p", 0.1, kWhere) > 0 ? x.out_elems : 0;  // one byte mask per element
}

void embedding_bag_cost(const CostInput& x, OpCosts& c, ParamCount& p) {
  double bag = static_cast<double>(x.in[0][1]);
  double rows = static_cast<double>(attr_int(x.op, "rows", std::nullopt, kWhere));
  double dim = static_cast<double>(x.op.output_shape[1]);
  p.params = p.table_params = rows * dim;
  p.tensors = 1;
  c.fwd_flops = bag * static_cast<double>(dim);
  c.bwd_flops = bag * static_cast<double>(dim);
  c.input_bytes += bag * static_cast<double>(dim) * x.eb;  // gathered rows
  c.saved_bytes = x.in0_bytes;                             // the indices
}

// A lookup: each index copies one row (forward) and adds into one gradient row (backward);
// learned positions add a [seq, dim] table to every sample and sum its gradient over the batch.
void embedding_cost(const CostInput& x, OpCosts& c, ParamCount& p) {
  const double tokens = x.in_elems0;
  const double rows = static_cast<double>(attr_int(x.op, "rows", std::nullopt, kWhere));
  const double dim = static_cast<double>(x.op.output_shape.back());
  p.params = p.table_params = rows * dim;
  p.tensors = 1;
  per_element(x, c, 1, 1);
  c.input_bytes += tokens * static_cast<double>(dim) * x.eb;  // gathered rows
  c.saved_bytes = x.in0_bytes;                                // the indices
  if (attr_bool(x.op, "positions", false, kWhere)) {
    p.params += static_cast<double>(attr_int(x.op, "position_rows", x.in[0][1], kWhere)) * dim;
    p.tensors = 2;
    c.fwd_flops += x.out_elems;
    c.bwd_flops += x.out_elems;
  }
}

// x [S, H]: Q,K,V projections 3*2SH^2, scores QK^T 2S^2H, weighted sum 2S^2H, output
// projection 2SH^2, softmax 5*heads*S^2. Saved: x, Q, K, V, context (5SH) + probs (heads*S^2).
// A causal or padding mask costs what full attention costs (the runtime computes every score and
// masks it, as PyTorch's math path does); a padding mask adds its read (input_bytes) and one byte
// per key kept for backward. Cross-attention (queries from x [S, H], keys and values from mem [T, H]):
// projections 2SH^2 (Q, output) x 2 + 2TH^2 (K, V) x 2, scores and weighted sum 4STH, softmax
// 5*heads*S*T; saved x, Q, context (3SH), mem, K, V (3TH) + probs (heads*S*T).
void attention_cost(const CostInput& x, OpCosts& c, ParamCount& p) {
  const AttentionInputs a = attention_inputs(x.op, kWhere);
  double s = static_cast<double>(x.in[0][1]), h = static_cast<double>(x.in[0][2]);
  double t = static_cast<double>(x.in[static_cast<size_t>(a.kv)][1]);
  double heads = static_cast<double>(attr_int(x.op, "heads", std::nullopt, kWhere));
  p.params = 4 * h * h + 4 * h;
  p.tensors = 8;
  const double proj = 4 * s * h * h + 4 * t * h * h, mix = 4 * s * t * h;
  c.fwd_flops = proj + mix + 5 * heads * s * t;
  c.bwd_flops = 2 * (proj + mix) + 4 * heads * s * t;
  const double kept = a.kv ? 3 * s * h + 3 * t * h : 5 * s * h;
  c.saved_bytes = (kept + heads * s * t) * x.eb + (a.mask >= 0 ? t : 0.0);
}

// Swin's window attention on the padded map [Hp, Wp, C], n = Hp Wp tokens in windows of N = wh ww:
// QKV and output projections 8nC^2, scores and weighted sum 4nNC, softmax and the bias / mask adds
// 7 heads n N. Saved: the padded input, Q, K, V, context (5nC) + probabilities (heads n N).
void window_attention_cost(const CostInput& x, OpCosts& c, ParamCount& p) {
  const std::vector<int64_t> win = attr_ints(x.op, "window", kWhere);
  const auto padded = [](int64_t d, int64_t w) { return static_cast<double>((d + w - 1) / w * w); };
  const double wh = static_cast<double>(win[0]), ww = static_cast<double>(win[1]);
  const double n = padded(x.in[0][1], win[0]) * padded(x.in[0][2], win[1]), w = wh * ww;
  const double ch = static_cast<double>(x.in[0][3]);
  const double heads = static_cast<double>(attr_int(x.op, "heads", std::nullopt, kWhere));
  p.params = 4 * ch * ch + 4 * ch + (2 * wh - 1) * (2 * ww - 1) * heads;
  p.tensors = 5;
  c.fwd_flops = 8 * n * ch * ch + 4 * n * w * ch + 7 * heads * n * w;
  c.bwd_flops = 2 * (8 * n * ch * ch + 4 * n * w * ch) + 5 * heads * n * w;
  c.saved_bytes = (5 * n * ch + heads * n * w) * x.eb;
}

// Each output element is a dot product over its group's ci/groups input channels x kh x kw.
void conv2d_cost(const CostInput& x, OpCosts& c, ParamCount& p) {
  const ConvGeometry g = conv_geometry(x.op, x.in[0][1], kWhere);
  const double co = static_cast<double>(x.op.output_shape[1]);
  const double taps = static_cast<double>(x.in[0][1] / g.groups) * static_cast<double>(g.kh) *
                      static_cast<double>(g.kw);
  p.params = co * taps + (attr_bool(x.op, "bias", true, kWhere) ? co : 0.0);
  p.tensors = 1 + (attr_bool(x.op, "bias", true, kWhere) ? 1 : 0);
  c.fwd_flops = 2 * x.out_elems * taps;
  c.bwd_flops = 2 * c.fwd_flops;
  c.saved_bytes = x.in0_bytes;
}

// Each input element scatters into out_channels/groups x kh x kw outputs (the adjoint of conv2d;
// cropped padding still computed, as cuDNN and PyTorch's CPU kernels do).
void conv_transpose2d_cost(const CostInput& x, OpCosts& c, ParamCount& p) {
  const ConvGeometry g = conv_geometry(x.op, x.in[0][1], kWhere);
  const double co = static_cast<double>(x.op.output_shape[1]);
  const double ci = static_cast<double>(x.in[0][1]);
  const double taps = co / static_cast<double>(g.groups) * static_cast<double>(g.kh) * static_cast<double>(g.kw);
  p.params = ci * taps + (attr_bool(x.op, "bias", true, kWhere) ? co : 0.0);
  p.tensors = 1 + (attr_bool(x.op, "bias", true, kWhere) ? 1 : 0);
  c.fwd_flops = 2 * x.in_elems0 * taps;
  c.bwd_flops = 2 * c.fwd_flops;
  c.saved_bytes = x.in0_bytes;
}

// nearest: one read per output element; linear: 4 taps (4 multiply-adds) per output element.
// Backward scatters the output gradient the same way; only shapes are saved.
void resize_cost(const CostInput& x, OpCosts& c, ParamCount&) {
  const bool linear = attr_choice(x.op, "mode", "nearest", {"nearest", "linear"}, kWhere) == "linear";
  per_element(x, c, linear ? 8 : 1, linear ? 8 : 1);
}

void batchnorm_cost(const CostInput& x, OpCosts& c, ParamCount& p) {
  p.params = 2 * static_cast<double>(x.in[0][1]);
  p.tensors = 2;
  per_element(x, c, 8, 14);
  c.saved_bytes = x.in0_bytes;
}

// maxpool saves its input and the argmax; avgpool nothing.
void pool_cost(const CostInput& x, OpCosts& c, ParamCount&) {
  const PoolGeometry g = pool_geometry(x.op, kWhere);
  const double window = static_cast<double>(g.kh) * static_cast<double>(g.kw);
  c.fwd_flops = x.out_elems * window;
  c.bwd_flops = x.out_elems * window;
  c.saved_bytes = x.op.kind == OpKind::maxpool ? x.in0_bytes + x.out_elems * 8 : 0;
}

// global_avgpool, mean, sum: one pass over the input.
void reduce_cost(const CostInput& x, OpCosts& c, ParamCount&) {
  c.fwd_flops = x.in_elems0;
  c.bwd_flops = x.in_elems0;
}

// max(x, 0) - x t + log(1 + exp(-|x|)) per element, and its gradient sigmoid(x) - t.
void bce_cost(const CostInput& x, OpCosts& c, ParamCount&) {
  c.fwd_flops = 8 * x.in_elems0;
  c.bwd_flops = 4 * x.in_elems0;
  c.saved_bytes = c.input_bytes;
}

void mse_loss_cost(const CostInput& x, OpCosts& c, ParamCount&) {
  c.fwd_flops = 3 * x.in_elems0;
  c.bwd_flops = 2 * x.in_elems0;
  c.saved_bytes = c.input_bytes;
}

void cross_entropy_cost(const CostInput& x, OpCosts& c, ParamCount&) {
  c.fwd_flops = 5 * x.in_elems0;
  c.bwd_flops = 3 * x.in_elems0;
  c.saved_bytes = x.in0_bytes;
}

/// The cost rule of each op kind (the compiler checks that every kind has one).
CostRule cost_rule(OpKind k) {
  switch (k) {
    case OpKind::linear: return linear_cost;
    case OpKind::matmul: return matmul_cost;
    case OpKind::add:
    case OpKind::mul: return elementwise_cost;
    case OpKind::concat: return concat_cost;
    case OpKind::pad:
    case OpKind::slice:
    case OpKind::gather:
    case OpKind::flatten:
    case OpKind::reshape:
    case OpKind::transpose: return movement_cost;
    case OpKind::relu: return relu_cost;
    case OpKind::gelu: return gelu_cost;
    case OpKind::clip:
    case OpKind::hardsigmoid: return clamp_cost;
    case OpKind::hardswish: return hardswish_cost;
    case OpKind::sigmoid:
    case OpKind::tanh: return squash_cost;
    case OpKind::softmax: return softmax_cost;
    case OpKind::layernorm: return layernorm_cost;
    case OpKind::dropout: return dropout_cost;
    case OpKind::embedding_bag: return embedding_bag_cost;
    case OpKind::embedding: return embedding_cost;
    case OpKind::attention: return attention_cost;
    case OpKind::window_attention: return window_attention_cost;
    case OpKind::conv2d: return conv2d_cost;
    case OpKind::conv_transpose2d: return conv_transpose2d_cost;
    case OpKind::resize: return resize_cost;
    case OpKind::batchnorm: return batchnorm_cost;
    case OpKind::maxpool:
    case OpKind::avgpool: return pool_cost;
    case OpKind::global_avgpool:
    case OpKind::mean:
    case OpKind::sum: return reduce_cost;
    case OpKind::mse_loss: return mse_loss_cost;
    case OpKind::bce_with_logits: return bce_cost;
    case OpKind::cross_entropy: return cross_entropy_cost;
  }
  return movement_cost;
}

}  // namespace

OpCosts derive_costs(const Op& op, const std::vector<Shape>& in, const std::vector<DType>& in_dt) {
  OpCosts c;
  const double eb = static_cast<double>(dtype_bytes(op.dtype));  // output element bytes
  const double out_elems = op.output_shape.empty() ? 0.0 : static_cast<double>(per_sample_elems(op.output_shape));
  double in_elems0 = in.empty() ? 0.0 : static_cast<double>(per_sample_elems(in[0]));
  for (size_t i = 0; i < in.size(); ++i)
    c.input_bytes += static_cast<double>(per_sample_elems(in[i]) * dtype_bytes(in_dt[i]));
  c.output_bytes = out_elems * eb;
  const double in0_bytes = in.empty() ? 0.0 : in_elems0 * static_cast<double>(dtype_bytes(in_dt[0]));
  ParamCount p;
  cost_rule(op.kind)(CostInput{op, in, eb, out_elems, in_elems0, in0_bytes}, c, p);
  if (p.params > kMaxParamsPerOp)
    throw UserError(fmt::format("{}: op \"{}\" ({}) has {:.4g} parameters, more than 2^44", kWhere, op.name,
                                to_string(op.kind), p.params));
  c.params = static_cast<int64_t>(p.params);
  c.param_bytes = c.params * dtype_bytes(op.dtype);
  c.param_tensors = p.tensors;
  c.weight_read_bytes = (c.params - static_cast<int64_t>(p.table_params)) * dtype_bytes(op.dtype);
  return c;
}

}  // namespace gp::ir
