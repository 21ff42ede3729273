// ONNX loading: parse and check the file, sort the nodes (cycles are errors), classify inputs into data
// and parameters, and infer concrete shapes with ONNX shape inference, folding shape-only computations
// (Shape -> Gather -> Unsqueeze -> Concat -> Reshape) into constants until nothing changes.
#include <onnx/shape_inference/implementation.h>

#include <algorithm>
#include <climits>
#include <cstring>
#include <functional>
#include <optional>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <unordered_map>
#include <unordered_set>

#include "graph/dag.h"
#include "importers/onnx_graph.h"
#include "support/error.h"

namespace gp::importers::onnx_detail {

const TensorInfo& Net::at(const std::string& name) const {
  auto it = t.find(name);
  GP_ASSERT(it != t.end(), "unknown tensor {}", name);
  return it->second;
}

const std::vector<int64_t>& Net::shape(const std::string& name) const {
  const TensorInfo& ti = at(name);
  GP_CHECK(ti.shape.has_value(), "{}: ONNX shape inference could not determine the shape of tensor \"{}\"", path, name);
  return *ti.shape;
}

const onnx::AttributeProto* find_attr(const onnx::NodeProto& n, const std::string& name) {
  for (const auto& a : n.attribute())
    if (a.name() == name) return &a;
  return nullptr;
}
int64_t attr_i(const onnx::NodeProto& n, const std::string& name, int64_t dflt) {
  const auto* a = find_attr(n, name);
  return a ? a->i() : dflt;
}
float attr_f(const onnx::NodeProto& n, const std::string& name, float dflt) {
  const auto* a = find_attr(n, name);
  return a ? a->f() : dflt;
}
std::vector<int64_t> attr_ints(const onnx::NodeProto& n, const std::string& name) {
  const auto* a = find_attr(n, name);
  return a ? std::vector<int64_t>(a->ints().begin(), a->ints().end()) : std::vector<int64_t>{};
}
std::string node_label(const onnx::NodeProto& n) { return fmt::format("\"{}\" ({})", n.name(), n.op_type()); }

namespace {

constexpr int64_t kMaxValues = 4096;  // constants larger than this keep only their shape

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  GP_CHECK(f.good(), "{}: cannot open the ONNX file", path);
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// A serialized ModelProto starts with the tag of one of its fields (1-8, 14, 20, 21, 25 with the wire
// type the field has). Anything else is not an ONNX model, whatever protobuf would make of it.
bool plausible_model_header(const std::string& bytes) {
  if (bytes.empty()) return false;
  const unsigned tag = static_cast<unsigned char>(bytes[0]);
  const unsigned field = tag >> 3, wire = tag & 7;
  if (field == 1 || field == 5) return wire == 0;                   // ir_version, model_version
  if ((field >= 2 && field <= 8) || field == 14) return wire == 2;  // strings, graph, opsets, metadata
  return false;
}

// Values of a TensorProto (up to kMaxValues elements). Dims must be non-negative with a product
// below 2^40 (fuzz_onnx: a corrupted initializer's dims overflowed the product).
void read_values(const std::string& path, const onnx::TensorProto& tp, TensorInfo& ti) {
  ti.value_shape.assign(tp.dims().begin(), tp.dims().end());
  int64_t n = 1;
  for (int64_t d : ti.value_shape) {
    GP_CHECK(d >= 0 && (d == 0 || n <= ir::kMaxExtent / d), "{}: corrupt ONNX file ({} has dims [{}])", path,
             tp.name().empty() ? "an unnamed tensor" : fmt::format("tensor \"{}\"", tp.name()),
             fmt::join(ti.value_shape, ", "));
    n *= d;
  }
  ti.shape = ti.value_shape;
  ti.elem_type = tp.data_type();
  if (n > kMaxValues || tp.data_location() == onnx::TensorProto::EXTERNAL) return;
  const std::string& raw = tp.raw_data();
  auto from_raw = [&](auto sample, auto& out) {
    using T = decltype(sample);
    if (raw.size() != static_cast<size_t>(n) * sizeof(T)) return false;
    for (int64_t i = 0; i < n; ++i) {
      T v;
      std::memcpy(&v, raw.data() + i * sizeof(T), sizeof(T));
      out.push_back(static_cast<typename std::decay_t<decltype(out)>::value_type>(v));
    }
    return true;
  };
  std::vector<int64_t> ints;
  std::vector<double> reals;
  switch (tp.data_type()) {
    case onnx::TensorProto::INT64:
      if (!raw.empty() ? from_raw(int64_t{}, ints)
                       : (ints.assign(tp.int64_data().begin(), tp.int64_data().end()), true))
        ti.ints = ints;
      break;
    case onnx::TensorProto::INT32:
    case onnx::TensorProto::BOOL:
      if (!raw.empty()) {
        bool ok = tp.data_type() == onnx::TensorProto::BOOL ? from_raw(uint8_t{}, ints) : from_raw(int32_t{}, ints);
        if (ok) ti.ints = ints;
      } else {
        ti.ints = std::vector<int64_t>(tp.int32_data().begin(), tp.int32_data().end());
      }
      break;
    case onnx::TensorProto::FLOAT:
      if (!raw.empty() ? from_raw(float{}, reals)
                       : (reals.assign(tp.float_data().begin(), tp.float_data().end()), true))
        ti.reals = reals;
      break;
    case onnx::TensorProto::DOUBLE:
      if (!raw.empty() ? from_raw(double{}, reals)
                       : (reals.assign(tp.double_data().begin(), tp.double_data().end()), true))
        ti.reals = reals;
      break;
    default: break;
  }
  if (ti.ints && static_cast<int64_t>(ti.ints->size()) != n) ti.ints.reset();
  if (ti.reals && static_cast<int64_t>(ti.reals->size()) != n) ti.reals.reset();
}

// The node-reads-node graph: an edge from each tensor's producer to every node that reads it.
graph::Dag tensor_dag(const std::string& path, const onnx::GraphProto& g,
                      const std::unordered_set<std::string>& sources) {
  const int n = g.node_size();
  std::unordered_map<std::string, int> producer;
  for (int i = 0; i < n; ++i)
    for (const auto& o : g.node(i).output())
      if (!o.empty()) producer[o] = i;
  graph::Dag dag(n);
  for (int i = 0; i < n; ++i)
    for (const auto& in : g.node(i).input()) {
      if (in.empty() || sources.count(in)) continue;
      auto it = producer.find(in);
      GP_CHECK(it != producer.end(), "{}: node {} reads tensor \"{}\", which no node, input or initializer provides",
               path, node_label(g.node(i)), in);
      dag.add_edge(it->second, i);
    }
  return dag;
}

// A cycle among the nodes Kahn could not place, in edge order: from the first unplaced node, walk
// unplaced predecessors (first input first) until one repeats.
std::vector<int> cycle_in_remainder(const graph::Dag& dag, const std::vector<char>& placed) {
  int v = 0;
  while (placed[v]) ++v;
  std::vector<int> pos(dag.size(), -1), walk;
  while (pos[v] < 0) {
    pos[v] = static_cast<int>(walk.size());
    walk.push_back(v);
    for (int u : dag.preds(v))
      if (!placed[u]) {
        v = u;
        break;
      }
  }
  std::vector<int> cyc(walk.begin() + pos[v], walk.end());
  std::reverse(cyc.begin(), cyc.end());
  return cyc;
}

// Nodes in graph::kahn_order (smallest node index first); a remainder is a cycle, reported by names.
std::vector<onnx::NodeProto> sort_nodes(const std::string& path, const onnx::GraphProto& g,
                                        const std::unordered_set<std::string>& sources) {
  const graph::Dag dag = tensor_dag(path, g, sources);
  const std::vector<int> order = graph::kahn_order(dag);
  std::vector<onnx::NodeProto> out;
  std::vector<char> placed(dag.size(), 0);
  for (int u : order) {
    placed[u] = 1;
    out.push_back(g.node(u));
  }
  if (static_cast<int>(out.size()) != dag.size()) {
    std::vector<int> cyc = cycle_in_remainder(dag, placed);
    std::string names;
    for (int c : cyc) names += "\"" + g.node(c).name() + "\" -> ";
    throw UserError(fmt::format("{}: the ONNX graph has a cycle: {}\"{}\"", path, names, g.node(cyc.front()).name()));
  }
  return out;
}

bool is_weight_slot(const onnx::NodeProto& n, int slot) {
  const std::string& op = n.op_type();
  if (op == "Conv" || op == "ConvTranspose" || op == "Gemm" || op == "LayerNormalization" ||
      op == "InstanceNormalization")
    return slot >= 1;
  if (op == "BatchNormalization") return slot >= 1;
  if (op == "MatMul") return slot == 1;
  return false;
}

// Folding shape computations: each rule computes an op's integer values and their shape from
// known integer inputs, or returns false when it cannot.
struct Folded {
  std::vector<int64_t> vals, vshape;
  std::vector<double> reals;  // a Concat of float constants (Resize's scales) instead of vals
};
using FoldRule = bool (*)(const onnx::NodeProto& n, Net& net, Folded& f);

// The known integer values of input k, or null.
const std::vector<int64_t>* ints_of(const onnx::NodeProto& n, Net& net, int k) {
  if (k >= n.input_size() || n.input(k).empty()) return nullptr;
  const TensorInfo& ti = net.t[n.input(k)];
  return ti.ints ? &*ti.ints : nullptr;
}

int64_t length(const std::vector<int64_t>& v) { return static_cast<int64_t>(v.size()); }

bool fold_shape(const onnx::NodeProto& n, Net& net, Folded& f) {
  const TensorInfo& x = net.t[n.input(0)];
  if (!x.shape) return false;
  int64_t r = length(*x.shape);
  int64_t s = attr_i(n, "start", 0), e = attr_i(n, "end", r);
  s = std::clamp(s < 0 ? s + r : s, int64_t{0}, r);
  e = std::clamp(e < 0 ? e + r : e, int64_t{0}, r);
  for (int64_t i = s; i < e; ++i) f.vals.push_back((*x.shape)[i]);
  f.vshape = {length(f.vals)};
  return true;
}

bool fold_gather(const onnx::NodeProto& n, Net& net, Folded& f) {
  const auto *d = ints_of(n, net, 0), *idx = ints_of(n, net, 1);
  if (!d || !idx || net.t[n.input(0)].value_shape.size() != 1) return false;
  for (int64_t i : *idx) {
    int64_t j = i < 0 ? i + length(*d) : i;
    if (j < 0 || j >= length(*d)) return false;
    f.vals.push_back((*d)[j]);
  }
  f.vshape = net.t[n.input(1)].value_shape;
  return true;
}

// Unsqueeze, Squeeze, Identity, Cast (to an integer type) and Reshape pass the values through.
bool fold_passthrough(const onnx::NodeProto& n, Net& net, Folded& f) {
  const std::string& op = n.op_type();
  const auto* d = ints_of(n, net, 0);
  if (!d) return false;
  if (op == "Cast") {
    int64_t to = attr_i(n, "to", 0);
    if (to != onnx::TensorProto::INT64 && to != onnx::TensorProto::INT32) return false;
  }
  f.vals = *d;
  f.vshape = net.t[n.input(0)].value_shape;
  if (op == "Unsqueeze" && f.vshape.empty()) f.vshape = {1};
  if (op == "Squeeze" && f.vals.size() == 1) f.vshape = {};
  if (op == "Reshape") {  // the target shape when it is known (0 copies the input's dim, -1 the rest)
    f.vshape = {length(f.vals)};
    const auto* target = ints_of(n, net, 1);
    if (target && !target->empty() && attr_i(n, "allowzero", 0) == 0) {
      const std::vector<int64_t>& in_shape = net.t[n.input(0)].value_shape;
      std::vector<int64_t> shape;
      int64_t known = 1, infer = -1;
      for (size_t k = 0; k < target->size(); ++k) {
        int64_t v = (*target)[k];
        if (v == 0) v = k < in_shape.size() ? in_shape[k] : -2;
        if (v == -1 && infer < 0) infer = static_cast<int64_t>(k);
        else if (v < 0) return true;  // not readable: keep it flat
        else known *= v;
        shape.push_back(v);
      }
      if (infer >= 0 && known > 0 && length(f.vals) % known == 0)
        shape[static_cast<size_t>(infer)] = length(f.vals) / known;
      int64_t total = 1;
      for (int64_t v : shape) total *= v;
      if (total == length(f.vals) && (infer < 0 || known > 0)) f.vshape = shape;
    }
  }
  return true;
}

bool fold_concat(const onnx::NodeProto& n, Net& net, Folded& f) {
  for (int k = 0; k < n.input_size(); ++k) {
    const auto* d = ints_of(n, net, k);
    const auto& r = net.t[n.input(k)].reals;
    if (!d && (!r || !f.vals.empty())) return false;
    if (d) f.vals.insert(f.vals.end(), d->begin(), d->end());
    if (!d) f.reals.insert(f.reals.end(), r->begin(), r->end());
    if (d && !f.reals.empty()) return false;
  }
  f.vshape = {length(f.vals) + static_cast<int64_t>(f.reals.size())};
  return true;
}

// expand(n, -1, -1) (ViT's class token): Where(Equal(s, -1), 1s, s).
bool fold_constant_of_shape(const onnx::NodeProto& n, Net& net, Folded& f) {
  const auto* d = ints_of(n, net, 0);
  const auto* v = find_attr(n, "value");
  if (!d || !v || (v->t().data_type() != onnx::TensorProto::INT64) || d->size() > 8) return false;
  int64_t count = 1;
  for (int64_t x : *d) count = x < 0 || x > 1024 ? -1 : count * x;
  if (count < 0 || count > 1024) return false;
  const auto& t = v->t();
  int64_t value = t.int64_data_size() ? t.int64_data(0) : 0;
  if (!t.int64_data_size() && t.raw_data().size() == sizeof(int64_t))
    std::memcpy(&value, t.raw_data().data(), sizeof value);
  f.vals.assign(static_cast<size_t>(count), value);
  f.vshape = *d;
  return true;
}

// NumPy broadcasting of known integer tensors (value shapes; a scalar has shape []): the output
// shape and, per operand, each output element's source index; false when they do not broadcast.
bool broadcast_values(const std::vector<std::vector<int64_t>>& shapes, std::vector<int64_t>& out,
                      std::vector<std::vector<int64_t>>& src) {
  size_t rank = 0;
  for (const auto& sh : shapes) rank = std::max(rank, sh.size());
  out.assign(rank, 1);
  for (const auto& sh : shapes)
    for (size_t k = 0; k < sh.size(); ++k) {
      int64_t& o = out[rank - sh.size() + k];
      if (sh[k] != 1 && o != 1 && sh[k] != o) return false;
      if (sh[k] != 1) o = sh[k];
    }
  int64_t total = 1;
  for (int64_t d : out) total *= d;
  if (total > (int64_t{1} << 16)) return false;
  src.assign(shapes.size(), {});
  for (size_t i = 0; i < shapes.size(); ++i) {
    const auto& sh = shapes[i];
    std::vector<int64_t> st(sh.size(), 1);
    for (size_t k = sh.size(); k-- > 1;) st[k - 1] = st[k] * sh[k];
    for (int64_t o = 0; o < total; ++o) {
      int64_t rest = o, idx = 0;
      for (size_t k = rank; k-- > 0;) {
        const int64_t coord = rest % out[k];
        rest /= out[k];
        const size_t kk = k + sh.size();
        if (kk >= rank && sh[kk - rank] != 1) idx += coord * st[kk - rank];
      }
      src[i].push_back(idx);
    }
  }
  return true;
}

// The value shape of input k for broadcasting: its recorded shape, [n] when it has none but n values.
std::vector<int64_t> value_shape_of(const onnx::NodeProto& n, Net& net, int k) {
  const TensorInfo& ti = net.t[n.input(k)];
  int64_t total = 1;
  for (int64_t d : ti.value_shape) total *= d;
  if (ti.ints && total != length(*ti.ints)) return {length(*ti.ints)};
  return ti.value_shape;
}

// Equal and Where on known integer tensors (NumPy broadcasting).
bool fold_equal_where(const onnx::NodeProto& n, Net& net, Folded& f) {
  const bool equal = n.op_type() == "Equal";
  std::vector<const std::vector<int64_t>*> in;
  std::vector<std::vector<int64_t>> shapes;
  for (int k = 0; k < n.input_size(); ++k) {
    in.push_back(ints_of(n, net, k));
    if (!in.back()) return false;
    shapes.push_back(value_shape_of(n, net, k));
  }
  if (in.size() != (equal ? 2u : 3u)) return false;
  std::vector<std::vector<int64_t>> src;
  if (!broadcast_values(shapes, f.vshape, src)) return false;
  auto at = [&](size_t k, size_t i) { return (*in[k])[static_cast<size_t>(src[k][i])]; };
  for (size_t i = 0; i < src[0].size(); ++i)
    f.vals.push_back(equal ? at(0, i) == at(1, i) : at(0, i) ? at(1, i) : at(2, i));
  return true;
}

// Add, Sub, Mul, Div, Mod on known integer tensors (NumPy broadcasting).
bool fold_arithmetic(const onnx::NodeProto& n, Net& net, Folded& f) {
  const std::string& op = n.op_type();
  const auto *a = ints_of(n, net, 0), *b = ints_of(n, net, 1);
  if (!a || !b) return false;
  std::vector<std::vector<int64_t>> src;
  if (!broadcast_values({value_shape_of(n, net, 0), value_shape_of(n, net, 1)}, f.vshape, src)) return false;
  for (size_t i = 0; i < src[0].size(); ++i) {
    int64_t x = (*a)[static_cast<size_t>(src[0][i])], y = (*b)[static_cast<size_t>(src[1][i])];
    if ((op == "Div" || op == "Mod") && y == 0) return false;
    if (op == "Mod") {  // integer Mod (fmod=0): the sign of the divisor, as Python's % (torch 2.x's dim wrapping)
      if (attr_i(n, "fmod", 0) != 0) return false;
      const int64_t r = x % y;
      f.vals.push_back(r != 0 && (r < 0) != (y < 0) ? r + y : r);
      continue;
    }
    f.vals.push_back(op == "Add" ? x + y : op == "Sub" ? x - y : op == "Mul" ? x * y : x / y);
  }
  return true;
}

// torch.arange(seq) for position ids.
bool fold_range(const onnx::NodeProto& n, Net& net, Folded& f) {
  const auto *st = ints_of(n, net, 0), *lim = ints_of(n, net, 1), *dt = ints_of(n, net, 2);
  if (!st || !lim || !dt || st->size() != 1 || lim->size() != 1 || dt->size() != 1 || (*dt)[0] == 0) return false;
  const int64_t s = (*st)[0], l = (*lim)[0], d = (*dt)[0];
  if (std::abs(s) > ir::kMaxExtent || std::abs(l) > ir::kMaxExtent || std::abs(d) > ir::kMaxExtent) return false;
  const int64_t count = std::max<int64_t>((l - s + d + (d > 0 ? -1 : 1)) / d, 0);
  if (count > (int64_t{1} << 20)) return false;  // not a shape computation; leave it to the mapper
  for (int64_t i = 0; i < count; ++i) f.vals.push_back(s + i * d);
  f.vshape = {count};
  return true;
}

// Row-major strides of a value shape.
std::vector<int64_t> strides_of(const std::vector<int64_t>& shape) {
  std::vector<int64_t> st(shape.size(), 1);
  for (size_t d = shape.size(); d-- > 1;) st[d - 1] = st[d] * shape[d];
  return st;
}

// Slice of a known integer tensor of any rank: constant starts / ends, optional axes and steps
// (ONNX's clamping; a negative step walks backwards: torch 2.x's F.pad writes its pads reversed so).
bool fold_slice(const onnx::NodeProto& n, Net& net, Folded& f) {
  const auto *d = ints_of(n, net, 0), *st = ints_of(n, net, 1), *en = ints_of(n, net, 2);
  const auto *ax = ints_of(n, net, 3), *sp = ints_of(n, net, 4);
  if (!d || !st || !en || st->size() != en->size() || (n.input_size() > 3 && !n.input(3).empty() && !ax) ||
      (n.input_size() > 4 && !n.input(4).empty() && !sp) || (ax && ax->size() != st->size()) ||
      (sp && sp->size() != st->size()))
    return false;
  std::vector<int64_t> shape = net.t[n.input(0)].value_shape;
  if (shape.empty()) shape = {length(*d)};
  int64_t total = 1;
  for (int64_t x : shape) total *= x;
  if (total != length(*d)) return false;
  const int64_t r = length(shape);
  std::vector<int64_t> begin(shape.size(), 0), step(shape.size(), 1), count = shape;
  for (size_t k = 0; k < st->size(); ++k) {
    int64_t a = ax ? (*ax)[k] : static_cast<int64_t>(k);
    a = a < 0 ? a + r : a;
    const int64_t s_k = sp ? (*sp)[k] : 1;
    if (a < 0 || a >= r || s_k == 0) return false;
    const int64_t dim = shape[static_cast<size_t>(a)];
    int64_t s = (*st)[k], e = (*en)[k];
    s = s < 0 ? (s < -dim ? 0 : s + dim) : s;
    e = e < 0 ? (e < -dim ? -1 : e + dim) : e;
    if (s_k > 0) {
      s = std::clamp(s, int64_t{0}, dim);
      e = std::clamp(e, int64_t{0}, dim);
    } else {
      s = std::clamp(s, int64_t{0}, dim - 1);
      e = std::clamp(e, int64_t{-1}, dim - 1);
      if ((*st)[k] < -dim) s = -1;  // an empty reverse slice
    }
    const int64_t c = s_k > 0 ? (e - s + s_k - 1) / s_k : (s - e + (-s_k) - 1) / (-s_k);
    begin[static_cast<size_t>(a)] = s;
    step[static_cast<size_t>(a)] = s_k;
    count[static_cast<size_t>(a)] = std::max<int64_t>(c, 0);
  }
  const std::vector<int64_t> in_st = strides_of(shape);
  int64_t out_total = 1;
  for (int64_t c : count) out_total *= c;
  std::vector<int64_t> idx(shape.size(), 0);
  for (int64_t o = 0; o < out_total; ++o) {
    int64_t src = 0;
    for (size_t k = 0; k < shape.size(); ++k) src += (begin[k] + idx[k] * step[k]) * in_st[k];
    f.vals.push_back((*d)[static_cast<size_t>(src)]);
    for (size_t k = shape.size(); k-- > 0;)
      if (++idx[k] < count[k]) break;
      else idx[k] = 0;
  }
  f.vshape = net.t[n.input(0)].value_shape.empty() ? std::vector<int64_t>{out_total} : count;
  return true;
}

// Transpose of a known integer tensor (torch 2.x's F.pad reorders its pads so).
bool fold_transpose(const onnx::NodeProto& n, Net& net, Folded& f) {
  const auto* d = ints_of(n, net, 0);
  const std::vector<int64_t> shape = net.t[n.input(0)].value_shape;
  if (!d || shape.empty()) return false;
  int64_t total = 1;
  for (int64_t x : shape) total *= x;
  if (total != length(*d)) return false;
  std::vector<int64_t> perm = attr_ints(n, "perm");
  if (perm.empty())
    for (size_t k = shape.size(); k-- > 0;) perm.push_back(static_cast<int64_t>(k));
  if (perm.size() != shape.size()) return false;
  std::vector<int64_t> out_shape;
  for (int64_t p : perm) {
    if (p < 0 || p >= length(shape)) return false;
    out_shape.push_back(shape[static_cast<size_t>(p)]);
  }
  const std::vector<int64_t> in_st = strides_of(shape);
  std::vector<int64_t> idx(shape.size(), 0);
  for (int64_t o = 0; o < total; ++o) {
    int64_t src = 0;
    for (size_t k = 0; k < perm.size(); ++k) src += idx[k] * in_st[static_cast<size_t>(perm[k])];
    f.vals.push_back((*d)[static_cast<size_t>(src)]);
    for (size_t k = out_shape.size(); k-- > 0;)
      if (++idx[k] < out_shape[k]) break;
      else idx[k] = 0;
  }
  f.vshape = out_shape;
  return true;
}

// Values of a shape computation, when its inputs are known. Returns false when it cannot be folded.
bool fold_node(const onnx::NodeProto& n, Net& net) {
  static const std::unordered_map<std::string, FoldRule> rules = {
      {"Shape", fold_shape},         {"Gather", fold_gather},        {"Unsqueeze", fold_passthrough},
      {"Squeeze", fold_passthrough}, {"Identity", fold_passthrough}, {"Cast", fold_passthrough},
      {"Reshape", fold_passthrough}, {"Concat", fold_concat},        {"ConstantOfShape", fold_constant_of_shape},
      {"Equal", fold_equal_where},   {"Where", fold_equal_where},    {"Add", fold_arithmetic},
      {"Sub", fold_arithmetic},      {"Mul", fold_arithmetic},       {"Div", fold_arithmetic},
      {"Mod", fold_arithmetic},      {"Range", fold_range},          {"Slice", fold_slice},
      {"Transpose", fold_transpose}};
  auto rule = rules.find(n.op_type());
  Folded f;
  if (rule == rules.end() || !rule->second(n, net, f)) return false;
  TensorInfo& out = net.t[n.output(0)];
  if (!f.reals.empty()) out.reals = f.reals;
  if (f.reals.empty()) out.ints = f.vals;
  out.value_shape = f.vshape;
  out.shape = f.vshape;
  out.elem_type = f.reals.empty() ? onnx::TensorProto::INT64 : onnx::TensorProto::FLOAT;
  return true;
}

onnx::TensorProto int_initializer(const std::string& name, const TensorInfo& ti) {
  onnx::TensorProto tp;
  tp.set_name(name);
  tp.set_data_type(ti.ints ? onnx::TensorProto::INT64 : onnx::TensorProto::FLOAT);
  for (int64_t d : ti.value_shape) tp.add_dims(d);
  if (ti.ints)
    for (int64_t v : *ti.ints) tp.add_int64_data(v);
  else
    for (double v : *ti.reals) tp.add_float_data(static_cast<float>(v));
  return tp;
}

std::optional<std::vector<int64_t>> proto_shape(const onnx::TypeProto& tp) {
  if (!tp.has_tensor_type() || !tp.tensor_type().has_shape()) return std::nullopt;
  std::vector<int64_t> s;
  for (const auto& d : tp.tensor_type().shape().dim()) {
    if (!d.has_dim_value()) return std::nullopt;
    s.push_back(d.dim_value());
  }
  return s;
}

}  // namespace

namespace {

// Reads and parses the file; checks what every later step relies on (a graph, a supported opset,
// nodes with outputs). Sets net.path and net.opset.
onnx::ModelProto parse_model(const std::string& path, Net& net) {
  const std::string bytes = read_file(path);
  GP_CHECK(!bytes.empty(), "{}: the ONNX file is empty", path);
  GP_CHECK(plausible_model_header(bytes),
           "{}: not an ONNX model (first byte 0x{:02x} is not the start of an ONNX ModelProto)", path,
           static_cast<unsigned char>(bytes[0]));
  onnx::ModelProto model;
  GP_CHECK(model.ParseFromString(bytes),
           "{}: corrupt or truncated ONNX file (protobuf parsing failed after {} bytes read)", path, bytes.size());
  GP_CHECK(model.has_graph() && model.graph().node_size() > 0,
           "{}: corrupt or truncated ONNX file (no graph or an empty graph)", path);
  net.path = path;
  for (const auto& os : model.opset_import())
    if (os.domain().empty() || os.domain() == "ai.onnx") net.opset = static_cast<int>(os.version());
  GP_CHECK(net.opset > 0, "{}: corrupt or truncated ONNX file (no opset_import for the default domain)", path);
  GP_CHECK(net.opset >= 7 && net.opset <= 21, "{}: opset {} is not supported (supported: 7 to 21)", path, net.opset);
  // Every operator we read produces at least one output; a node without one (a corrupt file, found by
  // fuzz/fuzz_onnx) would otherwise be indexed at output(0) further down.
  for (const auto& n : model.graph().node())
    GP_CHECK(n.output_size() > 0, "{}: corrupt ONNX file (node {} has no outputs)", path, node_label(n));
  return model;
}

bool has_symbolic_dim(const onnx::ValueInfoProto& v) {
  for (const auto& d : v.type().tensor_type().shape().dim())
    if (!d.has_dim_value()) return true;
  return false;
}

// Data inputs vs weights given as inputs (export_params=False): with a dynamic axis anywhere, the data
// inputs are exactly those with a symbolic dim; else those not read only by weight slots.
void classify_inputs(const onnx::GraphProto& g, const std::unordered_set<std::string>& initializers, Net& net) {
  std::vector<const onnx::ValueInfoProto*> free_inputs;
  bool any_symbolic = false;
  for (const auto& in : g.input())
    if (!initializers.count(in.name())) {
      free_inputs.push_back(&in);
      any_symbolic = any_symbolic || has_symbolic_dim(in);
    }
  for (const auto* in : free_inputs) {
    bool weight;
    if (any_symbolic) {
      weight = !has_symbolic_dim(*in);
    } else {
      int uses = 0, weight_uses = 0;
      for (const auto& n : net.nodes)
        for (int k = 0; k < n.input_size(); ++k)
          if (n.input(k) == in->name()) {
            ++uses;
            weight_uses += is_weight_slot(n, k) || n.op_type() == "Transpose";
          }
      weight = uses > 0 && uses == weight_uses;
    }
    TensorInfo& ti = net.t[in->name()];
    ti.elem_type = in->type().tensor_type().elem_type();
    ti.param = weight;
    ti.activation = !weight;
    (weight ? net.weight_inputs : net.data_inputs).push_back(in->name());
  }
  GP_CHECK(!net.data_inputs.empty(), "{}: the model has no data input (every graph input is a weight)", net.path);
}

// A Constant node's value as a tensor named after its output.
onnx::TensorProto constant_value(const std::string& path, const onnx::NodeProto& n) {
  onnx::TensorProto tp;
  if (const auto* a = find_attr(n, "value")) {
    tp = a->t();
  } else if (const auto* ai = find_attr(n, "value_int")) {
    tp.set_data_type(onnx::TensorProto::INT64);
    tp.add_int64_data(ai->i());
  } else if (const auto* ais = find_attr(n, "value_ints")) {
    tp.set_data_type(onnx::TensorProto::INT64);
    tp.add_dims(ais->ints_size());
    for (int64_t v : ais->ints()) tp.add_int64_data(v);
  } else if (const auto* af = find_attr(n, "value_float")) {
    tp.set_data_type(onnx::TensorProto::FLOAT);
    tp.add_float_data(af->f());
  } else {
    throw UserError(fmt::format("{}: Constant node {} has no supported value attribute", path, node_label(n)));
  }
  tp.set_name(n.output(0));
  return tp;
}

// Constant nodes become known tensors (and initializers of g); the other nodes stay in order.
void take_constants(onnx::GraphProto& g, bool keep_values, Net& net) {
  std::vector<onnx::NodeProto> kept;
  for (auto& n : net.nodes) {
    if (n.op_type() != "Constant") {
      kept.push_back(std::move(n));
      continue;
    }
    onnx::TensorProto tp = constant_value(net.path, n);
    read_values(net.path, tp, net.t[n.output(0)]);
    if (keep_values) net.values[tp.name()] = tp;
    *g.add_initializer() = tp;
  }
  net.nodes = std::move(kept);
}

// Activation-ness flows from data inputs through values; a node with no activation input computes
// shapes or constants only (folded). Records producers and consumers.
void mark_activations(Net& net) {
  net.folded.assign(net.nodes.size(), false);
  for (size_t i = 0; i < net.nodes.size(); ++i) {
    const auto& n = net.nodes[i];
    bool act = false, par = false;
    for (int k = 0; k < n.input_size(); ++k) {
      if (n.input(k).empty()) continue;
      TensorInfo& ti = net.t[n.input(k)];
      ti.consumers.push_back(static_cast<int>(i));
      if (n.op_type() != "Shape" && n.op_type() != "Size") act = act || ti.activation;
      par = par || ti.param;
    }
    for (const auto& o : n.output()) {
      TensorInfo& ti = net.t[o];
      ti.producer = static_cast<int>(i);
      ti.activation = act;
      ti.param = !act && par;
    }
    net.folded[i] = !act;
  }
}

// ONNX's own shape inference divides by strides, dilations and group without checking them
// (a stride of 0 is a SIGFPE inside libonnx, found by fuzz_onnx): reject such nodes first.
// It also indexes past its arrays when a Conv without kernel_shape has a weight whose rank differs
// from the input's (a SEGV, found by fuzz_onnx); with kernel_shape present it checks the rank and
// fails cleanly, so a Conv gets kernel_shape = the weight's spatial dims when they are known.
void check_windowed_nodes(const onnx::GraphProto& g, Net& net) {
  const std::string& path = net.path;
  std::map<std::string, std::vector<int64_t>> static_dims;
  for (const auto& init : g.initializer()) static_dims[init.name()] = {init.dims().begin(), init.dims().end()};
  for (const auto& in : g.input()) {
    std::vector<int64_t> d;
    for (const auto& x : in.type().tensor_type().shape().dim()) d.push_back(x.has_dim_value() ? x.dim_value() : -1);
    if (!static_dims.count(in.name()) && std::find(d.begin(), d.end(), -1) == d.end()) static_dims[in.name()] = d;
  }
  static const std::unordered_set<std::string> kWindowed = {"Conv",        "ConvTranspose", "MaxPool",
                                                            "AveragePool", "LpPool",        "MaxUnpool"};
  for (auto& n : net.nodes) {
    if (!kWindowed.count(n.op_type())) continue;
    if ((n.op_type() == "Conv" || n.op_type() == "ConvTranspose") && !find_attr(n, "kernel_shape") &&
        n.input_size() > 1) {
      auto w = static_dims.find(n.input(1));
      GP_CHECK(w == static_dims.end() || w->second.size() >= 3,
               "{}: corrupt ONNX file (node {}: weight \"{}\" has rank {}, expected at least 3)", path, node_label(n),
               n.input(1), w == static_dims.end() ? 0 : w->second.size());
      if (w != static_dims.end()) {
        onnx::AttributeProto* k = n.add_attribute();
        k->set_name("kernel_shape");
        k->set_type(onnx::AttributeProto::INTS);
        for (size_t i = 2; i < w->second.size(); ++i) k->add_ints(w->second[i]);
      }
    }
    for (const char* name : {"strides", "dilations", "kernel_shape", "pads", "group"}) {
      const onnx::AttributeProto* a = find_attr(n, name);
      if (!a) continue;
      bool pads = std::string(name) == "pads";
      std::vector<int64_t> v = a->ints_size() > 0 ? attr_ints(n, name) : std::vector<int64_t>{a->i()};
      for (int64_t x : v)
        GP_CHECK(pads ? x >= 0 : x > 0, "{}: corrupt ONNX file (node {}: attribute {} must be {}, found [{}])", path,
                 node_label(n), name, pads ? "non-negative" : "positive", fmt::join(v, ", "));
    }
  }
}

// Fixes every data input's batch to kProbeBatch (only dim 0 may be symbolic) and clears the shapes
// inference will fill in.
void probe_batch(onnx::GraphProto& g, const Net& net) {
  for (auto& in : *g.mutable_input()) {
    auto it = net.t.find(in.name());
    if (it == net.t.end() || !it->second.activation) continue;
    auto* shape = in.mutable_type()->mutable_tensor_type()->mutable_shape();
    GP_CHECK(shape->dim_size() >= 1, "{}: input \"{}\" is a scalar; expected a batch dimension", net.path, in.name());
    for (int d = 1; d < shape->dim_size(); ++d)
      GP_CHECK(shape->dim(d).has_dim_value(),
               "{}: input \"{}\": dimension {} is symbolic (\"{}\"); only the batch dimension (dim 0) may be dynamic",
               net.path, in.name(), d, shape->dim(d).dim_param());
    shape->mutable_dim(0)->set_dim_value(kProbeBatch);
  }
  g.clear_value_info();
  for (auto& o : *g.mutable_output()) o.mutable_type()->mutable_tensor_type()->clear_shape();
}

// Data propagation only while every operator has a schema: libonnx 1.12 dereferences a null type
// when it propagates data (e.g. through Shape) from the output of an operator it does not know (a
// SEGV, found by fuzz_onnx: one op_type renamed to "Tranzpose"). Such a model cannot be imported
// anyway; without propagation inference still runs and the mapper lists the unknown operators.
// Returns whether every node has one.
bool find_schemas(Net& net) {
  net.has_schema.assign(net.nodes.size(), true);
  for (size_t i = 0; i < net.nodes.size(); ++i) {
    const auto& n = net.nodes[i];
    const bool onnx_domain = n.domain().empty() || n.domain() == "ai.onnx";
    net.has_schema[i] = onnx::OpSchemaRegistry::Schema(n.op_type(), onnx_domain ? net.opset : INT_MAX, n.domain()) !=
                        nullptr;
  }
  return std::find(net.has_schema.begin(), net.has_schema.end(), false) == net.has_schema.end();
}

// One round of ONNX shape inference over the nodes not yet folded; the shapes and types it finds
// go into net.t.
void infer_round(onnx::ModelProto& model, const std::vector<bool>& materialized, bool data_prop, Net& net) {
  onnx::GraphProto& g = *model.mutable_graph();
  g.clear_node();
  for (size_t i = 0; i < net.nodes.size(); ++i)
    if (!materialized[i]) *g.add_node() = net.nodes[i];
  const onnx::GraphProto before = data_prop ? g : onnx::GraphProto();
  try {
    onnx::shape_inference::InferShapes(model, onnx::OpSchemaRegistry::Instance(),
                                       onnx::ShapeInferenceOptions(false, 1, data_prop));
  } catch (const std::exception& e) {
    // libonnx's data propagation can fail where the values are fine (a Slice with a negative step
    // gives an empty shape to torch 2.x's F.pad pads computation, Swin): inference without it still
    // gives the shapes up to there, and the importer folds those values itself in the next rounds.
    bool retried = false;
    if (data_prop) {
      *model.mutable_graph() = before;
      try {
        onnx::shape_inference::InferShapes(model, onnx::OpSchemaRegistry::Instance(),
                                           onnx::ShapeInferenceOptions(false, 1, false));
        retried = true;
      } catch (const std::exception&) {
      }
    }
    if (!retried) {
      std::string msg = e.what();
      throw UserError(fmt::format("{}: ONNX shape inference failed: {}{}", net.path, msg.substr(0, msg.find('\n')),
                                  net.inference_hint));
    }
  }
  auto take = [&](const onnx::ValueInfoProto& v) {
    TensorInfo& ti = net.t[v.name()];
    if (auto s = proto_shape(v.type())) ti.shape = s;
    if (v.type().tensor_type().elem_type()) ti.elem_type = v.type().tensor_type().elem_type();
  };
  for (const auto& v : g.input()) take(v);
  for (const auto& v : g.value_info()) take(v);
  for (const auto& v : g.output()) take(v);
  g.clear_value_info();
}

// Inference with the batch fixed to kProbeBatch; fold shape computations into initializers;
// repeat until nothing more folds.
void infer_and_fold(onnx::ModelProto& model, Net& net) {
  onnx::GraphProto& g = *model.mutable_graph();
  probe_batch(g, net);
  const bool all_known = find_schemas(net);
  std::vector<bool> materialized(net.nodes.size(), false);
  for (int round = 0;; ++round) {
    infer_round(model, materialized, all_known, net);
    bool progress = false;
    for (size_t i = 0; i < net.nodes.size(); ++i) {
      if (!net.folded[i] || materialized[i] || net.nodes[i].output_size() != 1) continue;
      if (!fold_node(net.nodes[i], net)) continue;
      materialized[i] = true;
      progress = true;
      *g.add_initializer() = int_initializer(net.nodes[i].output(0), net.t[net.nodes[i].output(0)]);
    }
    if (!progress || round > 4 * static_cast<int>(net.nodes.size())) break;
  }
}

}  // namespace

namespace {

// One Transpose moving dim 0 read by several nodes becomes one Transpose per reader: torch.export's
// optimizer shares the transpose of a decoder's memory ([B, S, H] -> [S, B, H]) among every layer's
// cross-attention, which would make all of them one region (onnx_patterns.cpp) where each is a block.
void unshare_batch_transposes(onnx::GraphProto& g) {
  std::map<std::string, std::vector<std::pair<int, int>>> readers;  // tensor -> (node, input slot)
  for (int i = 0; i < g.node_size(); ++i)
    for (int k = 0; k < g.node(i).input_size(); ++k) readers[g.node(i).input(k)].push_back({i, k});
  const int n = g.node_size();
  for (int i = 0; i < n; ++i) {
    const onnx::NodeProto t = g.node(i);
    if (t.op_type() != "Transpose" || t.output_size() != 1) continue;
    const auto* perm = find_attr(t, "perm");
    if (!perm || perm->ints_size() == 0 || perm->ints(0) == 0) continue;
    auto it = readers.find(t.output(0));
    if (it == readers.end()) continue;
    // Shape readers (the sizes MultiheadAttention reads) stay with the original: only computing
    // readers get a copy each.
    std::vector<std::pair<int, int>> computing;
    for (const auto& rd : it->second)
      if (g.node(rd.first).op_type() != "Shape" && g.node(rd.first).op_type() != "Size") computing.push_back(rd);
    if (computing.size() < 2) continue;
    it->second = computing;
    for (size_t r = 1; r < it->second.size(); ++r) {
      onnx::NodeProto copy = t;
      const std::string out = fmt::format("{}/unshared_{}", t.output(0), r);
      copy.set_output(0, out);
      copy.set_name(fmt::format("{}/unshared_{}", t.name(), r));
      g.mutable_node(it->second[r].first)->set_input(it->second[r].second, out);
      *g.add_node() = std::move(copy);
    }
  }
}

}  // namespace

Net load_net(const std::string& path, bool keep_values) {
  Net net;
  onnx::ModelProto model = parse_model(path, net);
  net.bag_indices = rewrite_bag_loops(*model.mutable_graph(), net.opset);
  refuse_loops(path, model.graph());
  inline_external_data(path, model);
  recover_dynamo_export(model, net);
  normalize_opset(model, net);
  onnx::GraphProto& g = *model.mutable_graph();
  std::unordered_set<std::string> sources, initializers;
  for (const auto& init : g.initializer()) {
    sources.insert(init.name());
    initializers.insert(init.name());
    TensorInfo& ti = net.t[init.name()];
    read_values(path, init, ti);
    ti.param = true;
  }
  for (const auto& in : g.input()) sources.insert(in.name());
  read_provenance(model, net);
  unshare_batch_transposes(g);
  net.nodes = sort_nodes(path, g, sources);
  for (const auto& o : g.output()) net.outputs.push_back(o.name());
  classify_inputs(g, initializers, net);
  take_constants(g, keep_values, net);
  mark_activations(net);
  check_windowed_nodes(g, net);
  infer_and_fold(model, net);
  for (const auto& idx : net.bag_indices) {  // nn.EmbeddingBag read back from its Loop: [B, bag] indices only
    const auto& ti = net.at(idx);
    GP_CHECK(ti.shape && ti.shape->size() == 2 && (*ti.shape)[0] == kProbeBatch,
             "{}: nn.EmbeddingBag (a Loop over bags) with indices \"{}\" of shape [{}]: only 2-d indices [B, bag] "
             "(one bag of equal size per sample, no offsets) are supported; pass the bags as a [B, bag] tensor",
             path, idx, ti.shape ? fmt::format("{}", fmt::join(*ti.shape, ", ")) : "unknown");
  }
  merge_reshaped_transposes(net);
  if (keep_values)  // the file's initializers (the folded ones added above are integer shape values)
    for (auto& init : *g.mutable_initializer())
      if (initializers.count(init.name())) net.values[init.name()].Swap(&init);
  return net;
}

}  // namespace gp::importers::onnx_detail
