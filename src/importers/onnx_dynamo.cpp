// Files from torch.onnx.export's dynamo exporter (torch 2.x's default, dynamo=True, opset 18+).
//
// Its graph optimizer (onnxscript's rewriter and constant folding) changes which parameters the file
// shows: it drops all-zero biases (RemoveOptionalBiasFromGemm / RemoveOptionalBiasFromConv), points
// equal initializers at one without an Identity (two LayerNorms' all-ones weights), folds the
// transposes of Linear weights on 3-d inputs into anonymous initializers ("val_N") and folds eval-mode
// BatchNorm into the preceding Conv. What it keeps is each node's `pkg.torch.onnx.fx_node` metadata:
// the torch.export node it came from, whose arguments name the module's parameters ("%p_a_0_bias"),
// and the graph's value_info metadata mapping each kept parameter's placeholder to its name.
//
// This pass reads that metadata (a NodeProto / ValueInfoProto field newer than the system libonnx:
// protobuf keeps it as an unknown field) and rewrites the graph into the form the TorchScript
// exporter writes, which the rest of the importer reads: a dropped bias becomes a zero initializer
// named as PyTorch names it; a merge becomes an Identity from the kept initializer to the merged
// parameter's name (so --ties decides, as for TorchScript's default exports); a folded transposed
// copy of a parameter the file no longer holds becomes that parameter (PyTorch's layout) read through
// a Transpose; a folded transposed copy of a parameter the file does hold is recorded as a copy
// (Net::transposed_copy_of: a tie, --ties auto). What it cannot recover is refused, naming it: folded
// BatchNorm above all, whose message names the call that keeps it (optimize=False). A file exported with
// optimize=False keeps what the optimizer would have folded: computed zero biases of bias-free Convs
// (dropped), CastLike of constants (read as the constant) and in-place dropout in training mode as
// bernoulli random ops (read as Dropout).
#include <google/protobuf/unknown_field_set.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstring>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <unordered_map>

#include "importers/onnx_mapper.h"
#include "support/error.h"

namespace gp::importers::onnx_detail {
namespace {

// Field numbers of metadata_props in onnx >= 1.16's NodeProto and ValueInfoProto.
constexpr int kNodeMetadataField = 9;
constexpr int kValueInfoMetadataField = 4;
constexpr int kGraphMetadataField = 16;

std::map<std::string, std::string> metadata_of(const google::protobuf::Message& m, int field) {
  std::map<std::string, std::string> out;
  const google::protobuf::UnknownFieldSet& uf = m.GetReflection()->GetUnknownFields(m);
  for (int i = 0; i < uf.field_count(); ++i) {
    const auto& f = uf.field(i);
    if (f.number() != field || f.type() != google::protobuf::UnknownField::TYPE_LENGTH_DELIMITED) continue;
    onnx::StringStringEntryProto e;
    if (e.ParseFromString(f.length_delimited())) out[e.key()] = e.value();
  }
  return out;
}

// One node's view of the module: the parameter placeholders its fx node reads, the optimizer's rules.
struct FxInfo {
  std::vector<std::string> params;  // placeholders "p_..." in argument order
  std::string rules;                // pkg.onnxscript.rewriter.rule_name
  std::string scope;                // the module path the node ran in ("b.1"), empty at the top
  bool scoped = false;              // the node has name_scopes (nodes the optimizer made have none)
  std::string text;                 // the fx node itself
};

// The placeholders "%p_..." an fx node's text reads from `from` on (a plain scan: std::regex recurses
// per character and a long crafted string would overflow the stack).
std::vector<std::string> placeholders(const std::string& s, size_t from) {
  std::vector<std::string> out;
  auto word = [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; };
  for (size_t k = s.find("%p_", from); k != std::string::npos; k = s.find("%p_", k + 1)) {
    size_t e = k + 1;
    while (e < s.size() && word(s[e])) ++e;
    std::string p = s.substr(k + 1, e - k - 1);
    if (p.size() > 2 && std::find(out.begin(), out.end(), p) == out.end()) out.push_back(std::move(p));
  }
  return out;
}

// The quoted strings of a Python list's text: "['', 'b', 'b.1']" -> "", "b", "b.1".
std::vector<std::string> quoted(const std::string& s) {
  std::vector<std::string> out;
  for (size_t k = s.find('\''); k != std::string::npos;) {
    const size_t e = s.find('\'', k + 1);
    if (e == std::string::npos) break;
    out.push_back(s.substr(k + 1, e - k - 1));
    k = s.find('\'', e + 1);
  }
  return out;
}

FxInfo fx_info(const onnx::NodeProto& n) {
  FxInfo fx;
  const auto md = metadata_of(n, kNodeMetadataField);
  if (auto it = md.find("pkg.onnxscript.rewriter.rule_name"); it != md.end()) fx.rules = it->second;
  if (auto it = md.find("pkg.torch.onnx.fx_node"); it != md.end()) {
    fx.text = it->second;
    const size_t args = it->second.find("args = ");
    fx.params = placeholders(it->second, args == std::string::npos ? 0 : args);
  }
  if (auto it = md.find("pkg.torch.onnx.name_scopes"); it != md.end()) {
    // "['', 'b', 'b.1', 'layer_norm']": the module is the last scope before the op's own name.
    const std::vector<std::string> scopes = quoted(it->second);
    if (scopes.size() >= 2) fx.scope = scopes[scopes.size() - 2];
    fx.scoped = true;
  }
  return fx;
}

// "blocks.0.attn" -> "/blocks.0/attn/": a numeric component (a ModuleList index) stays with its parent.
std::string torchscript_path(const std::string& scope) {
  std::string out = "/";
  size_t start = 0;
  while (start < scope.size()) {
    size_t dot = scope.find('.', start);
    if (dot == std::string::npos) dot = scope.size();
    const std::string part = scope.substr(start, dot - start);
    const bool index = !part.empty() &&
                       std::all_of(part.begin(), part.end(), [](char c) { return c >= '0' && c <= '9'; });
    if (index && out.size() > 1) out.back() = '.';
    out += part + "/";
    start = dot + 1;
  }
  return out;
}

bool mentions_torch_exporter(const onnx::GraphProto& g) {
  for (const auto& n : g.node())
    for (const auto& [k, v] : metadata_of(n, kNodeMetadataField))
      if (k.rfind("pkg.torch.onnx.", 0) == 0) return true;
  return false;
}

std::vector<float> float_values(const std::string& path, const onnx::TensorProto& tp) {
  GP_CHECK(tp.data_type() == onnx::TensorProto::FLOAT, "{}: initializer \"{}\" is not float32", path, tp.name());
  int64_t n = 1;
  for (int64_t d : tp.dims()) n *= d;
  std::vector<float> v(static_cast<size_t>(n));
  if (!tp.raw_data().empty()) {
    GP_CHECK(tp.raw_data().size() == v.size() * sizeof(float), "{}: initializer \"{}\" has {} bytes, expected {}", path,
             tp.name(), tp.raw_data().size(), v.size() * sizeof(float));
    std::memcpy(v.data(), tp.raw_data().data(), tp.raw_data().size());
  } else {
    GP_CHECK(tp.float_data_size() == n, "{}: initializer \"{}\" has {} values, expected {}", path, tp.name(),
             tp.float_data_size(), n);
    std::copy(tp.float_data().begin(), tp.float_data().end(), v.begin());
  }
  return v;
}

onnx::TensorProto float_tensor(const std::string& name, const std::vector<int64_t>& dims, const std::vector<float>& v) {
  onnx::TensorProto tp;
  tp.set_name(name);
  tp.set_data_type(onnx::TensorProto::FLOAT);
  for (int64_t d : dims) tp.add_dims(d);
  tp.set_raw_data(std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float)));
  return tp;
}

