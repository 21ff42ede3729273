// Transformer builtins: mmt (parallel encoders, one per modality) and gpt (one sequential stack).
#include "models/builders.h"

#include <fmt/format.h>

#include "support/error.h"

namespace gp::models::detail {

using ir::OpKind;

std::string transformer_layer(ir::ModelBuilder& b, const std::string& p, const std::string& x, int64_t heads,
                              int64_t hidden, int64_t ffn, bool causal) {
  Json attrs{{"heads", heads}};
  if (causal) attrs["causal"] = true;
  auto attn = b.op(p + ".attn", OpKind::attention, {x}, attrs);
  auto res1 = b.op(p + ".add1", OpKind::add, {x, attn});
  auto ln1 = b.op(p + ".ln1", OpKind::layernorm, {res1});
  auto up = b.linear(p + ".ffn1", ln1, ffn);
  auto act = b.unary(p + ".gelu", OpKind::gelu, up);
  auto down = b.linear(p + ".ffn2", act, hidden);
  auto res2 = b.op(p + ".add2", OpKind::add, {ln1, down});
  return b.op(p + ".ln2", OpKind::layernorm, {res2});
}

namespace {
void check_heads(const BuiltinSpec& s) {
  GP_CHECK(s["hidden"] % s["heads"] == 0,
           "{}: heads = {} must divide hidden = {} (each head gets hidden / heads features)", s.model, s["heads"],
           s["hidden"]);
}
}  // namespace

// MMT: one encoder per modality, mean-pooled over the sequence, fused by concat + a linear head.
ir::Model build_mmt(const BuiltinSpec& s) {
  check_heads(s);
  ir::ModelBuilder b(s.canonical());
  const int64_t hidden = s["hidden"];
  std::vector<std::string> pooled;
  for (int64_t m = 0; m < s["branches"]; ++m) {
    const std::string p = fmt::format("m{}", m);
    std::string x = b.input(p + ".input", {s["seq"], hidden});
    for (int64_t l = 0; l < s["layers"]; ++l)
      x = transformer_layer(b, fmt::format("{}.l{}", p, l), x, s["heads"], hidden, s["ffn"]);
    pooled.push_back(b.op(p + ".pool", OpKind::mean, {x}, {{"axis", 1}}));
  }
  auto label = b.input("label", {}, ir::DType::i64);
  auto fused = pooled.size() == 1 ? pooled[0] : b.op("fuse.concat", OpKind::concat, pooled, {{"axis", 1}});
  auto logits = b.linear("head.fc", fused, s["classes"]);
  b.output(b.op("loss", OpKind::cross_entropy, {logits, label}));
  return b.build();
}

// GPT: a decoder: every attention is causal (costs as full attention). The input is the token embeddings [seq, hidden] (the IR has no token-embedding op); the LM
// head runs on every position (its real cost), and the logits are averaged over positions so the
// loss is cross_entropy over [B, vocab] against one label token per sample.
// With tie_embeddings=1 the input is token ids into a token embedding "wte" (with learned
// positions), and the LM head (no bias, as GPT-2's) shares wte's [vocab, hidden] table: one
// ir::SharedParam, counted once, held by each stage that holds either op.
ir::Model build_gpt(const BuiltinSpec& s) {
  check_heads(s);
  const bool tie = s["tie_embeddings"] != 0;
  GP_CHECK(s["tie_embeddings"] <= 1, "{}: tie_embeddings = {} must be 1 (tied) or left out (untied)", s.model,
           s["tie_embeddings"]);
  ir::ModelBuilder b(s.canonical());
  std::string x = tie ? b.op("wte", OpKind::embedding, {b.input("tokens", {s["seq"]}, ir::DType::i64)},
                             {{"rows", s["vocab"]}, {"dim", s["hidden"]}, {"positions", true}})
                      : b.input("tokens", {s["seq"], s["hidden"]});
  for (int64_t l = 0; l < s["layers"]; ++l)
    x = transformer_layer(b, fmt::format("l{}", l), x, s["heads"], s["hidden"], s["ffn"], /*causal=*/true);
  auto label = b.input("label", {}, ir::DType::i64);
  auto norm = b.op("final.ln", OpKind::layernorm, {x});
  auto logits = b.linear("final.lm_head", norm, s["vocab"], /*bias=*/!tie);
  auto pooled = b.op("final.pool", OpKind::mean, {logits}, {{"axis", 1}});
  b.output(b.op("loss", OpKind::cross_entropy, {pooled, label}));
  ir::Model m = b.build();
  if (tie) m.shared_params.push_back({"wte", {s["vocab"], s["hidden"]}, {"wte/weight", "final.lm_head/weight"}});
  return m;
}

}  // namespace gp::models::detail
