// nn.EmbeddingBag's Loops read back as Gather + reduction, and every other Loop refused (see
// onnx_graph.h: rewrite_bag_loops, refuse_loops). Both run on the parsed graph before shape inference.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cstring>
#include <functional>
#include <map>
#include <optional>
#include <set>

#include "importers/onnx_graph.h"
#include "support/error.h"

namespace gp::importers::onnx_detail {
namespace {

// Names every tensor a graph (and the graphs nested in its nodes) reads.
void names_read(const onnx::GraphProto& g, std::set<std::string>& out) {
  for (const auto& n : g.node()) {
    for (const auto& in : n.input()) out.insert(in);
    for (const auto& a : n.attribute())
      if (a.has_g()) names_read(a.g(), out);
  }
}

// nn.EmbeddingBag over 2-d indices [B, bag] (mode "sum" or "mean", no per-sample weights), which both
// of torch's exporters write as a Loop over the bags (the TorchScript exporter gathers each bag's rows
// inside the body; torch.export gathers every row before the Loop, scales them by per-sample weights
// of 1 and sums slices in an If), becomes what it computes: Gather(table, indices) [B, bag, dim] and
// a ReduceSum / ReduceMean over the bag axis. The indices are the 1-d index tensor traced back
// through its Reshapes to where it has the batch's shape; that it is [B, bag] is checked once shapes
// are inferred (Net::bag_indices). A Loop that is not such a bag is left to refuse_loops.
struct BagLoop {
  std::string table, indices, result, mode;
  std::vector<int> dead;  // nodes only the Loop's bag computation uses: removed with it
};

std::optional<BagLoop> read_bag_loop(const onnx::GraphProto& g, int loop) {
  std::map<std::string, int> producer;
  std::map<std::string, std::vector<int>> readers;
  for (int i = 0; i < g.node_size(); ++i) {
    for (const auto& o : g.node(i).output()) producer[o] = i;
    for (const auto& in : g.node(i).input()) readers[in].push_back(i);
  }
  std::map<std::string, const onnx::TensorProto*> inits;
  for (const auto& t : g.initializer()) inits[t.name()] = &t;
  auto op_of = [&](const std::string& t) {
    auto it = producer.find(t);
    return it == producer.end() ? std::string() : g.node(it->second).op_type();
  };
  // What the body reads from outside, and how it reduces.
  std::set<std::string> outer;
  std::string mode;
  bool other_reduce = false;
  std::function<void(const onnx::GraphProto&)> scan = [&](const onnx::GraphProto& body) {
    for (const auto& n : body.node()) {
      for (const auto& in : n.input()) outer.insert(in);
      // mode "mean": torch.export averages the last bag as a ReduceSum divided by its length, the
      // others by ReduceMean; a ReduceMean anywhere makes it a mean.
      if (n.op_type() == "ReduceSum" && mode.empty()) mode = "sum";
      else if (n.op_type() == "ReduceMean") mode = "mean";
      else if (n.op_type() == "ReduceMax" || n.op_type() == "ReduceMin" || n.op_type() == "Mul") other_reduce = true;
      for (const auto& a : n.attribute())
        if (a.has_g()) scan(a.g());
    }
  };
  const onnx::NodeProto& L = g.node(loop);
  for (const auto& a : L.attribute())
    if (a.has_g()) scan(a.g());
  if (other_reduce || (mode != "sum" && mode != "mean")) return std::nullopt;
  BagLoop b;
  b.mode = mode;
  // The rows: a 2-d initializer gathered inside the body, or Gather(table, idx) outside read by it
  // (through a Mul by ones and Identity).
  std::string idx;
  for (const auto& name : outer)
    if (auto it = inits.find(name); it != inits.end() && it->second->dims_size() == 2) {
      if (!b.table.empty()) return std::nullopt;
      b.table = name;
    }
  if (!b.table.empty()) {  // TorchScript: the body slices an outer 1-d index tensor
    std::function<void(const onnx::GraphProto&)> find_idx = [&](const onnx::GraphProto& body) {
      for (const auto& n : body.node()) {
        if (n.op_type() == "Slice" && !n.input(0).empty() && producer.count(n.input(0)) && outer.count(n.input(0)) &&
            op_of(n.input(0)) == "Reshape")
          idx = n.input(0);
        for (const auto& a : n.attribute())
          if (a.has_g()) find_idx(a.g());
      }
    };
    for (const auto& a : L.attribute())
      if (a.has_g()) find_idx(a.g());
  } else {  // torch.export: rows gathered before the Loop
    for (const auto& name : outer) {
      std::string t = name;
      for (int guard = 0; guard < 6 && !t.empty(); ++guard) {
        auto p = producer.find(t);
        if (p == producer.end()) break;
        const onnx::NodeProto& n = g.node(p->second);
        if (n.op_type() == "Identity") {
          t = n.input(0);
        } else if (n.op_type() == "Mul") {  // per-sample weights: must be ones
          std::string w = n.input(1);
          while (producer.count(w) && (op_of(w) == "Unsqueeze" || op_of(w) == "Expand" || op_of(w) == "Reshape"))
            w = g.node(producer.at(w)).input(0);
          auto it = inits.find(w);
          if (it == inits.end()) return std::nullopt;
          const onnx::TensorProto& c = *it->second;
          float one = 0;
          if (c.data_type() != onnx::TensorProto::FLOAT) return std::nullopt;
          if (c.float_data_size() == 1) one = c.float_data(0);
          else if (c.raw_data().size() == 4) std::memcpy(&one, c.raw_data().data(), 4);
          if (one != 1.0f) return std::nullopt;
          b.dead.push_back(p->second);
          t = n.input(0);
        } else if (n.op_type() == "Gather" && inits.count(n.input(0)) && inits.at(n.input(0))->dims_size() == 2) {
          if (!b.table.empty() && b.table != n.input(0)) return std::nullopt;
          b.table = n.input(0);
          idx = n.input(1);
          b.dead.push_back(p->second);
          break;
        } else {
          break;
        }
      }
    }
  }
  if (b.table.empty() || idx.empty()) return std::nullopt;
  // The indices: back through Reshapes / Flatten / Squeeze to the tensor before them.
  for (int guard = 0; guard < 6 && producer.count(idx); ++guard) {
    const std::string op = op_of(idx);
    if (op != "Reshape" && op != "Flatten" && op != "Squeeze" && op != "Identity") break;
    idx = g.node(producer.at(idx)).input(0);
  }
  b.indices = idx;
  // The result: the Loop's first read output, through ConcatFromSequence / Cast / Identity.
  std::string r;
  for (const auto& o : L.output())
    if (readers.count(o)) {
      r = o;
      break;
    }
  if (r.empty()) return std::nullopt;
  for (int guard = 0; guard < 4; ++guard) {
    const auto& rd = readers[r];
    if (rd.size() != 1) break;
    const std::string& op = g.node(rd[0]).op_type();
    if (op != "ConcatFromSequence" && op != "Cast" && op != "Identity") break;
    r = g.node(rd[0]).output(0);
  }
  b.result = r;
  return b;
}

// Rewrites each nn.EmbeddingBag Loop (read_bag_loop); returns the bags' index tensors.
}  // namespace

std::vector<std::string> rewrite_bag_loops(onnx::GraphProto& g, int opset) {
  std::vector<std::string> indices;
  std::set<int> remove;
  std::vector<onnx::NodeProto> added;
  for (int i = 0; i < g.node_size(); ++i) {
    if (g.node(i).op_type() != "Loop") continue;
    std::optional<BagLoop> b = read_bag_loop(g, i);
    if (!b) continue;
    remove.insert(i);
    for (int d : b->dead) remove.insert(d);
    const std::string rows = b->result + "/bag_rows";
    onnx::NodeProto gather;
    gather.set_op_type("Gather");
    gather.set_name(g.node(i).name() + "/bag_gather");
    gather.add_input(b->table);
    gather.add_input(b->indices);
    gather.add_output(rows);
    onnx::NodeProto reduce;
    reduce.set_op_type(b->mode == "sum" ? "ReduceSum" : "ReduceMean");
    reduce.set_name(g.node(i).name() + "/bag_" + b->mode);
    reduce.add_input(rows);
    const bool axes_input = b->mode == "sum" ? opset >= 13 : opset >= 18;
    if (axes_input) {
      onnx::TensorProto* axes = g.add_initializer();
      axes->set_name(b->result + "/bag_axes");
      axes->set_data_type(onnx::TensorProto::INT64);
      axes->add_dims(1);
      axes->add_int64_data(1);
      reduce.add_input(axes->name());
    } else {
      auto* a = reduce.add_attribute();
      a->set_name("axes");
      a->set_type(onnx::AttributeProto::INTS);
      a->add_ints(1);
    }
    auto* k = reduce.add_attribute();
    k->set_name("keepdims");
    k->set_type(onnx::AttributeProto::INT);
    k->set_i(0);
    reduce.add_output(b->result);
    added.push_back(gather);
    added.push_back(reduce);
    indices.push_back(b->indices);
  }
  if (remove.empty()) return indices;
  // The nodes between the Loop and its result (ConcatFromSequence, Cast) write the result no more.
  std::set<std::string> results;
  for (const auto& n : added) results.insert(n.output(0));
  for (int i = 0; i < g.node_size(); ++i)
    for (const auto& o : g.node(i).output())
      if (results.count(o)) remove.insert(i);
  onnx::GraphProto kept;
  for (int i = 0; i < g.node_size(); ++i)
    if (!remove.count(i)) *kept.add_node() = g.node(i);
  for (auto& n : added) *kept.add_node() = std::move(n);
  g.mutable_node()->Swap(kept.mutable_node());
  // What only the Loops used (offsets, bag counts, the per-row index arithmetic) is dead now.
  for (bool changed = true; changed;) {
    changed = false;
    std::set<std::string> read;
    for (const auto& n : g.node()) {
      for (const auto& in : n.input()) read.insert(in);
      for (const auto& a : n.attribute())
        if (a.has_g()) names_read(a.g(), read);
    }
    for (const auto& o : g.output()) read.insert(o.name());
    for (int i = g.node_size() - 1; i >= 0; --i) {
      bool used = false;
      for (const auto& o : g.node(i).output()) used = used || read.count(o);
      if (!used) {
        g.mutable_node()->DeleteSubrange(i, 1);
        changed = true;
      }
    }
  }
  return indices;
}

// A Loop is control flow, which the IR does not have; refused before shape inference (which often
// fails on the Loops torch writes). Both of torch's exporters write nn.EmbeddingBag as one: the
// message names the tables whose rows the loop sums (gathered inside its body, or gathered before it
// and read by it, as torch.export writes it) and the module that exports as plain ops.
void refuse_loops(const std::string& path, const onnx::GraphProto& g) {
  int loops = 0;
  std::set<std::string> in_bodies;
  for (const auto& n : g.node())
    if (n.op_type() == "Loop") {
      ++loops;
      for (const auto& a : n.attribute())
        if (a.has_g()) names_read(a.g(), in_bodies);
    }
  if (loops == 0) return;
  std::set<std::string> inits, tables;
  for (const auto& t : g.initializer())
    if (t.dims_size() == 2) inits.insert(t.name());
  std::map<std::string, std::string> table_of;  // tensor -> the table it holds rows of
  for (const auto& n : g.node()) {
    if (n.op_type() == "Gather" && n.input_size() == 2 && inits.count(n.input(0))) {
      table_of[n.output(0)] = n.input(0);
    } else if (n.input_size() > 0 && n.output_size() == 1) {  // rows scaled, renamed (Mul, Identity)
      for (const auto& in : n.input())
        if (auto it = table_of.find(in); it != table_of.end()) table_of[n.output(0)] = it->second;
    }
  }
  for (const auto& [t, table] : table_of)
    if (in_bodies.count(t)) tables.insert(table);
  for (const auto& t : in_bodies)
    if (inits.count(t)) tables.insert(t);
  throw UserError(fmt::format(
      "{}: cannot import the ONNX model (nothing was imported): {} Loop node(s): control flow, which the IR does "
      "not have{}",
      path, loops,
      tables.empty()
          ? ""
          : fmt::format(". They gather rows of {}: both of torch's exporters write nn.EmbeddingBag this way, and "
                        "the importer reads back only mode \"sum\" or \"mean\" over 2-d indices [B, bag] without "
                        "per-sample weights (mode \"max\" is not supported yet; weights can be written as "
                        "(emb(ids) * w.unsqueeze(-1)).sum(1) with nn.Embedding)",
                        fmt::join(tables, ", "))));
}

}  // namespace gp::importers::onnx_detail