std::vector<float> transposed(const std::vector<float>& v, int64_t rows, int64_t cols) {
  std::vector<float> t(v.size());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) t[static_cast<size_t>(c * rows + r)] = v[static_cast<size_t>(r * cols + c)];
  return t;
}

std::string last_component(const std::string& name) {
  const size_t dot = name.rfind('.');
  return dot == std::string::npos ? name : name.substr(dot + 1);
}

// torchvision's Swin relative_position_index for a window wh x ww of n = wh * ww tokens, flattened
// [n * n] (as ops.cpp's window_attention computes it): token i = (hi, wi) reads row
// (hi - hj + wh - 1) (2 ww - 1) + (wi - wj + ww - 1) of the [(2wh-1)(2ww-1), heads] table for token j.
std::vector<int64_t> swin_relative_position_index(int64_t wh, int64_t ww) {
  const int64_t n = wh * ww;
  std::vector<int64_t> index(static_cast<size_t>(n * n));
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < n; ++j)
      index[static_cast<size_t>(i * n + j)] = (i / ww - j / ww + wh - 1) * (2 * ww - 1) + (i % ww - j % ww + ww - 1);
  return index;
}

// The table [rows, heads] whose lookup table[index] viewed [n, n, heads] and permuted to [heads, n, n]
// is `v` (heads * n * n values), or nothing when some entry of `v` differs from the one its row holds.
std::optional<std::vector<float>> ungather(const std::vector<float>& v, const std::vector<int64_t>& index, int64_t rows,
                                           int64_t heads) {
  const auto nn = static_cast<int64_t>(index.size());
  std::vector<float> table(static_cast<size_t>(rows * heads));
  std::vector<bool> seen(static_cast<size_t>(rows), false);
  for (int64_t p = 0; p < nn; ++p) {
    const int64_t r = index[static_cast<size_t>(p)];
    for (int64_t k = 0; k < heads; ++k) {
      const float x = v[static_cast<size_t>(k * nn + p)];
      float& t = table[static_cast<size_t>(r * heads + k)];
      if (!seen[static_cast<size_t>(r)]) t = x;
      else if (std::memcmp(&t, &x, sizeof x) != 0) return std::nullopt;
    }
    seen[static_cast<size_t>(r)] = true;
  }
  if (std::find(seen.begin(), seen.end(), false) != seen.end()) return std::nullopt;  // a row no entry reads
  return table;
}

class Recovery {
 public:
  Recovery(onnx::ModelProto& model, Net& net) : g_(*model.mutable_graph()), net_(net) {}

  void run() {
    read_parameter_names();
    read_signature();
    for (const auto& init : g_.initializer()) inits_[init.name()] = &init;
    refuse_folded_batchnorm();
    ungather_folded_lookups();
    std::vector<FxInfo> fx;
    for (const auto& n : g_.node()) fx.push_back(fx_info(n));
    for (int i = 0; i < g_.node_size(); ++i) drop_computed_zero_bias(i, fx[static_cast<size_t>(i)]);
    alias_castlike_constants();
    rewrite_bernoulli_dropout(fx);
    for (int i = 0; i < g_.node_size(); ++i) recover_inputs(i, fx[static_cast<size_t>(i)]);
    recover_split_merges(fx);
    for (int i = 0; i < g_.node_size(); ++i) restore_dropped_bias(i, fx[static_cast<size_t>(i)]);
    // Op names start as the TorchScript exporter's do, with the module path ("blocks.0.attn.c_attn" ->
    // "/blocks.0/attn/c_attn/node_linear"), so plans and `model info` group a module's ops.
    // A node the optimizer made (no name_scopes) takes the module of its first input's producer.
    std::unordered_map<std::string, std::string> scope_of;
    for (int i = 0; i < g_.node_size(); ++i) {
      onnx::NodeProto& n = *g_.mutable_node(i);
      FxInfo& f = fx[static_cast<size_t>(i)];
      if (!f.scoped && n.input_size() > 0)
        if (auto it = scope_of.find(n.input(0)); it != scope_of.end()) f.scope = it->second;
      for (const auto& o : n.output()) scope_of[o] = f.scope;
      if (!n.name().empty()) n.set_name(torchscript_path(f.scope) + n.name());
    }
    for (const auto& [i, p] : dropout_nodes_)
      recovered_dropouts_.push_back({g_.node(i).name(), fx[static_cast<size_t>(i)].scope, p});
    std::set<std::string> lost;
    for (const auto& f : fx)
      for (const auto& p : f.params)
        if (!present(name_of(p, f.scope))) lost.insert(name_of(p, f.scope));
    GP_CHECK(lost.empty(),
             "{}: torch.onnx.export's dynamo exporter (dynamo=True) optimised away parameter(s) {} in a way the "
             "importer cannot undo (the nodes' pkg.torch.onnx.fx_node metadata names them, but no initializer "
             "holds them or a known transform of them); export with dynamo=False, "
             "training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False (docs/onnx.md, \"Default "
             "exports and ties\")",
             net_.path, fmt::join(lost, ", "));
    for (auto& n : added_nodes_) *g_.add_node() = std::move(n);
    for (auto& t : added_inits_) *g_.add_initializer() = std::move(t);
    for (size_t i = 0; i < fx.size(); ++i) identity_as_strided(*g_.mutable_node(static_cast<int>(i)), fx[i]);
    drop_dead_nodes();
    sort_out_initializers();
    warn();
    net_.dynamo = DynamoRecovery{restored_, unfolded_, folded_, ungathered_, recovered_dropouts_};
  }

