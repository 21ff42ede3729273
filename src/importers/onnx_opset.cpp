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
// Operators whose later versions only add element types need nothing. A Reduce's `axes` computed by
// a subgraph of constants (torch 2.x's dynamo exporter with optimize=False writes mean's dims as
// Reshape(Constant, [-1])) is evaluated (evaluate_constant).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <set>
#include <unordered_map>

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

// A TensorProto's values as doubles (float, double, int32, int64, bool), or nullopt for another type
// or more than `limit` values.
std::optional<std::vector<double>> tensor_values(const onnx::TensorProto& tp, int64_t limit) {
  int64_t n = 1;
  for (int64_t d : tp.dims()) {
    if (d < 0 || (d > 0 && n > limit / d)) return std::nullopt;
    n *= d;
  }
  if (n > limit) return std::nullopt;
  std::vector<double> v;
  const std::string& raw = tp.raw_data();
  auto from_raw = [&](auto zero) {
    using T = decltype(zero);
    if (raw.size() != static_cast<size_t>(n) * sizeof(T)) return false;
    for (int64_t i = 0; i < n; ++i) {
      T x;
      std::memcpy(&x, raw.data() + i * sizeof(T), sizeof(T));
      v.push_back(static_cast<double>(x));
    }
    return true;
  };
  bool ok = true;
  switch (tp.data_type()) {
    case onnx::TensorProto::FLOAT:
      if (raw.empty()) v.assign(tp.float_data().begin(), tp.float_data().end());
      else ok = from_raw(0.0F);
      break;
    case onnx::TensorProto::DOUBLE:
      if (raw.empty()) v.assign(tp.double_data().begin(), tp.double_data().end());
      else ok = from_raw(0.0);
      break;
    case onnx::TensorProto::INT64:
      if (raw.empty()) v.assign(tp.int64_data().begin(), tp.int64_data().end());
      else ok = from_raw(int64_t{0});
      break;
    case onnx::TensorProto::INT32:
    case onnx::TensorProto::BOOL:
      if (raw.empty()) v.assign(tp.int32_data().begin(), tp.int32_data().end());
      else if (tp.data_type() == onnx::TensorProto::INT32) ok = from_raw(int32_t{0});
      else ok = from_raw(uint8_t{0});
      break;
    default: return std::nullopt;
  }
  if (!ok || static_cast<int64_t>(v.size()) != n) return std::nullopt;
  return v;
}

const std::set<std::string> kReduceWithAxesInput = {"ReduceMean",   "ReduceMax",       "ReduceMin",
                                                    "ReduceProd",   "ReduceL1",        "ReduceL2",
                                                    "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare"};

}  // namespace

