// Roofline, communication and stage-cost numbers, each checked against a hand computation on the
// made-up cluster of test_util.h (peak 1e12 FLOP/s, 1e11 B/s memory, 1e-5 s per kernel).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "cost/cost_model.h"
#include "cost/profile.h"
#include "cost/tests/test_util.h"

using namespace gp;
using namespace gp::cost;
using namespace gp::cost::testing;
using ir::DType;
using ir::ModelBuilder;
using ir::OpKind;

namespace {

// Relative tolerance for hand-computed values (the model divides by 0.7 etc.).
void expect_close(double actual, double expected) {
  EXPECT_NEAR(actual, expected, 1e-12 * expected) << "expected " << expected;
}

ir::Graph linear_model() {
  ModelBuilder b("lin");
  b.input("x", {1024});
  std::string y = b.linear("fc", "x", 1024);
  b.output(b.op("loss", OpKind::mse_loss, {y, "x"}));
  return ir::Graph::build(b.build());
}

ir::Graph attention_model() {
  ModelBuilder b("att");
  b.input("x", {128, 256});
  std::string a = b.op("attn", OpKind::attention, {"x"}, {{"heads", 4}});
  b.output(b.op("loss", OpKind::mse_loss, {a, "x"}));
  return ir::Graph::build(b.build());
}

ir::Graph embedding_model() {
  ModelBuilder b("emb");
  b.input("idx", {32}, DType::i64);
  b.input("y", {64});
  std::string e = b.op("emb", OpKind::embedding_bag, {"idx"}, {{"rows", 100000}, {"dim", 64}});
  b.output(b.op("loss", OpKind::mse_loss, {e, "y"}));
  return ir::Graph::build(b.build());
}

// x -> fc1 (64->64) -> act (relu) -> fc2 (64->16) -> loss (mse vs y)
ir::Graph chain_model() {
  ModelBuilder b("chain");
  b.input("x", {64});
  b.input("y", {16});
  std::string h = b.linear("fc1", "x", 64);
  h = b.unary("act", OpKind::relu, h);
  h = b.linear("fc2", h, 16);
  b.output(b.op("loss", OpKind::mse_loss, {h, "y"}));
  return ir::Graph::build(b.build());
}

}  // namespace

TEST(Roofline, LinearIsMemoryBoundAtBatchOneAndComputeBoundAt64) {
  ir::Graph g = linear_model();
  OpId fc = g.find("fc");
  const ir::OpCosts& c = g.costs(fc);
  // Preconditions from the IR: 1024x1024 weights + bias, 2 FLOPs per multiply-add.
  ASSERT_EQ(c.param_bytes, 4 * (1024 * 1024 + 1024));
  ASSERT_EQ(c.weight_read_bytes, c.param_bytes);
  ASSERT_DOUBLE_EQ(c.fwd_flops, 2.0 * 1024 * 1024);
  ASSERT_DOUBLE_EQ(c.input_bytes + c.output_bytes, 8192.0);
  CostModel cm(g, made_up_cluster());

  // b = 1: compute 2^21 / 0.7e12 = 3.0e-6 s < memory (4198400 + 8192) / 1e11 = 4.206592e-5 s.
  OpTime t1 = cm.op_time(fc, 1);
  expect_close(t1.fwd_s, 4206592 / 1e11 + 1e-5);
  // bwd bytes: weights read + gradients written + 2x activations = 2*4198400 + 16384.
  expect_close(t1.bwd_s, (2 * 4198400.0 + 16384) / 1e11 + 1e-5);
  EXPECT_EQ(t1.source, Source::formula);

  // b = 64: compute 64 * 2^21 / 0.7e12 = 1.917e-4 s > memory (4198400 + 64*8192) / 1e11 = 4.7e-5 s.
  OpTime t64 = cm.op_time(fc, 64);
  expect_close(t64.fwd_s, 64 * 2097152 / 0.7e12 + 1e-5);
  expect_close(t64.bwd_s, 64 * 4194304 / 0.7e12 + 1e-5);
  expect_close(cm.op_step_time(fc, 64), t64.fwd_s + t64.bwd_s);
}

