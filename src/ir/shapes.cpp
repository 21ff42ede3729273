// Shape inference per op kind (the semantics documented in model.h) and attribute access.
#include <algorithm>
#include <cmath>
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

int64_t attr_axis(const Op& op, const char* key, std::optional<int64_t> dflt, size_t rank, const std::string& where) {
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
      fail(op, where,
           fmt::format("attrs.{} has {} values, expected an integer or {}", key, v.size(),
                       counts.size() == 1 ? "2" : "2 or 4"));
    return v;
  }
  return {attr_int(op, key, dflt, where)};
}
// attrs[key] as (height, width): one integer for both or a list of two, each in [lo, 2^40].
std::pair<int64_t, int64_t> hw_pair(const Op& op, const char* key, std::optional<int64_t> dflt, int64_t lo,
                                    const std::string& where) {
  std::vector<int64_t> v = int_or_list(op, key, dflt, {2}, where);
  if (v.size() == 1) v.push_back(v[0]);
  for (int64_t x : v)
    if (x < lo || x > kMaxExtent) fail(op, where, fmt::format("attrs.{} has value {}, not in [{}, 2^40]", key, x, lo));
  return {v[0], v[1]};
}
}  // namespace

ConvGeometry conv_geometry(const Op& op, int64_t in_channels, const std::string& where) {
  ConvGeometry g;
  std::tie(g.kh, g.kw) = hw_pair(op, "kernel", std::nullopt, 1, where);
  std::tie(g.sh, g.sw) = hw_pair(op, "stride", 1, 1, where);
  std::tie(g.dh, g.dw) = hw_pair(op, "dilation", 1, 1, where);
  std::vector<int64_t> p = int_or_list(op, "padding", 0, {2, 4}, where);
  if (p.size() == 1) p = {p[0], p[0], p[0], p[0]};
  if (p.size() == 2) p = {p[0], p[1], p[0], p[1]};
  for (int64_t x : p)
    if (x < 0 || x > kMaxExtent) fail(op, where, fmt::format("attrs.padding has value {}, not in [0, 2^40]", x));
  g.pt = p[0], g.pl = p[1], g.pb = p[2], g.pr = p[3];
  g.groups = attr_int(op, "groups", 1, where);
  int64_t co = attr_int(op, "out_channels", std::nullopt, where);
  if (g.groups < 1 || in_channels % g.groups != 0 || co % g.groups != 0)
    fail(op, where,
         fmt::format("attrs.groups = {} must be positive and divide the {} input and {} output channels", g.groups,
                     in_channels, co));
  if (op.kind == OpKind::conv_transpose2d) std::tie(g.oph, g.opw) = hw_pair(op, "output_padding", 0, 0, where);
  else if (op.attrs.is_object() && op.attrs.contains("output_padding"))
    fail(op, where, "attrs.output_padding is an attribute of conv_transpose2d only");
  return g;
}

PoolGeometry pool_geometry(const Op& op, const std::string& where) {
  PoolGeometry g;
  std::tie(g.kh, g.kw) = hw_pair(op, "kernel", std::nullopt, 1, where);
  std::tie(g.sh, g.sw) = op.attrs.contains("stride") ? hw_pair(op, "stride", 1, 1, where) : std::pair{g.kh, g.kw};
  std::tie(g.ph, g.pw) = hw_pair(op, "padding", 0, 0, where);
  std::tie(g.dh, g.dw) = hw_pair(op, "dilation", 1, 1, where);
  if (op.kind != OpKind::maxpool && (g.dh != 1 || g.dw != 1))
    fail(op, where, fmt::format("attrs.dilation {}x{}: only maxpool is dilated", g.dh, g.dw));
  if (2 * g.ph > g.dh * (g.kh - 1) + 1 || 2 * g.pw > g.dw * (g.kw - 1) + 1)
    fail(op, where,
         fmt::format("attrs.padding {}x{} must be at most half the (dilated) kernel {}x{}", g.ph, g.pw,
                     g.dh * (g.kh - 1) + 1, g.dw * (g.kw - 1) + 1));
  g.ceil_mode = attr_bool(op, "ceil_mode", false, where);
  if (op.kind != OpKind::avgpool && op.attrs.is_object() && op.attrs.contains("count_include_pad"))
    fail(op, where, "attrs.count_include_pad is an attribute of avgpool only");
  g.count_include_pad = attr_bool(op, "count_include_pad", true, where);
  return g;
}