 private:
  // The graph's metadata: torch.export's graph signature, one line per input,
  // "p_a_weight: PARAMETER target='a.weight'", "b_a_index: BUFFER target='a.index' persistent=True"; and
  // per folded value, the values it was folded from (value_info pkg.onnxscript.optimizer.folded_from).
  void read_signature() {
    for (const auto& [k, text] : metadata_of(g_, kGraphMetadataField)) {
      if (k != "pkg.torch.export.ExportedProgram.graph_signature") continue;
      for (size_t at = 0; at < text.size();) {
        const size_t end = std::min(text.find('\n', at), text.size());
        const std::string line = text.substr(at, end - at);
        at = end + 1;
        const std::vector<std::string> q = quoted(line);
        if (q.size() != 1) continue;
        if (const size_t colon = line.find(": PARAMETER target="); colon != std::string::npos) {
          signature_params_.insert(q[0]);
          size_t start = 0;
          while (start < colon && line[start] == ' ') ++start;
          signature_target_[line.substr(start, colon - start)] = q[0];
        }
        if (line.find(": BUFFER target=") != std::string::npos) signature_buffers_.insert(q[0]);
      }
    }
    for (const auto& vi : g_.value_info()) {
      const auto md = metadata_of(vi, kValueInfoMetadataField);
      if (auto from = md.find("pkg.onnxscript.optimizer.folded_from"); from != md.end())
        folded_from_[vi.name()] = quoted(from->second);
    }
  }

  // A value the optimizer folded from constants only: its folded_from names no parameter of the
  // signature (Swin's mask fill scalar_tensor_default, from val_43). Known only when the file has both.
  bool folded_from_constants(const std::string& name) const {
    auto it = folded_from_.find(name);
    if (it == folded_from_.end() || signature_params_.empty()) return false;
    return std::none_of(it->second.begin(), it->second.end(),
                        [&](const std::string& s) { return signature_params_.count(s) > 0; });
  }

  // value_info metadata: placeholder "p_a_0_weight" -> initializer "a.0.weight" (kind PARAMETER).
  void read_parameter_names() {
    for (const auto& vi : g_.value_info()) {
      const auto md = metadata_of(vi, kValueInfoMetadataField);
      auto kind = md.find("pkg.torch.export.graph_signature.InputSpec.kind");
      auto orig = md.find("pkg.torch.onnx.original_node_name");
      if (kind != md.end() && kind->second == "PARAMETER" && orig != md.end()) placeholder_[orig->second] = vi.name();
      if (kind != md.end() && (kind->second == "BUFFER" || kind->second == "CONSTANT_TENSOR"))
        buffers_.insert(vi.name());
    }
  }

  // The PyTorch name of a placeholder: from value_info when the file kept the parameter, else from the
  // graph signature, else the node's module path ("b.1") and the placeholder's rest ("p_b_1_bias" ->
  // "b.1.bias").
  std::string name_of(const std::string& placeholder, const std::string& scope) const {
    if (auto it = placeholder_.find(placeholder); it != placeholder_.end()) return it->second;
    if (auto it = signature_target_.find(placeholder); it != signature_target_.end()) return it->second;
    // A sibling the file kept: "p_m_out_proj_weight" -> "m.out_proj.weight" names "p_m_out_proj_bias"
    // "m.out_proj.bias".
    const size_t cut = placeholder.rfind('_');
    for (const auto& [p, name] : placeholder_) {
      const size_t pc = p.rfind('_');
      if (cut == std::string::npos || pc == std::string::npos || p.compare(0, pc, placeholder, 0, cut) != 0 ||
          pc != cut)
        continue;
      const std::string leaf = p.substr(pc + 1);
      if (name.size() > leaf.size() + 1 &&
          name.compare(name.size() - leaf.size() - 1, std::string::npos, "." + leaf) == 0)
        return name.substr(0, name.size() - leaf.size()) + placeholder.substr(cut + 1);
    }
    std::string mangled = scope;
    std::replace(mangled.begin(), mangled.end(), '.', '_');
    const std::string prefix = "p_" + mangled + "_";
    if (!scope.empty() && placeholder.rfind(prefix, 0) == 0) return scope + "." + placeholder.substr(prefix.size());
    return placeholder.substr(2);
  }

  bool present(const std::string& name) const { return inits_.count(name) || made_.count(name); }
  bool is_parameter_name(const std::string& name) const {
    for (const auto& [p, n] : placeholder_)
      if (n == name) return true;
    return false;
  }

  // The optimizer (optimize=True, the default) folds every BatchNorm into the Conv before it, whatever
  // the module's mode: onnxscript writes aten._native_batch_norm_legit_functional (training mode) as
  // an inference BatchNormalization too. With optimize=False the BatchNormalization nodes stay (the IR's
  // batchnorm then uses the batch's statistics, as PyTorch's training does).
  void refuse_folded_batchnorm() {
    int fused = 0;
    bool training = false;
    std::string first;
    for (const auto& n : g_.node()) {
      const FxInfo f = fx_info(n);
      if (f.rules.find("FuseBatchNormIntoConv") == std::string::npos) continue;
      if (!fused++) first = node_label(n);
      training = training || f.text.find("aten._native_batch_norm_legit_functional") != std::string::npos;
    }
    GP_CHECK(fused == 0,
             "{}: torch.onnx.export's dynamo exporter (dynamo=True) folded batch normalization into {} "
             "convolution(s) (its optimizer's FuseBatchNormIntoConv, e.g. {}): the file computes eval-mode "
             "convolutions and has lost the BatchNorm layers' weight and bias, which PyTorch trains. Export with "
             "optimize=False, which keeps every BatchNormalization: torch.onnx.export(model, args, f, "
             "dynamic_shapes=({{0: torch.export.Dim(\"batch\")}},), optimize=False). {}Or export with "
             "dynamo=False, training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False (docs/onnx.md, "
             "\"torch 2.x's default exporter\")",
             net_.path, fused, first,
             training ? "The module was in training mode: model.train() does not help, the exporter writes "
                        "BatchNorm in inference form and the optimizer folds it all the same. "
                      : "Calling model.train() first does not help: the optimizer folds it all the same. ");
  }

  // optimize=False leaves a Conv (or Gemm) without bias reading a computed zero bias,
  // Expand(CastLike(0, x), Shape(W)[0]): its fx node reads no bias parameter and the value is all
  // zeros, so it is no bias, as the TorchScript exporter writes bias=False.
  void drop_computed_zero_bias(int i, const FxInfo& fx) {
    onnx::NodeProto& n = *g_.mutable_node(i);
    if ((n.op_type() != "Conv" && n.op_type() != "ConvTranspose" && n.op_type() != "Gemm") || n.input_size() != 3 ||
        n.input(2).empty() || inits_.count(n.input(2)))
      return;
    for (const auto& p : fx.params)
      if (last_component(name_of(p, fx.scope)) == "bias") return;
    const auto v = evaluate_constant(g_, n.input(2));
    if (!v || v->values.empty() || std::any_of(v->values.begin(), v->values.end(), [](double x) { return x != 0; }))
      return;
    n.mutable_input()->RemoveLast();
  }