TEST(Roofline, AttentionCountsTheScoreMatrixAndUsesTensorCoresWhenMixed) {
  ir::Graph g = attention_model();
  OpId at = g.find("attn");
  // 4 heads x 128^2 scores x 4 bytes, written and read twice.
  EXPECT_DOUBLE_EQ(extra_bytes_per_sample(g, at), 4.0 * 4 * 128 * 128 * 4);
  const double fwd_flops = 8.0 * 128 * 256 * 256 + 4.0 * 128 * 128 * 256 + 5.0 * 4 * 128 * 128;
  ASSERT_DOUBLE_EQ(g.costs(at).fwd_flops, fwd_flops);  // 84213760
  CostModel fp32(g, made_up_cluster());
  // b = 8: compute 8 * 84213760 / (0.5 * 1e12) = 1.3474e-3 s; memory
  // (1052672 + 8 * (131072 + 131072 + 1048576)) / 1e11 = 1.154e-4 s.
  expect_close(fp32.op_time(at, 8).fwd_s, 8 * fwd_flops / 0.5e12 + 1e-5);

  Cluster mixed = made_up_cluster();
  mixed.mixed_precision = true;
  CostModel f16(g, mixed);
  // With the 8e12 peak: compute 1.684e-4 s still beats memory 1.154e-4 s.
  expect_close(f16.op_time(at, 8).fwd_s, 8 * fwd_flops / 4e12 + 1e-5);
  // b = 1, f16: compute 2.105e-5 s < memory (1052672 + 1310720) / 1e11 = 2.363392e-5 s.
  expect_close(f16.op_time(at, 1).fwd_s, 2363392 / 1e11 + 1e-5);
}

TEST(Roofline, EmbeddingBagIsMemoryBoundAndItsBackwardWritesTheWholeTable) {
  ir::Graph g = embedding_model();
  OpId e = g.find("emb");
  const ir::OpCosts& c = g.costs(e);
  ASSERT_DOUBLE_EQ(c.input_bytes, 32 * 8 + 32 * 64 * 4);  // indices + gathered rows
  ASSERT_EQ(c.weight_read_bytes, 0);
  ASSERT_EQ(c.param_bytes, int64_t{100000} * 64 * 4);
  CostModel cm(g, made_up_cluster());
  // b = 128: compute 128 * 2048 / 0.25e12 = 1.05e-6 s; memory 128 * (8448 + 256) / 1e11.
  OpTime t = cm.op_time(e, 128);
  expect_close(t.fwd_s, 128 * 8704.0 / 1e11 + 1e-5);
  expect_close(t.bwd_s, (25.6e6 + 2 * 128 * 8704.0) / 1e11 + 1e-5);
}

TEST(Roofline, TablesAgreeWithDirectComputationOffPowersOfTwo) {
  ir::Graph g = chain_model();
  CostModel cm(g, made_up_cluster());
  OpId fc1 = g.find("fc1");
  Cluster curved = made_up_cluster();  // efficiency that depends on the batch
  curved.device.efficiency = v100_efficiency();
  CostModel cm_curved(g, curved);
  for (int64_t b : std::vector<int64_t>{1, 3, 4, 5, 1000, 1024, int64_t{1} << 21}) {
    OpTime direct = roofline_time(op_work(g, fc1), g.costs(fc1), made_up_cluster().device, false, b);
    expect_close(cm.op_time(fc1, b).fwd_s, direct.fwd_s);
    expect_close(cm.op_time(fc1, b).bwd_s, direct.bwd_s);
    OpTime direct_curved = roofline_time(op_work(g, fc1), g.costs(fc1), curved.device, false, b);
    expect_close(cm_curved.op_time(fc1, b).fwd_s, direct_curved.fwd_s);
    expect_close(cm_curved.op_time(fc1, b).bwd_s, direct_curved.bwd_s);
  }
  double sum = 0;
  for (size_t i = 1; i < 3; ++i) sum += cm.op_step_time(OpId(static_cast<int32_t>(i)), 16);
  expect_close(cm.range_step_time(1, 3, 16), sum);
  expect_close(cm.range_step_time(1, 3, 17), cm.op_step_time(OpId(1), 17) + cm.op_step_time(OpId(2), 17));
  EXPECT_EQ(cm.range_step_time(2, 2, 8), 0.0);
}

