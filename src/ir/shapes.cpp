// Shape inference per op kind (the semantics documented in model.h) and attribute access.
#include <algorithm>
#include <numeric>
#include <tuple>

#include "ir/attrs.h"
#include "ir/model.h"

namespace gp::ir {

namespace {
[[noreturn]] void fail(const Op& op, const std::string& where, const std::string& msg) {
  throw UserError(fmt::format("{}: op \"{}\" ({}): {}", where, op.name, to_string(op.kind), msg));
}
}  // namespace

int64_t attr_int(const Op& op, const char* key, std::optional<int64_t> dflt, const std::string& where) {
  if (!op.attrs.is_object() || !op.attrs.contains(key)) {
    if (dflt) return *dflt;
    fail(op, where, fmt::format("missing attribute \"{}\"", key));
  }
  const Json& v = op.attrs.at(key);
  if (!v.is_number_integer()) fail(op, where, fmt::format("attrs.{}: expected an integer, found {}", key, v.dump()));
  return v.get<int64_t>();
}

double attr_num(const Op& op, const char* key, double dflt, const std::string& where) {
  if (!op.attrs.is_object() || !op.attrs.contains(key)) return dflt;
  const Json& v = op.attrs.at(key);
  if (!v.is_number()) fail(op, where, fmt::format("attrs.{}: expected a number, found {}", key, v.dump()));
  return v.get<double>();
}

bool attr_bool(const Op& op, const char* key, bool dflt, const std::string& where) {
  if (!op.attrs.is_object() || !op.attrs.contains(key)) return dflt;
  const Json& v = op.attrs.at(key);
  if (!v.is_boolean()) fail(op, where, fmt::format("attrs.{}: expected true or false, found {}", key, v.dump()));
  return v.get<bool>();
}

std::vector<int64_t> attr_ints(const Op& op, const char* key, const std::string& where) {
  if (!op.attrs.is_object() || !op.attrs.contains(key)) fail(op, where, fmt::format("missing attribute \"{}\"", key));
  const Json& v = op.attrs.at(key);
  std::vector<int64_t> out;
  if (!v.is_array()) fail(op, where, fmt::format("attrs.{}: expected a list of integers, found {}", key, v.dump()));
  for (const auto& e : v) {
    if (!e.is_number_integer())
      fail(op, where, fmt::format("attrs.{}: expected a list of integers, found {}", key, v.dump()));
    out.push_back(e.get<int64_t>());
  }
  return out;
}

int64_t attr_axis(const Op& op, const char* key, std::optional<int64_t> dflt, size_t rank,
                  const std::string& where) {
  int64_t a = attr_int(op, key, dflt, where);
  int64_t r = static_cast<int64_t>(rank);
  int64_t norm = a < 0 ? a + r : a;
  if (norm < 1 || norm >= r)
    fail(op, where, fmt::format("attrs.{} = {} is not a non-batch axis of a rank-{} tensor", key, a, r));
  return norm;
}

int64_t per_sample_elems(const Shape& s) {
  int64_t n = 1;
  for (size_t i = 0; i < s.size(); ++i)
    if (!(i == 0 && s[i] == kBatch)) n *= s[i];
  return n;
}

std::string shape_str(const Shape& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) {
    if (i) out += ", ";
    out += s[i] == kBatch && i == 0 ? "B" : std::to_string(s[i]);
  }
  return out + "]";
}

namespace {
/// An integer or a list of `n` integers (n in `counts`) under attrs[key]; dflt when absent.
std::vector<int64_t> int_or_list(const Op& op, const char* key, std::optional<int64_t> dflt,
                                 std::initializer_list<size_t> counts, const std::string& where) {
  if (op.attrs.is_object() && op.attrs.contains(key) && op.attrs.at(key).is_array()) {
    std::vector<int64_t> v = attr_ints(op, key, where);
    if (std::find(counts.begin(), counts.end(), v.size()) == counts.end())
      fail(op, where, fmt::format("attrs.{} has {} values, expected an integer or {}", key, v.size(),
                                  counts.size() == 1 ? "2" : "2 or 4"));
    return v;
  }
  return {attr_int(op, key, dflt, where)};
}
}  // namespace