std::string attr_choice(const Op& op, const char* key, const char* dflt, std::initializer_list<const char*> allowed,
                        const std::string& where) {
  if (!op.attrs.is_object() || !op.attrs.contains(key)) return dflt;
  const Json& v = op.attrs.at(key);
  std::string names;
  for (const char* a : allowed) {
    if (v.is_string() && v.get<std::string>() == a) return a;
    names += fmt::format("{}\"{}\"", names.empty() ? "" : ", ", a);
  }
  fail(op, where, fmt::format("attrs.{} = {} is not one of {}", key, v.dump(), names));
}

AttentionInputs attention_inputs(const Op& op, const std::string& where) {
  AttentionInputs a;
  a.kv = attr_bool(op, "cross", false, where) ? 1 : 0;
  if (static_cast<int>(op.inputs.size()) > a.kv + 1) a.mask = a.kv + 1;
  return a;
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
    fail(op, where,
         fmt::format("attrs.param {} must have 1 to 2^40 elements and at least one dimension",
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

namespace {

/// One op's inputs and the checks every shape rule shares; each failure names the op and `where`.
struct ShapeInput {
  const Op& op;
  const std::vector<Shape>& in;
  const std::string& where;

  [[noreturn]] void fail(const std::string& msg) const { ir::fail(op, where, msg); }
  void need_inputs(size_t lo, size_t hi) const {
    if (in.size() >= lo && in.size() <= hi) return;
    if (lo == hi) fail(fmt::format("expects {} input(s), has {}", lo, in.size()));
    fail(fmt::format("expects {} to {} inputs, has {}", lo, hi, in.size()));
  }
  void need_rank(size_t i, size_t lo, size_t hi) const {
    if (in[i].size() < lo || in[i].size() > hi)
      fail(fmt::format("input {} has shape {}, expected rank {}{}", i, shape_str(in[i]), lo,
                       hi == lo ? "" : fmt::format(" to {}", hi)));
  }
  /// One input of rank lo..hi (hi = 0: any rank).
  void one_input(size_t lo = 0, size_t hi = 0) const {
    need_inputs(1, 1);
    if (hi > 0) need_rank(0, lo, hi);
  }
  int64_t positive(const char* key, std::optional<int64_t> dflt) const {
    int64_t v = attr_int(op, key, dflt, where);
    if (v <= 0) fail(fmt::format("attrs.{} must be positive, found {}", key, v));
    if (v > kMaxExtent) fail(fmt::format("attrs.{} = {} is larger than 2^40", key, v));
    return v;
  }
  int64_t integer(const char* key, std::optional<int64_t> dflt) const { return attr_int(op, key, dflt, where); }
  double number(const char* key, double dflt) const { return attr_num(op, key, dflt, where); }
  bool flag(const char* key) const { return attr_bool(op, key, false, where); }
  int64_t axis(const char* key, std::optional<int64_t> dflt, size_t rank) const {
    return attr_axis(op, key, dflt, rank, where);
  }
  /// attrs.param as a per-sample tensor shape [B, ...], if the op has one.
  std::optional<Shape> param_input() const {
    std::optional<Shape> ps = param_shape(op, where);
    if (!ps) return std::nullopt;
    Shape s{kBatch};
    s.insert(s.end(), ps->begin(), ps->end());
    return s;
  }
};

using ShapeRule = Shape (*)(const ShapeInput&);

Shape same_as_input(const ShapeInput& x) {
  x.one_input();
  return x.in[0];
}

Shape linear_shape(const ShapeInput& x) {
  x.one_input(2, 8);
  Shape out = x.in[0];
  out.back() = x.positive("out_features", std::nullopt);
  return out;
}

Shape matmul_shape(const ShapeInput& x) {
  x.need_inputs(2, 2);
  x.need_rank(0, 3, 8);
  x.need_rank(1, 3, 8);
  const Shape &a = x.in[0], &b = x.in[1];
  if (a.size() != b.size() || !std::equal(a.begin(), a.end() - 2, b.begin()) || a[a.size() - 1] != b[b.size() - 2])
    x.fail(fmt::format("shape mismatch: {} @ {}", shape_str(a), shape_str(b)));
  Shape out = a;
  out.back() = b.back();
  return out;
}

// add, mul: inputs (and attrs.param, as the last operand) broadcast.
Shape elementwise_shape(const ShapeInput& x) {
  std::vector<Shape> all = x.in;
  std::optional<Shape> ps = x.param_input();
  x.need_inputs(ps ? 1 : 2, 64);
  if (ps) all.push_back(*ps);
  std::optional<Shape> out = broadcast(all);
  if (!out) {
    std::string list;
    for (const Shape& s : all) list += (list.empty() ? "" : ", ") + shape_str(s);
    x.fail(fmt::format("shape mismatch: {} do not broadcast{}", list, ps ? " (the last is attrs.param)" : ""));
  }
  return *out;
}

Shape concat_shape(const ShapeInput& x) {
  x.need_inputs(1, 1024);
  std::vector<Shape> all = x.in;
  if (std::optional<Shape> p = x.param_input()) {
    int64_t at = x.integer("param_at", 0);
    if (at < 0 || at > static_cast<int64_t>(x.in.size()))
      x.fail(fmt::format("attrs.param_at = {} is not in [0, {}]", at, x.in.size()));
    all.insert(all.begin() + at, *p);
  }
  int64_t axis = x.axis("axis", std::nullopt, all[0].size());
  Shape out = all[0];
  for (size_t i = 1; i < all.size(); ++i) {
    Shape a = all[0], b = all[i];
    if (a.size() != b.size()) x.fail(fmt::format("shape mismatch: {} vs {}", shape_str(a), shape_str(b)));
    a[axis] = b[axis] = 0;
    if (a != b)
      x.fail(fmt::format("shape mismatch: operand 0 is {} but operand {} is {} (concat on axis {})", shape_str(all[0]),
                         i, shape_str(all[i]), axis));
    out[axis] += all[i][axis];
  }
  return out;
}

Shape slice_shape(const ShapeInput& x) {
  x.one_input();
  int64_t axis = x.axis("axis", std::nullopt, x.in[0].size());
  int64_t start = x.integer("start", std::nullopt), end = x.integer("end", std::nullopt);
  if (start < 0 || end > x.in[0][axis] || start >= end)
    x.fail(fmt::format("slice [{}, {}) out of range for axis {} of {}", start, end, axis, shape_str(x.in[0])));
  const int64_t step = x.positive("step", 1);
  Shape out = x.in[0];
  out[axis] = (end - start + step - 1) / step;
  return out;
}

Shape gather_shape(const ShapeInput& x) {
  x.one_input();
  const int64_t axis = x.axis("axis", std::nullopt, x.in[0].size());
  const std::vector<int64_t> idx = attr_ints(x.op, "indices", x.where);
  if (idx.empty()) x.fail("attrs.indices is empty");
  for (int64_t i : idx)
    if (i < 0 || i >= x.in[0][axis])
      x.fail(fmt::format("attrs.indices holds {}, outside [0, {}) (axis {} of {})", i, x.in[0][axis], axis,
                         shape_str(x.in[0])));
  Shape out = x.in[0];
  out[axis] = static_cast<int64_t>(idx.size());
  return out;
}

Shape dropout_shape(const ShapeInput& x) {
  x.one_input();
  double p = x.number("p", 0.1);
  if (p < 0 || p >= 1) x.fail(fmt::format("attrs.p must be in [0, 1), found {}", p));
  return x.in[0];
}

Shape clip_shape(const ShapeInput& x) {
  x.one_input();
  if (x.number("min", -1e300) > x.number("max", 1e300))
    x.fail(fmt::format("attrs.min = {} is above attrs.max = {}", x.number("min", 0), x.number("max", 0)));
  return x.in[0];
}

Shape pad_shape(const ShapeInput& x) {
  x.one_input();
  std::vector<int64_t> pads = attr_ints(x.op, "pads", x.where);
  const size_t r = x.in[0].size() - 1;
  if (pads.size() != 2 * r)
    x.fail(fmt::format("attrs.pads has {} values, expected {} (begin and end of each of the {} per-sample dims)",
                       pads.size(), 2 * r, r));
  Shape out = x.in[0];
  for (size_t d = 0; d < r; ++d) {
    if (pads[d] < 0 || pads[d + r] < 0 || pads[d] > kMaxExtent || pads[d + r] > kMaxExtent)
      x.fail(fmt::format("attrs.pads has a value outside [0, 2^40]: {}", x.op.attrs.at("pads").dump()));
    out[d + 1] += pads[d] + pads[d + r];
  }
  return out;
}

Shape softmax_shape(const ShapeInput& x) {
  x.one_input();
  x.axis("axis", -1, x.in[0].size());
  return x.in[0];
}

Shape layernorm_shape(const ShapeInput& x) {
  x.one_input(2, 8);
  return x.in[0];
}

Shape embedding_bag_shape(const ShapeInput& x) {
  x.one_input(2, 2);
  x.positive("rows", std::nullopt);
  return Shape{kBatch, x.positive("dim", std::nullopt)};
}

Shape embedding_shape(const ShapeInput& x) {
  x.one_input(1, 7);
  const int64_t rows = x.positive("rows", std::nullopt);
  const Shape& idx = x.in[0];
  if (x.op.attrs.is_object() && x.op.attrs.contains("offsets")) {
    const std::vector<int64_t> off = attr_ints(x.op, "offsets", x.where);
    if (off.size() != 1 && (idx.size() < 2 || static_cast<int64_t>(off.size()) != idx.back()))
      x.fail(fmt::format("attrs.offsets has {} values, expected 1 or one per index of the last dim of {}", off.size(),
                         shape_str(idx)));
    for (int64_t o : off)
      if (o < 0 || o >= rows) x.fail(fmt::format("attrs.offsets holds {}, outside [0, rows = {})", o, rows));
  }
  Shape out = idx;
  out.push_back(x.positive("dim", std::nullopt));
  if (x.flag("positions")) {
    if (idx.size() != 2) x.fail(fmt::format("attrs.positions needs [B, seq] indices, found {}", shape_str(idx)));
    if (int64_t pos_rows = x.integer("position_rows", idx[1]); pos_rows < idx[1])
      x.fail(fmt::format("attrs.position_rows = {} is less than the sequence length {}", pos_rows, idx[1]));
  } else if (x.op.attrs.contains("position_rows")) {
    x.fail("attrs.position_rows without attrs.positions");
  }
  return out;
}

// x [B, seq, hidden], with attrs.cross the keys' source [B, seq_kv, hidden], and an optional padding
// mask [B, seq_kv] over the keys (attrs.mask says how it is read).
Shape attention_shape(const ShapeInput& x) {
  const AttentionInputs a = attention_inputs(x.op, x.where);
  x.need_inputs(1 + a.kv, 2 + a.kv);
  x.need_rank(0, 3, 3);
  int64_t heads = x.positive("heads", std::nullopt);
  if (x.in[0][2] % heads != 0)
    x.fail(fmt::format("attrs.heads = {} does not divide hidden size {}", heads, x.in[0][2]));
  const bool causal = x.flag("causal");
  if (a.kv) {
    x.need_rank(1, 3, 3);
    if (x.in[1][2] != x.in[0][2])
      x.fail(
          fmt::format("input 1 (the keys' and values' source) has shape {}, expected [B, seq_kv, {}] (the "
                      "queries' hidden size)",
                      shape_str(x.in[1]), x.in[0][2]));
    if (causal && x.in[1][1] != x.in[0][1])
      x.fail(fmt::format("attrs.causal on cross-attention needs as many keys as queries, found {} and {}", x.in[1][1],
                         x.in[0][1]));
  }
  const int64_t keys = x.in[static_cast<size_t>(a.kv)][1];
  if (a.mask >= 0) {
    if (x.in[static_cast<size_t>(a.mask)] != Shape{kBatch, keys})
      x.fail(fmt::format("input {} (the padding mask) has shape {}, expected [B, {}] (one value per key position)",
                         a.mask, shape_str(x.in[static_cast<size_t>(a.mask)]), keys));
    attr_choice(x.op, "mask", "keep", {"keep", "ignore"}, x.where);
    const double fill = x.number("mask_fill", -1.0);
    if (x.op.attrs.contains("mask_fill") && !(fill < 0 && std::isfinite(fill)))
      x.fail(fmt::format("attrs.mask_fill must be a finite negative number (leave it out for -inf), found {}", fill));
  } else if (x.op.attrs.contains("mask") || x.op.attrs.contains("mask_fill")) {
    x.fail("attrs.mask / attrs.mask_fill without a padding-mask input (input 1)");
  }
  return x.in[0];
}

// x [B, H, W, C]; window [wh, ww] positive, shift [sh, sw] in [0, window) (Swin's shifts are window / 2).
Shape window_attention_shape(const ShapeInput& x) {
  x.one_input(4, 4);
  int64_t heads = x.positive("heads", std::nullopt);
  if (x.in[0][3] % heads != 0)
    x.fail(fmt::format("attrs.heads = {} does not divide the channels {}", heads, x.in[0][3]));
  std::vector<int64_t> win = attr_ints(x.op, "window", x.where);
  std::vector<int64_t> shift = x.op.attrs.contains("shift") ? attr_ints(x.op, "shift", x.where)
                                                            : std::vector<int64_t>{0, 0};
  if (win.size() != 2 || win[0] <= 0 || win[1] <= 0 || win[0] > 4096 || win[1] > 4096)
    x.fail(
        fmt::format("attrs.window must be [wh, ww] with each in [1, 4096], found {}", x.op.attrs.at("window").dump()));
  if (shift.size() != 2 || shift[0] < 0 || shift[1] < 0 || shift[0] >= win[0] || shift[1] >= win[1])
    x.fail(fmt::format("attrs.shift must be [sh, sw] with 0 <= sh < wh and 0 <= sw < ww, found {}",
                       x.op.attrs.at("shift").dump()));
  return x.in[0];
}

Shape conv2d_shape(const ShapeInput& x) {
  x.one_input(4, 4);
  int64_t co = x.positive("out_channels", std::nullopt);
  ConvGeometry cg = conv_geometry(x.op, x.in[0][1], x.where);
  int64_t span_h = x.in[0][2] + cg.pt + cg.pb - cg.dh * (cg.kh - 1) - 1;
  int64_t span_w = x.in[0][3] + cg.pl + cg.pr - cg.dw * (cg.kw - 1) - 1;
  if (span_h < 0 || span_w < 0)
    x.fail(fmt::format("kernel {}x{} (dilation {}x{}) does not fit input {}", cg.kh, cg.kw, cg.dh, cg.dw,
                       shape_str(x.in[0])));
  return Shape{kBatch, co, span_h / cg.sh + 1, span_w / cg.sw + 1};
}

Shape batchnorm_shape(const ShapeInput& x) {
  x.one_input(4, 4);
  return x.in[0];
}

// conv_transpose2d: each input pixel scatters a kernel window; padding crops the full output.
Shape conv_transpose2d_shape(const ShapeInput& x) {
  x.one_input(4, 4);
  int64_t co = x.positive("out_channels", std::nullopt);
  ConvGeometry cg = conv_geometry(x.op, x.in[0][1], x.where);
  int64_t h = (x.in[0][2] - 1) * cg.sh - cg.pt - cg.pb + cg.dh * (cg.kh - 1) + 1 + cg.oph;
  int64_t w = (x.in[0][3] - 1) * cg.sw - cg.pl - cg.pr + cg.dw * (cg.kw - 1) + 1 + cg.opw;
  if (h <= 0 || w <= 0)
    x.fail(fmt::format("padding crops the whole output of input {} (output would be {}x{})", shape_str(x.in[0]), h, w));
  return Shape{kBatch, co, h, w};
}

// maxpool, avgpool. ceil_mode (PyTorch/ONNX): round the window count up, dropping a last window
// that would start in the right padding.
Shape pool_shape(const ShapeInput& x) {
  x.one_input(4, 4);
  const PoolGeometry pg = pool_geometry(x.op, x.where);
  auto out_dim = [&](int64_t n, int64_t k, int64_t s, int64_t p, int64_t d) {
    int64_t span = n + 2 * p - d * (k - 1) - 1;
    if (span < 0) return int64_t{0};
    int64_t o = (pg.ceil_mode ? (span + s - 1) / s : span / s) + 1;
    if (pg.ceil_mode && (o - 1) * s >= n + p) --o;
    return o;
  };
  int64_t h = out_dim(x.in[0][2], pg.kh, pg.sh, pg.ph, pg.dh), w = out_dim(x.in[0][3], pg.kw, pg.sw, pg.pw, pg.dw);
  if (h <= 0 || w <= 0) x.fail(fmt::format("kernel {}x{} does not fit input {}", pg.kh, pg.kw, shape_str(x.in[0])));
  return Shape{kBatch, x.in[0][1], h, w};
}

Shape resize_shape(const ShapeInput& x) {
  x.one_input(4, 4);
  const std::string mode = attr_choice(x.op, "mode", "nearest", {"nearest", "linear"}, x.where);
  if (mode == "nearest" && x.op.attrs.contains("align_corners"))
    x.fail("attrs.align_corners is for mode \"linear\" only");
  x.flag("align_corners");
  std::vector<int64_t> size = attr_ints(x.op, "size", x.where);
  if (size.size() != 2) x.fail(fmt::format("attrs.size has {} values, expected [h, w]", size.size()));
  for (int64_t d : size)
    if (d <= 0 || d > kMaxExtent) x.fail(fmt::format("attrs.size has value {}, not in [1, 2^40]", d));
  if (x.op.attrs.contains("scales")) {
    const Json& sc = x.op.attrs.at("scales");
    if (!sc.is_array() || sc.size() != 2 || !sc[0].is_number() || !sc[1].is_number() || !(sc[0].get<double>() > 0) ||
        !(sc[1].get<double>() > 0))
      x.fail(fmt::format("attrs.scales = {} is not two positive numbers [sh, sw]", sc.dump()));
  }
  return Shape{kBatch, x.in[0][1], size[0], size[1]};
}

Shape global_avgpool_shape(const ShapeInput& x) {
  x.one_input(4, 4);
  return Shape{kBatch, x.in[0][1]};
}

Shape flatten_shape(const ShapeInput& x) {
  x.one_input();
  return Shape{kBatch, per_sample_elems(x.in[0])};
}

Shape reshape_shape(const ShapeInput& x) {
  x.one_input();
  Shape out{kBatch};
  double elems = 1;
  for (int64_t d : attr_ints(x.op, "shape", x.where)) {
    if (d <= 0 || d > kMaxExtent) x.fail(fmt::format("attrs.shape has dimension {}, not in [1, 2^40]", d));
    out.push_back(d);
    elems *= static_cast<double>(d);
  }
  if (elems > static_cast<double>(kMaxExtent))  // before per_sample_elems, which would wrap
    x.fail(fmt::format("attrs.shape {} has more than 2^40 elements per sample", shape_str(out)));
  if (per_sample_elems(out) != per_sample_elems(x.in[0]))
    x.fail(fmt::format("shape mismatch: cannot reshape {} to {}", shape_str(x.in[0]), shape_str(out)));
  return out;
}

Shape transpose_shape(const ShapeInput& x) {
  x.one_input();
  auto perm = attr_ints(x.op, "perm", x.where);
  std::vector<int64_t> sorted = perm;
  std::sort(sorted.begin(), sorted.end());
  std::vector<int64_t> iota(x.in[0].size());
  std::iota(iota.begin(), iota.end(), 0);
  if (sorted != iota || perm[0] != 0)
    x.fail(fmt::format("attrs.perm is not a permutation of 0..{} keeping 0 first", x.in[0].size() - 1));
  Shape out;
  for (int64_t p : perm) out.push_back(x.in[0][p]);
  return out;
}

// mean, sum over one non-batch axis.
Shape reduce_shape(const ShapeInput& x) {
  x.one_input(2, 8);
  int64_t axis = x.axis("axis", std::nullopt, x.in[0].size());
  Shape out = x.in[0];
  if (x.flag("keepdim")) out[axis] = 1;
  else out.erase(out.begin() + axis);
  return out;
}

Shape mse_loss_shape(const ShapeInput& x) {
  x.need_inputs(2, 2);
  if (x.in[0] != x.in[1])
    x.fail(fmt::format("shape mismatch: prediction {} vs target {}", shape_str(x.in[0]), shape_str(x.in[1])));
  return Shape{};
}

// Logits [B, C] and labels [B], or per position: logits [B, C, d1, ...] and labels [B, d1, ...].
Shape cross_entropy_shape(const ShapeInput& x) {
  x.need_inputs(2, 2);
  x.need_rank(0, 2, 8);
  Shape want = x.in[0];
  want.erase(want.begin() + 1);
  if (x.in[1] != want)
    x.fail(fmt::format("labels have shape {}, expected {} for logits {} (classes on dim 1)", shape_str(x.in[1]),
                       shape_str(want), shape_str(x.in[0])));
  if (x.op.attrs.is_object() && x.op.attrs.contains("ignore_index")) (void)x.integer("ignore_index", 0);
  const double smoothing = x.number("label_smoothing", 0.0);
  if (!(smoothing >= 0 && smoothing <= 1))
    x.fail(fmt::format("attrs.label_smoothing must be in [0, 1], found {}", smoothing));
  return Shape{};
}

/// The shape rule of each op kind (the compiler checks that every kind has one).
ShapeRule shape_rule(OpKind k) {
  switch (k) {
    case OpKind::linear: return linear_shape;
    case OpKind::matmul: return matmul_shape;
    case OpKind::add:
    case OpKind::mul: return elementwise_shape;
    case OpKind::concat: return concat_shape;
    case OpKind::slice: return slice_shape;
    case OpKind::gather: return gather_shape;
    case OpKind::relu:
    case OpKind::gelu:
    case OpKind::sigmoid:
    case OpKind::tanh:
    case OpKind::hardsigmoid:
    case OpKind::hardswish: return same_as_input;
    case OpKind::dropout: return dropout_shape;
    case OpKind::clip: return clip_shape;
    case OpKind::pad: return pad_shape;
    case OpKind::softmax: return softmax_shape;
    case OpKind::layernorm: return layernorm_shape;
    case OpKind::embedding_bag: return embedding_bag_shape;
    case OpKind::embedding: return embedding_shape;
    case OpKind::attention: return attention_shape;
    case OpKind::window_attention: return window_attention_shape;
    case OpKind::conv2d: return conv2d_shape;
    case OpKind::conv_transpose2d: return conv_transpose2d_shape;
    case OpKind::batchnorm: return batchnorm_shape;
    case OpKind::maxpool:
    case OpKind::avgpool: return pool_shape;
    case OpKind::resize: return resize_shape;
    case OpKind::global_avgpool: return global_avgpool_shape;
    case OpKind::flatten: return flatten_shape;
    case OpKind::reshape: return reshape_shape;
    case OpKind::transpose: return transpose_shape;
    case OpKind::mean:
    case OpKind::sum: return reduce_shape;
    case OpKind::mse_loss:
    case OpKind::bce_with_logits: return mse_loss_shape;
    case OpKind::cross_entropy: return cross_entropy_shape;
  }
  return nullptr;
}

}  // namespace

Shape infer_shape(const Op& op, const std::vector<Shape>& in, const std::string& where) {
  for (size_t i = 0; i < in.size(); ++i)
    if (in[i].empty() || in[i][0] != kBatch)
      fail(op, where, fmt::format("input {} has shape {} without a batch dimension", i, shape_str(in[i])));
  ShapeRule rule = shape_rule(op.kind);
  if (!rule) fail(op, where, "unhandled op kind");
  return rule(ShapeInput{op, in, where});
}

}  // namespace gp::ir
