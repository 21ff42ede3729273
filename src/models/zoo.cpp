// The builtin registry and spec parsing ("name" or "name:k=v,k=v").
#include "models/zoo.h"

#include <charconv>
#include <fmt/format.h>
#include <limits>

#include "models/builders.h"
#include "support/error.h"

namespace gp::models {

namespace {

struct Builtin {
  ModelInfo info;
  ir::Model (*build)(const BuiltinSpec&);
};

const std::vector<Builtin>& registry() {
  static const std::vector<Builtin> r = {
      {{"mmt",
        "multi-modal transformer: one post-LN transformer encoder per modality, mean-pooled, "
        "fused by concat + a linear classifier",
        {{"branches", 4, "modalities (parallel encoders)"},
         {"layers", 8, "transformer layers per encoder"},
         {"seq", 256, "sequence length per modality"},
         {"hidden", 1024, "hidden size"},
         {"heads", 16, "attention heads (must divide hidden)"},
         {"ffn", 4096, "feed-forward inner size"},
         {"classes", 1000, "output classes"}}},
       detail::build_mmt},
      {{"dlrm",
        "deep learning recommendation model: dense-feature MLP branches and embedding-bag "
        "branches, feature interaction by concat, top MLP (2 x hidden), 2-class output",
        {{"dense_branches", 7, "dense-feature MLP branches"},
         {"embedding_branches", 7, "embedding-bag branches (one table each)"},
         {"layers", 4, "linear+relu layers per dense branch"},
         {"hidden", 4096, "width of dense branches and top MLP (also the dense input size)"},
         {"rows", 1000000, "rows per embedding table"},
         {"dim", 64, "embedding dimension"},
         {"bag", 100, "indices per embedding bag"}}},
       detail::build_dlrm},
      {{"candle-uno",
        "CANDLE-Uno drug-response model: feature towers of dense layers, concat, dense head "
        "(2 x hidden), one regression output (mse)",
        {{"branches", 7, "feature towers"},
         {"layers", 4, "linear+relu layers per tower"},
         {"hidden", 4096, "width of towers and head (also each tower's input size)"}}},
       detail::build_candle_uno},
      {{"gpt",
        "sequential decoder-only transformer, causal attention (input: token embeddings; per-position LM head)",
        {{"layers", 12, "transformer layers"},
         {"seq", 1024, "sequence length"},
         {"hidden", 768, "hidden size"},
         {"heads", 12, "attention heads (must divide hidden)"},
         {"ffn", 3072, "feed-forward inner size"},
         {"vocab", 50257, "vocabulary size"},
         {"tie_embeddings", 0, "1: token ids in, a token embedding whose table the LM head shares (tied)"}}},
       detail::build_gpt},
      {{"inception",
        "GoogLeNet-style CNN: stem, inception blocks of 4 parallel branches (1x1 | 1x1-3x3 | "
        "1x1-5x5 | pool-1x1), global average pool, linear classifier",
        {{"blocks", 9, "inception blocks"},
         {"channels", 64, "output channels per branch (a block outputs 4x)"},
         {"image", 224, "input image height and width (at least 16)"},
         {"classes", 1000, "output classes"}}},
       detail::build_inception},
  };
  return r;
}

std::string model_names() {
  std::string s;
  for (const auto& b : registry()) s += (s.empty() ? "" : ", ") + b.info.name;
  return s;
}

std::string param_names(const ModelInfo& info) {
  std::string s;
  for (const auto& p : info.params) s += (s.empty() ? "" : ", ") + p.name;
  return s;
}

const Builtin& find_builtin(const std::string& name) {
  for (const auto& b : registry())
    if (b.info.name == name) return b;
  throw UserError(fmt::format("unknown model \"{}\" (builtin models: {}; or a model file ending in .json or .onnx)",
                              name, model_names()));
}

// Parameters stay below 2^31 so products of a few of them cannot overflow int64.
constexpr int64_t kMaxParam = std::numeric_limits<int32_t>::max();

}  // namespace

const std::vector<ModelInfo>& builtin_models() {
  static const std::vector<ModelInfo> infos = [] {
    std::vector<ModelInfo> v;
    for (const auto& b : registry()) v.push_back(b.info);
    return v;
  }();
  return infos;
}

bool is_builtin(const std::string& name) {
  for (const auto& b : registry())
    if (b.info.name == name) return true;
  return false;
}

std::string BuiltinSpec::canonical() const {
  const ModelInfo& info = find_builtin(model).info;
  std::string s;
  for (const auto& p : info.params) {
    auto it = params.find(p.name);
    if (it != params.end() && it->second != p.default_value)
      s += fmt::format("{}{}={}", s.empty() ? "" : ",", p.name, it->second);
  }
  return s.empty() ? model : model + ":" + s;
}

BuiltinSpec parse_builtin_spec(const std::string& spec) {
  auto colon = spec.find(':');
  BuiltinSpec out;
  out.model = spec.substr(0, colon);
  GP_CHECK(!out.model.empty(), "empty model spec \"{}\" (builtin models: {})", spec, model_names());
  const ModelInfo& info = find_builtin(out.model).info;
  for (const auto& p : info.params) out.params[p.name] = p.default_value;
  if (colon == std::string::npos) return out;

  std::map<std::string, bool> seen;
  std::string rest = spec.substr(colon + 1);
  size_t pos = 0;
  while (pos <= rest.size()) {
    size_t comma = rest.find(',', pos);
    std::string kv = rest.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    pos = comma == std::string::npos ? rest.size() + 1 : comma + 1;
    auto eq = kv.find('=');
    GP_CHECK(eq != std::string::npos && eq > 0,
             "model spec \"{}\": expected key=value, found \"{}\" (parameters of {}: {})", spec, kv, out.model,
             param_names(info));
    std::string key = kv.substr(0, eq), val = kv.substr(eq + 1);
    GP_CHECK(out.params.count(key), "model spec \"{}\": unknown parameter \"{}\" (parameters of {}: {})", spec, key,
             out.model, param_names(info));
    GP_CHECK(!seen[key], "model spec \"{}\": parameter \"{}\" given twice", spec, key);
    seen[key] = true;
    int64_t v = 0;
    auto [ptr, ec] = std::from_chars(val.data(), val.data() + val.size(), v);
    GP_CHECK(ec == std::errc() && ptr == val.data() + val.size() && v > 0 && v <= kMaxParam,
             "model spec \"{}\": {} = \"{}\" is not a positive integer (1 to {})", spec, key, val, kMaxParam);
    out.params[key] = v;
  }
  return out;
}

ir::Model build_builtin(const BuiltinSpec& spec) { return find_builtin(spec.model).build(spec); }

ir::Model build_builtin(const std::string& spec) { return build_builtin(parse_builtin_spec(spec)); }

}  // namespace gp::models