ConvGeometry conv_geometry(const Op& op, int64_t in_channels, const std::string& where) {
  auto pair = [&](const char* key, std::optional<int64_t> dflt, int64_t lo) {
    std::vector<int64_t> v = int_or_list(op, key, dflt, {2}, where);
    if (v.size() == 1) v.push_back(v[0]);
    for (int64_t x : v)
      if (x < lo || x > kMaxExtent)
        fail(op, where, fmt::format("attrs.{} has value {}, not in [{}, 2^40]", key, x, lo));
    return std::pair{v[0], v[1]};
  };
  ConvGeometry g;
  std::tie(g.kh, g.kw) = pair("kernel", std::nullopt, 1);
  std::tie(g.sh, g.sw) = pair("stride", 1, 1);
  std::tie(g.dh, g.dw) = pair("dilation", 1, 1);
  std::vector<int64_t> p = int_or_list(op, "padding", 0, {2, 4}, where);
  if (p.size() == 1) p = {p[0], p[0], p[0], p[0]};
  if (p.size() == 2) p = {p[0], p[1], p[0], p[1]};
  for (int64_t x : p)
    if (x < 0 || x > kMaxExtent) fail(op, where, fmt::format("attrs.padding has value {}, not in [0, 2^40]", x));
  g.pt = p[0], g.pl = p[1], g.pb = p[2], g.pr = p[3];
  g.groups = attr_int(op, "groups", 1, where);
  int64_t co = attr_int(op, "out_channels", std::nullopt, where);
  if (g.groups < 1 || in_channels % g.groups != 0 || co % g.groups != 0)
    fail(op, where, fmt::format("attrs.groups = {} must be positive and divide the {} input and {} output channels",
                                g.groups, in_channels, co));
  return g;
}

std::optional<Shape> param_shape(const Op& op, const std::string& where) {
  if (!op.attrs.is_object() || !op.attrs.contains("param")) return std::nullopt;
  Shape s = attr_ints(op, "param", where);
  double n = 1;
  for (int64_t d : s) {
    if (d <= 0 || d > kMaxExtent) fail(op, where, fmt::format("attrs.param has dimension {}, not in [1, 2^40]", d));
    n *= static_cast<double>(d);
  }
  if (s.empty() || n > static_cast<double>(kMaxExtent))
    fail(op, where, fmt::format("attrs.param {} must have 1 to 2^40 elements and at least one dimension",
                                op.attrs.at("param").dump()));
  return s;
}

std::optional<Shape> broadcast(const std::vector<Shape>& shapes) {
  Shape out = shapes.at(0);
  for (const Shape& s : shapes) {
    if (s.size() != out.size()) return std::nullopt;
    for (size_t d = 0; d < s.size(); ++d) {
      if (s[d] == out[d] || s[d] == 1) continue;
      if (out[d] != 1) return std::nullopt;
      out[d] = s[d];
    }
  }
  return out;
}

