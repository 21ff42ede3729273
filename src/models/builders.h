// Internal to gp_models: one builder per builtin and the layer blocks they share.
#pragma once
#include <string>

#include "ir/model.h"
#include "models/zoo.h"

namespace gp::models::detail {

/// A post-LN transformer encoder layer named "<p>.attn", "<p>.add1", "<p>.ln1", "<p>.ffn1",
/// "<p>.gelu", "<p>.ffn2", "<p>.add2", "<p>.ln2" (8 ops); x is [B, seq, hidden]. Returns the output.
/// causal: the attention masks future keys (a decoder layer, attrs.causal).
std::string transformer_layer(ir::ModelBuilder& b, const std::string& p, const std::string& x, int64_t heads,
                              int64_t hidden, int64_t ffn, bool causal = false);

/// `layers` x (linear `width` + relu) named "<p>.l<i>.fc", "<p>.l<i>.relu". Returns the output.
std::string mlp(ir::ModelBuilder& b, const std::string& p, std::string x, int64_t layers, int64_t width);

ir::Model build_mmt(const BuiltinSpec& s);
ir::Model build_gpt(const BuiltinSpec& s);
ir::Model build_dlrm(const BuiltinSpec& s);
ir::Model build_candle_uno(const BuiltinSpec& s);
ir::Model build_inception(const BuiltinSpec& s);

}  // namespace gp::models::detail
