// Parameters, FLOPs and bytes per op, derived from kind + shapes (never typed in per model).
// Conventions: a multiply-add is 2 FLOPs; backward of a weighted op costs 2x its forward (input and
// weight gradients); elementwise ops count a few FLOPs per element as noted.
#include "ir/attrs.h"
#include "ir/model.h"

namespace gp::ir {

OpCosts derive_costs(const Op& op, const std::vector<Shape>& in, const std::vector<DType>& in_dt) {
  OpCosts c;
  const std::string where = "model";
  const double eb = static_cast<double>(dtype_bytes(op.dtype));  // output element bytes
  const double out_elems = op.output_shape.empty() ? 0.0 : static_cast<double>(per_sample_elems(op.output_shape));
  double in_elems0 = in.empty() ? 0.0 : static_cast<double>(per_sample_elems(in[0]));
  for (size_t i = 0; i < in.size(); ++i)
    c.input_bytes += static_cast<double>(per_sample_elems(in[i]) * dtype_bytes(in_dt[i]));
  c.output_bytes = out_elems * eb;
  const double in0_bytes = in.empty() ? 0.0 : in_elems0 * static_cast<double>(dtype_bytes(in_dt[0]));
  // Parameter counts in double (attributes and dims can be up to 2^40 each; products checked below).
  double params = 0, table_params = 0;  // tables: read per gathered row (input_bytes), not per call

  switch (op.kind) {
    case OpKind::linear: {
      double k = static_cast<double>(in[0].back()), n = static_cast<double>(op.output_shape.back());
      double rows = in_elems0 / k;
      params = k * n + (attr_bool(op, "bias", true, where) ? n : 0);
      c.fwd_flops = 2 * rows * k * n;
      c.bwd_flops = 2 * c.fwd_flops;
      c.saved_bytes = in0_bytes;
      break;
    }
    case OpKind::matmul: {
      const Shape& a = in[0];
      double m = static_cast<double>(a[a.size() - 2]), k = static_cast<double>(a.back());
      double n = static_cast<double>(op.output_shape.back());
      double batch = in_elems0 / (m * k);
      c.fwd_flops = 2 * batch * m * k * n;
      c.bwd_flops = 2 * c.fwd_flops;
      c.saved_bytes = c.input_bytes;
      break;
    }
    case OpKind::add:
    case OpKind::mul: {
      // n operands (a parameter operand counts): n-1 FLOPs per output element; a broadcast operand's
      // gradient is the sum of the output gradient over its broadcast dims (one more pass each).
      const std::optional<Shape> ps = param_shape(op, where);
      const double n = static_cast<double>(in.size() + (ps ? 1 : 0));
      double broadcast_operands = ps ? 1 : 0;
      for (const Shape& s : in) broadcast_operands += s == op.output_shape ? 0 : 1;
      if (ps) params = static_cast<double>(per_sample_elems(*ps));
      c.fwd_flops = (n - 1) * out_elems;
      c.bwd_flops = (op.kind == OpKind::mul ? n * (n - 1) * out_elems : 0) + broadcast_operands * out_elems;
      if (op.kind == OpKind::mul) c.saved_bytes = c.input_bytes;
      break;
    }
    case OpKind::concat:
      if (const std::optional<Shape> ps = param_shape(op, where)) params = static_cast<double>(per_sample_elems(*ps));
      break;  // data movement only (the parameter's gradient sums over the batch: not counted)
    case OpKind::pad:
    case OpKind::slice:
    case OpKind::flatten:
    case OpKind::reshape:
    case OpKind::transpose:
      break;  // data movement only: bytes, no FLOPs, nothing saved
    case OpKind::relu:
      c.fwd_flops = out_elems;
      c.bwd_flops = out_elems;
      c.saved_bytes = c.output_bytes;
      break;
    case OpKind::gelu:  // erf form: ~8 FLOPs forward, ~12 backward per element
      c.fwd_flops = 8 * out_elems;
      c.bwd_flops = 12 * out_elems;
      c.saved_bytes = in0_bytes;
      break;
    case OpKind::clip:
    case OpKind::hardsigmoid:  // a multiply-add and a clamp; backward masks the gradient
      c.fwd_flops = (op.kind == OpKind::clip ? 1 : 3) * out_elems;
      c.bwd_flops = out_elems;
      c.saved_bytes = in0_bytes;
      break;
    case OpKind::hardswish:
      c.fwd_flops = 4 * out_elems;
      c.bwd_flops = 4 * out_elems;
      c.saved_bytes = in0_bytes;
      break;
    case OpKind::sigmoid:
    case OpKind::tanh:
      c.fwd_flops = 4 * out_elems;
      c.bwd_flops = 3 * out_elems;
      c.saved_bytes = c.output_bytes;
      break;
    case OpKind::softmax:
      c.fwd_flops = 5 * out_elems;
      c.bwd_flops = 4 * out_elems;
      c.saved_bytes = c.output_bytes;
      break;
    case OpKind::layernorm: {
      double h = static_cast<double>(in[0].back());
      params = 2 * h;
      c.fwd_flops = 8 * out_elems;
      c.bwd_flops = 14 * out_elems;
      c.saved_bytes = in0_bytes + 2 * (out_elems / h) * 4;  // input + mean and rstd per row
      break;
    }
    case OpKind::dropout:
      c.fwd_flops = 2 * out_elems;
      c.bwd_flops = out_elems;
      c.saved_bytes = attr_num(op, "p", 0.1, where) > 0 ? out_elems : 0;  // one byte mask per element
      break;
    case OpKind::embedding_bag: {
      double bag = static_cast<double>(in[0][1]);
      double rows = static_cast<double>(attr_int(op, "rows", std::nullopt, where));
      double dim = static_cast<double>(op.output_shape[1]);
      params = table_params = rows * dim;
      c.fwd_flops = bag * static_cast<double>(dim);
      c.bwd_flops = bag * static_cast<double>(dim);
      c.input_bytes += bag * static_cast<double>(dim) * eb;  // gathered rows
      c.saved_bytes = in0_bytes;                              // the indices
      break;
    }
    case OpKind::embedding: {
      // A lookup: each index copies one row (forward) and adds into one gradient row (backward);
      // learned positions add a [seq, dim] table to every sample and sum its gradient over the batch.
      const double tokens = in_elems0;
      const double rows = static_cast<double>(attr_int(op, "rows", std::nullopt, where));
      const double dim = static_cast<double>(op.output_shape.back());
      params = table_params = rows * dim;
      c.fwd_flops = out_elems;
      c.bwd_flops = out_elems;
      c.input_bytes += tokens * static_cast<double>(dim) * eb;  // gathered rows
      c.saved_bytes = in0_bytes;                                 // the indices
      if (attr_bool(op, "positions", false, where)) {
        params += static_cast<double>(attr_int(op, "position_rows", in[0][1], where)) * dim;
        c.fwd_flops += out_elems;
        c.bwd_flops += out_elems;
      }
      break;
    }
    case OpKind::attention: {
      // x [S, H]: Q,K,V projections 3*2SH^2, scores QK^T 2S^2H, weighted sum 2S^2H, output
      // projection 2SH^2, softmax 5*heads*S^2. Saved: x, Q, K, V, context (5SH) + probs (heads*S^2).
      double s = static_cast<double>(in[0][1]), h = static_cast<double>(in[0][2]);
      double heads = static_cast<double>(attr_int(op, "heads", std::nullopt, where));
      params = 4 * h * h + 4 * h;
      c.fwd_flops = 8 * s * h * h + 4 * s * s * h + 5 * heads * s * s;
      c.bwd_flops = 2 * (8 * s * h * h + 4 * s * s * h) + 4 * heads * s * s;
      c.saved_bytes = (5 * s * h + heads * s * s) * eb;
      break;
    }
    case OpKind::conv2d: {
      // Each output element is a dot product over its group's ci/groups input channels x kh x kw.
      const ConvGeometry g = conv_geometry(op, in[0][1], where);
      const double co = static_cast<double>(op.output_shape[1]);
      const double taps = static_cast<double>(in[0][1] / g.groups) * static_cast<double>(g.kh) * static_cast<double>(g.kw);
      params = co * taps + (attr_bool(op, "bias", true, where) ? co : 0.0);
      c.fwd_flops = 2 * out_elems * taps;
      c.bwd_flops = 2 * c.fwd_flops;
      c.saved_bytes = in0_bytes;
      break;
    }
    case OpKind::batchnorm:
      params = 2 * static_cast<double>(in[0][1]);
      c.fwd_flops = 8 * out_elems;
      c.bwd_flops = 14 * out_elems;
      c.saved_bytes = in0_bytes;
      break;
    case OpKind::maxpool:
    case OpKind::avgpool: {
      double k = static_cast<double>(attr_int(op, "kernel", std::nullopt, where));
      c.fwd_flops = out_elems * k * k;
      c.bwd_flops = out_elems * k * k;
      c.saved_bytes = op.kind == OpKind::maxpool ? in0_bytes + out_elems * 8 : 0;  // input + argmax
      break;
    }
    case OpKind::global_avgpool:
    case OpKind::mean:
    case OpKind::sum:
      c.fwd_flops = in_elems0;
      c.bwd_flops = in_elems0;
      break;
    case OpKind::mse_loss:
      c.fwd_flops = 3 * in_elems0;
      c.bwd_flops = 2 * in_elems0;
      c.saved_bytes = c.input_bytes;
      break;
    case OpKind::cross_entropy:
      c.fwd_flops = 5 * in_elems0;
      c.bwd_flops = 3 * in_elems0;
      c.saved_bytes = in0_bytes;
      break;
  }
  if (params > kMaxParamsPerOp)
    throw UserError(fmt::format("{}: op \"{}\" ({}) has {:.4g} parameters, more than 2^44", where, op.name,
                                to_string(op.kind), params));
  c.params = static_cast<int64_t>(params);
  c.param_bytes = c.params * dtype_bytes(op.dtype);
  c.weight_read_bytes = (c.params - static_cast<int64_t>(table_params)) * dtype_bytes(op.dtype);
  return c;
}

}  // namespace gp::ir
