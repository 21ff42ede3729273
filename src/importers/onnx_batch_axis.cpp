// Regions where the batch is a dimension of its own but not dim 0, mapped node by node (see
// onnx_patterns.h, map_batch_axis_region). The IR keeps the batch in dim 0 of every tensor, so each
// ONNX tensor t of the region is represented by its canonical form: t with the batch axis moved to
// the front and the other dimensions in their order. Every node is rewritten against those forms:
// a Transpose becomes the permutation of the non-batch dimensions (or nothing), a Reshape one of the
// per-sample dimensions when the batch keeps its place among them, a Gather / GatherND of constant
// indices a `gather` over the canonical axis, elementwise ops and reductions the same op over the
// moved axis. What needs the batch merged with another dimension is refused naming the node.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <numeric>

#include "importers/onnx_patterns.h"

namespace gp::importers::onnx_detail {
namespace {

constexpr const char* kInternal = "\x01";  // prefix of IR-only intermediate tensors (Mapper::finish)

struct BatchAxisMapper {
  Mapper& mp;
  const Net& net;

  // The batch's axis in tensor t, or -1 when it has none or shares a dimension with another factor.
  int batch_axis(const std::string& t) const {
    const auto& ti = net.at(t);
    if (!ti.shape) return -1;
    int axis = -1;
    for (size_t k = 0; k < ti.shape->size(); ++k) {
      const int64_t d = (*ti.shape)[k];
      if (d == kProbeBatch && axis < 0) axis = static_cast<int>(k);
      else if (d % kProbeBatch == 0) return -1;
    }
    return axis;
  }
  // The canonical index of dimension d of a tensor whose batch is at axis a.
  static int64_t cidx(int64_t d, int64_t a) { return d == a ? 0 : (d < a ? d + 1 : d); }
  // The canonical shape (batch first as ir::kBatch, the others in order).
  ir::Shape canonical(const std::string& t) const {
    const auto& s = net.shape(t);
    const int a = batch_axis(t);
    ir::Shape out{ir::kBatch};
    for (size_t k = 0; k < s.size(); ++k)
      if (static_cast<int>(k) != a) out.push_back(s[k]);
    return out;
  }
  static std::vector<int64_t> per_sample(const ir::Shape& s) { return {s.begin() + 1, s.end()}; }

  std::string emit(const std::string& name, ir::OpKind kind, std::vector<std::string> in, const std::string& y,
                   Json attrs, const ir::Shape& shape) {
    return mp.emit(name, kind, std::move(in), y, std::move(attrs), &shape);
  }
  // An IR op with no ONNX tensor of its own; returns the name its readers use.
  std::string intermediate(const std::string& name, ir::OpKind kind, std::vector<std::string> in, Json attrs,
                           const ir::Shape& shape) {
    const std::string op = mp.emit(name, kind, std::move(in), "", std::move(attrs), &shape);
    mp.producer_of[kInternal + op] = op;
    return kInternal + op;
  }
  // y is x in canonical form (a Transpose or Reshape that changes nothing the IR sees).
  void alias(const std::string& y, const std::string& x) { mp.alias[y] = x; }

  std::string transpose(const onnx::NodeProto& n) {
    const std::string &x = n.input(0), &y = n.output(0);
    const int64_t a = batch_axis(x), rank = static_cast<int64_t>(net.shape(x).size());
    std::vector<int64_t> p = attr_ints(n, "perm");
    if (p.empty())
      for (int64_t k = rank - 1; k >= 0; --k) p.push_back(k);
    std::vector<int64_t> q{0};
    for (int64_t p_j : p)
      if (p_j != a) q.push_back(cidx(p_j, a));
    bool same = true;
    for (size_t k = 0; k < q.size(); ++k) same = same && q[k] == static_cast<int64_t>(k);
    if (same) alias(y, x);
    else emit(n.name(), ir::OpKind::transpose, {x}, y, Json{{"perm", q}}, canonical(y));
    return "";
  }

  // Reshape / Flatten / Squeeze / Unsqueeze: a reshape of the per-sample dimensions when as many
  // elements come before the batch in the output as in the input (the batch keeps its place).
  std::string reshape(const onnx::NodeProto& n) {
    const std::string &x = n.input(0), &y = n.output(0);
    const auto &xs = net.shape(x), &ys = net.shape(y);
    const int a = batch_axis(x), b = batch_axis(y);
    const auto before = [](const std::vector<int64_t>& s, int upto) {
      int64_t p = 1;
      for (int k = 0; k < upto; ++k) p *= s[static_cast<size_t>(k)];
      return p;
    };
    if (before(xs, a) != before(ys, b))
      return fmt::format("reshapes [{}] to [{}], which moves data across the batch dimension", fmt::join(xs, ", "),
                         fmt::join(ys, ", "));
    const ir::Shape cy = canonical(y);
    if (cy == canonical(x)) alias(y, x);
    else emit(n.name(), ir::OpKind::reshape, {x}, y, Json{{"shape", per_sample(cy)}}, cy);
    return "";
  }

