// Opsets 18 to 21 read as opset 17: the importer's libonnx (1.12) knows operator schemas up to opset
// 17, and torch 2.x's TorchScript exporter writes up to 21 (opset_version=18..21, dynamo=False). What
// changed after 17 in what that exporter writes is rewritten to its opset-17 form before shape
// inference, the same computation:
// - Reduce* (18): `axes` from an input (a constant) back to an attribute;
// - Split (18): `num_outputs` dropped (opset 17 splits evenly by output count; an uneven split fails
//   shape inference, naming the node);
// - Gelu (20): the exact form becomes x * (1 + erf(x / sqrt 2)) * 0.5, the node sequence the GELU
//   pattern reads (onnx_patterns.cpp); the tanh form is left for the unsupported-operator list;
// - Resize (18, 19), Pad (18), Cast (19): new attributes or inputs at their defaults dropped; any other
//   value is refused naming the node and attribute.
// Operators whose later versions only add element types need nothing.
#include <cmath>
#include <cstring>
#include <set>

#include "importers/onnx_graph.h"
#include "support/error.h"

namespace gp::importers::onnx_detail {
namespace {

/// The int64 values of a constant tensor (an initializer or a Constant node's output), or nullopt.
std::optional<std::vector<int64_t>> constant_ints(const onnx::GraphProto& g, const std::string& name) {
  const onnx::TensorProto* tp = nullptr;
  for (const auto& init : g.initializer())
    if (init.name() == name) tp = &init;
  for (const auto& n : g.node())
    if (n.op_type() == "Constant" && n.output_size() == 1 && n.output(0) == name)
      for (const auto& a : n.attribute())
        if (a.name() == "value") tp = &a.t();
  if (!tp || tp->data_type() != onnx::TensorProto::INT64) return std::nullopt;
  std::vector<int64_t> v(tp->int64_data().begin(), tp->int64_data().end());
  if (v.empty() && !tp->raw_data().empty()) {
    v.resize(tp->raw_data().size() / sizeof(int64_t));
    std::memcpy(v.data(), tp->raw_data().data(), v.size() * sizeof(int64_t));
  }
  return v;
}

void drop_attr(onnx::NodeProto& n, const std::string& name) {
  auto* attrs = n.mutable_attribute();
  for (int k = 0; k < attrs->size(); ++k)
    if (attrs->Get(k).name() == name) {
      attrs->DeleteSubrange(k, 1);
      return;
    }
}

onnx::TensorProto float_scalar(const std::string& name, float v) {
  onnx::TensorProto t;
  t.set_name(name);
  t.set_data_type(onnx::TensorProto::FLOAT);
  t.add_float_data(v);
  return t;
}

onnx::NodeProto node(const std::string& type, const std::string& name, std::vector<std::string> in,
                     const std::string& out) {
  onnx::NodeProto n;
  n.set_op_type(type);
  n.set_name(name);
  for (auto& i : in) n.add_input(i);
  n.add_output(out);
  return n;
}

const std::set<std::string> kReduceWithAxesInput = {"ReduceMean",   "ReduceMax",       "ReduceMin",
                                                    "ReduceProd",   "ReduceL1",        "ReduceL2",
                                                    "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare"};

}  // namespace

void normalize_opset(onnx::ModelProto& model, Net& net) {
  if (net.opset <= 17) return;
  onnx::GraphProto& g = *model.mutable_graph();
  auto refuse = [&](const onnx::NodeProto& n, const std::string& what) {
    throw UserError(fmt::format("{}: node {}: {} (opset {} is read as opset 17, where this has no equivalent)",
                                net.path, node_label(n), what, net.opset));
  };
  std::vector<onnx::NodeProto> out;
  bool gelu_constants = false;
  for (const onnx::NodeProto& n0 : g.node()) {
    onnx::NodeProto n = n0;
    const std::string& op = n.op_type();
    const bool onnx_domain = n.domain().empty() || n.domain() == "ai.onnx";
    if (!onnx_domain) {
      out.push_back(std::move(n));
      continue;
    }
    if (kReduceWithAxesInput.count(op)) {
      if (attr_i(n, "noop_with_empty_axes", 0) != 0) refuse(n, "noop_with_empty_axes=1");
      if (n.input_size() >= 2 && !n.input(1).empty()) {
        auto axes = constant_ints(g, n.input(1));
        if (!axes) refuse(n, fmt::format("axes \"{}\" is computed, not a constant", n.input(1)));
        auto* a = n.add_attribute();
        a->set_name("axes");
        a->set_type(onnx::AttributeProto::INTS);
        for (int64_t x : *axes) a->add_ints(x);
      }
      while (n.input_size() > 1) n.mutable_input()->RemoveLast();
    } else if (op == "Split") {
      drop_attr(n, "num_outputs");
    } else if (op == "Resize") {
      if (attr_i(n, "antialias", 0) != 0) refuse(n, "antialias=1");
      if (find_attr(n, "axes")) refuse(n, "axes");
      const auto* k = find_attr(n, "keep_aspect_ratio_policy");
      if (k && k->s() != "stretch") refuse(n, "keep_aspect_ratio_policy " + k->s());
      const auto* ct = find_attr(n, "coordinate_transformation_mode");
      if (ct && ct->s() == "half_pixel_symmetric") refuse(n, "coordinate_transformation_mode half_pixel_symmetric");
      drop_attr(n, "antialias");
      drop_attr(n, "keep_aspect_ratio_policy");
    } else if (op == "Pad") {
      if (n.input_size() >= 4 && !n.input(3).empty()) refuse(n, "an axes input");
      const auto* mode = find_attr(n, "mode");
      if (mode && mode->s() == "wrap") refuse(n, "mode wrap");
    } else if (op == "Cast") {
      if (attr_i(n, "saturate", 1) != 1) refuse(n, "saturate=0");
      drop_attr(n, "saturate");
    } else if (op == "Gelu") {
      const auto* a = find_attr(n, "approximate");
      if (!a || a->s() == "none") {
        const std::string& x = n.input(0);
        const std::string p = n.name().empty() ? n.output(0) : n.name();
        out.push_back(node("Div", p + "/gp_div", {x, "gp_gelu_sqrt2"}, p + "/gp_div_output"));
        out.push_back(node("Erf", p + "/gp_erf", {p + "/gp_div_output"}, p + "/gp_erf_output"));
        out.push_back(node("Add", p + "/gp_add", {p + "/gp_erf_output", "gp_gelu_one"}, p + "/gp_add_output"));
        out.push_back(node("Mul", p + "/gp_mul", {x, p + "/gp_add_output"}, p + "/gp_mul_output"));
        out.push_back(node("Mul", p + "/gp_half", {p + "/gp_mul_output", "gp_gelu_half"}, n.output(0)));
        gelu_constants = true;
        continue;
      }
    }
    out.push_back(std::move(n));
  }
  if (gelu_constants)  // Constant nodes, as the exporter writes GELU's constants
    for (auto [name, v] : {std::pair{"gp_gelu_sqrt2", static_cast<float>(std::sqrt(2.0))},
                           std::pair{"gp_gelu_one", 1.0f}, std::pair{"gp_gelu_half", 0.5f}}) {
      onnx::NodeProto c = node("Constant", name, {}, name);
      auto* a = c.add_attribute();
      a->set_name("value");
      a->set_type(onnx::AttributeProto::TENSOR);
      *a->mutable_t() = float_scalar(name, v);
      out.insert(out.begin(), std::move(c));
    }
  g.clear_node();
  for (auto& n : out) *g.add_node() = std::move(n);
  for (auto& os : *model.mutable_opset_import())
    if (os.domain().empty() || os.domain() == "ai.onnx") os.set_version(17);
  net.opset = 17;
}

}  // namespace gp::importers::onnx_detail