  // optimize=False also leaves CastLike(c, x) of a constant c to x's element type (Clip's bounds,
  // the zero above): where c already has that type, the value is c (its users read c).
  void alias_castlike_constants() {
    std::unordered_map<std::string, int> type;
    for (const auto& v : g_.input()) type[v.name()] = v.type().tensor_type().elem_type();
    for (const auto& v : g_.value_info()) type[v.name()] = v.type().tensor_type().elem_type();
    for (const auto& t : g_.initializer()) type[t.name()] = t.data_type();
    std::set<std::string> outputs;
    for (const auto& o : g_.output()) outputs.insert(o.name());
    std::unordered_map<std::string, std::string> alias;
    for (const auto& n : g_.node()) {
      if (n.op_type() != "CastLike" || n.input_size() != 2 || n.output_size() != 1 || outputs.count(n.output(0)))
        continue;
      const auto c = evaluate_constant(g_, n.input(0));  // computed from constants only
      auto to = type.find(n.input(1));
      if (c && c->elem_type != 0 && to != type.end() && to->second == c->elem_type) alias[n.output(0)] = n.input(0);
    }
    if (alias.empty()) return;
    for (auto& n : *g_.mutable_node())
      for (int k = 0; k < n.input_size(); ++k)
        if (auto it = alias.find(n.input(k)); it != alias.end()) n.set_input(k, it->second);
  }

  // torch.export decomposes an in-place dropout in training mode (nn.Dropout(p, inplace=True):
  // torchvision's mobilenet_v3, efficientnet, mnasnet) into x * (bernoulli(empty_like(x), 1 - p) / (1 - p)),
  // written as Expand / RandomUniformLike / Less / Div / Mul. The Mul becomes the Dropout(x, p) it is
  // (training mode); the random nodes nothing reads any more are dropped.
  void rewrite_bernoulli_dropout(const std::vector<FxInfo>& fx) {
    std::unordered_map<std::string, int> producer;
    std::unordered_map<std::string, std::string> fx_text;  // fx node name ("empty_like") -> its text
    for (int i = 0; i < g_.node_size(); ++i) {
      for (const auto& o : g_.node(i).output()) producer[o] = i;
      const std::string& t = fx[static_cast<size_t>(i)].text;
      if (const size_t colon = t.find(" : "); !t.empty() && t[0] == '%' && colon != std::string::npos)
        fx_text[t.substr(1, colon - 1)] = t;
    }
    auto made_by = [&](const std::string& t) {
      auto it = producer.find(t);
      return it == producer.end() ? -1 : it->second;
    };
    // The arguments of an fx node's text: "...](args = (%a, 0.8), kwargs" -> "%a", "0.8".
    auto args = [](const std::string& t) {
      std::vector<std::string> out;
      const size_t at = t.find("](args = (");
      const size_t end = t.find("), kwargs", at);
      if (at == std::string::npos || end == std::string::npos) return out;
      const std::string list = t.substr(at + 10, end - at - 10);
      for (size_t k = 0; k <= list.size();) {
        const size_t e = std::min(list.find(", ", k), list.size());
        std::string a = list.substr(k, e - k);
        if (!a.empty() && a.back() == ',') a.pop_back();  // a 1-tuple: "(%x,)"
        if (!a.empty()) out.push_back(std::move(a));
        k = e + 2;
      }
      return out;
    };
    for (int i = 0; i < g_.node_size(); ++i) {
      onnx::NodeProto& m = *g_.mutable_node(i);
      if (m.op_type() != "Mul" || m.input_size() != 2) continue;
      for (int side = 0; side < 2; ++side) {
        const std::string x = m.input(side);
        const int d = made_by(m.input(1 - side));
        if (d < 0 || g_.node(d).op_type() != "Div" || g_.node(d).input_size() != 2) continue;
        const int b = made_by(g_.node(d).input(0));
        if (b < 0) continue;
        const std::string& bt = fx[static_cast<size_t>(b)].text;
        const std::vector<std::string> ba = args(bt);
        if (bt.find("call_function[target=torch.ops.aten.bernoulli.p]") == std::string::npos || ba.size() != 2 ||
            ba[0].empty() || ba[0][0] != '%')
          continue;
        auto like = fx_text.find(ba[0].substr(1));  // bernoulli(empty_like(x), keep): the mask has x's shape
        if (like == fx_text.end() || like->second.find("torch.ops.aten.empty_like.default") == std::string::npos ||
            args(like->second) != std::vector<std::string>{"%" + x})
          continue;
        double keep = -1;
        const auto [ptr, ec] = std::from_chars(ba[1].data(), ba[1].data() + ba[1].size(), keep);
        const auto divisor = evaluate_constant(g_, g_.node(d).input(1));
        if (ec != std::errc() || ptr != ba[1].data() + ba[1].size() || keep <= 0 || keep > 1 || !divisor ||
            divisor->values.size() != 1 || std::abs(divisor->values[0] - keep) > 1e-6)
          continue;
        const std::string base = "dynamo_dropout/" + m.output(0);
        onnx::NodeProto ratio;
        ratio.set_op_type("Constant");
        ratio.set_name(base + "/ratio");
        ratio.add_output(base + "/ratio");
        auto* rv = ratio.add_attribute();
        rv->set_name("value");
        rv->set_type(onnx::AttributeProto::TENSOR);
        *rv->mutable_t() = float_tensor(base + "/ratio", {}, {static_cast<float>(1.0 - keep)});
        onnx::NodeProto train = ratio;
        train.set_name(base + "/training_mode");
        train.set_output(0, base + "/training_mode");
        onnx::TensorProto& tv = *train.mutable_attribute(0)->mutable_t();
        tv.set_name(base + "/training_mode");
        tv.set_data_type(onnx::TensorProto::BOOL);
        tv.set_raw_data(std::string(1, '\1'));
        m.set_op_type("Dropout");
        m.clear_input();
        m.add_input(x);
        m.add_input(base + "/ratio");
        m.add_input(base + "/training_mode");
        added_nodes_.push_back(std::move(ratio));
        added_nodes_.push_back(std::move(train));
        dropouts_.push_back(fmt::format("{} (p {:.6g})", m.output(0), 1.0 - keep));
        // p as written in the model (0.2, not 1 - 0.8 = 0.19999999999999996); the op's name once renamed
        dropout_nodes_.emplace_back(i, std::round((1.0 - keep) * 1e12) / 1e12);
        break;
      }
    }
  }

