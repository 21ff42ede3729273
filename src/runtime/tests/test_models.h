// Hand-built models for the runtime tests: one op of every kind, and a batchnorm-free variant.
#pragma once
#include "ir/model.h"

namespace gp::runtime::testing {

/// Every ir::OpKind at least once; losses "ce" (cross_entropy) and "mse".
/// with_batchnorm = false drops the conv/batchnorm/pool branch (micro-batch split invariance).
inline ir::Model all_kinds_model(bool with_batchnorm = true) {
  using ir::OpKind;
  ir::ModelBuilder b(with_batchnorm ? "all_kinds" : "no_bn");
  std::string x = b.input("x", {8, 16});
  std::string idx = b.input("idx", {4}, ir::DType::i64);
  std::string lab = b.input("lab", {}, ir::DType::i64);
  std::string tgt = b.input("tgt", {3});
  std::string l1 = b.linear("l1", x, 32);
  std::string ge = b.unary("gelu", OpKind::gelu, l1), re = b.unary("relu", OpKind::relu, l1);
  std::string sg = b.unary("sigmoid", OpKind::sigmoid, l1), th = b.unary("tanh", OpKind::tanh, l1);
  std::string ad = b.op("add", OpKind::add, {ge, re, sg});
  std::string mu = b.op("mul", OpKind::mul, {ad, th});
  std::string sl = b.op("slice", OpKind::slice, {mu}, {{"axis", 2}, {"start", 4}, {"end", 20}});
  std::string ct = b.op("concat", OpKind::concat, {sl, x}, {{"axis", -1}});
  std::string l2 = b.linear("l2", ct, 16, /*bias=*/false);
  std::string ln = b.op("ln", OpKind::layernorm, {l2});
  std::string dr = b.op("drop", OpKind::dropout, {ln}, {{"p", 0.5}});
  std::string at = b.op("attn", OpKind::attention, {dr}, {{"heads", 2}});
  std::string tr = b.op("transpose", OpKind::transpose, {at}, {{"perm", {0, 2, 1}}});
  std::string mm = b.op("matmul", OpKind::matmul, {at, tr});
  std::string sm = b.op("softmax", OpKind::softmax, {mm}, {{"axis", -1}});
  std::string rs = b.op("reshape", OpKind::reshape, {sm}, {{"shape", {64}}});
  std::string me = b.op("mean", OpKind::mean, {at}, {{"axis", 1}});
  std::string su = b.op("sum", OpKind::sum, {at}, {{"axis", 2}, {"keepdim", true}});
  std::string sf = b.op("sum_flat", OpKind::flatten, {su});
  std::string em = b.op("emb", OpKind::embedding_bag, {idx}, {{"rows", 10}, {"dim", 16}});
  std::string tok = b.input("tok", {6}, ir::DType::i64);
  std::string te = b.op("tok_emb", OpKind::embedding, {tok},
                        {{"rows", 7}, {"dim", 16}, {"positions", true}, {"position_rows", 9}});
  std::string tm = b.op("tok_mean", OpKind::mean, {te}, {{"axis", 1}});
  // DLRM's interaction picks positions of a flattened product; a decoder reads its encoder.
  std::string ga = b.op("gather", OpKind::gather, {rs}, {{"axis", 1}, {"indices", {3, 0, 63, 3}}});
  std::string xa = b.op("cross_attn", OpKind::attention, {at, te}, {{"heads", 4}, {"cross", true}});
  std::string xm = b.op("cross_mean", OpKind::mean, {xa}, {{"axis", 1}});
  std::vector<std::string> feats{rs, me, sf, em, tm, ga, xm};
  if (with_batchnorm) {
    std::string img = b.input("img", {3, 8, 8});
    std::string cv = b.op("conv", OpKind::conv2d, {img}, {{"out_channels", 4}, {"kernel", 3}, {"padding", 1}});
    std::string bn = b.op("bn", OpKind::batchnorm, {cv});
    std::string mp = b.op("maxpool", OpKind::maxpool, {bn}, {{"kernel", 2}});
    std::string ap = b.op("avgpool", OpKind::avgpool, {mp}, {{"kernel", 2}});
    feats.push_back(b.op("gap", OpKind::global_avgpool, {ap}));
    feats.push_back(b.op("flatten", OpKind::flatten, {ap}));
    std::string up = b.op("deconv", OpKind::conv_transpose2d, {mp},
                          {{"out_channels", 2}, {"kernel", 3}, {"stride", 2}, {"padding", 1}, {"output_padding", 1}});
    std::string rz = b.op("resize", OpKind::resize, {up}, {{"size", {12, 12}}, {"mode", "linear"}});
    feats.push_back(b.op("gap3", OpKind::global_avgpool, {rz}));
    std::string pd = b.op("pad", OpKind::pad, {bn}, {{"pads", {0, 1, 1, 0, 1, 1}}});
    std::string hs = b.op("hardsigmoid", OpKind::hardsigmoid, {pd});
    std::string hw = b.op("hardswish", OpKind::hardswish, {hs});
    std::string cl = b.op("clip", OpKind::clip, {hw}, {{"min", 0}, {"max", 6}});
    feats.push_back(b.op("gap2", OpKind::global_avgpool, {cl}));
    // Swin's shifted window attention on a map that the window does not divide (padded 6 -> 8).
    std::string map = b.input("map", {6, 6, 8});
    std::string wa = b.op("win_attn", OpKind::window_attention, {map},
                          {{"heads", 2}, {"window", {4, 4}}, {"shift", {2, 2}}});
    feats.push_back(b.op("win_flat", OpKind::flatten, {b.op("win_mean", OpKind::mean, {wa}, {{"axis", 1}})}));
  }
  std::string cat2 = b.op("features", OpKind::concat, feats, {{"axis", 1}});
  std::string logits = b.linear("logits", cat2, 5);
  b.output(b.op("ce", OpKind::cross_entropy, {logits, lab}));
  std::string pred = b.linear("pred", cat2, 3);
  b.output(b.op("mse", OpKind::mse_loss, {pred, tgt}));
  std::string click = b.linear("click", cat2, 1);
  b.output(b.op("bce", OpKind::bce_with_logits, {click, b.input("clicked", {1})}));
  return b.build();
}

}  // namespace gp::runtime::testing
