// Model validation, the validated Graph with derived costs, and ModelBuilder.
#include "ir/model.h"

#include <algorithm>
#include <unordered_set>

#include "graph/dag.h"
#include "ir/attrs.h"

namespace gp::ir {

namespace {

/// Per-sample elements (computed in double, so never wrapped) at most kMaxExtent.
bool within_limits(const Shape& s) {
  double n = 1;
  for (size_t i = 0; i < s.size(); ++i)
    if (!(i == 0 && s[i] == kBatch)) n *= static_cast<double>(s[i]);
  return n <= static_cast<double>(kMaxExtent);
}

// Kahn's algorithm (graph::kahn_order) over op indices, smallest index first (keeps a file's order
// when it is already topological). Returns the order; ops left out are on or behind a cycle.
std::vector<int> kahn(const std::vector<std::vector<int>>& op_preds) {
  graph::Dag dag(static_cast<int>(op_preds.size()));
  std::vector<std::pair<int, int>> edges;
  for (size_t v = 0; v < op_preds.size(); ++v)
    for (int u : op_preds[v]) edges.emplace_back(u, static_cast<int>(v));
  dag.add_edges(edges);
  return graph::kahn_order(dag);
}

// A cycle among ops not placed by kahn(): walk predecessors inside the remainder until a repeat.
std::vector<int> some_cycle(const std::vector<std::vector<int>>& op_preds, const std::vector<char>& placed) {
  int start = -1;
  for (size_t v = 0; v < placed.size(); ++v)
    if (!placed[v]) start = static_cast<int>(v);
  std::vector<int> pos(placed.size(), -1), path;
  int v = start;
  while (pos[v] < 0) {
    pos[v] = static_cast<int>(path.size());
    path.push_back(v);
    for (int u : op_preds[v])
      if (!placed[u]) {
        v = u;
        break;
      }
  }
  std::vector<int> cycle(path.begin() + pos[v], path.end());
  std::reverse(cycle.begin(), cycle.end());  // walked backwards along edges
  return cycle;
}

}  // namespace

namespace {

/// Where each graph input and op name lives in the model.
struct Names {
  std::unordered_map<std::string, int> input, op;
};

Names check_names(const Model& m, const std::string& where) {
  Names n;
  for (size_t i = 0; i < m.inputs.size(); ++i) {
    const Input& in = m.inputs[i];
    GP_CHECK(!in.name.empty(), "{}: inputs[{}]: empty name", where, i);
    GP_CHECK(n.input.emplace(in.name, static_cast<int>(i)).second, "{}: duplicate name \"{}\" (inputs)", where,
             in.name);
    GP_CHECK(!in.shape.empty() && in.shape[0] == kBatch,
             "{}: input \"{}\": shape {} must start with the batch dimension -1", where, in.name, shape_str(in.shape));
    for (size_t d = 1; d < in.shape.size(); ++d)
      GP_CHECK(in.shape[d] > 0, "{}: input \"{}\": shape {} has a non-positive dimension", where, in.name,
               shape_str(in.shape));
    GP_CHECK(within_limits(in.shape), "{}: input \"{}\": shape {} has more than 2^40 elements per sample", where,
             in.name, shape_str(in.shape));
  }
  for (size_t i = 0; i < m.ops.size(); ++i) {
    const std::string& name = m.ops[i].name;
    GP_CHECK(!name.empty(), "{}: ops[{}]: empty name", where, i);
    auto [it, fresh] = n.op.emplace(name, static_cast<int>(i));
    GP_CHECK(fresh, "{}: duplicate op name \"{}\" (ops[{}] and ops[{}])", where, name, it->second, i);
    GP_CHECK(!n.input.count(name), "{}: op \"{}\" has the same name as a graph input", where, name);
  }
  return n;
}

/// Each op's producing ops (graph inputs left out); every input must name an op or a graph input.
std::vector<std::vector<int>> op_predecessors(const Model& m, const Names& n, const std::string& where) {
  std::vector<std::vector<int>> preds(m.ops.size());
  for (size_t i = 0; i < m.ops.size(); ++i) {
    const Op& op = m.ops[i];
    GP_CHECK(!op.inputs.empty(), "{}: op \"{}\" has no inputs", where, op.name);
    for (size_t k = 0; k < op.inputs.size(); ++k) {
      const std::string& src = op.inputs[k];
      if (auto it = n.op.find(src); it != n.op.end()) preds[i].push_back(it->second);
      else GP_CHECK(n.input.count(src), "{}: op \"{}\": inputs[{}]: unknown input \"{}\"", where, op.name, k, src);
    }
  }
  return preds;
}

/// A topological order of the ops, or a UserError naming one cycle.
std::vector<int> acyclic_order(const Model& m, const std::vector<std::vector<int>>& preds, const std::string& where) {
  std::vector<int> order = kahn(preds);
  if (order.size() == m.ops.size()) return order;
  std::vector<char> placed(m.ops.size(), 0);
  for (int v : order) placed[v] = 1;
  std::vector<int> cyc = some_cycle(preds, placed);
  std::string names;
  for (int v : cyc) names += "\"" + m.ops[v].name + "\" -> ";
  names += "\"" + m.ops[cyc.front()].name + "\"";
  throw UserError(fmt::format("{}: the graph has a cycle: {}", where, names));
}

/// One op's input dtypes against its kind, and its declared output shape against the inferred one.
void check_op_types(const Model& m, const Names& n, const Op& op, const std::string& where) {
  std::vector<Shape> shapes;
  std::vector<DType> dts;
  for (const std::string& src : op.inputs) {
    if (auto it = n.op.find(src); it != n.op.end()) {
      shapes.push_back(m.ops[it->second].output_shape);
      dts.push_back(m.ops[it->second].dtype);
    } else {
      shapes.push_back(m.inputs[n.input.at(src)].shape);
      dts.push_back(m.inputs[n.input.at(src)].dtype);
    }
  }
  // Data movement keeps its input's type: index tensors (ids[:, k]) may be sliced, gathered, reshaped.
  const bool movement = moves_data(op.kind);
  for (size_t k = 0; k < dts.size() && movement; ++k)
    GP_CHECK((dts[k] == DType::i64) == (op.dtype == DType::i64),
             "{}: op \"{}\" ({}): input {} (\"{}\") is {}, but the op's dtype is {} (data movement keeps the type)",
             where, op.name, to_string(op.kind), k, op.inputs[k], to_string(dts[k]), to_string(op.dtype));
  for (size_t k = 0; k < dts.size() && !movement; ++k) {
    if (op.kind == OpKind::attention && static_cast<int>(k) == attention_inputs(op, where).mask)
      continue;  // a padding mask: i64 or floating, 0 / 1
    bool want_int = ((op.kind == OpKind::embedding_bag || op.kind == OpKind::embedding) && k == 0) ||
                    (op.kind == OpKind::cross_entropy && k == 1);
    bool is_int = dts[k] == DType::i64;
    GP_CHECK(want_int == is_int, "{}: op \"{}\" ({}): input {} (\"{}\") is {}, expected {}", where, op.name,
             to_string(op.kind), k, op.inputs[k], to_string(dts[k]), want_int ? "i64" : "a floating type");
  }
  GP_CHECK(op.dtype != DType::i64 || movement,
           "{}: op \"{}\": output dtype i64 is only supported for data movement (slice, gather, reshape, flatten, "
           "transpose of an index input)",
           where, op.name);
  Shape inferred = infer_shape(op, shapes, where);
  GP_CHECK(within_limits(inferred), "{}: op \"{}\" ({}): output shape {} has more than 2^40 elements per sample", where,
           op.name, to_string(op.kind), shape_str(inferred));
  GP_CHECK(inferred == op.output_shape,
           "{}: op \"{}\" ({}): shape mismatch: declared output shape {} but its inputs give {}", where, op.name,
           to_string(op.kind), shape_str(op.output_shape), shape_str(inferred));
}

/// Outputs name ops, and every op reaches one.
void check_outputs(const Model& m, const Names& n, const std::vector<std::vector<int>>& preds,
                   const std::string& where) {
  GP_CHECK(!m.outputs.empty(), "{}: no outputs (name the loss op in \"outputs\")", where);
  std::vector<char> live(m.ops.size(), 0);
  std::vector<int> stack;
  for (const std::string& out : m.outputs) {
    auto it = n.op.find(out);
    GP_CHECK(it != n.op.end(), "{}: outputs: unknown op \"{}\"", where, out);
    if (!live[it->second]) {
      live[it->second] = 1;
      stack.push_back(it->second);
    }
  }
  while (!stack.empty()) {
    int v = stack.back();
    stack.pop_back();
    for (int u : preds[v])
      if (!live[u]) {
        live[u] = 1;
        stack.push_back(u);
      }
  }
  for (size_t i = 0; i < m.ops.size(); ++i)
    GP_CHECK(live[i], "{}: op \"{}\" has no path to an output ({})", where, m.ops[i].name, m.outputs.front());
}

}  // namespace

std::vector<int> validate(const Model& m, const std::string& where) {
  const Names names = check_names(m, where);
  const std::vector<std::vector<int>> preds = op_predecessors(m, names, where);
  std::vector<int> order = acyclic_order(m, preds, where);
  for (int i : order) check_op_types(m, names, m.ops[i], where);  // shapes and dtypes in topological order
  check_outputs(m, names, preds, where);
  validate_shared_params(m, where);
  return order;
}

Graph Graph::build(Model model, const std::string& where) {
  std::vector<int> order = validate(model, where);
  Graph g;
  g.model_.name = std::move(model.name);
  g.model_.inputs = std::move(model.inputs);
  g.model_.outputs = std::move(model.outputs);
  g.model_.shared_params = std::move(model.shared_params);
  for (int i : order) g.model_.ops.push_back(std::move(model.ops[i]));
  const size_t n = g.model_.ops.size();
  for (size_t i = 0; i < n; ++i) g.index_.emplace(g.model_.ops[i].name, static_cast<int32_t>(i));
  g.preds_.resize(n);
  g.succs_.resize(n);
  g.graph_inputs_.resize(n);
  g.costs_.resize(n);
  for (size_t i = 0; i < n; ++i) {
    const Op& op = g.model_.ops[i];
    std::vector<Shape> shapes;
    std::vector<DType> dts;
    for (const std::string& src : op.inputs) {
      OpId p = g.find(src);
      if (p.valid()) {
        if (std::find(g.preds_[i].begin(), g.preds_[i].end(), p) == g.preds_[i].end()) {
          g.preds_[i].push_back(p);
          g.succs_[p.v].push_back(OpId(static_cast<int32_t>(i)));
        }
        shapes.push_back(g.model_.ops[p.v].output_shape);
        dts.push_back(g.model_.ops[p.v].dtype);
      } else {
        const Input* in = g.find_input(src);
        int idx = static_cast<int>(in - g.model_.inputs.data());
        if (std::find(g.graph_inputs_[i].begin(), g.graph_inputs_[i].end(), idx) == g.graph_inputs_[i].end())
          g.graph_inputs_[i].push_back(idx);
        shapes.push_back(in->shape);
        dts.push_back(in->dtype);
      }
    }
    g.costs_[i] = derive_costs(op, shapes, dts);
  }
  g.link_shared_params(where);
  return g;
}

OpId Graph::find(const std::string& op_name) const {
  auto it = index_.find(op_name);
  return it == index_.end() ? OpId() : OpId(it->second);
}

const Input* Graph::find_input(const std::string& name) const {
  for (const Input& in : model_.inputs)
    if (in.name == name) return &in;
  return nullptr;
}

const Shape& Graph::shape_of(const std::string& name) const {
  if (OpId id = find(name); id.valid()) return op(id).output_shape;
  const Input* in = find_input(name);
  GP_CHECK(in, "{}: no op or graph input named \"{}\"", model_.name, name);
  return in->shape;
}

int64_t Graph::attention_keys(OpId id) const {
  const Op& o = op(id);
  const Shape& s = shape_of(o.inputs.at(static_cast<size_t>(attention_inputs(o, model_.name).kv)));
  return s.size() >= 2 ? s[1] : 1;
}

namespace {
template <class F>
double sum_costs(const std::vector<OpCosts>& costs, F field) {
  double s = 0;
  for (const auto& c : costs) s += static_cast<double>(c.*field);
  return s;
}
}  // namespace

int64_t Graph::total_params() const {
  int64_t s = 0;
  for (const auto& c : costs_) s += c.params;
  return s;
}
double Graph::total_fwd_flops() const { return sum_costs(costs_, &OpCosts::fwd_flops); }
double Graph::total_bwd_flops() const { return sum_costs(costs_, &OpCosts::bwd_flops); }
double Graph::total_saved_bytes() const { return sum_costs(costs_, &OpCosts::saved_bytes); }

std::string ModelBuilder::input(const std::string& name, Shape per_sample_shape, DType dt) {
  Shape s{kBatch};
  s.insert(s.end(), per_sample_shape.begin(), per_sample_shape.end());
  m_.inputs.push_back(Input{name, s, dt});
  shapes_[name] = s;
  dtypes_[name] = dt;
  return name;
}

std::string ModelBuilder::op(const std::string& name, OpKind kind, std::vector<std::string> inputs, Json attrs) {
  Op o;
  o.name = name;
  o.kind = kind;
  o.inputs = std::move(inputs);
  o.attrs = std::move(attrs);
  std::vector<Shape> shapes;
  for (const std::string& src : o.inputs) {
    auto it = shapes_.find(src);
    GP_CHECK(it != shapes_.end(), "model \"{}\": op \"{}\": unknown input \"{}\"", m_.name, name, src);
    shapes.push_back(it->second);
  }
  o.output_shape = infer_shape(o, shapes, "model \"" + m_.name + "\"");
  GP_CHECK(shapes_.emplace(name, o.output_shape).second, "model \"{}\": duplicate op name \"{}\"", m_.name, name);
  dtypes_[name] = o.dtype;
  m_.ops.push_back(std::move(o));
  return name;
}

std::string ModelBuilder::linear(const std::string& name, const std::string& x, int64_t out, bool bias) {
  Json a = {{"out_features", out}};
  if (!bias) a["bias"] = false;
  return op(name, OpKind::linear, {x}, a);
}

const Shape& ModelBuilder::shape_of(const std::string& name) const {
  auto it = shapes_.find(name);
  GP_CHECK(it != shapes_.end(), "model \"{}\": unknown tensor \"{}\"", m_.name, name);
  return it->second;
}

}  // namespace gp::ir
