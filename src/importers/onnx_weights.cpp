// Initial parameter values from an ONNX file: the mapper records, for every IR parameter, the tensor in
// its weight slot and the transform to the runtime's layout (onnx_mapper.h ParamSource); here those
// tensors are evaluated from the file's initializers (through Transpose / Identity / Cast nodes) and
// transformed: [in, out] -> [out, in] for MatMul and Gemm transB=0, rows of a packed Q/K/V projection.
#include <cstring>
#include <numeric>

#include "importers/onnx_mapper.h"
#include "importers/weights.h"
#include "support/error.h"

namespace gp::importers {
namespace onnx_detail {
namespace {

int64_t numel(const std::vector<int64_t>& s) {
  return std::accumulate(s.begin(), s.end(), int64_t{1}, std::multiplies<>());
}

float half_to_float(uint16_t h) {
  const uint32_t sign = (h & 0x8000u) << 16, exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: normalise
      int e = -1;
      uint32_t m = mant;
      do {
        ++e;
        m <<= 1;
      } while ((m & 0x400u) == 0);
      bits = sign | (static_cast<uint32_t>(127 - 15 - e) << 23) | ((m & 0x3ffu) << 13);
    }
  } else if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

float bf16_to_float(uint16_t h) {
  uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

/// The float values of an initializer or Constant. `what` names it in errors.
ParamValue to_float(const Net& net, const onnx::TensorProto& tp, const std::string& what) {
  ParamValue v;
  v.shape.assign(tp.dims().begin(), tp.dims().end());
  constexpr int64_t kMaxElems = int64_t{1} << 40;
  int64_t n = 1;
  for (int64_t d : v.shape) {
    GP_CHECK(d >= 0 && (d == 0 || n <= kMaxElems / d), "{}: {} has an invalid shape [{}]", net.path, what,
             fmt::join(v.shape, ", "));
    n *= d;
  }
  GP_CHECK(tp.data_location() != onnx::TensorProto::EXTERNAL,
           "{}: {} is stored in external data, which the importer does not read", net.path, what);
  const std::string& raw = tp.raw_data();
  auto from_raw = [&](auto sample, auto convert) {
    using T = decltype(sample);
    GP_CHECK(raw.size() == static_cast<size_t>(n) * sizeof(T),
             "{}: {} has {} bytes of raw data, expected {} for shape [{}]", net.path, what, raw.size(),
             static_cast<size_t>(n) * sizeof(T), fmt::join(v.shape, ", "));
    v.data.resize(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
      T x;
      std::memcpy(&x, raw.data() + i * sizeof(T), sizeof(T));
      v.data[static_cast<size_t>(i)] = convert(x);
    }
  };
  auto from_field = [&](const auto& field, auto convert) {
    GP_CHECK(field.size() == n, "{}: {} holds {} values, expected {} for shape [{}]", net.path, what, field.size(), n,
             fmt::join(v.shape, ", "));
    v.data.reserve(static_cast<size_t>(n));
    for (const auto& x : field) v.data.push_back(convert(x));
  };
  auto same = [](auto x) { return static_cast<float>(x); };
  auto half = [](auto x) { return half_to_float(static_cast<uint16_t>(x)); };
  auto bf16 = [](auto x) { return bf16_to_float(static_cast<uint16_t>(x)); };
  switch (tp.data_type()) {
    case onnx::TensorProto::FLOAT: raw.empty() ? from_field(tp.float_data(), same) : from_raw(float{}, same); break;
    case onnx::TensorProto::DOUBLE: raw.empty() ? from_field(tp.double_data(), same) : from_raw(double{}, same); break;
    case onnx::TensorProto::FLOAT16:  // typed storage: the 16 bits in int32_data
      raw.empty() ? from_field(tp.int32_data(), half) : from_raw(uint16_t{}, half);
      break;
    case onnx::TensorProto::BFLOAT16:
      raw.empty() ? from_field(tp.int32_data(), bf16) : from_raw(uint16_t{}, bf16);
      break;
    default:
      throw UserError(fmt::format("{}: {} has ONNX element type {}, expected float, float16, bfloat16 or double",
                                  net.path, what, tp.data_type()));
  }
  return v;
}

ParamValue permute(const ParamValue& x, const std::vector<int64_t>& perm) {
  const size_t r = x.shape.size();
  ParamValue y;
  for (int64_t p : perm) y.shape.push_back(x.shape[static_cast<size_t>(p)]);
  std::vector<int64_t> xstride(r, 1);
  for (size_t d = r; d-- > 1;) xstride[d - 1] = xstride[d] * x.shape[d];
  y.data.resize(x.data.size());
  std::vector<int64_t> idx(r, 0);  // index into y
  for (size_t k = 0; k < y.data.size(); ++k) {
    int64_t off = 0;
    for (size_t d = 0; d < r; ++d) off += idx[d] * xstride[static_cast<size_t>(perm[d])];
    y.data[k] = x.data[static_cast<size_t>(off)];
    for (size_t d = r; d-- > 0;) {
      if (++idx[d] < y.shape[d]) break;
      idx[d] = 0;
    }
  }
  return y;
}

/// The value of parameter tensor `t`: an initializer or Constant, possibly behind Transpose /
/// Identity / Cast nodes. nullopt for a weight given as a graph input (export_params=False).
std::optional<ParamValue> eval(const Net& net, const std::string& t, const ParamSource& ps) {
  const TensorInfo& ti = net.at(t);
  if (ti.producer < 0) {
    auto it = net.values.find(t);
    if (it == net.values.end()) return std::nullopt;
    return to_float(net, it->second, fmt::format("initializer \"{}\" (parameter {} of op \"{}\")", t, ps.param, ps.op));
  }
  const onnx::NodeProto& n = net.nodes[static_cast<size_t>(ti.producer)];
  const std::string& op = n.op_type();
  if ((op == "Identity" || op == "Cast" || op == "Transpose") && n.input_size() >= 1) {
    auto v = eval(net, n.input(0), ps);
    if (!v || op != "Transpose") return v;
    std::vector<int64_t> perm = attr_ints(n, "perm");
    if (perm.empty())
      for (size_t d = v->shape.size(); d-- > 0;) perm.push_back(static_cast<int64_t>(d));
    GP_CHECK(perm.size() == v->shape.size(), "{}: node {} has perm of rank {} for a tensor of rank {}", net.path,
             node_label(n), perm.size(), v->shape.size());
    return permute(*v, perm);
  }
  throw UserError(
      fmt::format("{}: parameter {} of op \"{}\" is tensor \"{}\", computed by node {}; only initializers "
                  "(behind Transpose, Identity or Cast) can be read as weights",
                  net.path, ps.param, ps.op, t, node_label(n)));
}

}  // namespace
}  // namespace onnx_detail

ParamValues import_onnx_weights(const std::string& path, ir::Model* model) {
  using namespace onnx_detail;
  Net net = load_net(path, /*keep_values=*/true);
  std::vector<ParamSource> sources;
  ir::Model m = map_net(net, &sources);
  if (model) *model = std::move(m);
  ParamValues out;
  if (!net.weight_inputs.empty())
    warn_once(path, "without values",
              fmt::format("{} parameter tensor(s) arrive as graph inputs without values (export_params=False): {}. "
                          "They start from GraphPipe's seeded initialisation, not from the module's weights; "
                          "export with export_params=True to train from those.",
                          net.weight_inputs.size(), fmt::join(net.weight_inputs, ", ")));
  if (net.values.empty()) return out;
  for (const ParamSource& ps : sources) {
    if (!ps.error.empty()) {
      // Only an error when the file has the values (a model exported without weights has nothing to map).
      if (!ps.tensor.empty() && eval(net, ps.tensor, ps)) throw UserError(ps.error);
      continue;
    }
    auto v = eval(net, ps.tensor, ps);
    if (!v) continue;
    const std::string where = fmt::format("{}: initializer \"{}\" for parameter {} of op \"{}\"", path, ps.tensor,
                                          ps.param, ps.op);
    if (ps.transpose) {
      GP_CHECK(v->shape.size() == 2, "{} has shape [{}], expected a 2-d weight", where, fmt::join(v->shape, ", "));
      *v = permute(*v, {1, 0});
    }
    if (ps.parts > 1) {
      GP_CHECK(!v->shape.empty() && v->shape[0] > 0 && v->shape[0] % ps.parts == 0,
               "{} has shape [{}], expected dim 0 to split into {} equal parts", where, fmt::join(v->shape, ", "),
               ps.parts);
      const int64_t rows = v->shape[0] / ps.parts, row = numel(v->shape) / v->shape[0];
      ParamValue part;
      part.shape = v->shape;
      part.shape[0] = rows;
      part.data.assign(v->data.begin() + ps.part * rows * row, v->data.begin() + (ps.part + 1) * rows * row);
      *v = std::move(part);
    }
    // A bias may come as [1, n] (Gemm's broadcast C), learned positions as [1, seq, dim]: same
    // values, the IR's shape.
    auto lead = v->shape.begin();
    while (v->shape.end() - lead > static_cast<std::ptrdiff_t>(ps.shape.size()) && *lead == 1) ++lead;
    // A parameter operand [C] of an add / mul over [B, H, W, C] is [1, 1, C] in the IR: leading 1s
    // added or dropped, same values.
    auto strip = [](std::vector<int64_t> d) {
      while (d.size() > 1 && d.front() == 1) d.erase(d.begin());
      return d;
    };
    bool fits = v->shape == ps.shape || std::vector<int64_t>(lead, v->shape.end()) == ps.shape ||
                (ps.shape.size() == 1 && numel(v->shape) == ps.shape[0]) || strip(v->shape) == strip(ps.shape) ||
                (ps.reshape && numel(v->shape) == numel(ps.shape));
    GP_CHECK(fits, "{} has shape [{}]{}, expected [{}]", where, fmt::join(v->shape, ", "),
             ps.transpose || ps.parts > 1 ? " after transposing / splitting" : "", fmt::join(ps.shape, ", "));
    v->shape = ps.shape;
    out[ps.op + "/" + ps.param] = std::move(*v);
  }
  return out;
}

}  // namespace gp::importers