  // torchvision's Swin adds table[relative_position_index].view(n, n, heads).permute(2, 0, 1).unsqueeze(0)
  // to its window scores: a parameter looked up by a buffer, which the optimizer folds into one value
  // [1, heads, n, n] (its value_info's pkg.onnxscript.optimizer.folded_from names the parameter and the
  // buffer; the table itself is gone). A window wh x ww of n tokens has one index (ops.cpp's
  // window_attention uses the same): where exactly one index among the factorisations n = wh * ww
  // reproduces every entry of the value bit for bit, the table is read back through it and the lookup
  // is written as the TorchScript exporter writes it (Gather of the table by the index buffer, Reshape,
  // Transpose, Unsqueeze), which the window-attention pattern reads.
  //
  // 1 x n and n x 1 have the same index (row i - j + n - 1), so they count as one. Otherwise two windows
  // with different indexes can both fit: token pairs with equal offsets (dh, dw) in one window can have
  // different offsets in another, so the value must hold equal entries where either index repeats a row.
  // A random table does so for its own window only, but a table whose entries are all equal fits every
  // window, and the lookup of a window 1 x n (a function of i - j alone, which every window's (dh, dw)
  // determines: i - j = ww dh + dw) fits every window of n tokens. Picking one could train the wrong
  // table: wh x ww and ww x wh have tables of the same shape and different indexes. So no window and
  // two windows are both refused, naming the value, the table and the index buffer (the parameter is
  // gone from the file, as refused below for every other parameter the graph names and no initializer
  // holds).
  void ungather_folded_lookups() {
    for (const auto& [folded, sources] : folded_from_) {
      auto init = inits_.find(folded);
      if (init == inits_.end() || init->second->data_type() != onnx::TensorProto::FLOAT) continue;
      std::vector<std::string> p, b;
      for (const std::string& name : sources) {
        if (signature_params_.count(name) && !present(name)) p.push_back(name);
        if (signature_buffers_.count(name)) b.push_back(name);
      }
      const onnx::TensorProto& value = *init->second;
      std::vector<int64_t> dims(value.dims().begin(), value.dims().end());
      const bool unsqueezed = dims.size() == 4 && dims[0] == 1;
      if (unsqueezed) dims.erase(dims.begin());
      if (p.size() != 1 || b.size() != 1 || dims.size() != 3 || dims[1] != dims[2] || dims[0] < 1 || dims[1] < 1)
        continue;
      const int64_t heads = dims[0], n = dims[1];
      const std::vector<float> v = float_values(net_.path, value);
      std::vector<std::pair<int64_t, std::vector<float>>> fits;  // wh, table
      std::vector<std::string> windows, fitting;
      for (int64_t wh = 1; wh <= n; ++wh) {
        if (n % wh != 0) continue;
        const int64_t ww = n / wh;
        windows.push_back(fmt::format("{}x{}", wh, ww));
        if (wh == n && n > 1) {  // n x 1: 1 x n's index, already tried
          if (!fits.empty() && fits.front().first == 1) fitting.front() += fmt::format(" (= {}x1)", n);
          continue;
        }
        if (auto t = ungather(v, swin_relative_position_index(wh, ww), (2 * wh - 1) * (2 * ww - 1), heads)) {
          fits.emplace_back(wh, std::move(*t));
          fitting.push_back(windows.back());
        }
      }
      GP_CHECK(fits.size() == 1,
               "{}: torch.onnx.export's dynamo exporter (dynamo=True) folded the lookup of parameter {} by buffer {} "
               "into the value \"{}\" [{}] (Swin's relative-position bias; the table is gone from the file), and the "
               "table cannot be read back: {}. Export with dynamo=False, training=torch.onnx.TrainingMode.TRAINING, "
               "do_constant_folding=False (docs/onnx.md, \"Swin\")",
               net_.path, p[0], b[0], folded, fmt::join(value.dims(), ", "),
               fits.empty()
                   ? fmt::format("the index of no window of {} tokens ({}) reproduces every entry", n,
                                 fmt::join(windows, ", "))
                   : fmt::format("the indexes of windows {} each reproduce every entry, so the values do not say "
                                 "which window's table it is (a table whose entries are all equal, or a window 1 x "
                                 "n, whose lookup every window's index reproduces)",
                                 fmt::join(fitting, ", ")));
      const int64_t wh = fits[0].first, ww = n / wh, rows = (2 * wh - 1) * (2 * ww - 1);
      const std::string& out = folded;
      const std::string base = "dynamo_ungather/" + out;
      added_inits_.push_back(float_tensor(p[0], {rows, heads}, fits[0].second));
      made_.insert(p[0]);
      auto int_tensor = [&](const std::string& name, const std::vector<int64_t>& d, const std::vector<int64_t>& x) {
        onnx::TensorProto tp;
        tp.set_name(name);
        tp.set_data_type(onnx::TensorProto::INT64);
        for (int64_t e : d) tp.add_dims(e);
        tp.set_raw_data(std::string(reinterpret_cast<const char*>(x.data()), x.size() * sizeof(int64_t)));
        buffers_.insert(name);  // constants, not parameters
        added_inits_.push_back(std::move(tp));
      };
      int_tensor(b[0], {n * n}, swin_relative_position_index(wh, ww));
      int_tensor(base + "/shape", {3}, {n, n, heads});
      auto node = [&](const std::string& op, std::vector<std::string> in, const std::string& o) -> onnx::NodeProto& {
        onnx::NodeProto& nd = added_nodes_.emplace_back();
        nd.set_op_type(op);
        nd.set_name(fmt::format("{}/{}", base, op));
        for (auto& i : in) nd.add_input(std::move(i));
        nd.add_output(o);
        return nd;
      };
      node("Gather", {p[0], b[0]}, base + "/rows");
      node("Reshape", {base + "/rows", base + "/shape"}, base + "/nnh");
      auto* perm = node("Transpose", {base + "/nnh"}, unsqueezed ? base + "/hnn" : out).add_attribute();
      perm->set_name("perm");
      perm->set_type(onnx::AttributeProto::INTS);
      for (int64_t a : {2, 0, 1}) perm->add_ints(a);
      if (unsqueezed) {
        int_tensor(base + "/axes", {1}, {0});
        node("Unsqueeze", {base + "/hnn", base + "/axes"}, out);
      }
      replaced_.insert(out);
      ungathered_.push_back(fmt::format("{} [{}, {}] (window {}) from {}", p[0], rows, heads, fitting[0], out));
    }
    for (const auto& r : replaced_) inits_.erase(r);
  }

  // The parameters node i's fx node reads that the file does not hold (yet), in argument order.
  std::vector<std::string> missing(const FxInfo& fx) const {
    std::vector<std::string> out;
    for (const auto& p : fx.params)
      if (!present(name_of(p, fx.scope))) out.push_back(name_of(p, fx.scope));
    return out;
  }

  // Prefers the missing parameter whose last name component ("weight", "bias") equals `like`'s.
  static std::string pick(const std::vector<std::string>& candidates, const std::string& like) {
    for (const auto& c : candidates)
      if (last_component(c) == last_component(like)) return c;
    return candidates.empty() ? std::string() : candidates.front();
  }

