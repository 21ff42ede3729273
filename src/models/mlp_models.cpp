// MLP-tower builtins: dlrm (dense MLP branches + embedding-bag branches) and candle-uno (feature
// towers). Both concatenate their branches and finish with a dense head.
#include <fmt/format.h>

#include "models/builders.h"

namespace gp::models::detail {

using ir::OpKind;

std::string mlp(ir::ModelBuilder& b, const std::string& p, std::string x, int64_t layers, int64_t width) {
  for (int64_t l = 0; l < layers; ++l) {
    x = b.linear(fmt::format("{}.l{}.fc", p, l), x, width);
    x = b.unary(fmt::format("{}.l{}.relu", p, l), OpKind::relu, x);
  }
  return x;
}

namespace {
constexpr int64_t kHeadLayers = 2;  // dense layers after the concat (DLRM's top MLP, Uno's head)
}

// DLRM: dense branch i reads "dense<i>.input" [hidden]; embedding branch j reads the i64 bag
// "emb<j>.input" [bag] from its own table. Feature interaction is a concat of every branch output,
// then the top MLP and a 2-class (click / no click) cross_entropy against "label".
ir::Model build_dlrm(const BuiltinSpec& s) {
  ir::ModelBuilder b(s.canonical());
  const int64_t hidden = s["hidden"];
  std::vector<std::string> features;
  for (int64_t i = 0; i < s["dense_branches"]; ++i) {
    const std::string p = fmt::format("dense{}", i);
    features.push_back(mlp(b, p, b.input(p + ".input", {hidden}), s["layers"], hidden));
  }
  for (int64_t j = 0; j < s["embedding_branches"]; ++j) {
    const std::string p = fmt::format("emb{}", j);
    auto idx = b.input(p + ".input", {s["bag"]}, ir::DType::i64);
    features.push_back(b.op(p + ".bag", OpKind::embedding_bag, {idx}, {{"rows", s["rows"]}, {"dim", s["dim"]}}));
  }
  auto label = b.input("label", {}, ir::DType::i64);
  auto x = features.size() == 1 ? features[0] : b.op("interact.concat", OpKind::concat, features, {{"axis", 1}});
  x = mlp(b, "top", x, kHeadLayers, hidden);
  auto logits = b.linear("top.out", x, 2);
  b.output(b.op("loss", OpKind::cross_entropy, {logits, label}));
  return b.build();
}

// CANDLE-Uno: tower i reads "tower<i>.input" [hidden] (one feature type each), `layers` dense layers;
// concat, a 2-layer dense head, one regression output, mse_loss against "target" [1].
ir::Model build_candle_uno(const BuiltinSpec& s) {
  ir::ModelBuilder b(s.canonical());
  const int64_t hidden = s["hidden"];
  std::vector<std::string> towers;
  for (int64_t i = 0; i < s["branches"]; ++i) {
    const std::string p = fmt::format("tower{}", i);
    towers.push_back(mlp(b, p, b.input(p + ".input", {hidden}), s["layers"], hidden));
  }
  auto target = b.input("target", {1});
  auto x = towers.size() == 1 ? towers[0] : b.op("merge.concat", OpKind::concat, towers, {{"axis", 1}});
  x = mlp(b, "head", x, kHeadLayers, hidden);
  auto pred = b.linear("head.out", x, 1);
  b.output(b.op("loss", OpKind::mse_loss, {pred, target}));
  return b.build();
}

}  // namespace gp::models::detail
