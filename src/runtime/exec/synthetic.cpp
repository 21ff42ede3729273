// Synthetic, partition-independent training data (synthetic.h).
#include "runtime/exec/synthetic.h"

#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <mutex>
#include <tuple>
#include <vector>

#include "ir/attrs.h"
#include "runtime/exec/stable_hash.h"
#include "support/error.h"

namespace gp::runtime {

namespace {

/// The smallest range the readers of `name` take its values in (0: none says); index tensors moved
/// by data movement ops (ids[:, k] before a table) are followed to their readers.
int64_t reader_range(const ir::Graph& g, const std::string& name, int depth) {
  int64_t range = 0;
  for (size_t i = 0; i < g.num_ops(); ++i) {
    const ir::Op& op = g.op(OpId(static_cast<int32_t>(i)));
    for (size_t k = 0; k < op.inputs.size(); ++k) {
      if (op.inputs[k] != name) continue;
      int64_t r = 0;
      if (op.dtype == ir::DType::i64 && depth < 16) r = reader_range(g, op.name, depth + 1);
      if ((op.kind == ir::OpKind::embedding_bag || op.kind == ir::OpKind::embedding) && k == 0) {
        r = op.attrs.value("rows", int64_t{0});
        if (op.attrs.contains("offsets"))  // indices + offsets must stay in the table
          for (int64_t o : ir::attr_ints(op, "offsets", g.name()))
            r = std::min(r, op.attrs.value("rows", int64_t{0}) - o);
      }
      if (op.kind == ir::OpKind::attention && static_cast<int>(k) == ir::attention_inputs(op, g.name()).mask)
        r = 2;  // a padding mask: 0 / 1
      if (op.kind == ir::OpKind::cross_entropy && k == 1) {
        OpId logits = g.find(op.inputs[0]);
        const ir::Shape& s = logits.valid() ? g.op(logits).output_shape : g.find_input(op.inputs[0])->shape;
        r = s.at(1);  // classes: dim 1 of [B, C] or per-position [B, C, d1, ...] logits
      }
      if (r > 0) range = range == 0 ? r : std::min(range, r);
    }
  }
  return range;
}

}  // namespace

std::optional<int64_t> ignored_label(const ir::Graph& g, int input_index) {
  const std::string& name = g.model().inputs.at(static_cast<size_t>(input_index)).name;
  for (size_t i = 0; i < g.num_ops(); ++i) {
    const ir::Op& op = g.op(OpId(static_cast<int32_t>(i)));
    if (op.kind == ir::OpKind::cross_entropy && op.inputs.size() == 2 && op.inputs[1] == name && op.attrs.is_object() &&
        op.attrs.contains("ignore_index"))
      return ir::attr_int(op, "ignore_index", std::nullopt, g.name());
  }
  return std::nullopt;
}

int64_t index_range(const ir::Graph& g, int input_index) {
  const ir::Input& input = g.model().inputs.at(static_cast<size_t>(input_index));
  const int64_t range = reader_range(g, input.name, 0);
  GP_CHECK(range > 0,
           "{}: i64 input \"{}\" is not read as embedding indices or cross_entropy labels, so the "
           "runtime cannot tell the range of its synthetic values",
           g.name(), input.name);
  return range;
}

namespace {

/// The loss op reading graph input `name` as its target (input 1), or nullptr.
const ir::Op* target_of(const ir::Graph& g, const std::string& name) {
  for (size_t i = 0; i < g.num_ops(); ++i) {
    const ir::Op& op = g.op(OpId(static_cast<int32_t>(i)));
    if (ir::is_loss(op.kind) && op.inputs.size() == 2 && op.inputs[1] == name) return &op;
  }
  return nullptr;
}

/// The attention op reading graph input `name` as its padding mask, or nullptr.
const ir::Op* mask_reader(const ir::Graph& g, const std::string& name) {
  for (size_t i = 0; i < g.num_ops(); ++i) {
    const ir::Op& op = g.op(OpId(static_cast<int32_t>(i)));
    if (op.kind != ir::OpKind::attention) continue;
    const int mask = ir::attention_inputs(op, g.name()).mask;
    if (mask >= 0 && op.inputs[static_cast<size_t>(mask)] == name) return &op;
  }
  return nullptr;
}

/// Padding masks [count, seq]: sample i keeps its first L keys (L uniform in [1, seq]; 1 = kept,
/// as attrs.mask "keep" reads it, 0 = kept for "ignore"), so no row has every key masked.
torch::Tensor random_padding_masks(const ir::Input& input, const ir::Op& reader, int64_t sample_begin, int64_t count,
                                   uint64_t seed, int64_t step) {
  const int64_t seq = input.shape.at(1);
  const bool keep = reader.attrs.value("mask", std::string("keep")) == "keep";
  uint64_t base = stable_hash({"mask", input.name}, seed);
  torch::Tensor m = torch::zeros({count, seq}, torch::kLong);
  for (int64_t i = 0; i < count; ++i) {
    auto gen = at::make_generator<at::CPUGeneratorImpl>(stable_hash_ints(base, {sample_begin + i, step}));
    const int64_t len = 1 + torch::randint(0, seq, {1}, gen, torch::kLong).item<int64_t>();
    m[i].narrow(0, 0, len).fill_(1);
  }
  if (!keep) m = 1 - m;
  return input.dtype == ir::DType::i64 ? m : m.to(torch::kFloat32);
}

constexpr int64_t kPoolValues = int64_t{1} << 20;  // normal(0, 1) values drawn once per seed (4 MiB)

/// The pool feature samples are cut from: kPoolValues normal(0, 1) values drawn once per seed and
/// kept. Its storage is not LibTorch's, so the memory meter (which wraps LibTorch's CPU allocator)
/// counts only the inputs cut from it, as it counted inputs drawn one by one before.
const float* normal_pool(uint64_t seed) {
  static std::mutex mu;
  static auto* pools = new std::map<uint64_t, std::vector<float>>;  // never destroyed, as teacher_weights
  std::lock_guard<std::mutex> lock(mu);
  std::vector<float>& pool = (*pools)[seed];
  if (pool.empty()) {
    pool.resize(static_cast<size_t>(kPoolValues));
    auto gen = at::make_generator<at::CPUGeneratorImpl>(stable_hash({"synthetic-pool"}, seed));
    torch::from_blob(pool.data(), {kPoolValues}, torch::kFloat32).normal_(0, 1, gen);
  }
  return pool.data();
}

/// Pure random samples of one input. Features: each sample is the sum of two windows of
/// `normal_pool` that start at hashed offsets (wrapping round), over sqrt 2: normal(0, 1) again, and
/// two samples are alike only where both offsets are. A sample costs a pass, not a draw (one generator
/// and a normal draw per sample cost 1.2 ms of a 32-sample step of the overhead-heavy mmt, inside
/// the forward where every core has a worker). Indices: uniform integers in [0, range) from a
/// splitmix64 counter per value.
torch::Tensor random_rows(const ir::Input& input, int64_t range, int64_t sample_begin, int64_t count, uint64_t seed,
                          int64_t step, bool pinned) {
  std::vector<int64_t> per_sample(input.shape.begin() + 1, input.shape.end());
  const int64_t n = ir::per_sample_elems(input.shape);
  bool is_index = input.dtype == ir::DType::i64;
  uint64_t base = stable_hash({"input", input.name}, seed);
  std::vector<int64_t> shape{count};
  shape.insert(shape.end(), per_sample.begin(), per_sample.end());
  torch::Tensor out = torch::empty(
      shape, torch::TensorOptions(is_index ? torch::kLong : torch::kFloat32).pinned_memory(pinned));
  if (is_index) {
    auto* dst = out.data_ptr<int64_t>();
    const auto r = static_cast<uint64_t>(range);
    for (int64_t i = 0; i < count; ++i) {
      const uint64_t h = stable_hash_ints(base, {sample_begin + i, step});
      for (int64_t j = 0; j < n; ++j)
        dst[i * n + j] = static_cast<int64_t>(splitmix64(h + static_cast<uint64_t>(j)) % r);
    }
    return out;
  }
  const float* pool = normal_pool(seed);
  const float scale = 1.0F / std::sqrt(2.0F);
  auto* dst = out.data_ptr<float>();
  const auto offset = [](uint64_t v) { return static_cast<int64_t>(v % static_cast<uint64_t>(kPoolValues)); };
  for (int64_t i = 0; i < count; ++i) {
    const uint64_t h = stable_hash_ints(base, {sample_begin + i, step});
    int64_t a = offset(h), b = offset(splitmix64(h));
    float* row = dst + i * n;
    for (int64_t done = 0; done < n;) {
      const int64_t take = std::min({n - done, kPoolValues - a, kPoolValues - b});
      for (int64_t j = 0; j < take; ++j) row[done + j] = (pool[a + j] + pool[b + j]) * scale;
      done += take;
      a = (a + take) % kPoolValues;
      b = (b + take) % kPoolValues;
    }
  }
  return out;
}

constexpr int64_t kTeacherInputs = 256;   // feature values a target depends on
constexpr int64_t kTeacherOutputs = 64;   // distinct values of an mse target, tiled to its size
constexpr int64_t kTeacherTokenDim = 16;  // values per token in the summary of an index input

/// The teacher's fixed random weights [inputs, outputs], drawn once per seed and shape and kept (a
/// 64 x 1000 draw took 0.24 ms, per micro-batch, on the step's critical path before).
torch::Tensor teacher_weights(uint64_t seed, int64_t inputs, int64_t outputs) {
  static std::mutex mu;
  // Never destroyed: tensors freed after LibTorch's allocators at exit would crash.
  static auto* drawn = new std::map<std::tuple<uint64_t, int64_t, int64_t>, torch::Tensor>;
  std::lock_guard<std::mutex> lock(mu);
  torch::Tensor& w = (*drawn)[{seed, inputs, outputs}];
  if (!w.defined()) {
    auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
    w = torch::randn({inputs, outputs}, gen, torch::kFloat32) / std::sqrt(static_cast<double>(inputs));
  }
  return w;
}

}  // namespace

int teacher_source(const ir::Graph& g) {
  const auto& inputs = g.model().inputs;
  for (bool want_index : {false, true})
    for (size_t i = 0; i < inputs.size(); ++i)
      if ((inputs[i].dtype == ir::DType::i64) == want_index && !target_of(g, inputs[i].name) &&
          !mask_reader(g, inputs[i].name))
        return static_cast<int>(i);
  return -1;
}

torch::Tensor synthetic_input(const ir::Graph& g, int input_index, int64_t sample_begin, int64_t count, uint64_t seed,
                              int64_t step, bool pinned) {
  const ir::Input& input = g.model().inputs.at(static_cast<size_t>(input_index));
  bool is_index = input.dtype == ir::DType::i64;
  int64_t range = is_index ? index_range(g, input_index) : 0;
  if (const ir::Op* reader = mask_reader(g, input.name))
    return random_padding_masks(input, *reader, sample_begin, count, seed, step);
  const ir::Op* loss = target_of(g, input.name);
  int source = teacher_source(g);
  if (!loss || source < 0) return random_rows(input, range, sample_begin, count, seed, step, pinned);

  // A target: a fixed random function (the "teacher", depending on seed and the input's name) of
  // the same samples' first feature input, so there is something to learn: the class with the
  // largest teacher logit, or tanh of teacher outputs. The teacher reads a summary a typical
  // model can represent: sequences are averaged over positions, images over space, and at most
  // the first kTeacherInputs values are used.
  torch::NoGradGuard no_grad;
  torch::Tensor x = synthetic_input(g, source, sample_begin, count, seed, step);
  if (x.scalar_type() == torch::kLong) {  // token indices: the mean of a fixed random vector per token
    const ir::Input& tokens = g.model().inputs.at(static_cast<size_t>(source));
    auto tgen = at::make_generator<at::CPUGeneratorImpl>(stable_hash({"teacher-tokens", tokens.name}, seed));
    torch::Tensor table = torch::randn({index_range(g, source), kTeacherTokenDim}, tgen, torch::kFloat32);
    x = torch::embedding(table, x.reshape({count, -1})).mean(1);
  }
  if (x.dim() == 3) x = x.mean(1);       // [B, seq, hidden]: per-feature mean over the sequence
  if (x.dim() == 4) x = x.mean({2, 3});  // [B, C, H, W]: per-channel mean
  x = x.reshape({count, -1});
  x = x.narrow(1, 0, std::min<int64_t>(x.size(1), kTeacherInputs));
  int64_t per_sample = ir::per_sample_elems(input.shape);
  // Per-position labels (segmentation): one class per position, up to kTeacherOutputs distinct
  // positions, tiled like an mse target.
  const int64_t positions = is_index ? std::min(per_sample, kTeacherOutputs) : 1;
  int64_t outs = is_index ? range * positions : std::min(per_sample, kTeacherOutputs);
  torch::Tensor y = torch::matmul(x, teacher_weights(stable_hash({"teacher", input.name}, seed), x.size(1), outs));
  std::vector<int64_t> shape{count};
  shape.insert(shape.end(), input.shape.begin() + 1, input.shape.end());
  if (is_index && positions == 1) return y.argmax(1).to(torch::kLong).reshape(shape);
  if (is_index) {
    torch::Tensor cls = y.reshape({count, positions, range}).argmax(2).to(torch::kLong);  // [count, positions]
    return cls.repeat({1, (per_sample + positions - 1) / positions})
        .narrow(1, 0, per_sample)
        .reshape(shape)
        .contiguous();
  }
  // BCE targets are probabilities: 0 / 1 labels, the sign of the teacher's output.
  torch::Tensor t = loss->kind == ir::OpKind::bce_with_logits ? y.gt(0).to(torch::kFloat32) : torch::tanh(y);
  return t.repeat({1, (per_sample + outs - 1) / outs}).narrow(1, 0, per_sample).reshape(shape).contiguous();
}

TensorMap synthetic_external_inputs(const StageModule& m, const MicroBatchInfo& info, bool on_host) {
  TensorMap out;
  const auto& inputs = m.graph().model().inputs;
  const bool pinned = on_host && m.device().is_cuda();
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!std::binary_search(m.external_inputs().begin(), m.external_inputs().end(), inputs[i].name)) continue;
    torch::Tensor t = synthetic_input(m.graph(), static_cast<int>(i), info.sample_begin, info.count, m.seed(),
                                      info.step, pinned);
    out.emplace(inputs[i].name, on_host ? t : t.to(m.device()));
  }
  return out;
}

}  // namespace gp::runtime