  // nn.MultiheadAttention(q, kv, kv) splits in_proj_weight and in_proj_bias into Q and K, V rows; the
  // optimizer writes those Splits itself (no fx metadata), so a bias it merged with another module's
  // equal one (zero at initialisation) reads that module's: Split(X.in_proj_bias) beside
  // Split(Y.in_proj_weight) with the same sizes, Y.in_proj_bias a parameter the file does not hold.
  // Y's bias becomes an Identity of X's, as recover_inputs makes every other merge.
  void recover_split_merges(const std::vector<FxInfo>& fx) {
    const std::string kw = ".in_proj_weight", kb = ".in_proj_bias";
    auto scope_of = [](const std::string& name, const std::string& suffix) {
      return name.size() > suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0
                 ? name.substr(0, name.size() - suffix.size())
                 : std::string();
    };
    for (int i = 0; i < g_.node_size(); ++i) {
      onnx::NodeProto& b = *g_.mutable_node(i);
      if (b.op_type() != "Split" || fx[static_cast<size_t>(i)].scoped || b.input_size() < 2) continue;
      const std::string x = scope_of(b.input(0), kb);
      if (x.empty() || !inits_.count(b.input(0))) continue;
      for (int j = 0; j < g_.node_size(); ++j) {
        const onnx::NodeProto& w = g_.node(j);
        if (w.op_type() != "Split" || w.input_size() < 2 || w.input(1) != b.input(1)) continue;
        const std::string y = scope_of(w.input(0), kw);
        if (y.empty() || y == x || present(y + kb) || !signature_params_.count(y + kb)) continue;
        onnx::NodeProto id;
        id.set_op_type("Identity");
        id.set_name("dynamo_merge/" + y + kb);
        id.add_input(b.input(0));
        id.add_output(y + kb);
        added_nodes_.push_back(id);
        made_.insert(y + kb);
        b.set_input(0, y + kb);
        break;
      }
    }
  }

  void recover_inputs(int i, const FxInfo& fx) {
    if (fx.params.empty()) return;
    onnx::NodeProto& n = *g_.mutable_node(i);
    std::set<std::string> reads;
    for (const auto& p : fx.params) reads.insert(name_of(p, fx.scope));
    for (int k = 0; k < n.input_size(); ++k) {
      const std::string in = n.input(k);
      auto it = inits_.find(in);
      if (it == inits_.end() || reads.count(in) || it->second->data_type() != onnx::TensorProto::FLOAT) continue;
      const std::vector<std::string> miss = missing(fx);
      if (is_parameter_name(in)) {  // another module's parameter of equal value: a merge
        const std::string p = pick(miss, in);
        if (p.empty()) continue;
        onnx::NodeProto id;
        id.set_op_type("Identity");
        id.set_name("dynamo_merge/" + p);
        id.add_input(in);
        id.add_output(p);
        added_nodes_.push_back(id);
        made_.insert(p);
        n.set_input(k, p);
      } else if (n.op_type() == "MatMul" && k == 1 && it->second->dims_size() == 2) {
        recover_transposed(n, k, *it->second, fx, miss);
      }
    }
  }

  // MatMul(x, W^T) with W^T folded into an anonymous initializer: a copy of a parameter the file holds
  // (a tie), or the only copy of one it lost (made again in PyTorch's layout, read through a Transpose).
  void recover_transposed(onnx::NodeProto& n, int k, const onnx::TensorProto& copy, const FxInfo& fx,
                          const std::vector<std::string>& miss) {
    const int64_t rows = copy.dims(0), cols = copy.dims(1);
    const std::vector<float> back = transposed(float_values(net_.path, copy), rows, cols);
    for (const auto& p : fx.params) {
      auto orig = inits_.find(name_of(p, fx.scope));
      if (orig == inits_.end() || orig->second->dims_size() != 2 || orig->second->dims(0) != cols ||
          orig->second->dims(1) != rows || orig->second->data_type() != onnx::TensorProto::FLOAT)
        continue;
      if (float_values(net_.path, *orig->second) == back) {
        net_.transposed_copy_of[copy.name()] = orig->first;
        return;
      }
    }
    const std::string p = pick(miss, "weight");
    if (p.empty()) return;
    added_inits_.push_back(float_tensor(p, {cols, rows}, back));
    onnx::NodeProto tr;
    tr.set_op_type("Transpose");
    tr.set_name("dynamo_unfold/" + p);
    tr.add_input(p);
    tr.add_output(p + "/transposed");
    auto* perm = tr.add_attribute();
    perm->set_name("perm");
    perm->set_type(onnx::AttributeProto::INTS);
    perm->add_ints(1);
    perm->add_ints(0);
    added_nodes_.push_back(tr);
    made_.insert(p);
    unfolded_.push_back(p);
    n.set_input(k, p + "/transposed");
  }

  // Gemm / Conv whose zero bias the optimizer removed: the bias again, zero, under PyTorch's name.
  void restore_dropped_bias(int i, const FxInfo& fx) {
    onnx::NodeProto& n = *g_.mutable_node(i);
    const bool gemm = n.op_type() == "Gemm" && fx.rules.find("RemoveOptionalBiasFromGemm") != std::string::npos;
    const bool conv = (n.op_type() == "Conv" || n.op_type() == "ConvTranspose") &&
                      fx.rules.find("RemoveOptionalBiasFromConv") != std::string::npos;
    if ((!gemm && !conv) || n.input_size() != 2) return;
    const std::vector<std::string> miss = missing(fx);
    const std::string p = pick(miss, "bias");
    auto w = inits_.find(n.input(1));
    if (p.empty() || last_component(p) != "bias" || w == inits_.end() || w->second->dims_size() < 2) return;
    int64_t out = w->second->dims(0);
    if (gemm && attr_i(n, "transB", 0) == 0) out = w->second->dims(1);
    if (n.op_type() == "ConvTranspose") out = w->second->dims(1) * attr_i(n, "group", 1);
    added_inits_.push_back(float_tensor(p, {out}, std::vector<float>(static_cast<size_t>(out), 0.0F)));
    made_.insert(p);
    restored_.push_back(p);
    n.add_input(p);
  }

