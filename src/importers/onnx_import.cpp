// ONNX node -> IR op mapping, node by node, after the multi-node patterns (onnx_patterns.cpp) have
// claimed their nodes. Shape-only nodes were folded by the loader and produce nothing here.
#include "importers/onnx_import.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <map>
#include <set>
#include <unordered_map>

#include "importers/onnx_mapper.h"
#include "ir/attrs.h"
#include "support/error.h"

namespace gp::importers {
namespace onnx_detail {

ir::Shape Mapper::ir_shape(const std::string& tensor) const {
  const auto& s = net.shape(tensor);
  GP_CHECK(!s.empty() && s[0] == kProbeBatch, "{}: tensor \"{}\" does not have the batch as its first dimension",
           net.path, tensor);
  ir::Shape out{ir::kBatch};
  for (size_t i = 1; i < s.size(); ++i) out.push_back(s[i]);
  return out;
}

bool Mapper::batch_first(const std::string& tensor) const {
  const auto& ti = net.at(tensor);
  if (!ti.shape || ti.shape->empty() || (*ti.shape)[0] != kProbeBatch) return false;
  for (size_t i = 1; i < ti.shape->size(); ++i)
    if ((*ti.shape)[i] % kProbeBatch == 0) return false;
  return true;
}

std::string Mapper::emit(const std::string& name_hint, ir::OpKind kind, std::vector<std::string> in_tensors,
                         const std::string& out_tensor, Json attrs, const ir::Shape* shape) {
  std::string name = name_hint.empty() ? fmt::format("{}_{}", ir::to_string(kind), model.ops.size()) : name_hint;
  for (int k = 2; used_names.count(name); ++k) name = fmt::format("{}_{}", name_hint, k);
  used_names.insert(name);
  ir::Op op;
  op.name = name;
  op.kind = kind;
  op.inputs = std::move(in_tensors);  // tensor names for now; resolved to IR names in finish()
  op.output_shape = shape ? *shape : ir_shape(out_tensor);
  op.attrs = std::move(attrs);
  // Index tensors computed from an index input (ids[:, k] feeding one embedding table per feature)
  // stay integers.
  auto is_int = [&](const std::string& t) {
    if (auto p = producer_of.find(t); p != producer_of.end())  // an IR-only intermediate
      for (const auto& o : model.ops)
        if (o.name == p->second) return o.dtype == ir::DType::i64;
    auto it = net.t.find(t);
    return it != net.t.end() &&
           (it->second.elem_type == onnx::TensorProto::INT64 || it->second.elem_type == onnx::TensorProto::INT32);
  };
  const bool movement = ir::moves_data(kind);
  if (movement && (out_tensor.empty() ? !op.inputs.empty() && is_int(op.inputs[0]) : is_int(out_tensor)))
    op.dtype = ir::DType::i64;
  model.ops.push_back(std::move(op));
  if (!out_tensor.empty()) producer_of[out_tensor] = name;
  return name;
}

void Mapper::unsupported(const onnx::NodeProto& n, const std::string& why) {
  reasons.push_back(fmt::format("{}: {}", node_label(n), why));
}

void Mapper::add_param(const std::string& op, const std::string& param, const std::string& tensor,
                       std::vector<int64_t> shape, bool transpose, int64_t part, int64_t parts) {
  ParamSource ps;
  ps.op = op;
  ps.param = param;
  ps.tensor = tensor;
  ps.transpose = transpose;
  ps.part = part;
  ps.parts = parts;
  ps.shape = std::move(shape);
  param_sources.push_back(std::move(ps));
}

namespace {

int64_t norm_axis(int64_t a, size_t rank) { return a < 0 ? a + static_cast<int64_t>(rank) : a; }

auto one_or_pair(const std::vector<int64_t>& v) { return v[0] == v[1] ? Json(v[0]) : Json(v); }

// A 2-d pooling window: any kernel, stride and (MaxPool) dilation pairs; pads symmetric per axis
// (PyTorch's exporter writes no others), or an explanation.
std::string window_attrs(const onnx::NodeProto& n, const std::vector<int64_t>& kernel, Json& attrs) {
  if (kernel.size() != 2)
    return fmt::format("only 2-d pooling is supported, found kernel_shape {}", fmt::join(kernel, "x"));
  auto strides = attr_ints(n, "strides"), pads = attr_ints(n, "pads"), dil = attr_ints(n, "dilations");
  if (strides.empty()) strides = {1, 1};
  if (pads.empty()) pads = {0, 0, 0, 0};
  if (dil.empty()) dil = {1, 1};
  if (strides.size() != 2 || pads.size() != 4 || dil.size() != 2)
    return fmt::format("strides {}, dilations {} or pads {} do not fit a 2-d kernel", fmt::join(strides, "x"),
                       fmt::join(dil, "x"), fmt::join(pads, ","));
  if (pads[0] != pads[2] || pads[1] != pads[3])
    return fmt::format("asymmetric pads {} are not supported (top/bottom and left/right must be equal)",
                       fmt::join(pads, ","));
  if (dil != std::vector<int64_t>{1, 1} && n.op_type() != "MaxPool")
    return fmt::format("dilations {} are supported on MaxPool only", fmt::join(dil, "x"));
  for (int k = 0; k < 2; ++k)
    if (2 * pads[k] > dil[k] * (kernel[k] - 1) + 1)
      return fmt::format("pads {} exceed half the kernel {} (PyTorch's pooling limit)", fmt::join(pads, ","),
                         fmt::join(kernel, "x"));
  const auto* ap = find_attr(n, "auto_pad");
  if (ap && ap->s() != "NOTSET" && ap->s() != "VALID")
    return fmt::format("auto_pad {} is not supported (export with explicit pads)", ap->s());
  if (ap && ap->s() == "VALID") pads = {0, 0, 0, 0};
  if (attr_i(n, "storage_order", 0) != 0) return "storage_order 1 (column-major indices) is not supported";
  attrs["kernel"] = one_or_pair(kernel);
  attrs["stride"] = one_or_pair(strides);
  if (pads[0] != 0 || pads[1] != 0) attrs["padding"] = one_or_pair({pads[0], pads[1]});
  if (dil != std::vector<int64_t>{1, 1}) attrs["dilation"] = one_or_pair(dil);
  return "";
}

// General 2-d convolution geometry: any kernel shape, stride and dilation pairs, asymmetric pads.
std::string conv_attrs(const onnx::NodeProto& n, const std::vector<int64_t>& kernel, Json& attrs) {
  if (kernel.size() != 2)
    return fmt::format("only 2-d convolutions are supported, found kernel {}", fmt::join(kernel, "x"));
  auto strides = attr_ints(n, "strides"), pads = attr_ints(n, "pads"), dil = attr_ints(n, "dilations");
  if (strides.empty()) strides = {1, 1};
  if (dil.empty()) dil = {1, 1};
  if (pads.empty()) pads = {0, 0, 0, 0};
  if (strides.size() != 2 || dil.size() != 2 || pads.size() != 4)
    return fmt::format("strides {}, dilations {} or pads {} do not fit a 2-d kernel", fmt::join(strides, "x"),
                       fmt::join(dil, "x"), fmt::join(pads, ","));
  const auto* ap = find_attr(n, "auto_pad");
  if (ap && ap->s() != "NOTSET")
    return fmt::format("auto_pad {} is not supported (export with explicit pads)", ap->s());
  attrs["kernel"] = one_or_pair(kernel);
  attrs["stride"] = one_or_pair(strides);
  if (dil != std::vector<int64_t>{1, 1}) attrs["dilation"] = one_or_pair(dil);
  if (std::count(pads.begin(), pads.end(), pads[0]) == 4) attrs["padding"] = pads[0];
  else if (pads[0] == pads[2] && pads[1] == pads[3]) attrs["padding"] = std::vector<int64_t>{pads[0], pads[1]};
  else attrs["padding"] = pads;  // ONNX [top, left, bottom, right] is the IR's order
  return "";
}

// Why `group` does not fit a convolution's input channels and weight [co, ci / group, ...] ("" when it does).
std::string group_mismatch(int64_t groups, int64_t ci, const std::vector<int64_t>& w) {
  if (groups >= 1 && ci % groups == 0 && w[0] % groups == 0 && w[1] * groups == ci) return "";
  return fmt::format("group {} does not fit {} input channels and weight [{}]", groups, ci, fmt::join(w, ", "));
}

bool unused(const Net& net, const std::string& tensor) {
  if (tensor.empty()) return true;
  auto it = net.t.find(tensor);
  return (it == net.t.end() || it->second.consumers.empty()) &&
         std::find(net.outputs.begin(), net.outputs.end(), tensor) == net.outputs.end();
}

// One node being mapped: its tensors and the shorthands the per-type rules share.
struct Node {
  Mapper& m;
  int i;
  const onnx::NodeProto& n;
  const std::string& x;  // the first input (the output for a node without inputs)
  const std::string& y;  // the first output

