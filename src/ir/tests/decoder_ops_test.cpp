// Decoder and dense-prediction ops (issue 34, item 1): conv_transpose2d, resize, general pooling and
// per-position cross-entropy: their shapes, parameters, FLOPs and the errors for bad attributes.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "ir/model.h"

using namespace gp;
using namespace gp::ir;
using ::testing::HasSubstr;

namespace {

/// x [B, c, h, w] -> op -> mse against a target of the op's shape; returns the built graph.
Graph one_op(OpKind kind, Json attrs, Shape x = {4, 6, 6}) {
  ModelBuilder b("one");
  std::string in = b.input("x", x);
  std::string y = b.op("op", kind, {in}, std::move(attrs));
  Shape t(b.shape_of(y).begin() + 1, b.shape_of(y).end());
  b.output(b.op("loss", OpKind::mse_loss, {y, b.input("t", t)}));
  return Graph::build(b.build());
}

std::string error_of(OpKind kind, Json attrs, Shape x = {4, 6, 6}) {
  try {
    one_op(kind, std::move(attrs), std::move(x));
  } catch (const UserError& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

TEST(DecoderOps, ConvTransposeShapesParamsAndFlops) {
  // PyTorch: ConvTranspose2d(4, 6, 3, stride=2, padding=1, output_padding=1) on 6x6 gives 12x12.
  Graph g = one_op(OpKind::conv_transpose2d,
                   {{"out_channels", 6}, {"kernel", 3}, {"stride", 2}, {"padding", 1}, {"output_padding", 1}});
  const OpId op = g.find("op");
  EXPECT_EQ(g.op(op).output_shape, (Shape{kBatch, 6, 12, 12}));
  const OpCosts& c = g.costs(op);
  EXPECT_EQ(c.params, 4 * 6 * 3 * 3 + 6);
  EXPECT_DOUBLE_EQ(c.fwd_flops, 2.0 * (4 * 6 * 6) * 6 * 3 * 3);  // every input pixel x its 6x3x3 window
  EXPECT_DOUBLE_EQ(c.bwd_flops, 2 * c.fwd_flops);
  EXPECT_DOUBLE_EQ(c.saved_bytes, 4.0 * 6 * 6 * 4);
  // Groups, rectangular kernel and stride, no bias: weight [4, 4/2, 3, 2].
  Graph grouped = one_op(OpKind::conv_transpose2d, {{"out_channels", 4},
                                                    {"kernel", {3, 2}},
                                                    {"stride", {2, 3}},
                                                    {"padding", {0, 1}},
                                                    {"groups", 2},
                                                    {"bias", false}});
  EXPECT_EQ(grouped.op(grouped.find("op")).output_shape, (Shape{kBatch, 4, 13, 15}));  // 5*2+3, 5*3-2+2 (6x6 input)
  EXPECT_EQ(grouped.costs(grouped.find("op")).params, 4 * 2 * 3 * 2);
  // Asymmetric padding and output padding beyond the stride, dilation: H' = 5*1 - 1 - 0 + 2*2 + 1 + 3.
  Graph odd = one_op(
      OpKind::conv_transpose2d,
      {{"out_channels", 2}, {"kernel", 3}, {"dilation", 2}, {"padding", {1, 0, 0, 2}}, {"output_padding", {3, 0}}});
  EXPECT_EQ(odd.op(odd.find("op")).output_shape, (Shape{kBatch, 2, 12, 8}));
}

TEST(DecoderOps, ConvTransposeErrorsNameTheAttribute) {
  EXPECT_THAT(error_of(OpKind::conv_transpose2d, {{"out_channels", 3}, {"kernel", 3}, {"groups", 2}}),
              HasSubstr("attrs.groups = 2 must be positive and divide the 4 input and 3 output channels"));
  EXPECT_THAT(error_of(OpKind::conv_transpose2d, {{"out_channels", 2}, {"kernel", 2}, {"output_padding", -1}}),
              HasSubstr("attrs.output_padding has value -1"));
  EXPECT_THAT(error_of(OpKind::conv_transpose2d, {{"out_channels", 2}, {"kernel", 1}, {"padding", 3}}),
              HasSubstr("padding crops the whole output"));
  EXPECT_THAT(error_of(OpKind::conv2d, {{"out_channels", 2}, {"kernel", 1}, {"output_padding", 1}}),
              HasSubstr("attrs.output_padding is an attribute of conv_transpose2d only"));
}

TEST(DecoderOps, PoolsTakeRectangularWindowsDilationCeilModeAndCountIncludePad) {
  // PyTorch: max_pool2d(kernel (3, 2), stride (2, 1), padding (1, 0), ceil_mode) on 6x6 -> 4x5.
  Graph g = one_op(OpKind::maxpool, {{"kernel", {3, 2}}, {"stride", {2, 1}}, {"padding", {1, 0}}, {"ceil_mode", true}});
  EXPECT_EQ(g.op(g.find("op")).output_shape, (Shape{kBatch, 4, 4, 5}));
  EXPECT_DOUBLE_EQ(g.costs(g.find("op")).fwd_flops, 4.0 * 4 * 5 * 3 * 2);
  // The stride defaults to the (rectangular) kernel.
  EXPECT_EQ(one_op(OpKind::avgpool, {{"kernel", {2, 3}}}).op(OpId(0)).output_shape, (Shape{kBatch, 4, 3, 2}));
  Graph dil = one_op(OpKind::maxpool, {{"kernel", 2}, {"stride", 1}, {"dilation", 2}});
  EXPECT_EQ(dil.op(dil.find("op")).output_shape, (Shape{kBatch, 4, 4, 4}));
  Graph avg = one_op(OpKind::avgpool,
                     {{"kernel", 3}, {"stride", 2}, {"padding", 1}, {"ceil_mode", true}, {"count_include_pad", false}});
  EXPECT_EQ(avg.op(avg.find("op")).output_shape, (Shape{kBatch, 4, 4, 4}));  // ceil(5 / 2) + 1, as PyTorch
  // A last window starting in the padding is dropped: 5x5, kernel 2, stride 2, padding 1 -> 3x3, not 4x4.
  EXPECT_EQ(
      one_op(OpKind::maxpool, {{"kernel", 2}, {"padding", 1}, {"ceil_mode", true}}, {4, 5, 5}).op(OpId(0)).output_shape,
      (Shape{kBatch, 4, 3, 3}));
  EXPECT_THAT(error_of(OpKind::avgpool, {{"kernel", 2}, {"dilation", 2}}), HasSubstr("only maxpool is dilated"));
  EXPECT_THAT(error_of(OpKind::maxpool, {{"kernel", 2}, {"count_include_pad", false}}),
              HasSubstr("attrs.count_include_pad is an attribute of avgpool only"));
  EXPECT_THAT(error_of(OpKind::maxpool, {{"kernel", {2, 4}}, {"padding", {1, 3}}}),
              HasSubstr("attrs.padding 1x3 must be at most half the (dilated) kernel 2x4"));
}

TEST(DecoderOps, ResizeShapesCostsAndErrors) {
  Graph g = one_op(OpKind::resize, {{"size", {12, 9}}, {"mode", "linear"}, {"align_corners", true}});
  EXPECT_EQ(g.op(g.find("op")).output_shape, (Shape{kBatch, 4, 12, 9}));
  EXPECT_EQ(g.costs(g.find("op")).params, 0);
  EXPECT_DOUBLE_EQ(g.costs(g.find("op")).fwd_flops, 8.0 * 4 * 12 * 9);
  EXPECT_DOUBLE_EQ(g.costs(g.find("op")).saved_bytes, 0);  // backward needs only the shapes
  Graph n = one_op(OpKind::resize, {{"size", {12, 12}}, {"scales", {2.0, 2.0}}});
  EXPECT_DOUBLE_EQ(n.costs(n.find("op")).fwd_flops, 1.0 * 4 * 12 * 12);
  EXPECT_THAT(error_of(OpKind::resize, {{"size", {12, 12}}, {"mode", "cubic"}}),
              HasSubstr("attrs.mode = \"cubic\" is not one of \"nearest\", \"linear\""));
  EXPECT_THAT(error_of(OpKind::resize, {{"size", {12, 12}}, {"align_corners", true}}),
              HasSubstr("attrs.align_corners is for mode \"linear\" only"));
  EXPECT_THAT(error_of(OpKind::resize, {{"size", {12}}}), HasSubstr("attrs.size has 1 values, expected [h, w]"));
  EXPECT_THAT(error_of(OpKind::resize, {{"size", {12, 12}}, {"scales", {2.0, 0.0}}}),
              HasSubstr("attrs.scales = [2.0,0.0] is not two positive numbers"));
  EXPECT_THAT(error_of(OpKind::resize, {{"size", {12, 12}}}, {4, 6}), HasSubstr("expected rank 4"));
}

TEST(DecoderOps, CrossEntropyPerPositionTakesLabelsWithoutTheClassDim) {
  ModelBuilder b("seg");
  std::string x = b.input("x", {3, 8, 8});
  std::string logits = b.op("head", OpKind::conv2d, {x}, {{"out_channels", 5}, {"kernel", 1}});
  b.output(b.op("loss", OpKind::cross_entropy, {logits, b.input("label", {8, 8}, DType::i64)}));
  Graph g = Graph::build(b.build());
  EXPECT_DOUBLE_EQ(g.costs(g.find("loss")).fwd_flops, 5.0 * 5 * 8 * 8);
  ModelBuilder bad("seg");
  std::string y = bad.input("x", {5, 8, 8});
  try {
    bad.op("loss", OpKind::cross_entropy, {y, bad.input("label", {8}, DType::i64)});
    FAIL() << "expected a UserError";
  } catch (const UserError& e) {
    EXPECT_THAT(e.what(), HasSubstr("labels have shape [B, 8], expected [B, 8, 8] for logits [B, 5, 8, 8]"));
  }
}