  // torch.export writes a view that keeps the layout (AdaptiveAvgPool2d(1)'s [B, C, 1, 1] as
  // as_strided(x, [B, C, 1, 1], [C, 1, C, C])) as a flat Reshape + Gather of computed indices. When the
  // sizes are x's shape (value_info), without offset, and every dim longer than 1 has its contiguous
  // stride, the view is x: the node making the fx node's output becomes Identity(x).
  void identity_as_strided(onnx::NodeProto& n, const FxInfo& fx) {
    const std::string head = "call_function[target=torch.ops.aten.as_strided.default](args = (%";
    const size_t at = fx.text.find(head);
    const size_t colon = fx.text.find(" : ");
    if (at == std::string::npos || colon == std::string::npos || fx.text[0] != '%' ||
        n.output(0) != fx.text.substr(1, colon - 1))
      return;
    const std::string args = fx.text.substr(at + head.size());
    const size_t comma = args.find(", [");
    const size_t mid = args.find("], [", comma);
    const size_t end = args.find("])", mid);
    if (comma == std::string::npos || mid == std::string::npos || end == std::string::npos) return;
    auto numbers = [](const std::string& list) {
      std::vector<int64_t> out;
      for (size_t k = 0; k <= list.size();) {
        const size_t e = std::min(list.find(", ", k), list.size());
        const std::string tok = list.substr(k, e - k);
        int64_t v = -1;
        if (tok.empty() || (tok[0] != '%' && std::from_chars(tok.data(), tok.data() + tok.size(), v).ec != std::errc()))
          return std::vector<int64_t>{};
        out.push_back(tok[0] == '%' ? -1 : v);  // -1: a symbolic size
        k = e + 2;
      }
      return out;
    };
    const std::string x = args.substr(0, comma);
    const std::vector<int64_t> sizes = numbers(args.substr(comma + 3, mid - comma - 3));
    const std::vector<int64_t> strides = numbers(args.substr(mid + 4, end - mid - 4));
    std::optional<std::vector<int64_t>> shape;
    for (const auto& vi : g_.value_info())
      if (vi.name() == x && vi.type().tensor_type().has_shape()) {
        shape.emplace();
        for (const auto& d : vi.type().tensor_type().shape().dim())
          shape->push_back(d.has_dim_value() ? d.dim_value() : -1);
      }
    if (!shape || sizes.empty() || *shape != sizes || strides.size() != sizes.size()) return;
    int64_t contiguous = 1;
    for (size_t d = sizes.size(); d-- > 0;) {
      if (sizes[d] != 1 && (contiguous < 0 || strides[d] != contiguous)) return;
      contiguous = sizes[d] < 0 || contiguous < 0 ? -1 : contiguous * sizes[d];
    }
    n.set_op_type("Identity");
    n.clear_input();
    n.add_input(x);
    n.clear_attribute();
  }

  // Nodes none of whose outputs is read any more (the index arithmetic of a view made Identity).
  void drop_dead_nodes() {
    for (bool dropped = true; dropped;) {
      std::set<std::string> read;
      for (const auto& o : g_.output()) read.insert(o.name());
      for (const auto& n : g_.node())
        for (const auto& in : n.input()) read.insert(in);
      google::protobuf::RepeatedPtrField<onnx::NodeProto> kept;
      for (auto& n : *g_.mutable_node())
        if (std::any_of(n.output().begin(), n.output().end(), [&](const std::string& o) { return read.count(o) > 0; }))
          *kept.Add() = std::move(n);
      dropped = kept.size() != g_.node_size();
      g_.mutable_node()->Swap(&kept);
    }
  }

  // After the rewrites: initializers no node reads any more (copies replaced above) are dropped; the
  // optimizer's own values ("val_N": scalars, shapes, masks) and the module's buffers (value_info
  // kind BUFFER) become Constant nodes, as TorchScript writes them, so they are not parameters; a value named after an fx node that is no parameter
  // (e.g. "embedding_1", a position table's lookup by constant indices) is a parameter computed from
  // one and folded: kept as a parameter of its shape, and said.
  void sort_out_initializers() {
    std::set<std::string> read;
    for (const auto& n : g_.node())
      for (const auto& in : n.input()) read.insert(in);
    std::vector<onnx::TensorProto> kept;
    for (auto& t : *g_.mutable_initializer()) {
      if (!read.count(t.name()) || replaced_.count(t.name())) continue;
      // The module's buffers (a BatchNorm's running statistics, a registered constant) are no
      // parameters in PyTorch: constants too.
      if ((t.name().rfind("val_", 0) == 0 || buffers_.count(t.name()) || folded_from_constants(t.name())) &&
          !net_.transposed_copy_of.count(t.name())) {
        onnx::NodeProto c;
        c.set_op_type("Constant");
        c.set_name("dynamo_constant/" + t.name());
        c.add_output(t.name());
        auto* a = c.add_attribute();
        a->set_name("value");
        a->set_type(onnx::AttributeProto::TENSOR);
        a->mutable_t()->Swap(&t);
        *g_.add_node() = std::move(c);
        continue;
      }
      if (t.data_type() == onnx::TensorProto::FLOAT && !is_parameter_name(t.name()) && !made_.count(t.name()) &&
          !net_.transposed_copy_of.count(t.name()))
        folded_.push_back(fmt::format("{} [{}]", t.name(), fmt::join(t.dims(), ", ")));
      kept.push_back(std::move(t));
    }
    g_.clear_initializer();
    for (auto& t : kept) *g_.add_initializer() = std::move(t);
  }

  // Merges and tied copies are reported with the other ties (warn_ties); this says the rest.
  void warn() const {
    if (unfolded_.empty() && restored_.empty() && folded_.empty() && dropouts_.empty() && ungathered_.empty()) return;
    std::string what;
    if (!ungathered_.empty())
      what += fmt::format(
          " Relative-position tables whose lookup by Swin's relative_position_index it folded are parameters "
          "again, read back through the index of the one window that reproduces every folded value: {}.",
          fmt::join(ungathered_, ", "));
    if (!dropouts_.empty())
      what += fmt::format(
          " in-place dropouts in training mode, written as x * bernoulli(1 - p) / (1 - p), are "
          "dropout again: {}.",
          fmt::join(dropouts_, ", "));
    if (!restored_.empty())
      what += fmt::format(" zero biases its optimizer dropped are parameters again (zero): {}.",
                          fmt::join(restored_, ", "));
    if (!unfolded_.empty())
      what += fmt::format(" Weights it stored transposed are read back as the parameters: {}.",
                          fmt::join(unfolded_, ", "));
    if (!folded_.empty())
      what += fmt::format(
          " Values it computed from parameters and folded, their source not named in the file, are trained as "
          "parameters of their shape (exact when each is a whole parameter, e.g. a position table read at every "
          "row): {}.",
          fmt::join(folded_, ", "));
    warn_once(net_.path, "dynamo",
              "read with the dynamo exporter's pkg.torch.onnx.fx_node metadata (torch.onnx.export, dynamo=True):" +
                  what + " (docs/onnx.md, \"Default exports and ties\")");
  }