TEST(Memory, StateBytesFollowTheOptimizer) {
  ir::Graph g = linear_model();
  OpId fc = g.find("fc");
  const double p = 1024 * 1024 + 1024;
  CostModel adam(g, made_up_cluster(), Optimizer::adam);
  CostModel sgd(g, made_up_cluster(), Optimizer::sgd);
  EXPECT_DOUBLE_EQ(adam.state_bytes(fc), 4 * p + 4 * p + 2 * 4 * p);  // weights, grads, 2 moments
  EXPECT_DOUBLE_EQ(sgd.state_bytes(fc), 4 * p + 4 * p + 4 * p);       // weights, grads, momentum
  EXPECT_DOUBLE_EQ(sgd.saved_bytes(fc, 16), 16 * 1024 * 4.0);
  EXPECT_DOUBLE_EQ(sgd.range_state_bytes(0, 2), sgd.state_bytes(fc));
  EXPECT_DOUBLE_EQ(sgd.range_saved_bytes(0, 2, 16),
                   16 * (g.costs(fc).saved_bytes + g.costs(g.find("loss")).saved_bytes));
  EXPECT_EQ(optimizer_from_string("sgd"), Optimizer::sgd);
  EXPECT_THAT(error_of([] { optimizer_from_string("lamb"); }), ::testing::HasSubstr("\"lamb\""));
}

TEST(Comm, PointToPointByLinkClass) {
  ir::Graph g = chain_model();
  CostModel cm(g, made_up_cluster());
  expect_close(cm.p2p_time(0, 1, 1e6), 1e-5 + 1e6 / 1e11);
  expect_close(cm.p2p_time(3, 4, 1e6), 1e-4 + 1e6 / 1e10);
  EXPECT_EQ(cm.p2p_time(2, 2, 1e6), 0.0);
  EXPECT_EQ(cm.p2p_time(true, 0), 0.0);
  expect_close(cm.p2p_time(false, 1e6), 2e-4);
  EXPECT_EQ(cm.effective_inter_bandwidth(1), 1e10);
  EXPECT_EQ(cm.effective_inter_bandwidth(2), 1e10);  // 20 GB/s injection / 2
  EXPECT_EQ(cm.effective_inter_bandwidth(4), 5e9);
  EXPECT_EQ(cm.link_source(), Source::formula);
}

TEST(Comm, RingAllReduceIntraAndInterNode) {
  ir::Graph g = chain_model();
  CostModel cm(g, made_up_cluster());
  const double n = 4e8;
  EXPECT_EQ(cm.allreduce_time({3}, n), 0.0);
  EXPECT_EQ(cm.allreduce_time(1, true, n), 0.0);
  // d = 4 in one node: 2*3/4 * 4e8 / 1e11 + 2*3 * 1e-5 = 6e-3 + 6e-5.
  expect_close(cm.allreduce_time({0, 1, 2, 3}, n), 6.06e-3);
  expect_close(cm.allreduce_time(4, true, n), 6.06e-3);
  // d = 4 over two nodes, 2 per node: bus bandwidth min(2 x 10 GB/s, 20 GB/s injection, 100 GB/s).
  expect_close(cm.allreduce_time({0, 1, 4, 5}, n), 1.5 * n / 2e10 + 6 * 1e-4);
  expect_close(cm.allreduce_time(4, false, n), 1.5 * n / 2e10 + 6 * 1e-4);
  // One member per node: a single NIC, 10 GB/s.
  expect_close(cm.allreduce_time({0, 4}, n), n / 1e10 + 2 * 1e-4);
  // 3 + 1 members: the lone member's node limits the ring to one NIC.
  expect_close(cm.allreduce_time({0, 1, 2, 4}, n), 1.5 * n / 1e10 + 6 * 1e-4);
  // d = 8: 4 NICs per node capped at the 20 GB/s injection.
  expect_close(cm.allreduce_time(8, false, n), 1.75 * n / 2e10 + 14 * 1e-4);
}