  const Net& net() const { return m.net; }
  bool is_act(int k) const { return k < n.input_size() && !n.input(k).empty() && net().at(n.input(k)).activation; }
  /// One IR op of `kind` from x to y.
  void simple(ir::OpKind kind, Json attrs = Json::object()) const { m.emit(n.name(), kind, {x}, y, std::move(attrs)); }
  void unsupported(const std::string& why) const { m.unsupported(n, why); }
};
using NodeRule = void (*)(const Node&);

void map_gelu(const Node& d) {
  const auto* a = find_attr(d.n, "approximate");
  if (a && a->s() != "none") return d.unsupported("only the exact (erf) GELU is supported");
  d.simple(ir::OpKind::gelu);
}

void map_batchnorm(const Node& d) {
  const Net& net = d.net();
  for (int k = 1; k < d.n.output_size(); ++k)
    if (!unused(net, d.n.output(k))) return d.unsupported("running statistics outputs are used by the graph");
  if (net.shape(d.x).size() != 4) return d.unsupported("only 2-d batch norm ([B,C,H,W]) is supported");
  // eps from the node: torchvision's inception and mobilenet_v3 use 0.001, not the default 1e-5.
  const std::string name = d.m.emit(d.n.name(), ir::OpKind::batchnorm, {d.x}, d.y,
                                    Json{{"eps", attr_f(d.n, "epsilon", 1e-5f)}});
  d.m.add_param(name, "weight", d.n.input(1), {net.shape(d.x)[1]});
  d.m.add_param(name, "bias", d.n.input(2), {net.shape(d.x)[1]});
}

void map_pool(const Node& d) {
  if (d.n.output_size() > 1 && !unused(d.net(), d.n.output(1))) return d.unsupported("the indices output is used");
  Json attrs = Json::object();
  std::string why = window_attrs(d.n, attr_ints(d.n, "kernel_shape"), attrs);
  if (!why.empty()) return d.unsupported(why);
  if (attr_i(d.n, "ceil_mode", 0)) attrs["ceil_mode"] = true;
  // ONNX's default excludes the padding from the average, PyTorch's (and the IR's) includes it.
  if (d.n.op_type() == "AveragePool" && attrs.contains("padding") && attr_i(d.n, "count_include_pad", 0) == 0)
    attrs["count_include_pad"] = false;
  d.simple(d.n.op_type() == "MaxPool" ? ir::OpKind::maxpool : ir::OpKind::avgpool, attrs);
}

// ConvTranspose (nn.ConvTranspose2d): weight [C_in, C_out / group, kh, kw]. output_shape or
// auto_pad SAME_* set the pads from the output size, as the ONNX spec says.
void map_conv_transpose(const Node& d) {
  const Net& net = d.net();
  const onnx::NodeProto& n = d.n;
  if (d.is_act(1)) return d.unsupported("the weight must be a parameter, not an activation");
  const auto& w = net.shape(n.input(1));
  const auto& xs = net.shape(d.x);
  if (w.size() != 4 || xs.size() != 4)
    return d.unsupported(
        fmt::format("only 2-d transposed convolutions are supported, found weight [{}]", fmt::join(w, ", ")));
  const std::vector<int64_t> kernel{w[2], w[3]};
  auto strides = attr_ints(n, "strides"), dil = attr_ints(n, "dilations"), pads = attr_ints(n, "pads");
  auto out_pad = attr_ints(n, "output_padding"), out_shape = attr_ints(n, "output_shape");
  if (strides.empty()) strides = {1, 1};
  if (dil.empty()) dil = {1, 1};
  if (pads.empty()) pads = {0, 0, 0, 0};
  if (out_pad.empty()) out_pad = {0, 0};
  if (strides.size() != 2 || dil.size() != 2 || pads.size() != 4 || out_pad.size() != 2)
    return d.unsupported(fmt::format("strides {}, dilations {}, pads {} or output_padding {} do not fit a 2-d kernel",
                                     fmt::join(strides, "x"), fmt::join(dil, "x"), fmt::join(pads, ","),
                                     fmt::join(out_pad, "x")));
  for (int64_t p : out_pad)
    if (p < 0) return d.unsupported(fmt::format("output_padding {} is negative", fmt::join(out_pad, "x")));
  const auto* ap = find_attr(n, "auto_pad");
  const std::string auto_pad = ap ? ap->s() : "NOTSET";
  if (auto_pad != "NOTSET" && auto_pad != "VALID" && auto_pad != "SAME_UPPER" && auto_pad != "SAME_LOWER")
    return d.unsupported(fmt::format("auto_pad {} is not an ONNX value", auto_pad));
  if (auto_pad == "VALID") pads = {0, 0, 0, 0};
  if (!out_shape.empty() || auto_pad == "SAME_UPPER" || auto_pad == "SAME_LOWER") {
    if (!out_shape.empty() && out_shape.size() != 2)
      return d.unsupported(fmt::format("output_shape {} is not [h, w]", fmt::join(out_shape, "x")));
    for (int k = 0; k < 2; ++k) {
      const int64_t want = out_shape.empty() ? xs[2 + k] * strides[k] : out_shape[k];
      const int64_t total = strides[k] * (xs[2 + k] - 1) + out_pad[k] + (kernel[k] - 1) * dil[k] + 1 - want;
      if (total < 0)
        return d.unsupported(fmt::format("output size {} is larger than the full transposed convolution", want));
      const bool upper = auto_pad == "SAME_UPPER";
      pads[k] = upper ? total / 2 : total - total / 2;
      pads[k + 2] = total - pads[k];
    }
  }
  const auto& ys = net.shape(d.y);
  for (int k = 0; k < 2; ++k) {  // libonnx's inference and the spec disagree for SAME with output_padding
    const int64_t h = strides[k] * (xs[2 + k] - 1) + out_pad[k] + (kernel[k] - 1) * dil[k] + 1 - pads[k] - pads[k + 2];
    if (h != ys[2 + k])
      return d.unsupported(
          fmt::format("ONNX shape inference gives output [{}], the attributes (auto_pad {}, "
                      "output_padding {}) give {} on axis {}",
                      fmt::join(ys, ", "), auto_pad, fmt::join(out_pad, "x"), h, 2 + k));
  }
  const int64_t groups = attr_i(n, "group", 1), ci = xs[1];
  if (groups < 1 || w[0] != ci || ci % groups != 0)
    return d.unsupported(
        fmt::format("group {} does not fit {} input channels and weight [{}]", groups, ci, fmt::join(w, ", ")));
  const int64_t co = w[1] * groups;
  Json attrs{{"out_channels", co}, {"kernel", one_or_pair(kernel)}, {"stride", one_or_pair(strides)}};
  if (dil != std::vector<int64_t>{1, 1}) attrs["dilation"] = one_or_pair(dil);
  if (std::count(pads.begin(), pads.end(), pads[0]) == 4) attrs["padding"] = pads[0];
  else if (pads[0] == pads[2] && pads[1] == pads[3]) attrs["padding"] = std::vector<int64_t>{pads[0], pads[1]};
  else attrs["padding"] = pads;
  if (out_pad != std::vector<int64_t>{0, 0}) attrs["output_padding"] = one_or_pair(out_pad);
  if (groups != 1) attrs["groups"] = groups;
  const bool bias = n.input_size() > 2 && !n.input(2).empty();
  attrs["bias"] = bias;
  const std::string name = d.m.emit(n.name(), ir::OpKind::conv_transpose2d, {d.x}, d.y, attrs);
  d.m.add_param(name, "weight", n.input(1), {w[0], w[1], w[2], w[3]});
  if (bias) d.m.add_param(name, "bias", n.input(2), {co});
}

// Resize (opset 10+) and Upsample (7-9) of [B, C, H, W] over H and W, as PyTorch's interpolate
// exports them: nearest with asymmetric coordinates and floor; (bi)linear with pytorch_half_pixel /
// half_pixel (align_corners=False) or align_corners. The output size is ONNX's inferred shape; the
// scales, when the node has them, are the coordinates' scale factors.
void map_resize(const Node& d) {
  const Net& net = d.net();
  const onnx::NodeProto& n = d.n;
  const bool upsample = n.op_type() == "Upsample";
  const auto& xs = net.shape(d.x);
  const auto& ys = net.shape(d.y);
  if (xs.size() != 4)
    return d.unsupported(fmt::format("only [B,C,H,W] inputs are supported, found rank {}", xs.size()));
  const auto* m = find_attr(n, "mode");
  const std::string mode = m ? m->s() : "nearest";
  if (mode != "nearest" && mode != "linear" && mode != "bilinear")
    return d.unsupported(fmt::format("mode {} is not supported (nearest and linear are)", mode));
  const auto* ct = find_attr(n, "coordinate_transformation_mode");
  // Upsample and opset-10 Resize have no attribute: their coordinates are asymmetric.
  const std::string coord = ct ? ct->s() : upsample || net.opset < 11 ? "asymmetric" : "half_pixel";
  Json attrs{{"size", std::vector<int64_t>{ys[2], ys[3]}}};
  if (mode == "nearest") {
    const auto* nm = find_attr(n, "nearest_mode");
    const std::string nearest = nm ? nm->s() : "round_prefer_floor";
    if (coord != "asymmetric" || (net.opset >= 11 && nearest != "floor"))
      return d.unsupported(
          fmt::format("nearest with coordinate_transformation_mode {} and nearest_mode {} (supported: "
                      "asymmetric with floor, PyTorch's 'nearest')",
                      coord, nearest));
    attrs["mode"] = "nearest";
  } else {
    if (coord == "align_corners") {
      attrs["align_corners"] = true;
    } else if (coord == "half_pixel" && (ys[2] == 1 || ys[3] == 1)) {
      return d.unsupported(
          "linear with coordinate_transformation_mode half_pixel onto an output of size 1 (PyTorch's "
          "pytorch_half_pixel differs there)");
    } else if (coord != "pytorch_half_pixel" && coord != "half_pixel") {
      return d.unsupported(
          fmt::format("linear with coordinate_transformation_mode {} (supported: pytorch_half_pixel, "
                      "half_pixel, align_corners)",
                      coord));
    }
    attrs["mode"] = "linear";
  }
  // Scales: Upsample's input 1 (opset 9) or attribute (7-8); Resize's input 2 when no sizes.
  std::vector<double> scales;
  if (upsample && find_attr(n, "scales")) {
    for (float f : find_attr(n, "scales")->floats()) scales.push_back(f);
  } else {
    const int k = upsample || net.opset < 11 ? 1 : 2;  // opset 10's Resize is (X, scales)
    const bool has_sizes = k == 2 && n.input_size() > 3 && !n.input(3).empty();
    if (!has_sizes && k < n.input_size() && !n.input(k).empty()) {
      const auto& t = net.at(n.input(k));
      if (!t.reals) return d.unsupported("the scales are not a constant");
      scales = *t.reals;
    }
  }
  if (!scales.empty()) {
    if (scales.size() != 4 || scales[0] != 1 || scales[1] != 1)
      return d.unsupported(fmt::format("scales [{}] resize the batch or channels", fmt::join(scales, ", ")));
    if (ys[2] != static_cast<int64_t>(std::floor(static_cast<double>(xs[2]) * scales[2])) ||
        ys[3] != static_cast<int64_t>(std::floor(static_cast<double>(xs[3]) * scales[3])))
      return d.unsupported("the output size is not floor(input size x scale)");
    attrs["scales"] = std::vector<double>{scales[2], scales[3]};
  } else if (ys[0] != xs[0] || ys[1] != xs[1]) {
    return d.unsupported(fmt::format("sizes [{}] resize the batch or channels", fmt::join(ys, ", ")));
  }
  d.simple(ir::OpKind::resize, attrs);
}

// ONNX keeps [B, C, 1, 1]; the IR's global_avgpool gives [B, C], reshaped back.
void map_global_avgpool(const Node& d) {
  const auto& xs = d.net().shape(d.x);
  if (xs.size() != 4) return d.unsupported("only [B,C,H,W] inputs are supported");
  ir::Shape pooled{ir::kBatch, xs[1]};
  std::string gap = d.m.emit(d.n.name(), ir::OpKind::global_avgpool, {d.x}, "", Json::object(), &pooled);
  d.m.producer_of["\x01" + gap] = gap;
  d.m.emit(d.n.name() + "/unsqueeze", ir::OpKind::reshape, {"\x01" + gap}, d.y, Json{{"shape", {xs[1], 1, 1}}});
}

// The constant integer offsets c of indices computed as Add(ids, c) (ids an integer activation, c a
// constant integer tensor: one per index of the last dim, or one), read only by table lookups: the
// lookup takes them as attrs.offsets. Nothing when `idx` is not that.
struct IndexOffsets {
  std::string ids;
  std::vector<int64_t> offsets;
};
std::optional<IndexOffsets> index_offsets(const Net& net, const std::string& idx) {
  const auto& ti = net.at(idx);
  if (ti.producer < 0) return std::nullopt;
  const auto& add = net.nodes[static_cast<size_t>(ti.producer)];
  if (add.op_type() != "Add" || add.input_size() != 2) return std::nullopt;
  for (int k = 0; k < 2; ++k) {
    const auto &a = net.at(add.input(k)), &c = net.at(add.input(1 - k));
    if (!a.activation || c.activation || !c.ints || !a.shape) continue;
    if (a.elem_type != onnx::TensorProto::INT64 && a.elem_type != onnx::TensorProto::INT32) continue;
    int64_t n = 1;
    for (int64_t d : c.value_shape) n *= d;
    if (n != 1 && n != a.shape->back()) continue;
    for (int ci : ti.consumers)
      if (net.nodes[static_cast<size_t>(ci)].op_type() != "Gather") return std::nullopt;
    return IndexOffsets{add.input(k), *c.ints};
  }
  return std::nullopt;
}

// Add(ids, c) feeding table lookups only: taken by the lookups (index_offsets); nothing of its own.
bool offsets_for_lookups(const Node& d) {
  if (!index_offsets(d.net(), d.y)) return false;
  for (int ci : d.net().at(d.y).consumers) {
    const auto& g = d.net().nodes[static_cast<size_t>(ci)];
    if (g.input(1) != d.y || d.net().at(g.input(0)).activation) return false;
  }
  return true;
}

void map_add_mul(const Node& d) {
  if (d.n.op_type() == "Add" && offsets_for_lookups(d)) return;  // the lookups read ids + offsets themselves
  if (d.n.op_type() == "Add" && d.is_act(0) != d.is_act(1) && d.m.learned_positions(d.i, d.is_act(0) ? 0 : 1)) return;
  d.m.map_elementwise(d.i);
}

void map_gemm(const Node& d) {
  const Net& net = d.net();
  const onnx::NodeProto& n = d.n;
  if (attr_i(n, "transA", 0) || attr_f(n, "alpha", 1) != 1.0f || attr_f(n, "beta", 1) != 1.0f || d.is_act(1) ||
      d.is_act(2))
    return d.unsupported("only Gemm(x, W, b) with transA=0, alpha=beta=1 and parameter W, b is supported");
  const auto& w = net.shape(n.input(1));
  const bool trans_b = attr_i(n, "transB", 0) != 0, bias = n.input_size() > 2 && !n.input(2).empty();
  int64_t out = trans_b ? w[0] : w[1];
  const std::string name = d.m.emit(n.name(), ir::OpKind::linear, {d.x}, d.y,
                                    Json{{"out_features", out}, {"bias", bias}});
  d.m.add_param(name, "weight", n.input(1), {out, net.shape(d.x).back()}, !trans_b);
  if (bias) d.m.add_param(name, "bias", n.input(2), {out});
}

void map_matmul(const Node& d) {
  const Net& net = d.net();
  const onnx::NodeProto& n = d.n;
  if (d.is_act(1)) {
    if (net.shape(d.x).size() < 3 || net.shape(d.x).size() != net.shape(n.input(1)).size())
      return d.unsupported("activation @ activation needs equal ranks >= 3");
    d.m.emit(n.name(), ir::OpKind::matmul, {d.x, n.input(1)}, d.y);
    return;
  }
  const auto& w = net.shape(n.input(1));
  if (w.size() != 2) return d.unsupported("a parameter operand must be a 2-d weight");
  const std::string name = d.m.emit(n.name(), ir::OpKind::linear, {d.x}, d.y,
                                    Json{{"out_features", w[1]}, {"bias", false}});
  d.m.add_param(name, "weight", n.input(1), {w[1], net.shape(d.x).back()}, true);
}

void map_flatten(const Node& d) {
  if (norm_axis(attr_i(d.n, "axis", 1), d.net().shape(d.x).size()) != 1)
    return d.unsupported("only axis=1 is supported");
  d.simple(ir::OpKind::flatten);
}

void map_dropout(const Node& d) {
  const onnx::NodeProto& n = d.n;
  if (n.output_size() > 1 && !unused(d.net(), n.output(1))) return d.unsupported("the mask output is used");
  double p = attr_f(n, "ratio", 0.5f);
  if (n.input_size() > 1 && !n.input(1).empty()) {
    const auto& r = d.net().at(n.input(1));
    if (!r.reals || r.reals->size() != 1) return d.unsupported("the ratio is not a constant");
    p = (*r.reals)[0];
  }
  d.simple(ir::OpKind::dropout, Json{{"p", p}});
}

// Reshape, Squeeze, Unsqueeze: the inferred output shape, per sample.
void map_reshape(const Node& d) {
  const auto& s = d.net().shape(d.y);
  d.simple(ir::OpKind::reshape, Json{{"shape", std::vector<int64_t>(s.begin() + 1, s.end())}});
}

void map_transpose(const Node& d) {
  auto perm = attr_ints(d.n, "perm");
  if (perm.empty() || perm[0] != 0) return d.unsupported("the permutation moves the batch dimension");
  d.simple(ir::OpKind::transpose, Json{{"perm", perm}});
}

void map_softmax(const Node& d) {
  const int opset = d.net().opset;
  size_t rank = d.net().shape(d.x).size();
  int64_t axis = norm_axis(attr_i(d.n, "axis", opset >= 13 ? -1 : 1), rank);
  if (opset < 13 && axis != static_cast<int64_t>(rank) - 1)
    return d.unsupported("opset < 13 Softmax over more than the last axis");
  d.simple(ir::OpKind::softmax, Json{{"axis", axis}});
}

void map_layernorm(const Node& d) {
  const onnx::NodeProto& n = d.n;
  const auto& xs = d.net().shape(d.x);
  if (norm_axis(attr_i(n, "axis", -1), xs.size()) != static_cast<int64_t>(xs.size()) - 1)
    return d.unsupported("normalization over more than the last axis");
  if (n.input_size() < 3 || n.input(2).empty() || d.is_act(1) || d.is_act(2))
    return d.unsupported("needs parameter scale and bias");
  const std::string name = d.m.emit(n.name(), ir::OpKind::layernorm, {d.x}, d.y,
                                    Json{{"eps", attr_f(n, "epsilon", 1e-5f)}});
  d.m.add_param(name, "weight", n.input(1), {xs.back()});
  d.m.add_param(name, "bias", n.input(2), {xs.back()});
}

// Split: one slice per output.
void map_split(const Node& d) {
  const onnx::NodeProto& n = d.n;
  int64_t axis = norm_axis(attr_i(n, "axis", 0), d.net().shape(d.x).size());
  if (axis < 1) return d.unsupported("split along the batch dimension");
  int64_t start = 0;
  for (int k = 0; k < n.output_size(); ++k) {
    int64_t len = d.net().shape(n.output(k))[axis];
    d.m.emit(fmt::format("{}/{}", n.name(), k), ir::OpKind::slice, {d.x}, n.output(k),
             Json{{"axis", axis}, {"start", start}, {"end", start + len}});
    start += len;
  }
}

// A lookup table (nn.Embedding): Gather(weight, indices) with the indices a graph input.
void map_table_lookup(const Node& d) {
  const Net& net = d.net();
  const onnx::NodeProto& n = d.n;
  const auto& w = net.shape(d.x);
  if (w.size() != 2 || norm_axis(attr_i(n, "axis", 0), 2) != 0)
    return d.unsupported("a table lookup needs a 2-d table gathered along axis 0");
  const int idx_type = net.at(n.input(1)).elem_type;
  if (idx_type != onnx::TensorProto::INT64 && idx_type != onnx::TensorProto::INT32)
    return d.unsupported("the indices of a table lookup must be int32 or int64 (a graph input, or a slice of one)");
  Json attrs{{"rows", w[0]}, {"dim", w[1]}};
  std::string idx = n.input(1);
  if (std::optional<IndexOffsets> off = index_offsets(net, idx)) {  // table[ids + offsets]
    idx = off->ids;
    attrs["offsets"] = off->offsets;
  }
  const std::string name = d.m.emit(n.name(), ir::OpKind::embedding, {idx}, d.y, attrs);
  d.m.add_param(name, "weight", d.x, {w[0], w[1]});
}

// Gather of one constant index along a non-batch axis: a slice (and a reshape dropping the axis
// when the index is a scalar); with activation indices and a parameter table, a lookup.
void map_gather(const Node& d) {
  if (!d.is_act(0) && d.is_act(1)) return map_table_lookup(d);
  const Net& net = d.net();
  const onnx::NodeProto& n = d.n;
  const auto& idx = net.at(n.input(1));
  int64_t axis = norm_axis(attr_i(n, "axis", 0), net.shape(d.x).size());
  if (!idx.ints || idx.ints->size() != 1 || axis < 1)
    return d.unsupported("only a constant single index along a non-batch axis is supported");
  int64_t j = (*idx.ints)[0] < 0 ? (*idx.ints)[0] + net.shape(d.x)[axis] : (*idx.ints)[0];
  Json attrs{{"axis", axis}, {"start", j}, {"end", j + 1}};
  if (!idx.value_shape.empty()) return d.simple(ir::OpKind::slice, attrs);
  ir::Shape sliced = d.m.ir_shape(d.x);
  sliced[axis] = 1;
  std::string s = d.m.emit(n.name() + "/slice", ir::OpKind::slice, {d.x}, "", attrs, &sliced);
  d.m.producer_of["\x01" + s] = s;
  const auto& ys = net.shape(d.y);
  d.m.emit(n.name(), ir::OpKind::reshape, {"\x01" + s}, d.y,
           Json{{"shape", std::vector<int64_t>(ys.begin() + 1, ys.end())}});
}

/// The supported ONNX operators and how each becomes IR ops: a table, one entry per op type.
const std::unordered_map<std::string, NodeRule>& node_rules() {
  static const std::unordered_map<std::string, NodeRule> rules = {
      {"Relu", [](const Node& d) { d.simple(ir::OpKind::relu); }},
      {"Sigmoid", [](const Node& d) { d.simple(ir::OpKind::sigmoid); }},
      {"Tanh", [](const Node& d) { d.simple(ir::OpKind::tanh); }},
      {"HardSigmoid",
       [](const Node& d) {
         d.simple(ir::OpKind::hardsigmoid,
                  Json{{"alpha", attr_f(d.n, "alpha", 0.2f)}, {"beta", attr_f(d.n, "beta", 0.5f)}});
       }},
      {"HardSwish", [](const Node& d) { d.simple(ir::OpKind::hardswish); }},
      {"Clip", [](const Node& d) { d.m.map_clip(d.i); }},
      {"Pad", [](const Node& d) { d.m.map_pad(d.i); }},
      {"Gelu", map_gelu},
      {"Identity", [](const Node& d) { d.m.alias[d.y] = d.x; }},
      {"Conv", [](const Node& d) { d.m.map_conv(d.i); }},
      {"ConvTranspose", map_conv_transpose},
      {"Resize", map_resize},
      {"Upsample", map_resize},
      {"BatchNormalization", map_batchnorm},
      {"MaxPool", map_pool},
      {"AveragePool", map_pool},
      {"GlobalAveragePool", map_global_avgpool},
      {"Concat", [](const Node& d) { d.m.map_concat(d.i); }},
      {"Add", map_add_mul},
      {"Mul", map_add_mul},
      {"Gemm", map_gemm},
      {"MatMul", map_matmul},
      {"Flatten", map_flatten},
      {"Dropout", map_dropout},
      {"Reshape", map_reshape},
      {"Squeeze", map_reshape},
      {"Unsqueeze", map_reshape},
      {"Transpose", map_transpose},
      {"Softmax", map_softmax},
      {"LayerNormalization", map_layernorm},
      {"Split", map_split},
      {"Slice", [](const Node& d) { d.m.map_slice(d.i); }},
      {"Gather", map_gather},
      {"ReduceMean", [](const Node& d) { d.m.map_reduce(d.i); }},
      {"ReduceSum", [](const Node& d) { d.m.map_reduce(d.i); }},
  };
  return rules;
}

}  // namespace

void Mapper::map_node(int i) {
  const onnx::NodeProto& n = net.nodes[i];
  const std::string& op = n.op_type();
  auto rule = node_rules().find(op);
  if (op == "LSTM" || op == "GRU" || op == "RNN")
    return unsupported(n, fmt::format("a recurrent layer (nn.{}) is not supported yet: the IR has no recurrent op, "
                                      "and neither of torch's exporters writes it as other ops, so no export of it "
                                      "imports",
                                      op));
  if (rule == node_rules().end()) {
    unsupported_ops[op] += 1;
    return;
  }
  const std::string& y = n.output(0);
  if (!net.at(y).shape) {  // usually behind an unsupported operator; reported only when there is none
    shape_unknown.push_back(
        fmt::format("{}: ONNX shape inference could not determine its output shape", node_label(n)));
    return;
  }
  if (!batch_first(y) && op != "Identity")
    return unsupported(
        n, fmt::format("output shape [{}] does not keep the batch as dim 0", fmt::join(net.shape(y), ", ")));
  rule->second(Node{*this, i, n, n.input_size() ? n.input(0) : y, y});
}

void Mapper::map_conv(int i) {
  const onnx::NodeProto& n = net.nodes[i];
  const std::string &x = n.input(0), &y = n.output(0);
  if (net.at(n.input(1)).activation) return unsupported(n, "the weight must be a parameter, not an activation");
  const auto& w = net.shape(n.input(1));
  if (w.size() == 3) return map_conv1d(i);
  Json attrs = Json::object();
  std::string why = conv_attrs(n, {w.begin() + 2, w.end()}, attrs);
  if (!why.empty()) return unsupported(n, why);
  const int64_t groups = attr_i(n, "group", 1), ci = net.shape(x)[1];
  why = group_mismatch(groups, ci, w);
  if (!why.empty()) return unsupported(n, why);
  if (groups != 1) attrs["groups"] = groups;
  attrs["out_channels"] = w[0];
  const bool bias = n.input_size() > 2 && !n.input(2).empty();
  attrs["bias"] = bias;
  const std::string name = emit(n.name(), ir::OpKind::conv2d, {x}, y, attrs);
  add_param(name, "weight", n.input(1), {w[0], w[1], w[2], w[3]});
  if (bias) add_param(name, "bias", n.input(2), {w[0]});
}

// nn.Conv1d (x [B, C, T], weight [co, C/groups, k]) as the 2-d convolution it equals on [B, C, 1, T]
// with a [1, k] kernel: reshape, conv2d, reshape back. The weight is the file's, read as [co, C/g, 1, k].
void Mapper::map_conv1d(int i) {
  const onnx::NodeProto& n = net.nodes[static_cast<size_t>(i)];
  const std::string &x = n.input(0), &y = n.output(0);
  const auto &w = net.shape(n.input(1)), &xs = net.shape(x), &ys = net.shape(y);
  auto strides = attr_ints(n, "strides"), pads = attr_ints(n, "pads"), dil = attr_ints(n, "dilations");
  if (strides.empty()) strides = {1};
  if (dil.empty()) dil = {1};
  if (pads.empty()) pads = {0, 0};
  const auto* ap = find_attr(n, "auto_pad");
  if (ap && ap->s() != "NOTSET")
    return unsupported(n, fmt::format("auto_pad {} is not supported (export with explicit pads)", ap->s()));
  if (strides.size() != 1 || dil.size() != 1 || pads.size() != 2 || xs.size() != 3)
    return unsupported(n, "a 1-d convolution needs one stride, one dilation, two pads and a [B, C, T] input");
  const int64_t groups = attr_i(n, "group", 1), ci = xs[1];
  if (std::string why = group_mismatch(groups, ci, w); !why.empty()) return unsupported(n, why);
  Json attrs{{"out_channels", w[0]},
             {"kernel", std::vector<int64_t>{1, w[2]}},
             {"stride", std::vector<int64_t>{1, strides[0]}}};
  if (dil[0] != 1) attrs["dilation"] = std::vector<int64_t>{1, dil[0]};
  attrs["padding"] = pads[0] == pads[1] ? Json(std::vector<int64_t>{0, pads[0]})
                                        : Json(std::vector<int64_t>{0, pads[0], 0, pads[1]});
  if (groups != 1) attrs["groups"] = groups;
  const bool bias = n.input_size() > 2 && !n.input(2).empty();
  attrs["bias"] = bias;
  const ir::Shape x4{ir::kBatch, xs[1], 1, xs[2]}, y4{ir::kBatch, ys[1], 1, ys[2]};
  const std::string up = emit(n.name() + "/as_2d", ir::OpKind::reshape, {x}, "",
                              Json{{"shape", std::vector<int64_t>{xs[1], 1, xs[2]}}}, &x4);
  producer_of["\x01" + up] = up;
  const std::string conv = emit(n.name(), ir::OpKind::conv2d, {"\x01" + up}, "", attrs, &y4);
  producer_of["\x01" + conv] = conv;
  add_param(conv, "weight", n.input(1), {w[0], w[1], 1, w[2]});
  param_sources.back().reshape = true;
  if (bias) add_param(conv, "bias", n.input(2), {w[0]});
  emit(n.name() + "/as_1d", ir::OpKind::reshape, {"\x01" + conv}, y,
       Json{{"shape", std::vector<int64_t>{ys[1], ys[2]}}});
}

void Mapper::map_pad(int i) {
  const onnx::NodeProto& n = net.nodes[i];
  const auto* mode = find_attr(n, "mode");
  if (mode && mode->s() != "constant")
    return unsupported(n, fmt::format("only constant padding, found mode {}", mode->s()));
  std::vector<int64_t> pads = attr_ints(n, "pads");  // opset < 11: an attribute
  if (n.input_size() > 1 && !n.input(1).empty()) {
    const auto& p = net.at(n.input(1));
    if (!p.ints) return unsupported(n, "the pads are not a constant");
    pads = *p.ints;
  }
  if (n.input_size() > 3 && !n.input(3).empty()) return unsupported(n, "padding selected axes (the axes input)");
  double value = attr_f(n, "value", 0.0f);
  if (n.input_size() > 2 && !n.input(2).empty()) {
    const auto& v = net.at(n.input(2));
    if (!v.reals && !v.ints) return unsupported(n, "the constant value is not a constant");
    value = v.reals ? (*v.reals).at(0) : static_cast<double>((*v.ints).at(0));
  }
  const size_t r = net.shape(n.input(0)).size();
  if (pads.size() != 2 * r || pads[0] != 0 || pads[r] != 0)
    return unsupported(n, fmt::format("pads [{}] pad the batch or do not fit rank {}", fmt::join(pads, ", "), r));
  std::vector<int64_t> per_sample;
  for (size_t side = 0; side < 2; ++side)
    for (size_t d = 1; d < r; ++d) {
      if (pads[side * r + d] < 0) return unsupported(n, "negative pads (cropping)");
      per_sample.push_back(pads[side * r + d]);
    }
  emit(n.name(), ir::OpKind::pad, {n.input(0)}, n.output(0), Json{{"pads", per_sample}, {"value", value}});
}

void Mapper::map_clip(int i) {
  const onnx::NodeProto& n = net.nodes[i];
  Json attrs = Json::object();
  auto bound = [&](int k, const char* key, const char* attr) {
    if (k < n.input_size() && !n.input(k).empty()) {
      const auto& t = net.at(n.input(k));
      if (!t.reals && !t.ints) return false;
      attrs[key] = t.reals ? (*t.reals).at(0) : static_cast<double>((*t.ints).at(0));
    } else if (find_attr(n, attr)) {  // opset < 11
      attrs[key] = attr_f(n, attr, 0.0f);
    }
    return true;
  };
  if (!bound(1, "min", "min") || !bound(2, "max", "max")) return unsupported(n, "the bounds are not constants");
  emit(n.name(), ir::OpKind::clip, {n.input(0)}, n.output(0), attrs);
}

std::optional<ParamOperand> Mapper::param_operand(const std::string& tensor, size_t rank) const {
  const TensorInfo& ti = net.at(tensor);
  if (!ti.param || !ti.shape) return std::nullopt;
  ParamOperand p{tensor, *ti.shape};
  if (ti.producer >= 0) {  // Expand(P, [B, ...]) (a class token repeated over the batch): P itself
    const onnx::NodeProto& e = net.nodes[static_cast<size_t>(ti.producer)];
    if (e.op_type() != "Expand" || net.at(e.input(0)).producer >= 0) return std::nullopt;
    p.tensor = e.input(0);
  }
  if (!p.shape.empty() && p.shape.size() == rank && (p.shape[0] == 1 || p.shape[0] == kProbeBatch))
    p.shape.erase(p.shape.begin());  // the batch dim: broadcast or expanded
  if (p.shape.size() >= rank) return std::nullopt;
  p.shape.insert(p.shape.begin(), rank - 1 - p.shape.size(), 1);  // NumPy: right-aligned
  return p;
}

void Mapper::map_elementwise(int i) {
  const onnx::NodeProto& n = net.nodes[i];
  const std::string& y = n.output(0);
  const size_t rank = net.shape(y).size();
  std::vector<std::string> acts;
  std::optional<ParamOperand> param;
  for (int k = 0; k < 2; ++k) {
    if (net.at(n.input(k)).activation) {
      if (net.shape(n.input(k)).size() != rank)
        return unsupported(n, fmt::format("operand \"{}\" has rank {}, the result {}", n.input(k),
                                          net.shape(n.input(k)).size(), rank));
      acts.push_back(n.input(k));
    } else if (!(param = param_operand(n.input(k), rank))) {
      return unsupported(n, fmt::format("{} with a constant operand \"{}\" outside a recognised pattern (linear bias, "
                                        "layer norm, GELU); parameters are supported",
                                        n.op_type(), n.input(k)));
    }
  }
  Json attrs = Json::object();
  if (param) attrs["param"] = param->shape;
  const std::string name = emit(n.name(), n.op_type() == "Add" ? ir::OpKind::add : ir::OpKind::mul, acts, y, attrs);
  if (param) add_param(name, "param", param->tensor, param->shape);
}

void Mapper::map_concat(int i) {
  const onnx::NodeProto& n = net.nodes[i];
  const size_t rank = net.shape(n.output(0)).size();
  int64_t axis = norm_axis(attr_i(n, "axis", 0), rank);
  if (axis < 1) return unsupported(n, "concatenation along the batch dimension");
  std::vector<std::string> acts;
  std::optional<ParamOperand> param;
  Json attrs{{"axis", axis}};
  for (int k = 0; k < n.input_size(); ++k) {
    if (net.at(n.input(k)).activation) {
      acts.push_back(n.input(k));
      continue;
    }
    if (param || !(param = param_operand(n.input(k), rank)))
      return unsupported(n, fmt::format("input \"{}\" is a constant, not an activation (one parameter operand, a class "
                                        "token, is supported)",
                                        n.input(k)));
    attrs["param"] = param->shape;
    if (k > 0) attrs["param_at"] = k;
  }
  if (acts.empty()) return unsupported(n, "no activation operand");
  const std::string name = emit(n.name(), ir::OpKind::concat, acts, n.output(0), attrs);
  if (param) add_param(name, "param", param->tensor, param->shape);
}

void Mapper::map_reduce(int i) {
  // One mean / sum per axis, the highest first (so the lower axes keep their index without keepdim):
  // x.mean([2, 3]) (shufflenet, mnasnet) is a mean over 3 then over 2, exactly the mean over both.
  const onnx::NodeProto& n = net.nodes[i];
  auto axes = attr_ints(n, "axes");
  if (axes.empty() && n.input_size() > 1 && !n.input(1).empty()) {  // ReduceSum since opset 13: axes an input
    const auto& ax = net.at(n.input(1));
    if (ax.activation || !ax.ints) return unsupported(n, "the axes are not a constant");
    axes = *ax.ints;
  }
  const size_t rank = net.shape(n.input(0)).size();
  if (axes.empty()) return unsupported(n, "a reduction over every axis (the batch included)");
  for (auto& a : axes) a = norm_axis(a, rank);
  std::sort(axes.begin(), axes.end(), std::greater<>());
  if (axes.back() < 1) return unsupported(n, "reduction over the batch dimension");
  if (std::adjacent_find(axes.begin(), axes.end()) != axes.end()) return unsupported(n, "an axis listed twice");
  const bool keep = attr_i(n, "keepdims", 1) != 0;
  const ir::OpKind kind = n.op_type() == "ReduceMean" ? ir::OpKind::mean : ir::OpKind::sum;
  std::string cur = n.input(0);
  ir::Shape shape = ir_shape(cur);
  for (size_t k = 0; k < axes.size(); ++k) {
    const bool last = k + 1 == axes.size();
    if (keep) shape[static_cast<size_t>(axes[k])] = 1;
    else shape.erase(shape.begin() + axes[k]);
    std::string out = last ? n.output(0) : fmt::format("\x01{}/{}", n.name(), k);
    emit(axes.size() == 1 ? n.name() : fmt::format("{}/{}", n.name(), k), kind, {cur}, out,
         Json{{"axis", axes[k]}, {"keepdim", keep}}, &shape);
    cur = out;
  }
}

void Mapper::map_slice(int i) {
  const onnx::NodeProto& n = net.nodes[i];
  auto ints = [&](int k) -> const std::vector<int64_t>* {
    if (k >= n.input_size() || n.input(k).empty()) return nullptr;
    const auto& ti = net.at(n.input(k));
    return ti.ints ? &*ti.ints : nullptr;
  };
  const auto *starts = ints(1), *ends = ints(2), *axes = ints(3), *steps = ints(4);
  if (!starts || !ends || (n.input_size() > 3 && !n.input(3).empty() && !axes) || (n.input_size() > 4 && !steps))
    return unsupported(n, "starts, ends, axes and steps must be constants");
  const auto& xs = net.shape(n.input(0));
  std::string cur = n.input(0);
  ir::Shape shape = ir_shape(cur);
  for (size_t k = 0; k < starts->size(); ++k) {
    int64_t axis = norm_axis(axes ? (*axes)[k] : static_cast<int64_t>(k), xs.size());
    const int64_t step = steps ? (*steps)[k] : 1;
    if (step < 1) return unsupported(n, fmt::format("step {} (only positive steps are supported)", step));
    if (axis < 1) return unsupported(n, "slicing the batch dimension");
    int64_t d = xs[axis], s = (*starts)[k], e = (*ends)[k];
    s = std::clamp(s < 0 ? s + d : s, int64_t{0}, d);
    e = std::clamp(e < 0 ? e + d : e, int64_t{0}, d);
    if (e <= s) return unsupported(n, fmt::format("an empty slice [{}, {}) of axis {}", s, e, axis));
    shape[axis] = (e - s + step - 1) / step;
    bool last = k + 1 == starts->size();
    std::string out = last ? n.output(0) : fmt::format("\x01{}/{}", n.name(), k);
    std::string name = emit(starts->size() == 1 ? n.name() : fmt::format("{}/{}", n.name(), k), ir::OpKind::slice,
                            {cur}, out,
                            step == 1 ? Json{{"axis", axis}, {"start", s}, {"end", e}}
                                      : Json{{"axis", axis}, {"start", s}, {"end", e}, {"step", step}},
                            &shape);
    cur = out;
  }
}

bool Mapper::learned_positions(int i, int act) {
  const onnx::NodeProto& n = net.nodes[i];
  const std::string &e = n.input(act), &p = n.input(1 - act);
  auto it = producer_of.find(e);
  if (it == producer_of.end() || !net.at(p).param || net.at(e).consumers.size() != 1) return false;
  auto op = std::find_if(model.ops.begin(), model.ops.end(), [&](const ir::Op& o) { return o.name == it->second; });
  if (op == model.ops.end() || op->kind != ir::OpKind::embedding || op->attrs.contains("positions")) return false;
  const auto &ys = net.shape(e), &ps = net.shape(p);
  if (ys.size() != 3) return false;
  const int64_t seq = ys[1], dim = ys[2];
  const TensorInfo& pi = net.at(p);
  if (pi.producer >= 0 && net.nodes[pi.producer].op_type() == "Gather") {
    // GPT-2 style: Gather(table [max_len, dim], arange(seq)): the whole table is the parameter.
    const onnx::NodeProto& g = net.nodes[pi.producer];
    const TensorInfo& idx = net.at(g.input(1));
    const auto& ts = net.shape(g.input(0));
    auto is_arange = [&](const std::vector<int64_t>& v) {
      if (static_cast<int64_t>(v.size()) != seq) return false;
      for (size_t k = 0; k < v.size(); ++k)
        if (v[k] != static_cast<int64_t>(k)) return false;
      return true;
    };
    if (attr_i(g, "axis", 0) != 0 || !net.at(g.input(0)).param || ts.size() != 2 || ts[1] != dim || !idx.ints ||
        !is_arange(*idx.ints))
      return false;
    op->attrs["positions"] = true;
    if (ts[0] != seq) op->attrs["position_rows"] = ts[0];
    add_param(op->name, "pos", g.input(0), {ts[0], dim});
  } else {
    // A parameter [seq, dim] or [1, seq, dim] added to the token embedding.
    if (ps != std::vector<int64_t>{seq, dim} && ps != std::vector<int64_t>{1, seq, dim}) return false;
    op->attrs["positions"] = true;
    add_param(op->name, "pos", p, {seq, dim});
  }
  alias[n.output(0)] = e;
  return true;
}

ir::Model Mapper::finish() {
  if (unsupported_ops.empty()) reasons.insert(reasons.end(), shape_unknown.begin(), shape_unknown.end());
  if (!unsupported_ops.empty() || !reasons.empty()) {
    std::string msg = fmt::format("{}: cannot import the ONNX model (nothing was imported):", net.path);
    if (!unsupported_ops.empty()) {
      std::vector<std::string> parts;
      for (const auto& [op, count] : unsupported_ops) parts.push_back(fmt::format("{} x{}", op, count));
      msg += fmt::format(" unsupported operators: {};", fmt::join(parts, ", "));
    }
    if (!reasons.empty()) msg += fmt::format(" unsupported uses: {}", fmt::join(reasons, "; "));
    if (msg.back() == ';') msg.pop_back();
    throw UserError(msg);
  }
  auto resolve = [&](std::string t) {
    for (auto it = alias.find(t); it != alias.end(); it = alias.find(t)) t = it->second;
    if (auto it = producer_of.find(t); it != producer_of.end()) return it->second;
    GP_CHECK(std::find(net.data_inputs.begin(), net.data_inputs.end(), t) != net.data_inputs.end(),
             "{}: tensor \"{}\" feeds an operator as an activation but is a constant", net.path, t);
    return t;
  };
  for (auto& op : model.ops)
    for (auto& in : op.inputs) in = resolve(in);
  // The loss: cross-entropy against an i64 "label" for [B, C] logits, else MSE against a "target";
  // GRAPHPIPE_ONNX_LOSS=cross_entropy makes every output logits with the classes on dim 1 (per
  // position for [B, C, H, W]: labels [B, H, W]), =mse makes every loss MSE.
  const char* env = std::getenv("GRAPHPIPE_ONNX_LOSS");
  const std::string loss_choice = env && *env ? env : "auto";
  GP_CHECK(loss_choice == "auto" || loss_choice == "cross_entropy" || loss_choice == "mse" || loss_choice == "bce",
           "GRAPHPIPE_ONNX_LOSS: expected auto, cross_entropy, mse or bce, found \"{}\"", loss_choice);
  for (const auto& [tensor, op] : own_losses) model.outputs.push_back(op);
  if (!own_losses.empty() && own_losses.size() < net.outputs.size())
    warn_once(net.path, "own loss",
              fmt::format("the model returns its own loss ({}); its other outputs are not trained against anything",
                          fmt::join(model.outputs, ", ")));
  for (size_t k = 0; k < net.outputs.size() && own_losses.empty(); ++k) {
    const std::string suffix = net.outputs.size() == 1 ? "" : fmt::format("_{}", k);
    const std::string pred = resolve(net.outputs[k]);
    ir::Shape shape = ir_shape(net.outputs[k]);
    ir::Op loss;
    loss.name = "loss" + suffix;
    for (int j = 2; used_names.count(loss.name); ++j) loss.name = fmt::format("loss{}_{}", suffix, j);
    used_names.insert(loss.name);
    ir::Input target;
    if (loss_choice == "bce" || (loss_choice == "auto" && shape.size() == 2 && shape[1] == 1)) {
      // One logit per sample (a click, a yes/no): cross-entropy over one class is always 0.
      loss.kind = ir::OpKind::bce_with_logits;
      target = ir::Input{"target" + suffix, shape, ir::DType::f32};
    } else if (loss_choice == "cross_entropy" || (loss_choice == "auto" && shape.size() == 2)) {
      GP_CHECK(shape.size() >= 2,
               "{}: GRAPHPIPE_ONNX_LOSS=cross_entropy: output \"{}\" has shape {}, expected logits "
               "[B, C, ...] with the classes on dim 1",
               net.path, net.outputs[k], ir::shape_str(shape));
      loss.kind = ir::OpKind::cross_entropy;
      ir::Shape labels = shape;
      labels.erase(labels.begin() + 1);
      target = ir::Input{"label" + suffix, labels, ir::DType::i64};
    } else {
      loss.kind = ir::OpKind::mse_loss;
      target = ir::Input{"target" + suffix, shape, ir::DType::f32};
    }
    GP_CHECK(!used_names.count(target.name), "{}: a node is named \"{}\", which the appended loss needs", net.path,
             target.name);
    model.inputs.push_back(target);
    loss.inputs = {pred, target.name};
    loss.output_shape = {};
    model.ops.push_back(loss);
    model.outputs.push_back(loss.name);
  }
  ir::validate(model, net.path);
  return model;
}

ir::Model map_net(const Net& net, std::vector<ParamSource>* sources, OnnxImportReport* report) {
  const std::string& path = net.path;
  Mapper m{net};
  std::string stem = path.substr(path.find_last_of('/') + 1);
  m.model.name = stem.substr(0, stem.rfind(".onnx"));
  for (const auto& in : net.data_inputs) {
    const auto& ti = net.at(in);
    // int32 inputs (token ids) are index inputs like int64 ones: the IR has one index type.
    ir::DType dt = ti.elem_type == onnx::TensorProto::INT64 || ti.elem_type == onnx::TensorProto::INT32 ? ir::DType::i64
                   : ti.elem_type == onnx::TensorProto::FLOAT16                                         ? ir::DType::f16
                   : ti.elem_type == onnx::TensorProto::BFLOAT16 ? ir::DType::bf16
                                                                 : ir::DType::f32;
    GP_CHECK(ti.elem_type == onnx::TensorProto::FLOAT || dt != ir::DType::f32,
             "{}: input \"{}\" has ONNX element type {}, expected float, float16, bfloat16, int32 or int64", path, in,
             ti.elem_type);
    m.model.inputs.push_back(ir::Input{in, m.ir_shape(in), dt});
    m.used_names.insert(in);
  }
  std::vector<bool> claimed = net.folded;
  bool unknown = false;  // operators ONNX itself does not define: listed, never mapped
  for (size_t i = 0; i < net.nodes.size(); ++i)
    if (!net.has_schema[i]) {
      m.unsupported_ops[net.nodes[i].op_type()] += 1;
      claimed[i] = unknown = true;
    }
  try {
    m.match_patterns(claimed);
    for (size_t i = 0; i < net.nodes.size(); ++i)
      if (!claimed[i]) m.map_node(static_cast<int>(i));
  } catch (const UserError&) {
    // Shapes past an unknown operator may be missing; finish() names the operators, the real cause.
    if (!unknown) throw;
  }
  ir::Model model = m.finish();
  tie_shared_params(net, m.param_sources, model, report);
  if (sources) *sources = std::move(m.param_sources);
  return model;
}

}  // namespace onnx_detail

ir::Model import_onnx(const std::string& path, OnnxImportReport* report) {
  const onnx_detail::Net net = onnx_detail::load_net(path);
  try {
    return onnx_detail::map_net(net, nullptr, report);
  } catch (const UserError& e) {  // a fixed-batch dynamo export: say how such a file goes wrong
    if (net.inference_hint.empty()) throw;
    throw UserError(e.what() + net.inference_hint);
  }
}

}  // namespace gp::importers
