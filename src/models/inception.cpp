// The inception builtin: a GoogLeNet-style CNN. Stem (conv 7x7/2 + batchnorm + relu + maxpool 3x3/2),
// `blocks` inception blocks of 4 parallel branches, a 3x3/2 maxpool after the blocks at 1/3 and 2/3
// of the depth, global average pool, linear classifier, cross_entropy.
#include <fmt/format.h>

#include "models/builders.h"
#include "support/error.h"

namespace gp::models::detail {

using ir::OpKind;

namespace {

std::string conv_relu(ir::ModelBuilder& b, const std::string& conv_name, const std::string& relu_name,
                      const std::string& x, int64_t out, int64_t kernel) {
  auto c = b.op(conv_name, OpKind::conv2d, {x}, {{"out_channels", out}, {"kernel", kernel}, {"padding", kernel / 2}});
  return b.unary(relu_name, OpKind::relu, c);
}

std::string pool3x3(ir::ModelBuilder& b, const std::string& name, const std::string& x, int64_t stride) {
  return b.op(name, OpKind::maxpool, {x}, {{"kernel", 3}, {"stride", stride}, {"padding", 1}});
}

// Each branch outputs `c` channels, so a block outputs 4c: 1x1 | 1x1 -> 3x3 | 1x1 -> 5x5 |
// maxpool 3x3/1 -> 1x1.
std::string inception_block(ir::ModelBuilder& b, const std::string& p, const std::string& x, int64_t c) {
  std::vector<std::string> outs;
  outs.push_back(conv_relu(b, p + ".br0.conv1x1", p + ".br0.relu", x, c, 1));
  for (auto [br, k] : {std::pair{1, 3}, std::pair{2, 5}}) {
    const std::string q = fmt::format("{}.br{}", p, br);
    auto r = conv_relu(b, q + ".reduce", q + ".reduce_relu", x, c, 1);
    outs.push_back(conv_relu(b, fmt::format("{}.conv{}x{}", q, k, k), q + ".relu", r, c, k));
  }
  auto pooled = pool3x3(b, p + ".br3.pool", x, 1);
  outs.push_back(conv_relu(b, p + ".br3.proj", p + ".br3.relu", pooled, c, 1));
  return b.op(p + ".concat", OpKind::concat, outs, {{"axis", 1}});
}

}  // namespace

ir::Model build_inception(const BuiltinSpec& s) {
  const int64_t image = s["image"], blocks = s["blocks"], c = s["channels"];
  GP_CHECK(image >= 16, "{}: image = {} is too small (at least 16: the network downsamples by 16)", s.model, image);
  ir::ModelBuilder b(s.canonical());
  auto x = b.input("image", {3, image, image});
  x = b.op("stem.conv", OpKind::conv2d, {x}, {{"out_channels", c}, {"kernel", 7}, {"stride", 2}, {"padding", 3}});
  x = b.op("stem.bn", OpKind::batchnorm, {x});
  x = b.unary("stem.relu", OpKind::relu, x);
  x = pool3x3(b, "stem.pool", x, 2);
  for (int64_t i = 0; i < blocks; ++i) {
    x = inception_block(b, fmt::format("b{}", i), x, c);
    bool down = i + 1 < blocks && (i + 1 == blocks / 3 || i + 1 == 2 * blocks / 3);
    if (down) x = pool3x3(b, fmt::format("b{}.down", i), x, 2);
  }
  auto label = b.input("label", {}, ir::DType::i64);
  x = b.op("head.gap", OpKind::global_avgpool, {x});
  auto logits = b.linear("head.fc", x, s["classes"]);
  b.output(b.op("loss", OpKind::cross_entropy, {logits, label}));
  return b.build();
}

}  // namespace gp::models::detail
