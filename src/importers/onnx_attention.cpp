// The score path of an exported attention block: its scale and masks (see onnx_attention.h).
// Constant masks are evaluated densely from the folded graph (SDPA's is_causal writes
// Expand -> Trilu -> Equal -> Where; a registered tril buffer is an initializer); a padding mask's
// operand is evaluated as a function of one mask value m (0 or 1) through elementwise ops.
#include "importers/onnx_attention.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>

namespace gp::importers::onnx_detail {
namespace {

constexpr int64_t kMaxDense = int64_t{1} << 22;  // elements of an evaluated constant
constexpr double kMaskedAtMost = -1e4;           // a finite fill this negative hides a key in f32

struct Dense {
  std::vector<int64_t> shape;
  std::vector<double> v;
};

int64_t numel(const std::vector<int64_t>& s) {
  int64_t n = 1;
  for (int64_t d : s) n = d < 0 || (d > 0 && n > kMaxDense / d) ? kMaxDense + 1 : n * d;
  return n;
}

bool is_act(const Net& net, const std::string& t) {
  auto it = net.t.find(t);
  return !t.empty() && it != net.t.end() && it->second.activation;
}

// NumPy broadcasting of several shapes, or nothing.
std::optional<std::vector<int64_t>> broadcast_shapes(const std::vector<const std::vector<int64_t>*>& in) {
  size_t r = 0;
  for (const auto* s : in) r = std::max(r, s->size());
  std::vector<int64_t> out(r, 1);
  for (const auto* s : in)
    for (size_t k = 0; k < s->size(); ++k) {
      int64_t d = (*s)[s->size() - 1 - k];
      int64_t& o = out[r - 1 - k];
      if (d == o || d == 1) continue;
      if (o != 1) return std::nullopt;
      o = d;
    }
  return out;
}

// The flat index into `s` (right-aligned, broadcast) of output position `idx` of shape `out`.
int64_t source_index(const std::vector<int64_t>& s, const std::vector<int64_t>& out, int64_t idx) {
  int64_t src = 0, stride = 1;
  for (size_t k = 0; k < out.size(); ++k) {
    const size_t od = out.size() - 1 - k;
    const int64_t pos = idx % out[od];
    idx /= out[od];
    if (k < s.size()) {
      const int64_t d = s[s.size() - 1 - k];
      src += (d == 1 ? 0 : pos) * stride;
      stride *= d;
    }
  }
  return src;
}

std::optional<Dense> broadcast_op(const std::vector<const Dense*>& in, const std::function<double(const double*)>& f) {
  std::vector<const std::vector<int64_t>*> shapes;
  for (const auto* d : in) shapes.push_back(&d->shape);
  auto out = broadcast_shapes(shapes);
  if (!out || numel(*out) > kMaxDense) return std::nullopt;
  Dense r{*out, std::vector<double>(static_cast<size_t>(numel(*out)))};
  double args[3];
  for (int64_t i = 0; i < numel(*out); ++i) {
    for (size_t k = 0; k < in.size(); ++k) args[k] = in[k]->v[static_cast<size_t>(source_index(in[k]->shape, *out, i))];
    r.v[static_cast<size_t>(i)] = f(args);
  }
  return r;
}

std::optional<double> binary(const std::string& op, double a, double b) {
  if (op == "Add") return a + b;
  if (op == "Sub") return a - b;
  if (op == "Mul") return a * b;
  if (op == "Div") return a / b;
  if (op == "Pow") return std::pow(a, b);  // Swin's (C // heads) ** -0.5
  if (op == "Equal") return a == b ? 1.0 : 0.0;
  if (op == "Less") return a < b ? 1.0 : 0.0;
  if (op == "Greater") return a > b ? 1.0 : 0.0;
  if (op == "LessOrEqual") return a <= b ? 1.0 : 0.0;
  if (op == "GreaterOrEqual") return a >= b ? 1.0 : 0.0;
  if (op == "And") return a != 0 && b != 0 ? 1.0 : 0.0;
  if (op == "Or") return a != 0 || b != 0 ? 1.0 : 0.0;
  return std::nullopt;
}

std::optional<double> unary(const onnx::NodeProto& n, double x) {
  const std::string& op = n.op_type();
  if (op == "Identity" || op == "Unsqueeze" || op == "Squeeze" || op == "Reshape" || op == "Expand" || op == "Dropout")
    return x;
  if (op == "Cast") {
    const int64_t to = attr_i(n, "to", 0);
    if (to == onnx::TensorProto::BOOL) return x != 0 ? 1.0 : 0.0;
    if (to == onnx::TensorProto::FLOAT || to == onnx::TensorProto::DOUBLE || to == onnx::TensorProto::FLOAT16) return x;
    return std::trunc(x);  // integer types
  }
  if (op == "Not") return x == 0 ? 1.0 : 0.0;
  if (op == "Neg") return -x;
  if (op == "Sqrt") return std::sqrt(x);
  if (op == "Reciprocal") return 1.0 / x;
  return std::nullopt;
}

/// Dense values of a constant (non-activation) tensor, evaluated through the folded nodes.
class ConstEval {
 public:
  explicit ConstEval(const Net& net) : net_(net) {}