// Gloo's ring (the cpu preset, "collectives": "gloo"): segments of at most 1 MiB, at least 2 per rank, a
// multiple of the ranks; two link latencies per ring step of a pair of segments (the receiver's notice
// and the data), the bytes as in NCCL's ring.
TEST(Comm, GlooRingPaysTheNoticeOfEverySegment) {
  ir::Graph g = chain_model();
  Cluster c = made_up_cluster();
  c.gloo_collectives = true;
  CostModel cm(g, c);
  // Small: 2 segments per rank, 2 (d-1) x 2 latencies; d = 4 in one node, latency 1e-5.
  expect_close(cm.allreduce_time({0, 1, 2, 3}, 1e3), 1.5 * 1e3 / 1e11 + 12 * 1e-5);
  // Two nodes, one member each: 4 latencies of the inter link.
  expect_close(cm.allreduce_time({0, 4}, 1e3), 1e3 / 1e10 + 4 * 1e-4);
  // 10 MiB over 2 ranks: 10 segments, 5 per rank, 2 x 5 latencies.
  const double n = 10.0 * (1 << 20);
  expect_close(cm.allreduce_time({0, 4}, n), n / 1e10 + 10 * 1e-4);
  // 10 MiB over 4 ranks: 10 segments rounded up to 12, 3 per rank, 2 x 3 x 3 latencies.
  expect_close(cm.allreduce_time({0, 1, 2, 3}, n), 1.5 * n / 1e11 + 18 * 1e-5);
  // The same cluster with NCCL's collectives: one latency per ring step.
  CostModel nccl(g, made_up_cluster());
  expect_close(nccl.allreduce_time({0, 4}, n), n / 1e10 + 2 * 1e-4);
}

