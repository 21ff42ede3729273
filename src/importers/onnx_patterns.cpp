// Multi-node ONNX patterns that become one IR op: multi-head self-attention blocks (regions where the
// batch leaves dim 0), decomposed LayerNorm, the erf form of GELU, MatMul + bias, GlobalAveragePool +
// Flatten (Swin's window attention: onnx_window_attention.cpp). Each match claims its nodes; whatever
// is left is mapped node by node.
#include <algorithm>
#include <array>
#include <cmath>
#include <functional>
#include <map>
#include <numeric>
#include <optional>
#include <set>
#include <variant>

#include "importers/onnx_attention.h"
#include "importers/onnx_mapper.h"
#include "importers/onnx_patterns.h"
#include "support/error.h"

namespace gp::importers::onnx_detail {

// Longest common "/"-separated prefix of the node names plus "/suffix" (torch names nodes by module).
std::string fused_name(const Net& net, const std::vector<int>& nodes, const char* suffix) {
  std::string p = net.nodes[nodes[0]].name();
  for (int i : nodes) {
    const std::string& s = net.nodes[i].name();
    size_t k = 0;
    while (k < p.size() && k < s.size() && p[k] == s[k]) ++k;
    p.resize(k);
  }
  p.resize(p.find_last_of('/') == std::string::npos ? 0 : p.find_last_of('/'));
  return p.empty() ? std::string(suffix) : p + "/" + suffix;
}

// Parameter tensors behind `t`, walking back through static (shape/weight preprocessing) nodes.
void param_roots(const Net& net, const std::string& t, std::set<std::string>& out) {
  const auto& ti = net.at(t);
  if (ti.activation || !ti.param) return;
  if (ti.producer < 0) {
    out.insert(t);
    return;
  }
  for (const auto& in : net.nodes[ti.producer].input())
    if (!in.empty()) param_roots(net, in, out);
}

void claim(std::vector<bool>& claimed, const std::vector<int>& nodes) {
  for (int i : nodes) claimed[i] = true;
}

namespace {

/// What scan_attention finds in an attention region.
struct AttentionScan {
  std::vector<Proj> projs;
  std::set<std::string> after;  // tensors computed from the Softmax's result
  int score_mm = -1, ctx_mm = -1;
  std::string any_param;
};

}  // namespace

// MatMul(x, W) [+ Add b] or Gemm(x, W, b) with a parameter W at node `i`, or nothing.
std::optional<Proj> projection_at(const Net& net, int i, const std::set<int>& inside) {
  const auto& nd = net.nodes[i];
  auto act = [&](const std::string& t) { return !t.empty() && net.at(t).activation; };
  auto is_param = [&](const std::string& t) { return !t.empty() && !net.at(t).activation && net.at(t).param; };
  Proj p;
  if (nd.op_type() == "MatMul" && act(nd.input(0)) && is_param(nd.input(1)) && net.shape(nd.input(1)).size() == 2) {
    p.w = nd.input(1);
    p.transpose = true;
    p.rows = net.shape(p.w)[1];
    p.out = nd.output(0);
    for (int c : net.at(p.out).consumers) {
      const auto& cn = net.nodes[c];
      if (!inside.count(c) || cn.op_type() != "Add" || cn.input_size() != 2) continue;
      const std::string& o = cn.input(0) == p.out ? cn.input(1) : cn.input(0);
      if (is_param(o)) p.b = o;
    }
    return p;
  }
  if (nd.op_type() == "Gemm" && act(nd.input(0)) && is_param(nd.input(1))) {
    p.w = nd.input(1);
    p.transpose = attr_i(nd, "transB", 0) == 0;
    p.rows = net.shape(p.w)[p.transpose ? 1 : 0];
    if (nd.input_size() > 2 && is_param(nd.input(2))) p.b = nd.input(2);
    p.out = nd.output(0);
    return p;
  }
  return std::nullopt;
}

namespace {

// The region's projections, which tensors follow the Softmax, and its two activation MatMuls.
AttentionScan scan_attention(const Net& net, const std::vector<int>& nodes) {
  std::set<int> inside(nodes.begin(), nodes.end());
  auto act = [&](const std::string& t) { return !t.empty() && net.at(t).activation; };
  AttentionScan a;
  for (int i : nodes) {
    const auto& nd = net.nodes[i];
    bool downstream = nd.op_type() == "Softmax";
    for (const auto& in : nd.input()) downstream = downstream || a.after.count(in);
    if (downstream)
      for (const auto& o : nd.output()) a.after.insert(o);
    if (nd.op_type() == "MatMul" && act(nd.input(0)) && act(nd.input(1)))
      (a.after.count(nd.input(0)) || a.after.count(nd.input(1)) ? a.ctx_mm : a.score_mm) = i;
    std::optional<Proj> p = projection_at(net, i, inside);
    if (!p) continue;
    p->after_softmax = a.after.count(nd.input(0)) > 0;
    a.any_param = p->w;
    a.projs.push_back(*p);
  }
  return a;
}

// Whether tensor `to` is computed from `from` inside the region (forward through its nodes).
bool reaches(const Net& net, const std::vector<int>& nodes, const std::string& from, const std::string& to) {
  std::set<std::string> r{from};
  for (int i : nodes) {
    const auto& nd = net.nodes[i];
    bool hit = false;
    for (const auto& in : nd.input()) hit = hit || r.count(in);
    if (hit)
      for (const auto& o : nd.output()) r.insert(o);
  }
  return r.count(to) > 0;
}

// Q, K and V's projections among the input projections (one packed [3h, h] serves all three), or
// the reason they cannot be told apart.
std::variant<std::array<const Proj*, 3>, std::string> assign_qkv(const Net& net, const std::vector<int>& nodes,
                                                                 const AttentionScan& a,
                                                                 const std::vector<const Proj*>& in_projs, int64_t h) {
  std::array<const Proj*, 3> qkv{nullptr, nullptr, nullptr};
  if (in_projs.size() == 1 && in_projs[0]->rows == 3 * h) {
    qkv.fill(in_projs[0]);
    return qkv;
  }
  if ((in_projs.size() != 3 && in_projs.size() != 2) || a.score_mm < 0 || a.ctx_mm < 0)
    return fmt::format(
        "{} input projection(s), expected one packed [{}, {}], three [{}, {}] or (cross-attention) "
        "[{}, {}] for Q and a packed [{}, {}] for K and V",
        in_projs.size(), 3 * h, h, h, h, h, h, 2 * h, h);
  const auto &sn = net.nodes[a.score_mm], &cn = net.nodes[a.ctx_mm];
  const std::string& v_in = a.after.count(cn.input(0)) ? cn.input(1) : cn.input(0);
  if (in_projs.size() == 2) {  // nn.MultiheadAttention with key is value but not query: Q, then K and V packed
    for (const auto* p : in_projs) {
      if (p->rows == h && reaches(net, nodes, p->out, sn.input(0)) && !qkv[0]) qkv[0] = p;
      else if (p->rows == 2 * h && reaches(net, nodes, p->out, sn.input(1)) && reaches(net, nodes, p->out, v_in) &&
               !qkv[1])
        qkv[1] = qkv[2] = p;
      else return std::string("the input projections are not Q [h, h] and a packed K, V [2h, h]");
    }
    return qkv;
  }
  for (const auto* p : in_projs) {
    int k = reaches(net, nodes, p->out, sn.input(0))   ? 0
            : reaches(net, nodes, p->out, sn.input(1)) ? 1
            : reaches(net, nodes, p->out, v_in)        ? 2
                                                       : -1;
    if (k < 0 || qkv[k] || p->rows != h) return std::string("an input projection feeds none or several of Q, K, V");
    qkv[k] = p;
  }
  return qkv;
}

}  // namespace

namespace {

// Rows [offset, offset + rows) of a parameter initializer `root` with `total` rows, reached from `t`
// through Transpose / Identity and one Split (or Slice) along dim 0 of the root.
struct SplitRows {
  std::string root;
  int64_t offset = 0, total = 0;
  bool transposed = false;  // an odd number of Transposes between the Split and t
};
std::optional<SplitRows> split_rows(const Net& net, std::string t) {
  SplitRows r;
  for (int guard = 0; guard < 8; ++guard) {
    const auto& ti = net.at(t);
    if (ti.activation || ti.producer < 0) return std::nullopt;
    const auto& nd = net.nodes[static_cast<size_t>(ti.producer)];
    if (nd.op_type() == "Identity") {
      t = nd.input(0);
      continue;
    }
    if (nd.op_type() == "Transpose") {
      r.transposed = !r.transposed;
      t = nd.input(0);
      continue;
    }
    if (nd.op_type() != "Split" && nd.op_type() != "Slice") return std::nullopt;
    const std::string& root = nd.input(0);
    const auto& rt = net.at(root);
    // The root: an initializer, or an Identity of one (a merge the importer reads as its own parameter).
    const bool behind_identity = rt.producer >= 0 &&
                                 net.nodes[static_cast<size_t>(rt.producer)].op_type() == "Identity" &&
                                 net.at(net.nodes[static_cast<size_t>(rt.producer)].input(0)).producer < 0;
    if (rt.activation || !rt.param || (rt.producer >= 0 && !behind_identity) || !rt.shape || rt.shape->empty())
      return std::nullopt;
    const auto& rs = *rt.shape;
    if (nd.op_type() == "Split") {
      if (attr_i(nd, "axis", 0) != 0) return std::nullopt;
      for (int k = 0; k < nd.output_size() && nd.output(k) != t; ++k) r.offset += net.shape(nd.output(k))[0];
    } else {  // Slice(root, starts, ends, axes = [0], steps = [1])
      const auto& st = net.at(nd.input(1));
      if (!st.ints || st.ints->size() != 1 || (*st.ints)[0] < 0) return std::nullopt;
      if (nd.input_size() > 3 && !nd.input(3).empty()) {
        const auto& ax = net.at(nd.input(3));
        if (!ax.ints || ax.ints->size() != 1 || (*ax.ints)[0] != 0) return std::nullopt;
      }
      if (nd.input_size() > 4 && !nd.input(4).empty()) {
        const auto& sp = net.at(nd.input(4));
        if (!sp.ints || sp.ints->size() != 1 || (*sp.ints)[0] != 1) return std::nullopt;
      }
      r.offset = (*st.ints)[0];
    }
    r.root = root;
    r.total = rs[0];
    return r;
  }
  return std::nullopt;
}

}  // namespace

// The projections of an attention region: MatMul(x, W) [+ Add b] or Gemm(x, W, b) with a parameter W.
// Those reading the Softmax's result are the output projection; the others are the input projections:
// one packed [3h, h] (torch's in_proj_weight: rows Q, K, V) or three [h, h] told apart by where they go
// (Q: left operand of the score MatMul, K: its right operand, V: the right operand of the context MatMul).
void Mapper::attention_params(const std::string& op, const std::vector<int>& nodes, int64_t h) {
  const AttentionScan a = scan_attention(net, nodes);
  std::vector<const Proj*> in_projs, out_projs;
  for (const auto& p : a.projs) (p.after_softmax ? out_projs : in_projs).push_back(&p);
  auto fail = [&](const std::string& why) {
    ParamSource ps;
    ps.op = op;
    ps.tensor = a.any_param;
    ps.error = fmt::format("{}: cannot tell which initializers are the projections of attention op \"{}\": {}",
                           net.path, op, why);
    param_sources.push_back(std::move(ps));
  };
  for (const auto& p : a.projs)
    if (p.b.empty()) return fail(fmt::format("the projection with weight \"{}\" has no bias", p.w));
  if (out_projs.size() != 1 || out_projs[0]->rows != h)
    return fail(
        fmt::format("{} output projection(s) after the Softmax, expected one [{}, {}]", out_projs.size(), h, h));
  auto qkv = assign_qkv(net, nodes, a, in_projs, h);
  if (auto* why = std::get_if<std::string>(&qkv)) return fail(*why);
  const auto& proj = std::get<std::array<const Proj*, 3>>(qkv);
  const char* names[3][2] = {{"wq", "bq"}, {"wk", "bk"}, {"wv", "bv"}};
  for (int k = 0; k < 3; ++k) {
    const int64_t parts = proj[k]->rows / h;  // 3: Q, K, V packed; 2: K, V packed; 1: one of them
    const int64_t part = parts == 3 ? k : parts == 2 ? k - 1 : 0;
    for (int b = 0; b < 2; ++b) {
      const std::string& t = b == 0 ? proj[k]->w : proj[k]->b;
      // A projection reading rows of a larger packed initializer (in_proj_weight split into Q and K, V
      // for cross-attention) reads them from that initializer directly.
      if (std::optional<SplitRows> sr = split_rows(net, t); sr && sr->offset % h == 0 && sr->total % h == 0)
        add_param(op, names[k][b], sr->root, b == 0 ? std::vector<int64_t>{h, h} : std::vector<int64_t>{h},
                  b == 0 && proj[k]->transpose != sr->transposed, sr->offset / h + part, sr->total / h);
      else if (b == 0) add_param(op, names[k][0], t, {h, h}, proj[k]->transpose, part, parts);
      else add_param(op, names[k][1], t, {h}, false, part, parts);
    }
  }
  add_param(op, "wo", out_projs[0]->w, {h, h}, out_projs[0]->transpose);
  add_param(op, "bo", out_projs[0]->b, {h});
}

namespace {

// Regions where the batch leaves dim 0 (torch's MultiheadAttention works sequence-first and merges
// batch and heads): unclaimed nodes connected by such tensors, by root. Only tensors that an op reads
// count (training-mode BatchNorm / Dropout have unused side outputs).
std::map<int, std::vector<int>> batch_moving_regions(const Mapper& mp, const Matcher& m) {
  const Net& net = mp.net;
  const int n = static_cast<int>(net.nodes.size());
  auto mixed = [&](const std::string& t) {
    const auto& ti = net.at(t);
    bool read = m.is_output(t);
    for (int c : ti.consumers) read = read || !net.folded[c];
    return read && ti.activation && ti.shape && !mp.batch_first(t);
  };
  std::vector<int> parent(n);
  std::iota(parent.begin(), parent.end(), 0);
  std::function<int(int)> find = [&](int v) { return parent[v] == v ? v : parent[v] = find(parent[v]); };
  std::vector<bool> member(n, false);
  for (int i = 0; i < n; ++i) {
    if (m.claimed[i]) continue;
    for (const auto& o : net.nodes[i].output())
      if (!o.empty() && mixed(o)) member[i] = true;
    for (const auto& in : net.nodes[i].input())
      if (!in.empty() && mixed(in)) member[i] = true;
  }
  for (int i = 0; i < n; ++i)
    if (member[i])
      for (const auto& o : net.nodes[i].output())
        if (!o.empty() && mixed(o))
          for (int c : net.at(o).consumers)
            if (member[c]) parent[find(c)] = find(i);
  std::map<int, std::vector<int>> regions;
  for (int i = 0; i < n; ++i)
    if (member[i]) regions[find(i)].push_back(i);
  return regions;
}

// torch 2.x's MultiheadAttention splits the heads batch-first ([B, heads, S, d]): between the region
// that projects and splits Q, K and V and the one that merges the heads back, the scaled scores,
// Softmax and context are batch-first. A region whose outputs lead, only through such rank-4 nodes
// (scale, MatMul, Softmax, transpose, dropout) that read nothing else, into exactly one other region
// is joined with it and those nodes: one block, judged as a whole below.
void join_head_split_regions(const Mapper& mp, const Matcher& m, std::map<int, std::vector<int>>& regions) {
  const Net& net = mp.net;
  static const std::set<std::string> kBetween = {"Mul",  "Div",     "MatMul", "Softmax", "Transpose", "Reshape",
                                                 "Cast", "Dropout", "Add",    "Sub",     "Where"};
  std::vector<int> region_of(net.nodes.size(), -1);
  for (const auto& [root, nodes] : regions)
    for (int i : nodes) region_of[static_cast<size_t>(i)] = root;
  auto rank4 = [&](const std::string& t) { return net.at(t).shape && net.at(t).shape->size() == 4; };
  // A rank-4 node that may sit between the regions of one block.
  auto between_node = [&](int c) {
    const auto& cn = net.nodes[static_cast<size_t>(c)];
    return !m.claimed[static_cast<size_t>(c)] && kBetween.count(cn.op_type()) && rank4(cn.output(0)) &&
           !m.is_output(cn.output(0));
  };
  for (bool joined = true; joined;) {
    joined = false;
    for (auto& [root, nodes] : regions) {
      // From the region's outputs forward through rank-4 nodes, and back from those nodes' other
      // operands (cross-attention: the keys come from a region of their own): every region met is
      // one block with this one. A node of any other kind on the way (a mask computed from an input)
      // keeps them apart.
      std::set<int> between, hit;
      std::vector<int> work;  // between nodes to explore
      bool ok = true;
      auto reach = [&](int c) {  // a node met from the region's side
        const int r = region_of[static_cast<size_t>(c)];
        if (net.folded[static_cast<size_t>(c)] || r == root) return;
        if (r >= 0) {
          hit.insert(r);
        } else if (!between_node(c)) {
          ok = false;
        } else if (between.insert(c).second) {
          work.push_back(c);
        }
      };
      for (int i : nodes)
        for (const auto& o : net.nodes[static_cast<size_t>(i)].output())
          if (!o.empty() && net.at(o).activation)
            for (int c : net.at(o).consumers) reach(c);
      while (ok && !work.empty()) {
        const int c = work.back();
        work.pop_back();
        const auto& cn = net.nodes[static_cast<size_t>(c)];
        for (const auto& o : cn.output())
          if (!o.empty() && net.at(o).activation)
            for (int d : net.at(o).consumers) reach(d);
        for (const auto& in : cn.input())
          if (!in.empty() && net.at(in).activation) {
            const int p = net.at(in).producer;
            if (p < 0) ok = false;  // a data input flows in
            else reach(p);
          }
      }
      if (!ok || hit.empty() || between.empty()) continue;
      for (int c : between) nodes.push_back(c);
      for (int other : hit) {
        for (int c : regions.at(other)) nodes.push_back(c);
        regions.erase(other);
      }
      for (int c : nodes) region_of[static_cast<size_t>(c)] = root;
      std::sort(nodes.begin(), nodes.end());
      joined = true;
      break;
    }
  }
}

// A region as seen from outside: its activation inputs and outputs (shape-only readers do not
// count), the parameters behind it, and what it computes inside.
struct Region {
  std::set<std::string> ext_in, outs, params;
  int softmax = 0, act_matmul = 0;
  std::vector<std::vector<int64_t>> rank3;  // rank-3 shapes inside: [S, B*heads, H/heads] etc.
};

// `masks`: tensors entering the score path as masks (read by the op's attrs / input 1 instead).
Region summarize_region(const Net& net, const Matcher& m, const std::vector<int>& nodes,
                        const std::set<std::string>& masks = {}) {
  Region r;
  std::set<int> inside(nodes.begin(), nodes.end());
  for (int i : nodes) {
    const auto& nd = net.nodes[i];
    r.softmax += nd.op_type() == "Softmax";
    if (nd.op_type() == "MatMul" && net.at(nd.input(0)).activation && net.at(nd.input(1)).activation) ++r.act_matmul;
    for (const auto& in : nd.input()) {
      if (in.empty() || masks.count(in)) continue;
      const auto& ti = net.at(in);
      if (ti.activation && !inside.count(ti.producer)) r.ext_in.insert(in);
      param_roots(net, in, r.params);
    }
    for (const auto& o : nd.output()) {
      if (o.empty()) continue;
      for (int c : net.at(o).consumers)
        if (!inside.count(c) && !net.folded[c]) r.outs.insert(o);
      if (m.is_output(o)) r.outs.insert(o);
      if (const auto& s = net.at(o).shape; s && s->size() == 3) r.rank3.push_back(*s);
    }
  }
  return r;
}

// The block's activation inputs: the queries' source x and, for cross-attention, the keys' and
// values' source (empty for self-attention).
struct AttentionSources {
  std::string x, kv;
};

// Why the region is not a multi-head attention block ("" when it is); `h` gets the hidden width and
// `src` the inputs when the region has one input (self-attention) or two (cross-attention: the one
// reaching the score MatMul's left operand is the queries' source) and one output.
std::string attention_mismatch(const Mapper& mp, const Region& r, const std::vector<int>& nodes, int score_mm,
                               int64_t& h, AttentionSources& src) {
  const Net& net = mp.net;
  if (r.ext_in.size() < 1 || r.ext_in.size() > 2 || r.outs.size() != 1)
    return fmt::format(
        "{} activation input(s) and {} output(s), expected 1 (self-attention) or 2 (cross-attention) "
        "and 1",
        r.ext_in.size(), r.outs.size());
  src = AttentionSources{*r.ext_in.begin(), ""};
  if (r.ext_in.size() == 2) {
    if (score_mm < 0) return "two activation inputs and no score MatMul to tell queries from keys";
    const std::string &a = *r.ext_in.begin(), &b = *std::next(r.ext_in.begin());
    const std::string& left = net.nodes[static_cast<size_t>(score_mm)].input(0);
    const std::string& right = net.nodes[static_cast<size_t>(score_mm)].input(1);
    const bool aq = reaches(net, nodes, a, left), bq = reaches(net, nodes, b, left);
    const bool ak = reaches(net, nodes, a, right), bk = reaches(net, nodes, b, right);
    if (aq && !ak && bk && !bq) src = {a, b};
    else if (bq && !bk && ak && !aq) src = {b, a};
    else return fmt::format("two activation inputs ({}, {}), but not one for the queries and one for the keys", a, b);
    const auto &qs = net.shape(src.x), &ks = net.shape(src.kv);
    if (ks.size() != 3 || qs.size() != 3 || ks.back() != qs.back() || !mp.batch_first(src.kv))
      return fmt::format("the keys' source [{}] is not [B, seq, {}] like the queries' [{}]", fmt::join(ks, ","),
                         qs.back(), fmt::join(qs, ","));
  }
  const auto &xs = net.shape(src.x), &ys = net.shape(*r.outs.begin());
  h = xs.back();
  int64_t count = 0;
  for (const auto& p : r.params)
    count += std::max<int64_t>(0, ir::per_sample_elems(net.shape(p)) > 1 ? ir::per_sample_elems(net.shape(p)) : 0);
  if (xs.size() != 3 || xs != ys || !mp.batch_first(src.x))
    return fmt::format("input [{}] and output [{}] are not both [B, seq, hidden]", fmt::join(xs, ","),
                       fmt::join(ys, ","));
  if (r.softmax != 1 || r.act_matmul != 2)
    return fmt::format("{} Softmax and {} activation MatMul nodes, expected 1 and 2", r.softmax, r.act_matmul);
  if (count != 4 * h * h + 4 * h)
    return fmt::format("{} parameters, expected 4*{}^2+4*{} = {} (Q,K,V,output projections with biases)", count, h, h,
                       4 * h * h + 4 * h);
  return "";
}

// heads: the k of a rank-3 tensor with a dim k * batch whose last dim is hidden / k (k = 1 if none).
int64_t attention_heads(const Region& r, int64_t h) {
  int64_t heads = 1;
  for (const auto& s : r.rank3)
    for (int64_t d : s)
      if (h > 0 && d % kProbeBatch == 0 && d / kProbeBatch > 1 && h % (d / kProbeBatch) == 0 &&
          s.back() == h / (d / kProbeBatch))
        heads = std::max(heads, d / kProbeBatch);
  return heads;
}

// The region's one Softmax, or -1.
int region_softmax(const Net& net, const std::vector<int>& nodes) {
  int sm = -1;
  for (int i : nodes)
    if (net.nodes[static_cast<size_t>(i)].op_type() == "Softmax") sm = sm < 0 ? i : -2;
  return sm < 0 ? -1 : sm;
}

// The key length of the scores the Softmax reads ([.., S, S]), or 0.
int64_t score_seq(const Net& net, int softmax) {
  const auto& s = net.at(net.nodes[static_cast<size_t>(softmax)].input(0)).shape;
  return s && !s->empty() ? s->back() : 0;
}

// The attention op's inputs and attrs: x, the keys' source for cross-attention, then the padding mask
// when there is one.
std::pair<std::vector<std::string>, Json> attention_signature(const AttentionSources& src, int64_t heads,
                                                              const AttentionMasks& am) {
  Json attrs{{"heads", heads}};
  std::vector<std::string> in{src.x};
  if (!src.kv.empty()) {
    in.push_back(src.kv);
    attrs["cross"] = true;
  }
  if (am.causal) attrs["causal"] = true;
  if (!am.mask_input.empty()) {
    in.push_back(am.mask_input);
    attrs["mask"] = am.mask_mode;
    if (am.mask_fill) attrs["mask_fill"] = *am.mask_fill;
  }
  return {in, attrs};
}

// Why the scale of the scores is not 1/sqrt(d_head) ("" when it is; an unknown scale passes only
// when `known_required` is false).
std::string scale_mismatch(const AttentionMasks& am, int64_t h, int64_t heads, bool known_required) {
  const double want = 1.0 / std::sqrt(static_cast<double>(h / heads));
  if (!am.scale) return known_required ? "the scale of the scores is not a constant it can read" : "";
  if (std::abs(*am.scale - want) <= 1e-5 * want) return "";
  return fmt::format("the scores are scaled by {:.6g}, expected 1/sqrt({}) = {:.6g}", *am.scale, h / heads, want);
}

// 1. Each batch-moving region is accepted only as a whole self-attention block (one attention op);
// otherwise it is claimed with a reason, so the import fails naming it.
void map_batch_moving_regions(Mapper& mp, const Matcher& m, std::vector<bool>& claimed) {
  const Net& net = mp.net;
  std::map<int, std::vector<int>> regions = batch_moving_regions(mp, m);
  join_head_split_regions(mp, m, regions);
  for (const auto& [root, nodes] : regions) {
    const int sm = region_softmax(net, nodes);
    if (sm == -1) {  // no attention: node by node, the batch tracked through each tensor
      claim(claimed, nodes);
      if (std::string why = map_batch_axis_region(mp, nodes); !why.empty())
        mp.reasons.push_back(fmt::format("nodes {} .. {} move the batch dimension away from dim 0 and back: {}",
                                         node_label(net.nodes[static_cast<size_t>(nodes.front())]),
                                         node_label(net.nodes[static_cast<size_t>(nodes.back())]), why));
      continue;
    }
    const AttentionMasks am = sm >= 0 ? scan_attention_masks(net, sm, score_seq(net, sm)) : AttentionMasks{};
    const Region r = summarize_region(net, m, nodes, am.operands);
    int64_t h = 0;
    AttentionSources src;
    std::string why = attention_mismatch(mp, r, nodes, am.score_mm, h, src);
    const int64_t heads = attention_heads(r, h);
    if (why.empty() && !am.error.empty()) why = am.error;
    if (why.empty()) why = scale_mismatch(am, h, heads, false);
    if (why.empty() && !am.mask_input.empty() && net.at(net.nodes[static_cast<size_t>(sm)].input(0)).shape->size() != 4)
      why = "a padding mask on sequence-first scores [B*heads, S, S] (export nn.MultiheadAttention with batch_first)";
    claim(claimed, nodes);
    if (!why.empty()) {
      mp.reasons.push_back(
          fmt::format("nodes {} .. {} move the batch dimension away from dim 0 and are not a "
                      "multi-head attention block ({})",
                      node_label(net.nodes[nodes.front()]), node_label(net.nodes[nodes.back()]), why));
      continue;
    }
    claim(claimed, am.prep);
    auto [in, attrs] = attention_signature(src, heads, am);
    mp.attention_params(mp.emit(fused_name(net, nodes, "attention"), ir::OpKind::attention, in, *r.outs.begin(), attrs),
                        nodes, h);
  }
}

// Batch-first attention (GPT-2 / nanoGPT / BERT written by hand, F.scaled_dot_product_attention):
// the heads split as [B, heads, S, d], so the batch never leaves dim 0. From each Softmax over
// rank-4 batch-first scores whose path reaches a MatMul of two activations: the nodes joined to it
// by rank-4 activations (mask operands excluded), then back from each rank-3 input through
// Split / Slice to the projection (MatMul with a weight [+ bias Add], or Gemm), and forward from the
// rank-3 output to the output projection. Returns the nodes (sorted), or nothing when this is not
// such a block.
std::optional<std::vector<int>> batch_first_region(const Mapper& mp, const Matcher& m, int softmax,
                                                   const AttentionMasks& am) {
  const Net& net = mp.net;
  auto rank = [&](const std::string& t) { return net.at(t).shape ? net.at(t).shape->size() : size_t{0}; };
  auto usable = [&](int c) {
    return c >= 0 && !net.folded[static_cast<size_t>(c)] && !m.claimed[static_cast<size_t>(c)];
  };
  std::set<int> in_region{softmax};
  std::vector<std::string> work;
  auto add = [&](int i) {
    if (!in_region.insert(i).second) return;
    for (const auto& t : net.nodes[static_cast<size_t>(i)].input())
      if (!t.empty() && net.at(t).activation && !am.operands.count(t)) work.push_back(t);
    for (const auto& t : net.nodes[static_cast<size_t>(i)].output())
      if (!t.empty()) work.push_back(t);
  };
  for (const auto& t : net.nodes[static_cast<size_t>(softmax)].input()) work.push_back(t);
  for (const auto& t : net.nodes[static_cast<size_t>(softmax)].output()) work.push_back(t);
  std::set<std::string> seen;
  while (!work.empty()) {
    const std::string t = work.back();
    work.pop_back();
    if (t.empty() || !seen.insert(t).second || !net.at(t).activation || rank(t) != 4 || !mp.batch_first(t)) continue;
    if (m.is_output(t)) return std::nullopt;
    if (usable(net.at(t).producer)) add(net.at(t).producer);
    for (int c : net.at(t).consumers)
      if (usable(c)) add(c);
    if (in_region.size() > 64) return std::nullopt;
  }
  auto inside = [&](int i) { return in_region.count(i) > 0; };
  auto param = [&](const std::string& t) { return !t.empty() && !net.at(t).activation && net.at(t).param; };
  // Back to the input projections.
  std::set<std::string> ext;
  for (int i : in_region)
    for (const auto& t : net.nodes[static_cast<size_t>(i)].input())
      if (!t.empty() && net.at(t).activation && !am.operands.count(t) && !inside(net.at(t).producer)) ext.insert(t);
  for (std::string t : ext) {
    if (rank(t) != 3) return std::nullopt;
    int p = net.at(t).producer;
    while (usable(p) && (net.nodes[static_cast<size_t>(p)].op_type() == "Split" ||
                         net.nodes[static_cast<size_t>(p)].op_type() == "Slice")) {
      in_region.insert(p);
      p = net.at(net.nodes[static_cast<size_t>(p)].input(0)).producer;
    }
    if (!usable(p) || inside(p)) continue;
    const auto& nd = net.nodes[static_cast<size_t>(p)];
    if (nd.op_type() == "Add" && (param(nd.input(0)) || param(nd.input(1)))) {
      in_region.insert(p);
      p = net.at(param(nd.input(0)) ? nd.input(1) : nd.input(0)).producer;
    }
    if (usable(p) &&
        (net.nodes[static_cast<size_t>(p)].op_type() == "MatMul" ||
         net.nodes[static_cast<size_t>(p)].op_type() == "Gemm") &&
        param(net.nodes[static_cast<size_t>(p)].input(1)))
      in_region.insert(p);
  }
  // Forward to the output projection.
  std::set<std::string> outs;
  for (int i : in_region)
    for (const auto& t : net.nodes[static_cast<size_t>(i)].output())
      for (int c : t.empty() ? std::vector<int>{} : net.at(t).consumers)
        if (!inside(c) && !net.folded[static_cast<size_t>(c)] && rank(t) == 3) outs.insert(t);
  if (outs.size() == 1) {
    const auto& cs = net.at(*outs.begin()).consumers;
    int mm = -1;
    for (int c : cs)
      if (!net.folded[static_cast<size_t>(c)]) mm = mm == -1 ? c : -2;
    if (usable(mm) &&
        (net.nodes[static_cast<size_t>(mm)].op_type() == "MatMul" ||
         net.nodes[static_cast<size_t>(mm)].op_type() == "Gemm") &&
        param(net.nodes[static_cast<size_t>(mm)].input(1))) {
      in_region.insert(mm);
      const std::string& o = net.nodes[static_cast<size_t>(mm)].output(0);
      int ad = net.nodes[static_cast<size_t>(mm)].op_type() == "MatMul" ? m.sole(o, "Add") : -1;
      if (ad >= 0 &&
          (param(net.nodes[static_cast<size_t>(ad)].input(0)) || param(net.nodes[static_cast<size_t>(ad)].input(1))))
        in_region.insert(ad);
    }
  }
  return std::vector<int>(in_region.begin(), in_region.end());
}

// 1b. Batch-first attention blocks (batch_first_region). A Softmax whose scores come from a MatMul
// of two activations and whose region is not a whole block with a readable scale and masks is
// refused naming its nodes, unless its score path is a bare MatMul (no scale, no mask: the node
// mapping maps such a computation op by op, as before); a Softmax that reaches no such MatMul is
// left to the node mapping.
void map_batch_first_attention(Mapper& mp, const Matcher& m, std::vector<bool>& claimed) {
  const Net& net = mp.net;
  for (int i = 0; i < static_cast<int>(net.nodes.size()); ++i) {
    const auto& nd = net.nodes[static_cast<size_t>(i)];
    if (claimed[static_cast<size_t>(i)] || nd.op_type() != "Softmax" || !net.at(nd.input(0)).shape ||
        net.at(nd.input(0)).shape->size() != 4 || !mp.batch_first(nd.input(0)))
      continue;
    const AttentionMasks am = scan_attention_masks(net, i, score_seq(net, i));
    if (!am.found()) continue;  // not attention scores
    std::optional<std::vector<int>> nodes = batch_first_region(mp, m, i, am);
    std::string why;
    int64_t h = 0, heads = 1;
    Region r;
    AttentionSources src;
    if (!nodes) {
      why = "its nodes reach past the attention block";
      nodes = std::vector<int>{i};
    } else {
      r = summarize_region(net, m, *nodes, am.operands);
      why = attention_mismatch(mp, r, *nodes, am.score_mm, h, src);
      const auto& q = net.at(net.nodes[static_cast<size_t>(am.score_mm)].input(0)).shape;
      if (q && q->size() == 4 && (*q)[1] * q->back() == h) heads = (*q)[1];
      if (why.empty() && !am.error.empty()) why = am.error;
      if (why.empty()) why = scale_mismatch(am, h, heads, true);
    }
    if (!why.empty() && am.factors == 0 && am.operands.empty() && am.path.empty()) continue;
    claim(claimed, *nodes);
    if (!why.empty()) {
      mp.reasons.push_back(
          fmt::format("nodes {} .. {} (the Softmax {} over [B, heads, S, S] scores) are not a "
                      "multi-head attention block ({})",
                      node_label(net.nodes[static_cast<size_t>(nodes->front())]),
                      node_label(net.nodes[static_cast<size_t>(nodes->back())]), node_label(nd), why));
      continue;
    }
    claim(claimed, am.prep);
    auto [in, attrs] = attention_signature(src, heads, am);
    mp.attention_params(
        mp.emit(fused_name(net, *nodes, "attention"), ir::OpKind::attention, in, *r.outs.begin(), attrs), *nodes, h);
  }
}

// 2. LayerNorm decomposed (opset < 17): mean, x - mean, pow 2, mean, + eps, sqrt, div, * w, + b.
bool match_layernorm(Mapper& mp, const Matcher& m, int i, std::vector<bool>& claimed) {
  const Net& net = mp.net;
  const auto& nd = net.nodes[i];
  if (nd.op_type() != "ReduceMean" || nd.input_size() != 1 || attr_i(nd, "keepdims", 1) != 1 ||
      !net.at(nd.input(0)).activation)
    return false;
  const std::string& x = nd.input(0);
  auto axes = attr_ints(nd, "axes");
  const auto& xs = net.shape(x);
  if (axes.size() != 1 || (axes[0] != -1 && axes[0] != static_cast<int64_t>(xs.size()) - 1)) return false;
  int sub = m.sole(nd.output(0), "Sub");
  if (sub < 0 || m.node(sub).input(0) != x) return false;
  const auto& c = net.at(m.node(sub).output(0)).consumers;
  if (c.size() != 2) return false;
  int pw = net.nodes[c[0]].op_type() == "Pow" ? c[0] : c[1], dv = pw == c[0] ? c[1] : c[0];
  if (net.nodes[pw].op_type() != "Pow" || net.nodes[dv].op_type() != "Div" || claimed[pw] || claimed[dv] ||
      !m.near(m.scalar(net.nodes[pw].input(1)), 2.0))
    return false;
  int r2 = m.sole(net.nodes[pw].output(0), "ReduceMean");
  int ad = r2 < 0 ? -1 : m.sole(m.node(r2).output(0), "Add");
  auto eps = ad < 0 ? std::nullopt : m.scalar(m.other(ad, m.node(r2).output(0)));
  int sq = ad < 0 ? -1 : m.sole(m.node(ad).output(0), "Sqrt");
  if (!eps || sq < 0 || m.sole(m.node(sq).output(0), "Div") != dv || m.node(dv).input(0) != m.node(sub).output(0))
    return false;
  int mu = m.sole(m.node(dv).output(0), "Mul");
  int bi = mu < 0 ? -1 : m.sole(m.node(mu).output(0), "Add");
  if (bi < 0 || !m.param_vec(m.other(mu, m.node(dv).output(0)), xs.back()) ||
      !m.param_vec(m.other(bi, m.node(mu).output(0)), xs.back()))
    return false;
  std::vector<int> group{i, sub, pw, r2, ad, sq, dv, mu, bi};
  claim(claimed, group);
  std::string ln = mp.emit(fused_name(net, group, "layernorm"), ir::OpKind::layernorm, {x}, m.node(bi).output(0),
                           Json{{"eps", *eps}});
  mp.add_param(ln, "weight", m.other(mu, m.node(dv).output(0)), {xs.back()});
  mp.add_param(ln, "bias", m.other(bi, m.node(mu).output(0)), {xs.back()});
  return true;
}

// 3. GELU, erf form: x * 0.5 * (1 + erf(x / sqrt(2))) in either multiplication order.
bool match_gelu(Mapper& mp, const Matcher& m, int i, std::vector<bool>& claimed) {
  const Net& net = mp.net;
  const auto& nd = net.nodes[i];
  const std::string& op = nd.op_type();
  if (op != "Div" && op != "Mul") return false;
  const std::string& x = nd.input(0);
  auto c = m.scalar(nd.input(1));
  bool scaled = op == "Div" ? m.near(c, std::sqrt(2.0)) : m.near(c, 1.0 / std::sqrt(2.0));
  int erf = scaled && net.at(x).activation ? m.sole(nd.output(0), "Erf") : -1;
  int one = erf < 0 ? -1 : m.sole(m.node(erf).output(0), "Add");
  int m1 = one < 0 || !m.near(m.scalar(m.other(one, m.node(erf).output(0))), 1.0)
               ? -1
               : m.sole(m.node(one).output(0), "Mul");
  if (m1 < 0) return false;
  std::string o = m.other(m1, m.node(one).output(0));
  std::vector<int> group{i, erf, one, m1};
  std::string out;
  int m2 = o == x ? m.sole(m.node(m1).output(0), "Mul") : -1;
  int half = m.producer(o);
  if (m2 >= 0 && m.near(m.scalar(m.other(m2, m.node(m1).output(0))), 0.5)) {
    group.push_back(m2);
    out = m.node(m2).output(0);
  } else if (o != x && half >= 0 && !claimed[half] && net.nodes[half].op_type() == "Mul" && m.sole(o, "Mul") == m1 &&
             m.other(half, x) != "" && m.near(m.scalar(m.other(half, x)), 0.5) &&
             (m.node(half).input(0) == x || m.node(half).input(1) == x)) {
    group.push_back(half);
    out = m.node(m1).output(0);
  }
  if (out.empty()) return false;
  claim(claimed, group);
  mp.emit(fused_name(net, group, "gelu"), ir::OpKind::gelu, {x}, out);
  return true;
}

// 4. MatMul with a 2-d parameter weight followed by a parameter bias: one linear with bias.
bool match_linear_bias(Mapper& mp, const Matcher& m, int i, std::vector<bool>& claimed) {
  const Net& net = mp.net;
  const auto& nd = net.nodes[i];
  if (nd.op_type() != "MatMul" || !net.at(nd.input(0)).activation || net.at(nd.input(1)).activation) return false;
  const auto& w = net.shape(nd.input(1));
  int ad = w.size() == 2 ? m.sole(nd.output(0), "Add") : -1;
  if (ad < 0 || !m.param_vec(m.other(ad, nd.output(0)), w[1])) return false;
  claim(claimed, {i, ad});
  std::string lin = mp.emit(nd.name(), ir::OpKind::linear, {nd.input(0)}, m.node(ad).output(0),
                            Json{{"out_features", w[1]}, {"bias", true}});
  mp.add_param(lin, "weight", nd.input(1), {w[1], w[0]}, true);
  mp.add_param(lin, "bias", m.other(ad, nd.output(0)), {w[1]});
  return true;
}

// 5. GlobalAveragePool then Flatten: the IR's global_avgpool already gives [B, C].
bool match_pool_flatten(Mapper& mp, const Matcher& m, int i, std::vector<bool>& claimed) {
  const auto& nd = mp.net.nodes[i];
  if (nd.op_type() != "GlobalAveragePool") return false;
  int fl = m.sole(nd.output(0), "Flatten");
  if (fl < 0 || attr_i(m.node(fl), "axis", 1) != 1 || mp.net.shape(nd.input(0)).size() != 4) return false;
  claim(claimed, {i, fl});
  mp.emit(nd.name(), ir::OpKind::global_avgpool, {nd.input(0)}, m.node(fl).output(0));
  return true;
}

}  // namespace

void Mapper::match_patterns(std::vector<bool>& claimed) {
  Matcher m{net, claimed};
  // The model's own loss first: its reshapes merge the batch with the positions ([B*N, C]).
  for (int i = 0; i < static_cast<int>(net.nodes.size()); ++i)
    if (!claimed[static_cast<size_t>(i)]) (void)match_own_loss(*this, m, i, claimed);
  // First: its Transposes move the batch away from dim 0, which the region patterns below would claim.
  for (int i = 0; i < static_cast<int>(net.nodes.size()); ++i)
    if (!claimed[static_cast<size_t>(i)]) (void)match_index_pool(*this, m, i, claimed);
  map_window_attention(*this, m, claimed);
  map_batch_moving_regions(*this, m, claimed);
  map_batch_first_attention(*this, m, claimed);
  for (int i = 0; i < static_cast<int>(net.nodes.size()); ++i) {
    if (claimed[i]) continue;
    // The first pattern that matches at node i claims its nodes; at most one can (by op type).
    (void)(match_layernorm(*this, m, i, claimed) || match_gelu(*this, m, i, claimed) ||
           match_linear_bias(*this, m, i, claimed) || match_pool_flatten(*this, m, i, claimed));
  }
}

}  // namespace gp::importers::onnx_detail