  onnx::GraphProto& g_;
  Net& net_;
  std::map<std::string, std::string> placeholder_;
  std::set<std::string> buffers_;  // initializers that are the module's buffers, not parameters
  std::unordered_map<std::string, const onnx::TensorProto*> inits_;
  std::set<std::string> made_;
  std::vector<onnx::NodeProto> added_nodes_;
  std::vector<onnx::TensorProto> added_inits_;
  std::set<std::string> replaced_;  // folded values now computed by added nodes
  std::set<std::string> signature_params_, signature_buffers_;
  std::map<std::string, std::string> signature_target_;  // placeholder "p_a_weight" -> "a.weight"
  std::map<std::string, std::vector<std::string>> folded_from_;
  std::vector<std::string> unfolded_, restored_, folded_, dropouts_, ungathered_;
  std::vector<std::pair<int, double>> dropout_nodes_;  // the Mul made Dropout, and p
  std::vector<RecoveredDropout> recovered_dropouts_;
};

}  // namespace

void merge_reshaped_transposes(Net& net) {
  auto erase_one = [](std::vector<int>& v, int x) {
    if (auto it = std::find(v.begin(), v.end(), x); it != v.end()) v.erase(it);
  };
  for (size_t i3 = 0; i3 < net.nodes.size(); ++i3) {
    onnx::NodeProto& n3 = net.nodes[i3];
    if (n3.op_type() != "Reshape" || net.folded[i3] || n3.input_size() != 2) continue;
    const TensorInfo& b = net.at(n3.input(0));
    if (b.producer < 0 || b.consumers.size() != 1) continue;
    const auto i2 = static_cast<size_t>(b.producer);
    const onnx::NodeProto& n2 = net.nodes[i2];
    if (n2.op_type() != "Transpose" || attr_ints(n2, "perm") != std::vector<int64_t>{0, 2, 1}) continue;
    const TensorInfo& a = net.at(n2.input(0));
    if (a.producer < 0 || a.consumers.size() != 1 || net.nodes[static_cast<size_t>(a.producer)].op_type() != "Reshape")
      continue;
    const auto i1 = static_cast<size_t>(a.producer);
    const std::string x = net.nodes[i1].input(0);
    const auto& sx = net.at(x).shape;
    const auto& sa = a.shape;
    const auto& sy = net.at(n3.output(0)).shape;
    if (!sx || !sa || !sy || sx->size() != 4) continue;
    const std::vector<int64_t>& X = *sx;
    if (*sa != std::vector<int64_t>{X[0] * X[1], X[2], X[3]} || *sy != std::vector<int64_t>{X[0], X[1], X[3], X[2]})
      continue;
    erase_one(net.t[n3.input(1)].consumers, static_cast<int>(i3));
    erase_one(net.t[n3.input(0)].consumers, static_cast<int>(i3));
    erase_one(net.t[x].consumers, static_cast<int>(i1));
    net.t[x].consumers.push_back(static_cast<int>(i3));
    n3.set_op_type("Transpose");
    n3.clear_input();
    n3.add_input(x);
    n3.clear_attribute();
    auto* perm = n3.add_attribute();
    perm->set_name("perm");
    perm->set_type(onnx::AttributeProto::INTS);
    for (int64_t p : {0, 1, 3, 2}) perm->add_ints(p);
    net.folded[i1] = net.folded[i2] = true;  // dead now: nothing reads their outputs
  }
}

void inline_external_data(const std::string& path, onnx::ModelProto& model) {
  const size_t slash = path.find_last_of('/');
  const std::string dir = slash == std::string::npos ? std::string() : path.substr(0, slash + 1);
  for (auto& tp : *model.mutable_graph()->mutable_initializer()) {
    if (tp.data_location() != onnx::TensorProto::EXTERNAL) continue;
    std::string location;
    int64_t offset = 0, length = -1;
    for (const auto& e : tp.external_data()) {
      if (e.key() == "location") location = e.value();
      if (e.key() == "offset" || e.key() == "length") {
        int64_t v = -1;
        const auto [end, ec] = std::from_chars(e.value().data(), e.value().data() + e.value().size(), v);
        GP_CHECK(ec == std::errc() && end == e.value().data() + e.value().size() && v >= 0,
                 "{}: initializer \"{}\": external data {} \"{}\" is not a byte count", path, tp.name(), e.key(),
                 e.value());
        (e.key() == "offset" ? offset : length) = v;
      }
    }
    GP_CHECK(!location.empty() && location[0] != '/' && location.find("..") == std::string::npos,
             "{}: initializer \"{}\" names external data \"{}\": expected a file name next to the model", path,
             tp.name(), location);
    int64_t n = 1;
    for (int64_t d : tp.dims()) {
      GP_CHECK(d >= 0 && (d == 0 || n <= ir::kMaxExtent / d), "{}: corrupt ONNX file (initializer \"{}\" dims)", path,
               tp.name());
      n *= d;
    }
    const int64_t bytes = n *
                          (tp.data_type() == onnx::TensorProto::DOUBLE || tp.data_type() == onnx::TensorProto::INT64 ? 8
                           : tp.data_type() == onnx::TensorProto::FLOAT || tp.data_type() == onnx::TensorProto::INT32
                               ? 4
                               : 1);
    if (length < 0) length = bytes;
    std::ifstream f(dir + location, std::ios::binary);
    GP_CHECK(f.good(), "{}: initializer \"{}\" is stored in external data file \"{}\", which cannot be read", path,
             tp.name(), dir + location);
    f.seekg(0, std::ios::end);
    const auto size = static_cast<int64_t>(f.tellg());
    GP_CHECK(offset >= 0 && length == bytes && offset + length <= size,
             "{}: initializer \"{}\": external data \"{}\" offset {} length {} does not fit the file ({} bytes) or "
             "the tensor ({} bytes)",
             path, tp.name(), location, offset, length, size, bytes);
    std::string raw(static_cast<size_t>(length), '\0');
    f.seekg(offset);
    f.read(raw.data(), length);
    tp.set_raw_data(std::move(raw));
    tp.clear_external_data();
    tp.set_data_location(onnx::TensorProto::DEFAULT);
  }
}

void recover_dynamo_export(onnx::ModelProto& model, Net& net) {
  if (!mentions_torch_exporter(model.graph())) return;
  // Without dynamic_shapes every dim is the example's, and the exporter writes that batch into the
  // Reshapes' shapes: a batch other than the example's then contradicts them.
  bool symbolic = false;
  for (const auto& in : model.graph().input())
    for (const auto& d : in.type().tensor_type().shape().dim()) symbolic = symbolic || !d.has_dim_value();
  if (!symbolic)
    net.inference_hint =
        " (this dynamo export has a fixed batch: torch.onnx.export without dynamic_shapes writes the example's "
        "batch into its Reshapes; export with dynamic_shapes giving each input's dim 0 a "
        "torch.export.Dim(\"batch\"), docs/onnx.md \"torch 2.x's default exporter\")";
  Recovery(model, net).run();
}

}  // namespace gp::importers::onnx_detail
