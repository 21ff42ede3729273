// Names of op kinds and dtypes, and their parsing with errors that list the valid names.
#include <array>
#include <string>

#include "ir/model.h"

namespace gp::ir {
namespace {

struct KindName {
  OpKind kind;
  const char* name;
};

constexpr std::array kKinds = {
    KindName{OpKind::linear, "linear"},
    KindName{OpKind::matmul, "matmul"},
    KindName{OpKind::add, "add"},
    KindName{OpKind::mul, "mul"},
    KindName{OpKind::concat, "concat"},
    KindName{OpKind::slice, "slice"},
    KindName{OpKind::gather, "gather"},
    KindName{OpKind::relu, "relu"},
    KindName{OpKind::gelu, "gelu"},
    KindName{OpKind::sigmoid, "sigmoid"},
    KindName{OpKind::tanh, "tanh"},
    KindName{OpKind::softmax, "softmax"},
    KindName{OpKind::layernorm, "layernorm"},
    KindName{OpKind::dropout, "dropout"},
    KindName{OpKind::embedding_bag, "embedding_bag"},
    KindName{OpKind::attention, "attention"},
    KindName{OpKind::conv2d, "conv2d"},
    KindName{OpKind::batchnorm, "batchnorm"},
    KindName{OpKind::maxpool, "maxpool"},
    KindName{OpKind::avgpool, "avgpool"},
    KindName{OpKind::global_avgpool, "global_avgpool"},
    KindName{OpKind::flatten, "flatten"},
    KindName{OpKind::reshape, "reshape"},
    KindName{OpKind::transpose, "transpose"},
    KindName{OpKind::mean, "mean"},
    KindName{OpKind::sum, "sum"},
    KindName{OpKind::mse_loss, "mse_loss"},
    KindName{OpKind::bce_with_logits, "bce_with_logits"},
    KindName{OpKind::cross_entropy, "cross_entropy"},
    KindName{OpKind::embedding, "embedding"},
    KindName{OpKind::clip, "clip"},
    KindName{OpKind::hardsigmoid, "hardsigmoid"},
    KindName{OpKind::hardswish, "hardswish"},
    KindName{OpKind::pad, "pad"},
    KindName{OpKind::conv_transpose2d, "conv_transpose2d"},
    KindName{OpKind::resize, "resize"},
    KindName{OpKind::window_attention, "window_attention"},
};

}  // namespace

const char* to_string(OpKind k) {
  for (const auto& kn : kKinds)
    if (kn.kind == k) return kn.name;
  GP_ASSERT(false, "unnamed op kind {}", static_cast<int>(k));
}

OpKind op_kind_from_string(const std::string& s) {
  std::string all;
  for (const auto& kn : kKinds) {
    if (s == kn.name) return kn.kind;
    all += all.empty() ? "" : ", ";
    all += kn.name;
  }
  throw UserError(fmt::format("unknown op kind \"{}\" (valid kinds: {})", s, all));
}

bool is_loss(OpKind k) { return k == OpKind::mse_loss || k == OpKind::cross_entropy || k == OpKind::bce_with_logits; }

int64_t dtype_bytes(DType t) {
  switch (t) {
    case DType::f32: return 4;
    case DType::f16: return 2;
    case DType::bf16: return 2;
    case DType::i64: return 8;
  }
  return 4;
}

const char* to_string(DType t) {
  switch (t) {
    case DType::f32: return "f32";
    case DType::f16: return "f16";
    case DType::bf16: return "bf16";
    case DType::i64: return "i64";
  }
  return "f32";
}

DType dtype_from_string(const std::string& s) {
  if (s == "f32") return DType::f32;
  if (s == "f16") return DType::f16;
  if (s == "bf16") return DType::bf16;
  if (s == "i64") return DType::i64;
  throw UserError(fmt::format("unknown dtype \"{}\" (valid: f32, f16, bf16, i64)", s));
}

}  // namespace gp::ir