std::optional<ConstantValue> evaluate_constant(const onnx::GraphProto& g, const std::string& name) {
  constexpr int64_t kLimit = 1 << 20;  // values: a bias or a shape, never a weight's worth
  std::unordered_map<std::string, const onnx::TensorProto*> inits;
  for (const auto& t : g.initializer()) inits[t.name()] = &t;
  std::unordered_map<std::string, const onnx::NodeProto*> producer;
  for (const auto& n : g.node())
    for (const auto& o : n.output()) producer[o] = &n;
  std::function<std::optional<ConstantValue>(const std::string&, int)> eval;
  auto count = [](const std::vector<int64_t>& dims) {
    int64_t n = 1;
    for (int64_t d : dims) {
      if (d < 0 || (d > 0 && n > kLimit / d)) return kLimit + 1;
      n *= d;
    }
    return n;
  };
  auto ints = [](const ConstantValue& v) {
    std::vector<int64_t> out;
    for (double x : v.values) out.push_back(static_cast<int64_t>(x));
    return out;
  };
  eval = [&](const std::string& x, int depth) -> std::optional<ConstantValue> {
    if (depth > 64 || x.empty()) return std::nullopt;
    if (auto it = inits.find(x); it != inits.end()) {
      auto v = tensor_values(*it->second, kLimit);
      if (!v) return std::nullopt;
      return ConstantValue{
          {it->second->dims().begin(), it->second->dims().end()}, std::move(*v), it->second->data_type()};
    }
    auto pit = producer.find(x);
    if (pit == producer.end()) return std::nullopt;
    const onnx::NodeProto& n = *pit->second;
    if (!n.domain().empty() && n.domain() != "ai.onnx") return std::nullopt;
    const std::string& op = n.op_type();
    if (op == "Constant") {
      if (const auto* a = find_attr(n, "value")) {
        auto v = tensor_values(a->t(), kLimit);
        if (!v) return std::nullopt;
        return ConstantValue{{a->t().dims().begin(), a->t().dims().end()}, std::move(*v), a->t().data_type()};
      }
      if (const auto* a = find_attr(n, "value_float"))
        return ConstantValue{{}, {static_cast<double>(a->f())}, onnx::TensorProto::FLOAT};
      if (const auto* a = find_attr(n, "value_int"))
        return ConstantValue{{}, {static_cast<double>(a->i())}, onnx::TensorProto::INT64};
      if (const auto* a = find_attr(n, "value_floats"))
        return ConstantValue{{a->floats_size()}, {a->floats().begin(), a->floats().end()}, onnx::TensorProto::FLOAT};
      if (const auto* a = find_attr(n, "value_ints")) {
        ConstantValue c{{a->ints_size()}, {}, onnx::TensorProto::INT64};
        for (int64_t i : a->ints()) c.values.push_back(static_cast<double>(i));
        return c;
      }
      return std::nullopt;
    }
    if (op == "Shape") {  // of an initializer: its dims, whatever its size
      auto it = n.input_size() == 1 ? inits.find(n.input(0)) : inits.end();
      if (it == inits.end()) return std::nullopt;
      const auto r = static_cast<int64_t>(it->second->dims_size());
      int64_t start = attr_i(n, "start", 0), end = attr_i(n, "end", r);
      if (start < 0) start += r;
      if (end < 0) end += r;
      start = std::clamp<int64_t>(start, 0, r);
      end = std::clamp<int64_t>(end, start, r);
      ConstantValue c{{end - start}, {}, onnx::TensorProto::INT64};
      for (int64_t d = start; d < end; ++d)
        c.values.push_back(static_cast<double>(it->second->dims(static_cast<int>(d))));
      return c;
    }
    if (n.input_size() < 1) return std::nullopt;
    auto a = eval(n.input(0), depth + 1);
    if (!a) return std::nullopt;
    if (op == "Identity") return a;
    if (op == "Cast") {
      a->elem_type = static_cast<int>(attr_i(n, "to", a->elem_type));
      if (a->elem_type != onnx::TensorProto::FLOAT && a->elem_type != onnx::TensorProto::DOUBLE)
        for (double& v : a->values) v = std::trunc(v);
      return a;
    }
    if (op == "CastLike") return a;  // the values; only their type follows the second input
    if (op == "Squeeze" || op == "Unsqueeze") {
      std::vector<int64_t> axes = attr_ints(n, "axes");
      if (n.input_size() > 1 && !n.input(1).empty()) {
        auto ax = eval(n.input(1), depth + 1);
        if (!ax) return std::nullopt;
        axes = ints(*ax);
      }
      const auto r = static_cast<int64_t>(a->dims.size()) + (op == "Unsqueeze" ? static_cast<int64_t>(axes.size()) : 0);
      for (int64_t& ax : axes)
        if (ax < 0) ax += r;
      std::vector<int64_t> dims;
      if (op == "Squeeze") {
        for (int64_t d = 0; d < static_cast<int64_t>(a->dims.size()); ++d)
          if (a->dims[d] != 1 || (!axes.empty() && std::find(axes.begin(), axes.end(), d) == axes.end()))
            dims.push_back(a->dims[d]);
      } else {
        size_t k = 0;
        for (int64_t d = 0; d < r; ++d)
          if (std::find(axes.begin(), axes.end(), d) != axes.end()) dims.push_back(1);
          else if (k < a->dims.size()) dims.push_back(a->dims[k++]);
          else return std::nullopt;
      }
      a->dims = std::move(dims);
      return a;
    }
    if (n.input_size() < 2) return std::nullopt;
    if (op == "Reshape" || op == "Expand") {
      auto s = eval(n.input(1), depth + 1);
      if (!s) return std::nullopt;
      std::vector<int64_t> shape = ints(*s);
      if (op == "Reshape") {
        const int64_t total = static_cast<int64_t>(a->values.size());
        int64_t known = 1, infer = -1;
        for (size_t d = 0; d < shape.size(); ++d) {
          if (shape[d] == 0 && attr_i(n, "allowzero", 0) == 0) {
            if (d >= a->dims.size()) return std::nullopt;
            shape[d] = a->dims[d];
          }
          if (shape[d] == -1) {
            if (infer >= 0) return std::nullopt;
            infer = static_cast<int64_t>(d);
          } else if (shape[d] < 0) {
            return std::nullopt;
          } else {
            known *= shape[d];
          }
        }
        if (infer >= 0) {
          if (known == 0 || total % known != 0) return std::nullopt;
          shape[static_cast<size_t>(infer)] = total / known;
        }
        if (count(shape) != total) return std::nullopt;
        a->dims = std::move(shape);
        return a;
      }
      // Expand: NumPy broadcasting of a to `shape`.
      const size_t r = std::max(shape.size(), a->dims.size());
      std::vector<int64_t> in(r, 1), out(r, 1);
      std::copy(a->dims.begin(), a->dims.end(), in.begin() + static_cast<std::ptrdiff_t>(r - a->dims.size()));
      std::copy(shape.begin(), shape.end(), out.begin() + static_cast<std::ptrdiff_t>(r - shape.size()));
      for (size_t d = 0; d < r; ++d) {
        if (in[d] != out[d] && in[d] != 1 && out[d] != 1) return std::nullopt;
        out[d] = std::max(in[d], out[d]);
      }
      const int64_t total = count(out);
      if (total > kLimit) return std::nullopt;
      std::vector<double> v(static_cast<size_t>(total));
      for (int64_t i = 0; i < total; ++i) {
        int64_t rest = i, src = 0, stride = 1;
        for (size_t d = r; d-- > 0;) {
          const int64_t idx = rest % out[d];
          rest /= out[d];
          if (in[d] != 1) src += idx * stride;
          stride *= in[d];
        }
        v[static_cast<size_t>(i)] = a->values[static_cast<size_t>(src)];
      }
      return ConstantValue{std::move(out), std::move(v), a->elem_type};
    }
    if (op == "Concat" && attr_i(n, "axis", 0) == 0) {  // along the first axis: the values one after another
      ConstantValue c = *a;
      for (int k = 1; k < n.input_size(); ++k) {
        auto b = eval(n.input(k), depth + 1);
        if (!b || b->dims.size() != c.dims.size() || c.dims.empty() ||
            !std::equal(b->dims.begin() + 1, b->dims.end(), c.dims.begin() + 1))
          return std::nullopt;
        c.dims[0] += b->dims[0];
        c.values.insert(c.values.end(), b->values.begin(), b->values.end());
      }
      return c;
    }
    return std::nullopt;
  };
  return eval(name, 0);
}

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
        if (!axes)  // computed from constants only (Reshape of a Constant): its value
          if (auto v = evaluate_constant(g, n.input(1)); v && v->dims.size() <= 1) {
            axes.emplace();
            for (double x : v->values) axes->push_back(static_cast<int64_t>(x));
          }
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