TEST(StageCost, MiddleOfAChainWithDataParallelism) {
  ir::Graph g = chain_model();
  CostModel cm(g, made_up_cluster(), Optimizer::adam);
  OpId act = g.find("act"), fc2 = g.find("fc2");
  std::vector<char> in_stage(g.num_ops(), 0);
  in_stage[act.v] = in_stage[fc2.v] = 1;
  // Micro-batch 8 over 2 replicas: per-device batch 4.
  StageCost s = stage_cost(cm, {act, fc2}, in_stage, 2, 8, 64, true);
  EXPECT_EQ(s.per_device_batch, 4);
  // relu (64 elems, 0.25 eff): fwd memory 4*512/1e11, bwd 2x; fc2 (64->16, 4160 weight bytes):
  // fwd memory (4160 + 4*320)/1e11, bwd (2*4160 + 2*4*320)/1e11; every kernel +1e-5.
  const double compute = 4e-5 + (2048 + 4096 + 5440 + 10880) / 1e11;
  expect_close(s.compute_s, compute);
  // In: fc1's output (4 x 256 B); out: fc2's output to the loss (4 x 64 B); each twice.
  const double comm = 2 * (1e-5 + 1024 / 1e11) + 2 * (1e-5 + 256 / 1e11);
  expect_close(s.comm_s, comm);
  // Ring of 2 in one node over fc2's 4160 gradient bytes.
  const double ar = 4160 / 1e11 + 2e-5;
  expect_close(s.allreduce_s, ar);
  // The Adam step reads and writes the stage's 16,640 state bytes once each at 1e11 B/s.
  const double opt = 2 * 16640 / 1e11;
  expect_close(s.optimizer_s, opt);
  expect_close(s.tps_s, (compute + comm) / 8 + (ar + opt) / 64);
  EXPECT_DOUBLE_EQ(s.state_bytes, 2 * 4160 + 2 * 4 * 1040);
  EXPECT_DOUBLE_EQ(s.act_bytes_per_mb, 4 * (256 + 256));
  // Memory: fc1's output gradient (4 x 256 B) is held for each of the step's 8 micro-batches until its
  // send ends; the transient is backward's: fc2's output gradient arriving (256) + fc2's output (256),
  // input (1024) and weight gradient (4160) gradients; forward's rise (outputs 1024 + 256 + received
  // 1024 - saved 2048 = 256) and Adam's two copies of fc2's weights less the held activations
  // (8320 - 3 x 2048) are smaller.
  EXPECT_DOUBLE_EQ(s.sent_grad_bytes_per_mb, 1024);
  EXPECT_EQ(s.micro_batches, 8);
  EXPECT_DOUBLE_EQ(s.transient_bytes, 256 + 256 + 1024 + 4160);
  EXPECT_DOUBLE_EQ(s.step_transient_bytes, 8320);
  StageMemory m = stage_memory_parts(s, 3);
  EXPECT_DOUBLE_EQ(m.weights + m.gradients + m.optimizer, 16640);
  EXPECT_DOUBLE_EQ(m.activations, 3 * 2048 + 8 * 1024);
  EXPECT_DOUBLE_EQ(m.transient, 5696);
  EXPECT_DOUBLE_EQ(stage_memory(s, 3), 16640 + 3 * 2048 + 8 * 1024 + 5696);
  // With no activations held the optimizer's temporaries dominate the transient.
  EXPECT_DOUBLE_EQ(stage_memory_parts(s, 0).transient, 8320);
}

TEST(Memory, MixedPrecisionHalvesActivationsAndMessagesAndKeepsMasterWeights) {
  ir::Graph g = linear_model();
  OpId fc = g.find("fc");
  const double p = 1024 * 1024 + 1024;
  Cluster c = made_up_cluster();
  c.mixed_precision = true;
  CostModel mixed(g, c, Optimizer::adam), full(g, made_up_cluster(), Optimizer::adam);
  CostModel::StateParts sp = mixed.state_parts(fc);
  EXPECT_DOUBLE_EQ(sp.weights, 2 * p);
  EXPECT_DOUBLE_EQ(sp.gradients, 2 * p);
  EXPECT_DOUBLE_EQ(sp.optimizer, 12 * p);                         // fp32 master weights + two fp32 moments
  EXPECT_DOUBLE_EQ(mixed.state_bytes(fc), full.state_bytes(fc));  // 16 bytes per parameter either way
  EXPECT_DOUBLE_EQ(mixed.saved_bytes(fc, 16), full.saved_bytes(fc, 16) / 2);
  EXPECT_DOUBLE_EQ(mixed.output_bytes(fc, 3), 3 * 1024 * 2.0);
  EXPECT_DOUBLE_EQ(full.output_bytes(fc, 3), 3 * 1024 * 4.0);
  CostModel sgd(g, c, Optimizer::sgd);
  EXPECT_DOUBLE_EQ(sgd.state_bytes(fc), (2 + 2 + 4 + 4) * p);  // master weights + momentum
}

TEST(Memory, ReserveComesOffTheUsableMemory) {
  ir::Graph g = linear_model();
  Cluster c = made_up_cluster();
  c.device.memory_reserve_bytes = 1e8;
  CostModel cm(g, c);
  EXPECT_DOUBLE_EQ(cm.usable_memory_bytes(), 9e8);
  EXPECT_DOUBLE_EQ(cm.usable_memory_bytes(5e8), 4e8);
  EXPECT_GT(load_cluster("summit").device.memory_reserve_bytes, 1e9);
  EXPECT_GT(load_cluster("cpu").device.memory_reserve_bytes, 0);
}