  // Gather(x, constant indices) along a non-batch axis.
  std::string gather(const onnx::NodeProto& n) {
    const std::string &x = n.input(0), &y = n.output(0);
    const auto& idx = net.at(n.input(1));
    const int64_t a = batch_axis(x), rank = static_cast<int64_t>(net.shape(x).size());
    int64_t axis = attr_i(n, "axis", 0);
    if (axis < 0) axis += rank;
    if (idx.activation || !idx.ints) return "the indices are not a constant it can read";
    if (axis == a) return "it gathers along the batch dimension";
    if (idx.value_shape.size() > 1) return "the indices have more than one dimension";
    const int64_t dim = net.shape(x)[static_cast<size_t>(axis)];
    std::vector<int64_t> list = *idx.ints;
    for (int64_t& i : list) i = i < 0 ? i + dim : i;
    const int64_t c = cidx(axis, a);
    if (!idx.value_shape.empty()) {
      emit(n.name(), ir::OpKind::gather, {x}, y, Json{{"axis", c}, {"indices", list}}, canonical(y));
      return "";
    }
    ir::Shape picked = canonical(x);
    picked[static_cast<size_t>(c)] = 1;
    const std::string g = intermediate(n.name() + "/gather", ir::OpKind::gather, {x},
                                       Json{{"axis", c}, {"indices", list}}, picked);
    emit(n.name(), ir::OpKind::reshape, {g}, y, Json{{"shape", per_sample(canonical(y))}}, canonical(y));
    return "";
  }

  // GatherND(x, constant indices [..., k]) with batch_dims 0 and the batch after the k indexed
  // dimensions: the indexed dimensions flattened into one, a gather of the flat positions, a reshape
  // to the output (DLRM's Z[:, li, lj] as torch.export writes it: Transpose, GatherND, Transpose).
  std::string gather_nd(const onnx::NodeProto& n) {
    const std::string &x = n.input(0), &y = n.output(0);
    const auto& idx = net.at(n.input(1));
    const auto& xs = net.shape(x);
    const int64_t a = batch_axis(x);
    if (attr_i(n, "batch_dims", 0) != 0) return "batch_dims is not 0";
    if (idx.activation || !idx.ints || idx.value_shape.empty()) return "the indices are not a constant it can read";
    const int64_t k = idx.value_shape.back();
    if (k < 1 || a < k) return "it indexes the batch dimension";
    int64_t flat = 1;
    for (int64_t d = 0; d < k; ++d) flat *= xs[static_cast<size_t>(d)];
    std::vector<int64_t> list;
    for (size_t i = 0; i < idx.ints->size(); i += static_cast<size_t>(k)) {
      int64_t pos = 0;
      for (int64_t d = 0; d < k; ++d) {
        int64_t v = (*idx.ints)[i + static_cast<size_t>(d)], dim = xs[static_cast<size_t>(d)];
        if (v < 0) v += dim;
        if (v < 0 || v >= dim) return fmt::format("index {} is outside [0, {}) for dimension {}", v, dim, d);
        pos = pos * dim + v;
      }
      list.push_back(pos);
    }
    ir::Shape flat_shape{ir::kBatch, flat};  // the canonical input with dims [0, k) flattened
    for (size_t d = static_cast<size_t>(k); d < xs.size(); ++d)
      if (static_cast<int64_t>(d) != a) flat_shape.push_back(xs[d]);
    std::string in = x;
    if (flat_shape != canonical(x))
      in = intermediate(n.name() + "/flatten", ir::OpKind::reshape, {x}, Json{{"shape", per_sample(flat_shape)}},
                        flat_shape);
    ir::Shape picked = flat_shape;
    picked[1] = static_cast<int64_t>(list.size());
    const ir::Shape cy = canonical(y);
    if (picked == cy) {
      emit(n.name(), ir::OpKind::gather, {in}, y, Json{{"axis", 1}, {"indices", list}}, cy);
      return "";
    }
    const std::string g = intermediate(n.name() + "/gather", ir::OpKind::gather, {in},
                                       Json{{"axis", 1}, {"indices", list}}, picked);
    emit(n.name(), ir::OpKind::reshape, {g}, y, Json{{"shape", per_sample(cy)}}, cy);
    return "";
  }