  std::optional<Dense> eval(const std::string& t, std::string& why, int depth = 0) {
    auto it = net_.t.find(t);
    if (t.empty() || it == net_.t.end() || it->second.activation || depth > 64) {
      why = fmt::format("\"{}\" is not a constant", t);
      return std::nullopt;
    }
    const TensorInfo& ti = it->second;
    if (ti.ints || ti.reals) {
      Dense d{ti.value_shape, {}};
      if (ti.ints) d.v.assign(ti.ints->begin(), ti.ints->end());
      if (ti.reals) d.v = *ti.reals;
      if (numel(d.shape) != static_cast<int64_t>(d.v.size())) d.shape = {static_cast<int64_t>(d.v.size())};
      return d;
    }
    if (ti.producer < 0) {
      why = fmt::format("the values of \"{}\" are not kept (more than 4096 elements)", t);
      return std::nullopt;
    }
    const onnx::NodeProto& n = net_.nodes[static_cast<size_t>(ti.producer)];
    std::optional<Dense> r = node(n, why, depth);
    if (!r && why.empty()) why = fmt::format("cannot evaluate node {}", node_label(n));
    return r;
  }

 private:
  const Net& net_;

  std::optional<std::vector<int64_t>> ints(const onnx::NodeProto& n, int k, std::string& why, int depth) {
    if (k >= n.input_size() || n.input(k).empty()) return std::nullopt;
    auto d = eval(n.input(k), why, depth + 1);
    if (!d) return std::nullopt;
    std::vector<int64_t> out;
    for (double x : d->v) out.push_back(static_cast<int64_t>(x));
    return out;
  }

