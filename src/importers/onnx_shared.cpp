// Tied parameters in an ONNX file: one initializer read by the weight slots of several IR ops
// (directly or behind Transpose / Identity / Cast, e.g. GPT-2's LM head MatMul(x, Transpose(wte))
// and the embedding's Gather(wte, ids)) becomes one ir::SharedParam, so the parameter is counted,
// held and trained once as PyTorch does.
//
// Except where the exporter's constant folding (torch.onnx.export's default, eval mode) changed
// what the file says, in two ways:
// - merges: of each set of initializers of equal value and shape it keeps one and gives the others'
//   names to Identity nodes reading it (two LayerNorms' all-ones weights, zero biases). Those are
//   separate parameters in PyTorch; a real tie reaches the file as one initializer without Identity.
// - folded copies: a tied weight read through a Transpose (GPT-2's LM head) becomes a second,
//   anonymous initializer "onnx::MatMul_N" holding the transpose. One parameter in PyTorch.
// --ties / GRAPHPIPE_ONNX_TIES says how to read them: auto (merges separate, copies tied: what
// PyTorch has), keep (the file as written: merges one parameter, copies two) or split (neither
// tied). A file graphpipe.export wrote (metadata "graphpipe.export") names every parameter: exact.
// Every decision is one warning per file and in `model info`.
#include <nlohmann/json.hpp>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <numeric>
#include <set>

#include "importers/onnx_mapper.h"