  // ReduceSum / ReduceMean over one non-batch axis; Softmax over one.
  std::string along_axis(const onnx::NodeProto& n, ir::OpKind kind) {
    const std::string &x = n.input(0), &y = n.output(0);
    const int64_t a = batch_axis(x), rank = static_cast<int64_t>(net.shape(x).size());
    std::vector<int64_t> axes;
    if (kind == ir::OpKind::softmax) {
      axes.push_back(attr_i(n, "axis", -1));
    } else if (n.input_size() > 1 && !n.input(1).empty()) {
      const auto& ax = net.at(n.input(1));
      if (!ax.ints) return "the axes are not a constant";
      axes = *ax.ints;
    } else {
      axes = attr_ints(n, "axes");
    }
    if (axes.size() != 1) return "it reduces over other than one axis";
    const int64_t axis = axes[0] < 0 ? axes[0] + rank : axes[0];
    if (axis == a) return "it reduces over the batch dimension";
    Json attrs{{"axis", cidx(axis, a)}};
    if (kind != ir::OpKind::softmax) attrs["keepdim"] = attr_i(n, "keepdims", 1) != 0;
    emit(n.name(), kind, {x}, y, attrs, canonical(y));
    return "";
  }

  // Elementwise ops and MatMul of activations: the same op on the canonical forms, when every
  // activation operand has the batch at the same axis and the same shape (MatMul: a leading axis).
  std::string same_layout(const onnx::NodeProto& n, ir::OpKind kind) {
    const std::string& y = n.output(0);
    const int b = batch_axis(y);
    std::vector<std::string> in;
    for (const auto& t : n.input()) {
      if (t.empty()) continue;
      if (!net.at(t).activation) return "an operand is a constant or parameter";
      if (batch_axis(t) != b || net.shape(t).size() != net.shape(y).size())
        return "its operands do not have the batch at the same axis";
      in.push_back(t);
    }
    if (kind == ir::OpKind::matmul && b >= static_cast<int>(net.shape(y).size()) - 2)
      return "the batch is one of the two multiplied dimensions";
    emit(n.name(), kind, in, y, Json::object(), canonical(y));
    return "";
  }

  std::string map(const onnx::NodeProto& n) {
    const std::string& op = n.op_type();
    for (const auto* list : {&n.input(), &n.output()})
      for (const auto& t : *list) {
        if (t.empty() || !net.at(t).activation) continue;
        if (!net.at(t).shape) return fmt::format("ONNX shape inference could not determine the shape of \"{}\"", t);
        if (batch_axis(t) < 0)
          return fmt::format("\"{}\" [{}] has no batch dimension of its own", t, fmt::join(net.shape(t), ", "));
      }
    if (op == "LSTM" || op == "GRU" || op == "RNN")
      return fmt::format(
          "a recurrent layer (nn.{}) is not supported yet: the IR has no recurrent op, and neither of "
          "torch's exporters writes it as other ops, so no export of it imports",
          op);
    if (op == "Transpose") return transpose(n);
    if (op == "Reshape" || op == "Flatten" || op == "Squeeze" || op == "Unsqueeze") return reshape(n);
    if (op == "Gather") return gather(n);
    if (op == "GatherND") return gather_nd(n);
    if (op == "ReduceSum") return along_axis(n, ir::OpKind::sum);
    if (op == "ReduceMean") return along_axis(n, ir::OpKind::mean);
    if (op == "Softmax") return along_axis(n, ir::OpKind::softmax);
    if (op == "Identity") {
      alias(n.output(0), n.input(0));
      return "";
    }
    if (op == "Relu") return same_layout(n, ir::OpKind::relu);
    if (op == "Sigmoid") return same_layout(n, ir::OpKind::sigmoid);
    if (op == "Tanh") return same_layout(n, ir::OpKind::tanh);
    if (op == "Add") return same_layout(n, ir::OpKind::add);
    if (op == "Mul") return same_layout(n, ir::OpKind::mul);
    if (op == "MatMul") return same_layout(n, ir::OpKind::matmul);
    return fmt::format("{} is not mapped with the batch outside dim 0", op);
  }
};

}  // namespace

std::string map_batch_axis_region(Mapper& mp, const std::vector<int>& nodes) {
  BatchAxisMapper bm{mp, mp.net};
  for (int i : nodes) {
    const auto& n = mp.net.nodes[static_cast<size_t>(i)];
    if (std::string why = bm.map(n); !why.empty()) return fmt::format("{}: {}", node_label(n), why);
  }
  return "";
}

}  // namespace gp::importers::onnx_detail