  std::optional<Dense> node(const onnx::NodeProto& n, std::string& why, int depth) {
    const std::string& op = n.op_type();
    std::vector<Dense> in;
    auto operand = [&](int k) -> bool {
      auto d = eval(n.input(k), why, depth + 1);
      if (d) in.push_back(std::move(*d));
      return d.has_value();
    };
    if (op == "ConstantOfShape") {
      auto shape = ints(n, 0, why, depth);
      const auto* a = find_attr(n, "value");
      if (!shape || numel(*shape) > kMaxDense) return std::nullopt;
      double value = 0;
      if (a) {
        const auto& tp = a->t();
        if (tp.float_data_size()) value = tp.float_data(0);
        else if (tp.int64_data_size()) value = static_cast<double>(tp.int64_data(0));
        else if (tp.raw_data().size() == 4 && tp.data_type() == onnx::TensorProto::FLOAT) {
          float f;
          std::memcpy(&f, tp.raw_data().data(), 4);
          value = f;
        } else if (tp.raw_data().size() == 8 && tp.data_type() == onnx::TensorProto::INT64) {
          int64_t i;
          std::memcpy(&i, tp.raw_data().data(), 8);
          value = static_cast<double>(i);
        } else if (tp.raw_data().size() == 1) {
          value = static_cast<unsigned char>(tp.raw_data()[0]);
        }
      }
      return Dense{*shape, std::vector<double>(static_cast<size_t>(numel(*shape)), value)};
    }
    if (!operand(0)) return std::nullopt;
    if (auto f = unary(n, 0.0); f && op != "Unsqueeze" && op != "Squeeze" && op != "Reshape" && op != "Expand") {
      for (double& x : in[0].v) x = *unary(n, x);
      return in[0];
    }
    if (op == "Unsqueeze" || op == "Squeeze") {
      std::vector<int64_t> axes = attr_ints(n, "axes");
      if (n.input_size() > 1)
        if (auto a = ints(n, 1, why, depth)) axes = *a;
      std::vector<int64_t> s = in[0].shape;
      if (op == "Unsqueeze") {
        const int64_t r = static_cast<int64_t>(s.size() + axes.size());
        std::vector<int64_t> norm;
        for (int64_t a : axes) norm.push_back(a < 0 ? a + r : a);
        std::sort(norm.begin(), norm.end());
        for (int64_t a : norm) s.insert(s.begin() + std::clamp<int64_t>(a, 0, static_cast<int64_t>(s.size())), 1);
      } else {
        std::vector<int64_t> keep;
        for (size_t k = 0; k < s.size(); ++k) {
          bool drop = axes.empty() ? s[k] == 1 : false;
          for (int64_t a : axes)
            drop = drop || (a < 0 ? a + static_cast<int64_t>(s.size()) : a) == static_cast<int64_t>(k);
          if (!drop) keep.push_back(s[k]);
        }
        s = keep;
      }
      in[0].shape = s;
      return in[0];
    }
    if (op == "Reshape") {
      auto shape = ints(n, 1, why, depth);
      if (!shape) return std::nullopt;
      std::vector<int64_t> s = *shape;
      int64_t known = 1, infer = -1;
      for (size_t k = 0; k < s.size(); ++k) {
        if (s[k] == 0 && k < in[0].shape.size()) s[k] = in[0].shape[k];
        if (s[k] == -1) infer = static_cast<int64_t>(k);
        else known *= s[k];
      }
      if (infer >= 0 && known > 0) s[static_cast<size_t>(infer)] = static_cast<int64_t>(in[0].v.size()) / known;
      if (numel(s) != static_cast<int64_t>(in[0].v.size())) return std::nullopt;
      in[0].shape = s;
      return in[0];
    }
    if (op == "Expand") {
      auto shape = ints(n, 1, why, depth);
      if (!shape) return std::nullopt;
      Dense target{*shape, {0.0}};
      target.shape = *shape;
      std::vector<const std::vector<int64_t>*> shapes{&in[0].shape, &target.shape};
      auto out = broadcast_shapes(shapes);
      if (!out || numel(*out) > kMaxDense) return std::nullopt;
      Dense r{*out, std::vector<double>(static_cast<size_t>(numel(*out)))};
      for (int64_t i = 0; i < numel(*out); ++i)
        r.v[static_cast<size_t>(i)] = in[0].v[static_cast<size_t>(source_index(in[0].shape, *out, i))];
      return r;
    }
    if (op == "Trilu") {
      int64_t k = 0;
      if (n.input_size() > 1 && !n.input(1).empty()) {
        auto kk = ints(n, 1, why, depth);
        if (!kk || kk->size() != 1) return std::nullopt;
        k = (*kk)[0];
      }
      const bool upper = attr_i(n, "upper", 1) != 0;
      Dense& d = in[0];
      if (d.shape.size() < 2) return std::nullopt;
      const int64_t rows = d.shape[d.shape.size() - 2], cols = d.shape.back();
      for (size_t i = 0; i < d.v.size(); ++i) {
        const int64_t c = static_cast<int64_t>(i) % cols, r = static_cast<int64_t>(i) / cols % rows;
        if (upper ? c - r < k : c - r > k) d.v[i] = 0;
      }
      return d;
    }
    if (op == "Slice") {
      auto starts = ints(n, 1, why, depth), ends = ints(n, 2, why, depth);
      if (!starts || !ends) return std::nullopt;
      std::vector<int64_t> axes, steps;
      if (n.input_size() > 3 && !n.input(3).empty()) axes = ints(n, 3, why, depth).value_or(std::vector<int64_t>{});
      if (n.input_size() > 4 && !n.input(4).empty()) steps = ints(n, 4, why, depth).value_or(std::vector<int64_t>{});
      const Dense& d = in[0];
      const int64_t r = static_cast<int64_t>(d.shape.size());
      std::vector<int64_t> lo(d.shape.size(), 0), hi = d.shape;
      for (size_t k = 0; k < starts->size(); ++k) {
        int64_t a = axes.empty() ? static_cast<int64_t>(k) : axes[k];
        a = a < 0 ? a + r : a;
        if (a < 0 || a >= r || (!steps.empty() && steps[k] != 1)) return std::nullopt;
        const int64_t dim = d.shape[static_cast<size_t>(a)];
        auto clampi = [&](int64_t x) { return std::clamp(x < 0 ? x + dim : x, int64_t{0}, dim); };
        lo[static_cast<size_t>(a)] = clampi((*starts)[k]);
        hi[static_cast<size_t>(a)] = std::max(lo[static_cast<size_t>(a)], clampi((*ends)[k]));
      }
      Dense out;
      for (size_t k = 0; k < d.shape.size(); ++k) out.shape.push_back(hi[k] - lo[k]);
      for (int64_t i = 0; i < numel(out.shape); ++i) {
        int64_t idx = i, src = 0, stride = 1;
        for (size_t k = d.shape.size(); k-- > 0;) {
          const int64_t pos = idx % out.shape[k] + lo[k];
          idx /= out.shape[k];
          src += pos * stride;
          stride *= d.shape[k];
        }
        out.v.push_back(d.v[static_cast<size_t>(src)]);
      }
      return out;
    }
    if (binary(op, 0, 1)) {
      if (!operand(1)) return std::nullopt;
      return broadcast_op({&in[0], &in[1]}, [&](const double* a) { return *binary(op, a[0], a[1]); });
    }
    if (op == "Where") {
      if (!operand(1) || !operand(2)) return std::nullopt;
      return broadcast_op({&in[0], &in[1], &in[2]}, [](const double* a) { return a[0] != 0 ? a[1] : a[2]; });
    }
    why = fmt::format("cannot evaluate node {}", node_label(n));
    return std::nullopt;
  }
};

// A constant's single value (all elements equal), or nothing.
std::optional<double> constant_scalar(const Net& net, const std::string& t, std::string& why) {
  ConstEval ce(net);
  auto d = ce.eval(t, why);
  if (!d || d->v.empty()) return std::nullopt;
  for (double x : d->v)
    if (!(x == d->v[0] || (std::isnan(x) && std::isnan(d->v[0])))) {
      why = fmt::format("\"{}\" is not a single value", t);
      return std::nullopt;
    }
  return d->v[0];
}

/// A padding-mask operand as a function of the one data input it reads: f(m) for m = 0 and 1.
struct MaskFunction {
  const Net& net;
  std::string input;       // the data input found
  std::vector<int> nodes;  // the activation nodes on the way
  std::string why;