namespace gp::importers::onnx_detail {
namespace {

enum class TieMode { automatic, keep, split, exact };

const char* mode_name(TieMode m) {
  switch (m) {
    case TieMode::automatic: return "auto";
    case TieMode::keep: return "keep";
    case TieMode::split: return "split";
    case TieMode::exact: return "exact";
  }
  return "?";
}

TieMode tie_mode(const Net& net) {
  if (net.export_names) return TieMode::exact;
  const char* v = std::getenv("GRAPHPIPE_ONNX_TIES");
  const std::string mode = v ? v : "auto";
  if (mode == "auto") return TieMode::automatic;
  if (mode == "keep") return TieMode::keep;
  if (mode == "split") return TieMode::split;
  throw UserError(fmt::format(
      "GRAPHPIPE_ONNX_TIES (--ties): expected auto (initializers the exporter merged are separate parameters, "
      "folded transposed copies one), keep (the file as written) or split (neither tied), found \"{}\"",
      mode));
}

/// The parameter tensor behind a weight slot and the permutation from its layout to the IR
/// parameter's: IR value = permute(root value, perm). Empty root when the slot is computed otherwise.
struct Root {
  std::string tensor;
  std::vector<int64_t> perm;
  std::string merged_as;  // the Identity output (a PyTorch parameter's name) the slot read it through
};

Root root_of(const Net& net, const ParamSource& ps) {
  std::string t = ps.tensor;
  const size_t rank = net.at(t).shape ? net.at(t).shape->size() : ps.shape.size();
  std::vector<int64_t> perm(rank);
  std::iota(perm.begin(), perm.end(), int64_t{0});
  std::string merged_as;
  auto apply = [&](const std::vector<int64_t>& p) {
    if (p.size() != perm.size()) return false;
    for (auto& c : perm) c = p[static_cast<size_t>(c)];
    return true;
  };
  for (;;) {
    const TensorInfo& ti = net.at(t);
    if (ti.producer < 0) break;
    const onnx::NodeProto& n = net.nodes[static_cast<size_t>(ti.producer)];
    if (n.op_type() == "Transpose") {
      std::vector<int64_t> p = attr_ints(n, "perm");
      if (p.empty())
        for (size_t d = perm.size(); d-- > 0;) p.push_back(static_cast<int64_t>(d));
      if (!apply(p)) return {};
    } else if (n.op_type() == "Identity") {
      if (net.at(n.input(0)).param && net.at(n.input(0)).producer < 0) merged_as = n.output(0);
    } else if (n.op_type() != "Cast") {
      return {};
    }
    t = n.input(0);
  }
  if (!net.at(t).param) return {};
  if (ps.transpose && perm.size() == 2) std::swap(perm[0], perm[1]);
  return {t, perm, merged_as};
}

void warn_ties(const std::string& path, const std::vector<OnnxSharedNote>& notes, TieMode mode) {
  std::string merged, copies;
  bool merged_one = false, copies_one = false;
  for (const OnnxSharedNote& n : notes) {
    if (n.kind == "merged") {
      merged += fmt::format("{}{} also stands for {}", merged.empty() ? "" : "; ", n.initializer,
                            fmt::join(n.names, ", "));
      merged_one = n.trained_as_one;
    } else if (n.kind == "transposed copy") {
      copies += fmt::format("{}{} holds {} transposed", copies.empty() ? "" : "; ", fmt::join(n.names, ", "),
                            n.initializer);
      copies_one = n.trained_as_one;
    }
  }
  if (merged.empty() && copies.empty()) return;
  std::string text;
  if (!merged.empty())
    text += fmt::format(
        "the exporter merged initializers of equal value into one (torch.onnx.export's constant folding, on by "
        "default): {}. {} ",
        merged,
        merged_one ? "--ties keep: each set is trained as ONE parameter, unlike PyTorch."
                   : "Each is imported as the separate parameter PyTorch has (--ties keep trains each set as one).");
  if (!copies.empty())
    text += fmt::format(
        "constant folding made a transposed copy of a tied weight: {}. {} ", copies,
        copies_one ? "Each copy is read as the weight it copies: ONE parameter, as PyTorch ties it (--ties keep "
                     "trains the copy as a parameter of its own)."
                   : fmt::format("--ties {}: the copy is trained as a parameter of its own, unlike a PyTorch tie.",
                                 mode_name(mode)));
  text +=
      "Export with do_constant_folding=False and training=torch.onnx.TrainingMode.TRAINING (or with "
      "graphpipe.export from Python) to keep the file exact.";
  warn_once(path, "ties", text);
}

// --- provenance, read while the file is loaded ---

/// Element i of a float tensor (raw or typed storage); `n` elements, checked by the caller.
float float_at(const onnx::TensorProto& tp, int64_t i) {
  if (tp.raw_data().empty()) return tp.float_data(static_cast<int>(i));
  float x;
  std::memcpy(&x, tp.raw_data().data() + i * static_cast<int64_t>(sizeof x), sizeof x);
  return x;
}

/// A 2-d float initializer stored in the file whose values can be compared; nullopt otherwise.
std::optional<std::pair<int64_t, int64_t>> matrix_dims(const onnx::TensorProto& tp) {
  if (tp.data_type() != onnx::TensorProto::FLOAT || tp.dims_size() != 2 ||
      tp.data_location() == onnx::TensorProto::EXTERNAL)
    return std::nullopt;
  const int64_t r = tp.dims(0), c = tp.dims(1);
  if (r <= 0 || c <= 0 || r > ir::kMaxExtent / c) return std::nullopt;
  const auto n = static_cast<size_t>(r * c);
  if (tp.raw_data().empty() ? static_cast<size_t>(tp.float_data_size()) != n : tp.raw_data().size() != n * 4)
    return std::nullopt;
  return std::make_pair(r, c);
}

bool same_bits(float a, float b) { return std::memcmp(&a, &b, sizeof a) == 0; }

bool all_equal(const onnx::TensorProto& tp, int64_t n) {
  const float first = float_at(tp, 0);
  for (int64_t i = 1; i < n; ++i)
    if (!same_bits(float_at(tp, i), first)) return false;
  return true;
}

/// copy[i][j] == orig[j][i] for every element (copy is r x c, orig c x r).
bool is_transpose(const onnx::TensorProto& copy, const onnx::TensorProto& orig, int64_t r, int64_t c) {
  for (int64_t i = 0; i < r; ++i)
    for (int64_t j = 0; j < c; ++j)
      if (!same_bits(float_at(copy, i * c + j), float_at(orig, j * r + i))) return false;
  return true;
}

bool anonymous(const std::string& name) { return name.rfind("onnx::", 0) == 0; }

void read_export_metadata(const std::string& path, const std::string& value, const onnx::GraphProto& g, Net& net) {
  const std::string where = path + ": metadata \"graphpipe.export\"";
  const nlohmann::json j = nlohmann::json::parse(value, nullptr, /*allow_exceptions=*/false);
  GP_CHECK(j.is_object(), "{} is not a JSON object (written by graphpipe.export?)", where);
  GP_CHECK(j.value("format", std::string()) == "graphpipe.export/1",
           "{}: field \"format\" is {}, expected \"graphpipe.export/1\"", where,
           j.contains("format") ? j["format"].dump() : "missing");
  GP_CHECK(j.contains("parameters") && j["parameters"].is_object(),
           "{}: field \"parameters\" must be an object (initializer -> PyTorch names)", where);
  std::set<std::string> tensors;
  for (const auto& init : g.initializer()) tensors.insert(init.name());
  for (const auto& in : g.input()) tensors.insert(in.name());
  std::map<std::string, std::vector<std::string>> names;
  for (const auto& [init, list] : j["parameters"].items()) {
    GP_CHECK(tensors.count(init), "{}: parameters names \"{}\", which is no initializer or input of the graph", where,
             init);
    GP_CHECK(list.is_array() && !list.empty(), "{}: parameters[\"{}\"] must be a non-empty list of names", where, init);
    for (const auto& n : list) {
      GP_CHECK(n.is_string(), "{}: parameters[\"{}\"] holds {}, expected a name", where, init, n.dump());
      names[init].push_back(n.get<std::string>());
    }
  }
  net.export_names = std::move(names);
}

}  // namespace

// One line per file and process (a model is loaded several times), from rank 0 only under a launcher.
void warn_once(const std::string& path, const std::string& what, const std::string& text) {
  static std::mutex mu;
  static std::set<std::string> warned;
  std::lock_guard<std::mutex> lock(mu);
  const char* rank = std::getenv("RANK");
  if (!warned.insert(what + "\n" + path).second || (rank && std::string(rank) != "0")) return;
  std::fprintf(stderr, "graphpipe: warning: %s: %s\n", path.c_str(), text.c_str());
}

/// torch.onnx.export's TorchScript exporter (dynamo=False) in eval mode, its default, fuses each
/// BatchNorm into the convolution before it and stores the fused weight and bias as new anonymous
/// initializers ("onnx::Conv_N"): the file computes eval-mode convolutions and no longer holds the
/// BatchNorm's weight, bias or the convolution's own weight, which PyTorch trains. A Conv whose weight
/// is such an initializer is refused (nothing else in that exporter writes an anonymous Conv weight).
static void refuse_folded_conv_weights(const onnx::GraphProto& g, const Net& net) {
  std::set<std::string> inits;
  for (const auto& init : g.initializer()) inits.insert(init.name());
  std::vector<std::string> convs;
  for (const auto& n : g.node()) {
    if ((n.op_type() != "Conv" && n.op_type() != "ConvTranspose") || n.input_size() < 2) continue;
    if (inits.count(n.input(1)) && anonymous(n.input(1))) convs.push_back(fmt::format("\"{}\"", n.name()));
  }
  if (convs.empty()) return;
  const size_t shown = std::min<size_t>(convs.size(), 3);
  throw UserError(fmt::format(
      "{}: {} convolution(s) ({}{}) read weights the exporter computed (anonymous initializers \"onnx::Conv_N\"): "
      "torch.onnx.export with dynamo=False in eval mode (its default) folds each BatchNorm into the "
      "convolution before it, so the file computes eval-mode convolutions and has lost the BatchNorm "
      "layers' weight and bias, which PyTorch trains; training it would train a different model. Export "
      "in training mode without folding: torch.onnx.export(model, args, f, dynamo=False, "
      "training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False), or with graphpipe.export "
      "(python/graphpipe), which does this",
      net.path, convs.size(), fmt::join(convs.begin(), convs.begin() + static_cast<std::ptrdiff_t>(shown), ", "),
      convs.size() > shown ? ", ..." : ""));
}

void read_provenance(const onnx::ModelProto& model, Net& net) {
  const onnx::GraphProto& g = model.graph();
  for (const auto& p : model.metadata_props())
    if (p.key() == "graphpipe.export") read_export_metadata(net.path, p.value(), g, net);
  if (net.export_names) return;  // exported without folding: no copies
  if (!net.dynamo) refuse_folded_conv_weights(g, net);
  // Named 2-d initializers by shape; each anonymous one is compared with those of its transposed shape.
  std::map<std::pair<int64_t, int64_t>, std::vector<const onnx::TensorProto*>> named;
  for (const auto& init : g.initializer())
    if (auto d = matrix_dims(init); d && !anonymous(init.name())) named[*d].push_back(&init);
  for (const auto& init : g.initializer()) {
    auto d = matrix_dims(init);
    if (!d || !anonymous(init.name())) continue;
    auto it = named.find({d->second, d->first});
    if (it == named.end() || all_equal(init, d->first * d->second)) continue;
    for (const onnx::TensorProto* orig : it->second)
      if (is_transpose(init, *orig, d->first, d->second)) {
        net.transposed_copy_of[init.name()] = orig->name();
        break;
      }
  }
}

void tie_shared_params(const Net& net, const std::vector<ParamSource>& sources, ir::Model& model,
                       OnnxImportReport* report) {
  const TieMode mode = tie_mode(net);
  std::map<std::string, std::vector<const ParamSource*>> users;  // root tensor -> its slots
  std::map<std::string, Root> roots;
  std::map<std::string, std::set<std::string>> merged;  // initializer -> the parameter names merged into it
  std::map<std::string, std::set<std::string>> copies;  // original -> its folded transposed copies
  auto pytorch_tie = [&](const std::string& init, const std::string& name) {
    const auto it = net.export_names->find(init);
    return it != net.export_names->end() && std::find(it->second.begin(), it->second.end(), name) != it->second.end();
  };
  const bool merges_tied = mode == TieMode::keep, copies_tied = mode == TieMode::automatic;
  for (const ParamSource& ps : sources) {
    if (!ps.error.empty() || ps.tensor.empty()) continue;
    Root r = root_of(net, ps);
    if (r.tensor.empty()) continue;
    if (!r.merged_as.empty()) {
      merged[r.tensor].insert(r.merged_as);
      const bool tied = mode == TieMode::exact ? pytorch_tie(r.tensor, r.merged_as) : merges_tied;
      if (!tied) r.tensor = r.merged_as;  // a parameter of its own, its value read through the Identity
    }
    if (auto c = net.transposed_copy_of.find(r.tensor); c != net.transposed_copy_of.end()) {
      copies[c->second].insert(r.tensor);
      if (copies_tied) {  // read as the original: one more transpose on the way up
        for (auto& p : r.perm) p = 1 - p;
        r.tensor = c->second;
      }
    }
    users[r.tensor].push_back(&ps);
    roots[ps.op + "/" + ps.param] = r;
  }
  std::vector<OnnxSharedNote> notes;
  for (const auto& [init, names] : merged)
    notes.push_back({init,
                     {names.begin(), names.end()},
                     "merged",
                     mode == TieMode::exact ? pytorch_tie(init, *names.begin()) : merges_tied});
  for (const auto& [orig, cs] : copies) notes.push_back({orig, {cs.begin(), cs.end()}, "transposed copy", copies_tied});
  warn_ties(net.path, notes, mode);
  for (const auto& [tensor, slots] : users) {
    std::vector<std::string> ops;
    for (const ParamSource* ps : slots)
      if (std::find(ops.begin(), ops.end(), ps->op) == ops.end()) ops.push_back(ps->op);
    if (ops.size() < 2) continue;  // one op's packed Q/K/V parts, or an ordinary parameter
    ir::SharedParam sp{tensor, slots.front()->shape, {}};
    const std::vector<int64_t>& first = roots.at(slots.front()->op + "/" + slots.front()->param).perm;
    for (const ParamSource* ps : slots) {
      const std::string use = ps->op + "/" + ps->param;
      // Equal when every slot reads the root through the same permutation (and takes all of it).
      GP_CHECK(ps->parts == 1 && ps->shape == sp.shape && roots.at(use).perm == first,
               "{}: initializer \"{}\" is shared by ops \"{}\" and \"{}\" in different layouts (as [{}] and [{}]{}); "
               "only a parameter used with the same shape and element order by every op can be tied",
               net.path, tensor, slots.front()->op, ps->op, fmt::join(sp.shape, ", "), fmt::join(ps->shape, ", "),
               ps->parts > 1 ? ", a part of it" : "");
      sp.uses.push_back(use);
    }
    const bool noted = merged.count(tensor) || copies.count(tensor);
    if (!noted) {
      std::vector<std::string> names;
      if (net.export_names && net.export_names->count(tensor)) names = net.export_names->at(tensor);
      notes.push_back({tensor, names, net.export_names ? "named tie" : "tie", true});
    }
    model.shared_params.push_back(std::move(sp));
  }
  ir::validate_shared_params(model, net.path);
  if (report) {
    report->ties_mode = mode_name(mode);
    report->shared = std::move(notes);
    report->without_values = net.weight_inputs;
    report->dynamo = net.dynamo;
  }
}

}  // namespace gp::importers::onnx_detail