Shape infer_shape(const Op& op, const std::vector<Shape>& in, const std::string& where) {
  auto need_inputs = [&](size_t lo, size_t hi) {
    if (in.size() < lo || in.size() > hi) {
      if (lo == hi) fail(op, where, fmt::format("expects {} input(s), has {}", lo, in.size()));
      fail(op, where, fmt::format("expects {} to {} inputs, has {}", lo, hi, in.size()));
    }
  };
  auto need_rank = [&](size_t i, size_t lo, size_t hi) {
    if (in[i].size() < lo || in[i].size() > hi)
      fail(op, where, fmt::format("input {} has shape {}, expected rank {}{}", i, shape_str(in[i]), lo,
                                  hi == lo ? "" : fmt::format(" to {}", hi)));
  };
  auto positive = [&](const char* key, std::optional<int64_t> dflt) {
    int64_t v = attr_int(op, key, dflt, where);
    if (v <= 0) fail(op, where, fmt::format("attrs.{} must be positive, found {}", key, v));
    if (v > kMaxExtent) fail(op, where, fmt::format("attrs.{} = {} is larger than 2^40", key, v));
    return v;
  };
  for (size_t i = 0; i < in.size(); ++i)
    if (in[i].empty() || in[i][0] != kBatch)
      fail(op, where, fmt::format("input {} has shape {} without a batch dimension", i, shape_str(in[i])));

  switch (op.kind) {
    case OpKind::linear: {
      need_inputs(1, 1);
      need_rank(0, 2, 8);
      Shape out = in[0];
      out.back() = positive("out_features", std::nullopt);
      return out;
    }
    case OpKind::matmul: {
      need_inputs(2, 2);
      need_rank(0, 3, 8);
      need_rank(1, 3, 8);
      const Shape &a = in[0], &b = in[1];
      if (a.size() != b.size() || !std::equal(a.begin(), a.end() - 2, b.begin()) || a[a.size() - 1] != b[b.size() - 2])
        fail(op, where, fmt::format("shape mismatch: {} @ {}", shape_str(a), shape_str(b)));
      Shape out = a;
      out.back() = b.back();
      return out;
    }
    case OpKind::add:
    case OpKind::mul: {
      std::vector<Shape> all = in;
      std::optional<Shape> ps = param_shape(op, where);
      need_inputs(ps ? 1 : 2, 64);
      if (ps) {
        all.push_back(Shape{kBatch});
        all.back().insert(all.back().end(), ps->begin(), ps->end());
      }
      std::optional<Shape> out = broadcast(all);
      if (!out) {
        std::string list;
        for (const Shape& s : all) list += (list.empty() ? "" : ", ") + shape_str(s);
        fail(op, where, fmt::format("shape mismatch: {} do not broadcast{}", list, ps ? " (the last is attrs.param)" : ""));
      }
      return *out;
    }
    case OpKind::concat: {
      need_inputs(1, 1024);
      std::vector<Shape> all = in;
      if (std::optional<Shape> ps = param_shape(op, where)) {
        int64_t at = attr_int(op, "param_at", 0, where);
        if (at < 0 || at > static_cast<int64_t>(in.size()))
          fail(op, where, fmt::format("attrs.param_at = {} is not in [0, {}]", at, in.size()));
        Shape p{kBatch};
        p.insert(p.end(), ps->begin(), ps->end());
        all.insert(all.begin() + at, p);
      }
      int64_t axis = attr_axis(op, "axis", std::nullopt, all[0].size(), where);
      Shape out = all[0];
      for (size_t i = 1; i < all.size(); ++i) {
        Shape a = all[0], b = all[i];
        if (a.size() != b.size()) fail(op, where, fmt::format("shape mismatch: {} vs {}", shape_str(a), shape_str(b)));
        a[axis] = b[axis] = 0;
        if (a != b)
          fail(op, where, fmt::format("shape mismatch: operand 0 is {} but operand {} is {} (concat on axis {})",
                                      shape_str(all[0]), i, shape_str(all[i]), axis));
        out[axis] += all[i][axis];
      }
      return out;
    }
    case OpKind::slice: {
      need_inputs(1, 1);
      int64_t axis = attr_axis(op, "axis", std::nullopt, in[0].size(), where);
      int64_t start = attr_int(op, "start", std::nullopt, where), end = attr_int(op, "end", std::nullopt, where);
      if (start < 0 || end > in[0][axis] || start >= end)
        fail(op, where, fmt::format("slice [{}, {}) out of range for axis {} of {}", start, end, axis, shape_str(in[0])));
      Shape out = in[0];
      out[axis] = end - start;
      return out;
    }
    case OpKind::relu:
    case OpKind::gelu:
    case OpKind::sigmoid:
    case OpKind::tanh:
    case OpKind::dropout:
      need_inputs(1, 1);
      if (op.kind == OpKind::dropout) {
        double p = attr_num(op, "p", 0.1, where);
        if (p < 0 || p >= 1) fail(op, where, fmt::format("attrs.p must be in [0, 1), found {}", p));
      }
      return in[0];
    case OpKind::clip:
    case OpKind::hardsigmoid:
    case OpKind::hardswish:
      need_inputs(1, 1);
      if (op.kind == OpKind::clip && attr_num(op, "min", -1e300, where) > attr_num(op, "max", 1e300, where))
        fail(op, where, fmt::format("attrs.min = {} is above attrs.max = {}", attr_num(op, "min", 0, where),
                                    attr_num(op, "max", 0, where)));
      return in[0];
    case OpKind::pad: {
      need_inputs(1, 1);
      std::vector<int64_t> pads = attr_ints(op, "pads", where);
      const size_t r = in[0].size() - 1;
      if (pads.size() != 2 * r)
        fail(op, where, fmt::format("attrs.pads has {} values, expected {} (begin and end of each of the {} per-sample dims)",
                                    pads.size(), 2 * r, r));
      Shape out = in[0];
      for (size_t d = 0; d < r; ++d) {
        if (pads[d] < 0 || pads[d + r] < 0 || pads[d] > kMaxExtent || pads[d + r] > kMaxExtent)
          fail(op, where, fmt::format("attrs.pads has a value outside [0, 2^40]: {}", op.attrs.at("pads").dump()));
        out[d + 1] += pads[d] + pads[d + r];
      }
      return out;
    }
    case OpKind::softmax:
      need_inputs(1, 1);
      attr_axis(op, "axis", -1, in[0].size(), where);
      return in[0];
    case OpKind::layernorm:
      need_inputs(1, 1);
      need_rank(0, 2, 8);
      return in[0];
    case OpKind::embedding_bag: {
      need_inputs(1, 1);
      need_rank(0, 2, 2);
      positive("rows", std::nullopt);
      return Shape{kBatch, positive("dim", std::nullopt)};
    }
    case OpKind::embedding: {
      need_inputs(1, 1);
      need_rank(0, 1, 7);
      positive("rows", std::nullopt);
      Shape out = in[0];
      out.push_back(positive("dim", std::nullopt));
      if (attr_bool(op, "positions", false, where)) {
        if (in[0].size() != 2)
          fail(op, where, fmt::format("attrs.positions needs [B, seq] indices, found {}", shape_str(in[0])));
        if (attr_int(op, "position_rows", in[0][1], where) < in[0][1])
          fail(op, where, fmt::format("attrs.position_rows = {} is less than the sequence length {}",
                                      attr_int(op, "position_rows", in[0][1], where), in[0][1]));
      } else if (op.attrs.contains("position_rows")) {
        fail(op, where, "attrs.position_rows without attrs.positions");
      }
      return out;
    }
    case OpKind::attention: {
      need_inputs(1, 1);
      need_rank(0, 3, 3);
      int64_t heads = positive("heads", std::nullopt);
      if (in[0][2] % heads != 0)
        fail(op, where, fmt::format("attrs.heads = {} does not divide hidden size {}", heads, in[0][2]));
      return in[0];
    }
    case OpKind::conv2d: {
      need_inputs(1, 1);
      need_rank(0, 4, 4);
      int64_t co = positive("out_channels", std::nullopt);
      ConvGeometry cg = conv_geometry(op, in[0][1], where);
      int64_t span_h = in[0][2] + cg.pt + cg.pb - cg.dh * (cg.kh - 1) - 1;
      int64_t span_w = in[0][3] + cg.pl + cg.pr - cg.dw * (cg.kw - 1) - 1;
      if (span_h < 0 || span_w < 0)
        fail(op, where, fmt::format("kernel {}x{} (dilation {}x{}) does not fit input {}", cg.kh, cg.kw, cg.dh, cg.dw,
                                    shape_str(in[0])));
      return Shape{kBatch, co, span_h / cg.sh + 1, span_w / cg.sw + 1};
    }
    case OpKind::batchnorm:
      need_inputs(1, 1);
      need_rank(0, 4, 4);
      return in[0];
    case OpKind::maxpool:
    case OpKind::avgpool: {
      need_inputs(1, 1);
      need_rank(0, 4, 4);
      int64_t k = positive("kernel", std::nullopt), s = positive("stride", k), p = attr_int(op, "padding", 0, where);
      if (p < 0 || 2 * p > k) fail(op, where, fmt::format("attrs.padding = {} must be in [0, kernel/2]", p));
      // ceil_mode (PyTorch/ONNX): round the window count up, dropping a last window that would start
      // in the right padding.
      const bool ceil = attr_bool(op, "ceil_mode", false, where);
      auto out_dim = [&](int64_t n) {
        int64_t span = n + 2 * p - k;
        if (span < 0) return int64_t{0};
        int64_t o = (ceil ? (span + s - 1) / s : span / s) + 1;
        if (ceil && (o - 1) * s >= n + p) --o;
        return o;
      };
      int64_t h = out_dim(in[0][2]), w = out_dim(in[0][3]);
      if (h <= 0 || w <= 0) fail(op, where, fmt::format("kernel {} does not fit input {}", k, shape_str(in[0])));
      return Shape{kBatch, in[0][1], h, w};
    }
    case OpKind::global_avgpool:
      need_inputs(1, 1);
      need_rank(0, 4, 4);
      return Shape{kBatch, in[0][1]};
    case OpKind::flatten:
      need_inputs(1, 1);
      return Shape{kBatch, per_sample_elems(in[0])};
    case OpKind::reshape: {
      need_inputs(1, 1);
      Shape out{kBatch};
      double elems = 1;
      for (int64_t d : attr_ints(op, "shape", where)) {
        if (d <= 0 || d > kMaxExtent)
          fail(op, where, fmt::format("attrs.shape has dimension {}, not in [1, 2^40]", d));
        out.push_back(d);
        elems *= static_cast<double>(d);
      }
      if (elems > static_cast<double>(kMaxExtent))  // before per_sample_elems, which would wrap
        fail(op, where, fmt::format("attrs.shape {} has more than 2^40 elements per sample", shape_str(out)));
      if (per_sample_elems(out) != per_sample_elems(in[0]))
        fail(op, where, fmt::format("shape mismatch: cannot reshape {} to {}", shape_str(in[0]), shape_str(out)));
      return out;
    }
    case OpKind::transpose: {
      need_inputs(1, 1);
      auto perm = attr_ints(op, "perm", where);
      std::vector<int64_t> sorted = perm;
      std::sort(sorted.begin(), sorted.end());
      std::vector<int64_t> iota(in[0].size());
      std::iota(iota.begin(), iota.end(), 0);
      if (sorted != iota || perm[0] != 0)
        fail(op, where, fmt::format("attrs.perm is not a permutation of 0..{} keeping 0 first", in[0].size() - 1));
      Shape out;
      for (int64_t p : perm) out.push_back(in[0][p]);
      return out;
    }
    case OpKind::mean:
    case OpKind::sum: {
      need_inputs(1, 1);
      need_rank(0, 2, 8);
      int64_t axis = attr_axis(op, "axis", std::nullopt, in[0].size(), where);
      Shape out = in[0];
      if (attr_bool(op, "keepdim", false, where))
        out[axis] = 1;
      else
        out.erase(out.begin() + axis);
      return out;
    }
    case OpKind::mse_loss:
      need_inputs(2, 2);
      if (in[0] != in[1])
        fail(op, where, fmt::format("shape mismatch: prediction {} vs target {}", shape_str(in[0]), shape_str(in[1])));
      return Shape{};
    case OpKind::cross_entropy:
      need_inputs(2, 2);
      need_rank(0, 2, 2);
      need_rank(1, 1, 1);
      return Shape{};
  }
  fail(op, where, "unhandled op kind");
}

}  // namespace gp::ir