  std::optional<double> at(const std::string& t, double m, int depth = 0) {
    if (depth > 64) return std::nullopt;
    if (!is_act(net, t)) {
      std::string w;
      auto v = constant_scalar(net, t, w);
      if (!v) why = w;
      return v;
    }
    const TensorInfo& ti = net.at(t);
    if (ti.producer < 0) {  // a data input
      if (!input.empty() && input != t) {
        why = fmt::format("it reads two data inputs (\"{}\", \"{}\")", input, t);
        return std::nullopt;
      }
      input = t;
      return m;
    }
    const int p = ti.producer;
    const onnx::NodeProto& n = net.nodes[static_cast<size_t>(p)];
    if (std::find(nodes.begin(), nodes.end(), p) == nodes.end()) nodes.push_back(p);
    const std::string& op = n.op_type();
    if (op == "Transpose" || op == "MatMul" || op == "Gather" || op == "Slice" || op == "Concat") {
      why = fmt::format("node {} moves or mixes mask values", node_label(n));
      return std::nullopt;
    }
    if (auto u = unary(n, 0.0)) {
      auto x = at(n.input(0), m, depth + 1);
      return x ? unary(n, *x) : std::nullopt;
    }
    if (binary(op, 0, 1)) {
      auto a = at(n.input(0), m, depth + 1), b = a ? at(n.input(1), m, depth + 1) : std::nullopt;
      return a && b ? binary(op, *a, *b) : std::nullopt;
    }
    if (op == "Where") {
      auto c = at(n.input(0), m, depth + 1), a = c ? at(n.input(1), m, depth + 1) : std::nullopt;
      auto b = a ? at(n.input(2), m, depth + 1) : std::nullopt;
      return b ? std::optional<double>(*c != 0 ? *a : *b) : std::nullopt;
    }
    why = fmt::format("node {} is not an elementwise op", node_label(n));
    return std::nullopt;
  }
};

// One mask on the score path: Add(scores, operand) or Where(cond, fill, scores) / Where(cond, scores, fill).
struct Term {
  int node = -1;
  bool where = false;
  std::string operand;           // Add: the added tensor; Where: the condition
  bool masked_when_true = true;  // Where: the condition hides a key where it is true
  std::string fill;              // Where: the value written
};

struct Walk {
  int mm = -1;
  std::vector<int> path;
  std::vector<Term> terms;
  std::vector<std::pair<std::string, bool>> factors;  // constant operand, divides
  std::string why;
};

// Backward from tensor t to the score MatMul; false (with why) when the path has another node.
bool walk_scores(const Net& net, std::string t, Walk& w) {
  for (int steps = 0; steps < 64; ++steps) {
    if (!is_act(net, t) || net.at(t).producer < 0) {
      w.why = fmt::format("no MatMul of two activations before the Softmax (reached \"{}\")", t);
      return false;
    }
    const int i = net.at(t).producer;
    const onnx::NodeProto& n = net.nodes[static_cast<size_t>(i)];
    const std::string& op = n.op_type();
    auto act = [&](int k) { return k < n.input_size() && is_act(net, n.input(k)); };
    if (op == "MatMul" && act(0) && act(1)) {
      w.mm = i;
      return true;
    }
    w.path.push_back(i);
    if (op == "Reshape" || op == "Cast" || op == "Identity") {
      t = n.input(0);
    } else if ((op == "Mul" || op == "Div") && act(0) != act(1)) {
      const int k = act(0) ? 0 : 1;
      if (op == "Div" && k == 1) {
        w.why = fmt::format("node {} divides a constant by the scores", node_label(n));
        return false;
      }
      w.factors.push_back({n.input(1 - k), op == "Div"});
      t = n.input(k);
    } else if (op == "Add" && act(0) != act(1)) {
      const int k = act(0) ? 0 : 1;
      w.terms.push_back({i, false, n.input(1 - k)});
      t = n.input(k);
    } else if (op == "Add" && act(0) && act(1)) {
      // The scores come from a MatMul; the mask from a data input through elementwise ops.
      for (int k = 0; k < 2; ++k) {
        Walk sub;
        if (!walk_scores(net, n.input(k), sub)) continue;
        w.terms.push_back({i, false, n.input(1 - k)});
        w.mm = sub.mm;
        w.path.insert(w.path.end(), sub.path.begin(), sub.path.end());
        w.terms.insert(w.terms.end(), sub.terms.begin(), sub.terms.end());
        w.factors.insert(w.factors.end(), sub.factors.begin(), sub.factors.end());
        return true;
      }
      w.why = fmt::format("neither operand of node {} comes from the score MatMul", node_label(n));
      return false;
    } else if (op == "Where" && n.input_size() == 3 && act(1) != act(2)) {
      const int k = act(1) ? 1 : 2;
      w.terms.push_back({i, true, n.input(0), /*masked_when_true=*/k == 2, n.input(3 - k)});
      t = n.input(k);
    } else {
      w.why = fmt::format("node {} between the score MatMul and the Softmax", node_label(n));
      return false;
    }
  }
  w.why = "the score path is longer than 64 nodes";
  return false;
}

// Q or K's constant factors: backward from a score-MatMul operand through Mul / Div by a
// constant, Transpose, Reshape, Cast, up to the first other node.
void qk_factors(const Net& net, std::string t, std::vector<std::pair<std::string, bool>>& out) {
  for (int steps = 0; steps < 16 && is_act(net, t) && net.at(t).producer >= 0; ++steps) {
    const onnx::NodeProto& n = net.nodes[static_cast<size_t>(net.at(t).producer)];
    const std::string& op = n.op_type();
    if (op == "Transpose" || op == "Reshape" || op == "Cast" || op == "Identity") {
      t = n.input(0);
    } else if ((op == "Mul" || op == "Div") && is_act(net, n.input(0)) != is_act(net, n.input(1))) {
      const int k = is_act(net, n.input(0)) ? 0 : 1;
      if (op == "Div" && k == 1) return;
      out.push_back({n.input(1 - k), op == "Div"});
      t = n.input(k);
    } else {
      return;
    }
  }
}

// A constant mask [.., S, S] (leading dims 1): which keys it hides; `hidden(value)` says whether a
// value hides a key. Causal when exactly the keys j > i are hidden.
bool causal_pattern(const Dense& d, int64_t seq, const std::function<std::optional<bool>(double)>& hidden) {
  if (d.shape.size() < 2 || d.shape.back() != seq || d.shape[d.shape.size() - 2] != seq ||
      static_cast<int64_t>(d.v.size()) != seq * seq)
    return false;
  for (int64_t i = 0; i < seq; ++i)
    for (int64_t j = 0; j < seq; ++j) {
      std::optional<bool> h = hidden(d.v[static_cast<size_t>(i * seq + j)]);
      if (!h || *h != (j > i)) return false;
    }
  return true;
}

}  // namespace

AttentionMasks scan_attention_masks(const Net& net, int softmax, int64_t seq) {
  AttentionMasks r;
  const onnx::NodeProto& sm = net.nodes[static_cast<size_t>(softmax)];
  Walk w;
  if (!walk_scores(net, sm.input(0), w)) {
    r.error = w.why;
    return r;
  }
  r.score_mm = w.mm;
  r.path = w.path;
  const onnx::NodeProto& mm = net.nodes[static_cast<size_t>(w.mm)];
  qk_factors(net, mm.input(0), w.factors);
  qk_factors(net, mm.input(1), w.factors);
  double scale = 1;
  bool known = true;
  r.factors = static_cast<int>(w.factors.size());
  for (const auto& [t, divides] : w.factors) {
    std::string why;
    auto v = constant_scalar(net, t, why);
    if (!v) known = false;
    else scale = divides ? scale / *v : scale * *v;
  }
  if (known) r.scale = scale;
  auto fail = [&](const Term& term, const std::string& why) {
    r.error = fmt::format("mask at node {}: {}", node_label(net.nodes[static_cast<size_t>(term.node)]), why);
    return r;
  };
  for (const Term& term : w.terms) {
    r.operands.insert(term.operand);
    std::optional<double> fill;
    if (term.where) {
      std::string why;
      fill = constant_scalar(net, term.fill, why);
      if (!fill) return fail(term, "the filled value is not a constant (" + why + ")");
      if (!(*fill <= kMaskedAtMost))
        return fail(term, fmt::format("the filled value {} does not hide a key (expected -inf)", *fill));
    }
    if (!is_act(net, term.operand)) {  // a constant: causal, or refused
      std::string why;
      ConstEval ce(net);
      auto d = ce.eval(term.operand, why);
      if (!d) return fail(term, "cannot read the constant mask: " + why);
      auto hidden = [&](double v) -> std::optional<bool> {
        if (term.where) return (v != 0) == term.masked_when_true;
        if (v == 0) return false;
        if (v <= kMaskedAtMost) return true;
        return std::nullopt;  // a bias that neither keeps nor hides
      };
      if (!causal_pattern(*d, seq, hidden))
        return fail(term, fmt::format("the constant mask [{}] is not causal (only keys after the query hidden)",
                                      fmt::join(d->shape, ", ")));
      if (r.causal) return fail(term, "a second causal mask");
      r.causal = true;
      continue;
    }
    // A padding mask: f(m) of one data input [B, S], one value per key, broadcast over heads and queries.
    const auto& os = net.at(term.operand).shape;
    if (!os || os->size() < 3 || (*os)[0] != kProbeBatch || os->back() != seq)
      return fail(term,
                  fmt::format("the mask operand \"{}\" is not [B, .., {}] (one value per key)", term.operand, seq));
    for (size_t k = 1; k + 1 < os->size(); ++k)
      if ((*os)[k] != 1 && !(k + 2 == os->size() && (*os)[k] == seq))
        return fail(term, fmt::format("the mask operand \"{}\" has shape [{}]: it differs between heads", term.operand,
                                      fmt::join(*os, ", ")));
    MaskFunction f{net, "", {}, ""};
    auto f0 = f.at(term.operand, 0.0), f1 = f0 ? f.at(term.operand, 1.0) : std::nullopt;
    if (!f0 || !f1) return fail(term, "cannot read it as a function of one data input: " + f.why);
    const auto& is = net.at(f.input).shape;
    if (!is || is->size() != 2 || (*is)[0] != kProbeBatch || (*is)[1] != seq)
      return fail(term, fmt::format("its data input \"{}\" is not [B, {}]", f.input, seq));
    bool h0, h1;
    if (term.where) {
      h0 = (*f0 != 0) == term.masked_when_true;
      h1 = (*f1 != 0) == term.masked_when_true;
      if (h0 == h1) return fail(term, "mask values 0 and 1 hide the same keys");
    } else {
      const double added = *f0 == 0 ? *f1 : *f0, zero = *f0 == 0 ? *f0 : *f1;
      if (zero != 0 || !(added < 0))
        return fail(term, fmt::format("it adds {} for m = 0 and {} for m = 1, expected 0 for one and a negative fill "
                                      "for the other",
                                      *f0, *f1));
      h0 = *f0 != 0;
      h1 = *f1 != 0;
      fill = std::isinf(added) ? std::nullopt : std::optional<double>(added);
    }
    if (!r.mask_input.empty()) return fail(term, "a second padding mask");
    r.mask_input = f.input;
    r.mask_mode = h0 && !h1 ? "keep" : "ignore";
    r.mask_fill = term.where ? std::nullopt : fill;
    if (term.where && std::isfinite(*fill))  // masked_fill writes the value: equal to -inf only while some key is kept
      return fail(term, fmt::format("masked_fill with the finite value {} on a padding mask (use -inf)", *fill));
    r.prep = f.nodes;
  }
  return r;
}

std::optional<double> constant_value(const Net& net, const std::string& t) {
  std::string why;
  return constant_scalar(net, t, why);
}

}  // namespace gp::importers::onnx_detail
