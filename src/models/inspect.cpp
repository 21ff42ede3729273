// Model inspection: totals, SP branch structure in words, and Graphviz output.
#include "models/inspect.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <fmt/format.h>
#include <functional>

#include "support/error.h"

namespace gp::models {

using graph::SpNode;

graph::Dag to_dag(const ir::Graph& g) {
  graph::Dag d(static_cast<int>(g.num_ops()));
  for (size_t i = 0; i < g.num_ops(); ++i)
    for (OpId s : g.succs(OpId(static_cast<int32_t>(i)))) d.add_edge(static_cast<int>(i), s.v);
  return d;
}

SpStructure sp_structure(const ir::Graph& g) {
  SpStructure out;
  graph::SpDecomposition d = graph::sp_decompose_or_ize(to_dag(g));
  out.series_parallel = d.series_parallel();
  out.failure = std::move(d.failure);
  out.tree = std::move(d.tree);
  return out;
}

std::vector<int> SpStructure::spine_parallel_widths() const {
  std::vector<int> w;
  if (tree.root < 0) return w;
  const SpNode& root = tree.nodes[tree.root];
  if (root.kind == SpNode::Kind::parallel) w.push_back(static_cast<int>(root.children.size()));
  if (root.kind == SpNode::Kind::series)
    for (int c : root.children)
      if (tree.nodes[c].kind == SpNode::Kind::parallel) w.push_back(static_cast<int>(tree.nodes[c].children.size()));
  return w;
}

int SpStructure::max_parallel_width() const {
  int w = 1;
  for (const SpNode& n : tree.nodes)
    if (n.kind == SpNode::Kind::parallel) w = std::max(w, static_cast<int>(n.children.size()));
  return w;
}

namespace {

std::string ops_str(size_t n) { return fmt::format("{} op{}", n, n == 1 ? "" : "s"); }

bool has_parallel(const graph::SpTree& t, int node) {
  const SpNode& n = t.nodes[node];
  if (n.kind == SpNode::Kind::parallel) return true;
  for (int c : n.children)
    if (has_parallel(t, c)) return true;
  return false;
}

std::string describe_parallel(const graph::SpTree& t, int node) {
  const SpNode& p = t.nodes[node];
  std::vector<size_t> sizes;
  bool nested = false;
  for (int c : p.children) {
    sizes.push_back(t.leaves(c).size());
    nested = nested || has_parallel(t, c);
  }
  std::string s = fmt::format("parallel of {} branches", sizes.size());
  bool all_equal = std::all_of(sizes.begin(), sizes.end(), [&](size_t v) { return v == sizes[0]; });
  if (all_equal) {
    s += " x " + ops_str(sizes[0]);
  } else if (sizes.size() <= 6) {
    s += " of ";
    for (size_t i = 0; i < sizes.size(); ++i) s += fmt::format("{}{}", i ? ", " : "", sizes[i]);
    s += " ops";
  } else {  // group runs of equal sizes: "7 x 8 ops, 7 x 1 op"
    s += ": ";
    for (size_t i = 0; i < sizes.size();) {
      size_t j = i;
      while (j < sizes.size() && sizes[j] == sizes[i]) ++j;
      s += fmt::format("{}{} x {}", i ? ", " : "", j - i, ops_str(sizes[i]));
      i = j;
    }
  }
  if (nested) s += " (with nested parallelism)";
  return "[" + s + "]";
}

// One element of a series description: a run of single ops (run > 0) or a parallel block.
struct Item {
  std::string text;
  size_t run = 0;
  bool operator==(const Item& o) const { return text == o.text; }
};

// Folds a stretch of >= 3 identical parallel blocks separated by short op runs (inception's
// blocks with a concat, sometimes a pool, between them) into "9 x [...] joined by 1-2 ops".
std::vector<Item> fold_joined(const std::vector<Item>& items) {
  std::vector<Item> out;
  for (size_t i = 0; i < items.size();) {
    size_t j = i, k = 1, lo = SIZE_MAX, hi = 0;
    if (items[i].run == 0)
      while (j + 2 < items.size() && items[j + 1].run > 0 && items[j + 2] == items[i]) {
        lo = std::min(lo, items[j + 1].run), hi = std::max(hi, items[j + 1].run);
        j += 2, ++k;
      }
    if (k >= 3) {
      std::string between = lo == hi ? ops_str(lo) : fmt::format("{}-{} ops", lo, hi);
      out.push_back({fmt::format("{} x {} joined by {}", k, items[i].text, between)});
      i = j + 1;
    } else {
      out.push_back(items[i++]);
    }
  }
  return out;
}

// Folds repeats greedily: at each position take the period (1..8) covering the most items.
std::string fold(const std::vector<Item>& items) {
  std::vector<std::string> out;
  for (size_t i = 0; i < items.size();) {
    size_t best_p = 1, best_r = 1;
    for (size_t p = 1; p <= 8 && i + 2 * p <= items.size(); ++p) {
      size_t r = 1;
      while (i + (r + 1) * p <= items.size() &&
             std::equal(items.begin() + i, items.begin() + i + p, items.begin() + i + r * p))
        ++r;
      if (r >= 2 && p * r > best_p * best_r) best_p = p, best_r = r;
    }
    if (best_r >= 2) {
      std::string group;
      for (size_t k = 0; k < best_p; ++k) group += (k ? " -> " : "") + items[i + k].text;
      out.push_back(best_p == 1 ? fmt::format("{} x {}", best_r, group) : fmt::format("{} x ({})", best_r, group));
    } else {
      out.push_back(items[i].text);
    }
    i += best_p * best_r;
  }
  std::string s;
  for (size_t k = 0; k < out.size(); ++k) s += (k ? " -> " : "") + out[k];
  return s;
}

}  // namespace

std::string describe_structure(const ir::Graph& g, const SpStructure& sp) {
  const graph::SpTree& t = sp.tree;
  std::string head = sp.series_parallel
                         ? "series-parallel: yes"
                         : fmt::format("series-parallel: no ({}); structure of its SP-ized form", sp.failure);
  if (t.root < 0) return head + "\nstructure: empty";
  const SpNode& root = t.nodes[t.root];
  std::string body;
  if (root.kind == SpNode::Kind::leaf) {
    body = "1 op";
  } else if (root.kind == SpNode::Kind::parallel) {
    body = describe_parallel(t, t.root);
  } else {
    std::vector<Item> items;
    size_t run = 0;
    auto flush = [&] {
      if (run) items.push_back({ops_str(run), run});
      run = 0;
    };
    for (int c : root.children) {
      const SpNode& n = t.nodes[c];
      if (n.kind == SpNode::Kind::leaf) {
        const ir::Op& op = g.op(OpId(n.node));
        if (ir::is_loss(op.kind)) {
          flush();
          items.push_back({op.name});
        } else {
          ++run;
        }
      } else {
        flush();
        items.push_back({describe_parallel(t, c)});
      }
    }
    flush();
    body = fmt::format("series of {}: {}", root.children.size(), fold(fold_joined(items)));
  }
  int width = sp.max_parallel_width();
  return fmt::format("{}\nstructure: {}\nwidest parallel: {}", head, body,
                     width > 1 ? fmt::format("{} branches", width) : std::string("none (a chain)"));
}

ModelSummary summarize(const ir::Graph& g) {
  ModelSummary s;
  s.name = g.name();
  s.num_ops = g.num_ops();
  s.num_inputs = g.model().inputs.size();
  for (size_t i = 0; i < g.num_ops(); ++i) {
    OpId id(static_cast<int32_t>(i));
    const ir::OpCosts& c = g.costs(id);
    s.params += c.params;
    s.param_bytes += c.param_bytes;
    s.fwd_flops += c.fwd_flops;
    s.bwd_flops += c.bwd_flops;
    s.saved_bytes += c.saved_bytes;
    s.ops_per_kind[ir::to_string(g.op(id).kind)]++;
  }
  return s;
}

std::string to_dot(const ir::Graph& g, const SpStructure& sp) {
  std::string out = fmt::format("digraph \"{}\" {{\n  rankdir=TB;\n  node [shape=box, fontsize=10, style=rounded];\n",
                                g.name());
  int cluster = 0;
  std::function<void(int, int, const std::string&)> emit = [&](int t, int depth, const std::string& indent) {
    const SpNode& n = sp.tree.nodes[t];
    if (n.kind == SpNode::Kind::leaf) {
      const ir::Op& op = g.op(OpId(n.node));
      out += fmt::format("{}n{} [label=\"{}\\n{}\"{}];\n", indent, n.node, op.name, ir::to_string(op.kind),
                         ir::is_loss(op.kind) ? ", style=\"rounded,bold\"" : "");
      return;
    }
    for (size_t i = 0; i < n.children.size(); ++i) {
      if (n.kind == SpNode::Kind::parallel) {
        out += fmt::format("{}subgraph cluster_{} {{\n{}  label=\"branch {}\"; style=dashed;\n", indent, cluster++,
                           indent, i);
        emit(n.children[i], depth + 1, indent + "  ");
        out += indent + "}\n";
      } else {
        emit(n.children[i], depth, indent);
      }
    }
  };
  if (sp.tree.root >= 0) emit(sp.tree.root, 0, "  ");
  for (size_t i = 0; i < g.num_ops(); ++i)
    for (OpId s : g.succs(OpId(static_cast<int32_t>(i)))) out += fmt::format("  n{} -> n{};\n", i, s.v);
  return out + "}\n";
}

std::string thousands(int64_t v) {
  std::string digits = std::to_string(v < 0 ? -v : v), out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return v < 0 ? "-" + out : out;
}

std::string si(double v, const std::string& unit) {
  static const char* prefixes[] = {"", "k", "M", "G", "T", "P", "E"};
  int p = 0;
  double a = std::fabs(v);
  while (a >= 999.5 && p < 6) a /= 1000, v /= 1000, ++p;
  if (p == 0 && v == std::floor(v)) return fmt::format("{:.0f} {}", v, unit);
  int decimals = a >= 99.95 ? 0 : a >= 9.995 ? 1 : 2;
  return fmt::format("{:.{}f} {}{}", v, decimals, prefixes[p], unit);
}

}  // namespace gp::models
