// Parameter shapes per op kind, their deterministic initialisation and the model file's values.
#include "runtime/exec/params.h"

#include <fmt/ranges.h>
#include <ATen/CPUGeneratorImpl.h>

#include <cmath>
#include <map>
#include <optional>

#include "ir/attrs.h"
#include "runtime/exec/stable_hash.h"
#include "support/error.h"

namespace gp::runtime {

namespace {

const ir::Shape& shape_of(const ir::Graph& g, const std::string& name) {
  if (const ir::Input* in = g.find_input(name)) return in->shape;
  OpId id = g.find(name);
  GP_ASSERT(id.valid(), "unknown tensor {}", name);
  return g.op(id).output_shape;
}

std::vector<int64_t> dims(int64_t a) { return {a}; }
std::vector<int64_t> dims(int64_t a, int64_t b) { return {a, b}; }
}  // namespace

std::vector<std::pair<std::string, std::vector<int64_t>>> param_specs(const ir::Graph& g, OpId id) {
  const ir::Op& op = g.op(id);
  const std::string where = g.name();
  auto in_shape = [&](size_t i) -> const ir::Shape& { return shape_of(g, op.inputs.at(i)); };
  switch (op.kind) {
    case ir::OpKind::linear: {
      int64_t in = in_shape(0).back(), out = ir::attr_int(op, "out_features", std::nullopt, where);
      std::vector<std::pair<std::string, std::vector<int64_t>>> s{{"weight", dims(out, in)}};
      if (ir::attr_bool(op, "bias", true, where)) s.push_back({"bias", dims(out)});
      return s;
    }
    case ir::OpKind::layernorm: return {{"weight", dims(in_shape(0).back())}, {"bias", dims(in_shape(0).back())}};
    case ir::OpKind::batchnorm: return {{"weight", dims(in_shape(0)[1])}, {"bias", dims(in_shape(0)[1])}};
    case ir::OpKind::embedding_bag:
      return {{"weight",
               dims(ir::attr_int(op, "rows", std::nullopt, where), ir::attr_int(op, "dim", std::nullopt, where))}};
    case ir::OpKind::embedding: {
      int64_t dim = ir::attr_int(op, "dim", std::nullopt, where);
      std::vector<std::pair<std::string, std::vector<int64_t>>> s{
          {"weight", dims(ir::attr_int(op, "rows", std::nullopt, where), dim)}};
      if (ir::attr_bool(op, "positions", false, where))
        s.push_back({"pos", dims(ir::attr_int(op, "position_rows", in_shape(0).at(1), where), dim)});
      return s;
    }
    case ir::OpKind::attention: {
      int64_t h = in_shape(0).back();
      return {{"wq", dims(h, h)}, {"bq", dims(h)}, {"wk", dims(h, h)}, {"bk", dims(h)},
              {"wv", dims(h, h)}, {"bv", dims(h)}, {"wo", dims(h, h)}, {"bo", dims(h)}};
    }
    case ir::OpKind::window_attention: {  // torchvision's SwinTransformerBlock attention parameters
      int64_t c = in_shape(0).back(), heads = ir::attr_int(op, "heads", std::nullopt, where);
      std::vector<int64_t> win = ir::attr_ints(op, "window", where);
      return {{"wqkv", dims(3 * c, c)},
              {"bqkv", dims(3 * c)},
              {"wo", dims(c, c)},
              {"bo", dims(c)},
              {"rel_bias", dims((2 * win[0] - 1) * (2 * win[1] - 1), heads)}};
    }
    case ir::OpKind::conv2d: {
      int64_t ci = in_shape(0)[1], co = ir::attr_int(op, "out_channels", std::nullopt, where);
      ir::ConvGeometry cg = ir::conv_geometry(op, ci, where);
      std::vector<std::pair<std::string, std::vector<int64_t>>> s{{"weight", {co, ci / cg.groups, cg.kh, cg.kw}}};
      if (ir::attr_bool(op, "bias", true, where)) s.push_back({"bias", dims(co)});
      return s;
    }
    case ir::OpKind::conv_transpose2d: {  // PyTorch's layout: [in, out / groups, kh, kw]
      int64_t ci = in_shape(0)[1], co = ir::attr_int(op, "out_channels", std::nullopt, where);
      ir::ConvGeometry cg = ir::conv_geometry(op, ci, where);
      std::vector<std::pair<std::string, std::vector<int64_t>>> s{{"weight", {ci, co / cg.groups, cg.kh, cg.kw}}};
      if (ir::attr_bool(op, "bias", true, where)) s.push_back({"bias", dims(co)});
      return s;
    }
    case ir::OpKind::add:
    case ir::OpKind::mul:
    case ir::OpKind::concat:
      if (std::optional<ir::Shape> ps = ir::param_shape(op, where)) return {{"param", *ps}};
      return {};
    default: return {};
  }
}

torch::Tensor init_parameter(const ir::Graph& g, OpId id, const std::string& param, const std::vector<int64_t>& shape,
                             uint64_t seed) {
  const ir::Op& op = g.op(id);
  torch::NoGradGuard no_grad;
  auto opts = torch::TensorOptions().dtype(torch::kFloat32);
  if (op.kind == ir::OpKind::layernorm || op.kind == ir::OpKind::batchnorm)
    return param == "weight" ? torch::ones(shape, opts) : torch::zeros(shape, opts);
  if (op.kind == ir::OpKind::mul) return torch::ones(shape, opts);  // a scale starts as the identity
  double fan_in = 1;
  switch (op.kind) {
    case ir::OpKind::linear:
    case ir::OpKind::window_attention:
    case ir::OpKind::attention: fan_in = static_cast<double>(shape_of(g, op.inputs[0]).back()); break;
    case ir::OpKind::conv2d: {  // in_channels / groups x kh x kw, for weight and bias alike
      int64_t ci = shape_of(g, op.inputs[0])[1];
      ir::ConvGeometry cg = ir::conv_geometry(op, ci, g.name());
      fan_in = static_cast<double>(ci / cg.groups * cg.kh * cg.kw);
      break;
    }
    case ir::OpKind::conv_transpose2d: {  // PyTorch: fan_in of weight [in, out / groups, kh, kw]
      ir::ConvGeometry cg = ir::conv_geometry(op, shape_of(g, op.inputs[0])[1], g.name());
      fan_in = static_cast<double>(ir::attr_int(op, "out_channels", std::nullopt, g.name()) / cg.groups * cg.kh *
                                   cg.kw);
      break;
    }
    case ir::OpKind::add:
    case ir::OpKind::concat:  // a bias, position table or token: bound 1/sqrt(its last dim)
    case ir::OpKind::embedding_bag:
    case ir::OpKind::embedding: fan_in = static_cast<double>(shape.back()); break;
    default: break;
  }
  double bound = 1.0 / std::sqrt(fan_in);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(stable_hash({"param", op.name, param}, seed));
  return torch::empty(shape, opts).uniform_(-bound, bound, gen);
}

torch::Tensor initial_value(const ir::Graph& g, OpId id, const std::string& param, const std::vector<int64_t>& shape,
                            uint64_t seed, const importers::ParamValues& initial) {
  auto it = initial.find(g.op(id).name + "/" + param);
  if (it == initial.end()) return init_parameter(g, id, param, shape, seed);
  const importers::ParamValue& v = it->second;
  GP_CHECK(v.shape == shape, "{}: the initial value of parameter \"{}/{}\" has shape [{}], the op needs [{}]", g.name(),
           g.op(id).name, param, fmt::join(v.shape, ", "), fmt::join(shape, ", "));
  GP_CHECK(static_cast<int64_t>(v.data.size()) == c10::multiply_integers(shape),
           "{}: the initial value of parameter \"{}/{}\" has {} values for shape [{}]", g.name(), g.op(id).name, param,
           v.data.size(), fmt::join(shape, ", "));
  return torch::tensor(v.data, torch::kFloat32).reshape(shape);
}

void check_initial_values(const ir::Graph& g, const importers::ParamValues& initial) {
  std::map<std::string, std::vector<int64_t>> known;
  for (size_t i = 0; i < g.num_ops(); ++i)
    for (const auto& [name, shape] : param_specs(g, OpId(static_cast<int32_t>(i))))
      known.emplace(g.op(OpId(static_cast<int32_t>(i))).name + "/" + name, shape);
  for (const ir::SharedParam& sp : g.model().shared_params)
    for (const std::string& use : sp.uses) {
      auto it = known.find(use);
      GP_CHECK(it != known.end(), "{}: shared parameter \"{}\": \"{}\" is not a parameter of the model", g.name(),
               sp.name, use);
      GP_CHECK(it->second == sp.shape, "{}: shared parameter \"{}\" has shape {}, but \"{}\" is [{}]", g.name(),
               sp.name, ir::shape_str(sp.shape), use, fmt::join(it->second, ", "));
    }
  for (const auto& [key, v] : initial)
    GP_CHECK(known.count(key), "{}: initial value for \"{}\", which is not a parameter of the model", g.name(), key);
}

}  // namespace gp::runtime