TEST(StageCost, WholeModelHasNoCutEdgesAndGraphInputsAreLocal) {
  ir::Graph g = chain_model();
  CostModel cm(g, made_up_cluster());
  std::vector<OpId> ops;
  for (size_t i = 0; i < g.num_ops(); ++i) ops.push_back(OpId(static_cast<int32_t>(i)));
  std::vector<char> all(g.num_ops(), 1);
  StageCost s = stage_cost(cm, ops, all, 1, 16, 16, true);
  EXPECT_EQ(s.comm_s, 0.0);
  EXPECT_EQ(s.allreduce_s, 0.0);
  expect_close(s.compute_s, cm.range_step_time(0, g.num_ops(), 16));
  expect_close(s.optimizer_s, 2 * s.state_bytes / 1e11);
  expect_close(s.tps_s, (s.compute_s + s.optimizer_s) / 16);
  // Across nodes the same stage replicated 8 ways pays the inter-node ring.
  StageCost r = stage_cost(cm, ops, all, 8, 64, 512, false);
  EXPECT_EQ(r.per_device_batch, 8);
  expect_close(
      r.allreduce_s,
      cm.allreduce_time(8, false, static_cast<double>(g.costs(ops[0]).param_bytes + g.costs(ops[2]).param_bytes)));
}

// The zero-bubble split of backward (docs/cost-model.md, "Backward split"): W is the weights'
// gradient work, B the rest; they add up to the backward, which itself does not change.
TEST(BackwardSplit, WeightFractionPerOpKind) {
  ir::Graph lin = linear_model();
  EXPECT_EQ(bwd_weight_fraction(lin, lin.find("fc")), 0.5);  // dX = dY W, dW = X^T dY
  EXPECT_EQ(bwd_weight_fraction(lin, lin.find("loss")), 0.0);
  ir::Graph emb = embedding_model();
  EXPECT_EQ(bwd_weight_fraction(emb, emb.find("emb")), 1.0);  // integer indices: no dX
  ir::Graph att = attention_model();
  // Projections: 16 seq hidden^2 FLOPs backward, half of it dW; over the whole backward.
  const double proj_bwd = 16.0 * 128 * 256 * 256;
  expect_close(bwd_weight_fraction(att, att.find("attn")), 0.5 * proj_bwd / att.costs(att.find("attn")).bwd_flops);
  ModelBuilder b("ln");
  b.input("x", {64});
  std::string y = b.op("ln", OpKind::layernorm, {"x"});
  std::string r = b.unary("act", OpKind::relu, y);
  b.output(b.op("loss", OpKind::mse_loss, {r, "x"}));
  ir::Graph g = ir::Graph::build(b.build());
  EXPECT_EQ(bwd_weight_fraction(g, g.find("ln")), 3.0 / 14.0);
  EXPECT_EQ(bwd_weight_fraction(g, g.find("act")), 0.0);
}

TEST(BackwardSplit, OpAndStageTimesAddUpToTheBackward) {
  ir::Graph g = chain_model();
  CostModel cm(g, made_up_cluster());
  std::vector<OpId> ops;
  std::vector<char> all(g.num_ops(), 1);
  for (size_t i = 0; i < g.num_ops(); ++i) ops.push_back(OpId(static_cast<int32_t>(i)));
  for (int64_t b : {1, 6, 64}) {
    for (OpId op : ops) {
      OpTime t = cm.op_time(op, b);
      EXPECT_EQ(t.bwd_weight_s, t.bwd_s * bwd_weight_fraction(g, op));
      EXPECT_DOUBLE_EQ(t.bwd_input_s() + t.bwd_weight_s, t.bwd_s);
    }
    StageCost s = stage_cost(cm, ops, all, 1, b, 64, true);
    EXPECT_GT(s.bwd_weight_s, 0);
    EXPECT_GT(s.bwd_input_s, 0);
    expect_close(s.bwd_input_s + s.bwd_weight_s, s.bwd_s);
  }
}
