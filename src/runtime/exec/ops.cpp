// LibTorch implementations of every ir::OpKind (semantics documented in ir/model.h).
#include "runtime/exec/ops.h"

#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>

#include "ir/attrs.h"
#include "runtime/exec/params.h"
#include "runtime/exec/stable_hash.h"
#include "support/error.h"

namespace gp::runtime {

namespace {

torch::Tensor dropout(const ir::Graph& g, const ir::Op& op, const torch::Tensor& x, const MicroBatchInfo& info,
                      uint64_t seed) {
  double p = ir::attr_num(op, "p", 0.1, g.name());
  if (p == 0 || !info.train) return x;
  // One mask row per global sample: independent of how the mini-batch is split.
  uint64_t base = stable_hash({"dropout", op.name}, seed);
  std::vector<int64_t> per_sample(x.sizes().begin() + 1, x.sizes().end());
  std::vector<torch::Tensor> rows;
  rows.reserve(static_cast<size_t>(x.size(0)));
  for (int64_t i = 0; i < x.size(0); ++i) {
    auto gen = at::make_generator<at::CPUGeneratorImpl>(stable_hash_ints(base, {info.sample_begin + i, info.step}));
    rows.push_back(torch::rand(per_sample, gen, torch::kFloat32).ge(p));
  }
  // A bool mask: backward keeps it (1 byte per element, as the cost model counts), not a float copy.
  // The rows come from CPU generators (the same masks on every device), then go to x's device.
  torch::Tensor mask = rows.empty() ? torch::ones_like(x, torch::kBool) : torch::stack(rows).to(x.device());
  return x * mask * (1.0 / (1.0 - p));
}

/// Constant padding over the per-sample dims; `pads` in the IR's order (all begins, then all ends).
torch::Tensor pad(const torch::Tensor& x, const std::vector<int64_t>& pads, double value) {
  const size_t r = pads.size() / 2;
  std::vector<int64_t> torch_pads;  // last dim first, (begin, end) pairs
  for (size_t d = r; d-- > 0;) {
    torch_pads.push_back(pads[d]);
    torch_pads.push_back(pads[d + r]);
  }
  return torch::constant_pad_nd(x, torch_pads, value);
}

torch::Tensor conv2d(const ir::Graph& g, const ir::Op& op, const torch::Tensor& x,
                     const std::vector<torch::Tensor>& w) {
  ir::ConvGeometry cg = ir::conv_geometry(op, x.size(1), g.name());
  c10::optional<torch::Tensor> bias = w.size() > 1 ? c10::optional<torch::Tensor>(w[1]) : c10::nullopt;
  const std::vector<int64_t> stride{cg.sh, cg.sw}, dilation{cg.dh, cg.dw}, padding{cg.pt, cg.pl}, none{0, 0};
  if (cg.symmetric()) return torch::conv2d(x, w[0], bias, stride, padding, dilation, cg.groups);
  torch::Tensor padded = pad(x, {0, cg.pt, cg.pl, 0, cg.pb, cg.pr}, 0.0);  // asymmetric: pad first
  return torch::conv2d(padded, w[0], bias, stride, none, dilation, cg.groups);
}

// PyTorch's conv_transpose2d takes symmetric padding and output_padding < stride or dilation;
// otherwise the full output (no padding) is cropped: rows [top, top + H') of it, with zero rows
// past its end where output_padding reaches beyond the bottom padding (columns alike).
torch::Tensor conv_transpose2d(const ir::Graph& g, const ir::Op& op, const torch::Tensor& x,
                               const std::vector<torch::Tensor>& w) {
  ir::ConvGeometry cg = ir::conv_geometry(op, x.size(1), g.name());
  c10::optional<torch::Tensor> bias = w.size() > 1 ? c10::optional<torch::Tensor>(w[1]) : c10::nullopt;
  const std::vector<int64_t> stride{cg.sh, cg.sw}, dilation{cg.dh, cg.dw};
  if (cg.symmetric() && cg.oph < std::max(cg.sh, cg.dh) && cg.opw < std::max(cg.sw, cg.dw))
    return torch::conv_transpose2d(x, w[0], bias, stride, {cg.pt, cg.pl}, {cg.oph, cg.opw}, cg.groups, dilation);
  torch::Tensor full = torch::conv_transpose2d(x, w[0], c10::nullopt, stride, {0, 0}, {0, 0}, cg.groups, dilation);
  const int64_t h = full.size(2) - cg.pt - cg.pb + cg.oph, wd = full.size(3) - cg.pl - cg.pr + cg.opw;
  const int64_t extra_h = std::max<int64_t>(0, cg.oph - cg.pb), extra_w = std::max<int64_t>(0, cg.opw - cg.pr);
  if (extra_h > 0 || extra_w > 0) full = torch::constant_pad_nd(full, {0, extra_w, 0, extra_h}, 0.0);
  torch::Tensor y = full.narrow(2, cg.pt, h).narrow(3, cg.pl, wd);
  return bias ? y + bias->view({1, -1, 1, 1}) : y;
}

torch::Tensor pool2d(const ir::Graph& g, const ir::Op& op, const torch::Tensor& x) {
  const ir::PoolGeometry pg = ir::pool_geometry(op, g.name());
  const std::vector<int64_t> k{pg.kh, pg.kw}, s{pg.sh, pg.sw}, p{pg.ph, pg.pw};
  if (op.kind == ir::OpKind::maxpool) return torch::max_pool2d(x, k, s, p, {pg.dh, pg.dw}, pg.ceil_mode);
  return torch::avg_pool2d(x, k, s, p, pg.ceil_mode, pg.count_include_pad);
}

torch::Tensor resize(const ir::Graph& g, const ir::Op& op, const torch::Tensor& x) {
  const std::vector<int64_t> size = ir::attr_ints(op, "size", g.name());
  c10::optional<double> sh, sw;
  if (op.attrs.contains("scales")) {
    sh = op.attrs.at("scales")[0].get<double>();
    sw = op.attrs.at("scales")[1].get<double>();
  }
  if (ir::attr_choice(op, "mode", "nearest", {"nearest", "linear"}, g.name()) == "nearest")
    return torch::upsample_nearest2d(x, size, sh, sw);
  return torch::upsample_bilinear2d(x, size, ir::attr_bool(op, "align_corners", false, g.name()), sh, sw);
}

/// add / mul over broadcast operands, the parameter (if any) last.
torch::Tensor elementwise(const ir::Op& op, const std::vector<torch::Tensor>& in, const std::vector<torch::Tensor>& w) {
  std::vector<torch::Tensor> all = in;
  if (!w.empty()) all.push_back(w[0]);  // per-sample shape: broadcasts against [B, ...] from the right
  torch::Tensor y = all[0];
  for (size_t i = 1; i < all.size(); ++i) y = op.kind == ir::OpKind::add ? y + all[i] : y * all[i];
  return y;
}

torch::Tensor concat(const ir::Graph& g, const ir::Op& op, const std::vector<torch::Tensor>& in,
                     const std::vector<torch::Tensor>& w) {
  std::vector<torch::Tensor> all = in;
  if (!w.empty()) {  // the parameter, repeated for every sample (gradients sum over the batch)
    std::vector<int64_t> shape{in[0].size(0)};
    shape.insert(shape.end(), w[0].sizes().begin(), w[0].sizes().end());
    all.insert(all.begin() + ir::attr_int(op, "param_at", 0, g.name()), w[0].unsqueeze(0).expand(shape));
  }
  return torch::cat(all, ir::attr_axis(op, "axis", std::nullopt, static_cast<size_t>(all[0].dim()), g.name()));
}

// Masks as PyTorch applies them: masked scores get -inf (masked_fill: zero gradient there) or, with
// attrs.mask_fill, that value added (BERT's (1 - m) * -10000).
torch::Tensor attention(const ir::Graph& g, const ir::Op& op, const std::vector<torch::Tensor>& in,
                        const std::vector<torch::Tensor>& w) {
  const torch::Tensor& x = in[0];
  const ir::AttentionInputs a = ir::attention_inputs(op, g.name());
  const torch::Tensor& mem = in[static_cast<size_t>(a.kv)];  // x itself unless cross-attention
  int64_t heads = ir::attr_int(op, "heads", std::nullopt, g.name());
  int64_t b = x.size(0), s = x.size(1), h = x.size(2), dh = h / heads, t = mem.size(1);
  auto split = [&](const torch::Tensor& y, int64_t n) { return y.view({b, n, heads, dh}).transpose(1, 2); };
  torch::Tensor q = split(torch::linear(x, w[0], w[1]), s);
  torch::Tensor k = split(torch::linear(mem, w[2], w[3]), t);
  torch::Tensor v = split(torch::linear(mem, w[4], w[5]), t);
  torch::Tensor scores = torch::matmul(q, k.transpose(-2, -1)) * (1.0 / std::sqrt(static_cast<double>(dh)));
  if (ir::attr_bool(op, "causal", false, g.name())) {  // key j > query i
    torch::Tensor future = torch::ones({s, t}, torch::TensorOptions(torch::kBool).device(x.device())).triu(1);
    scores = scores.masked_fill(future, -std::numeric_limits<double>::infinity());
  }
  if (a.mask >= 0) {  // a padding mask m [b, t] over the keys
    torch::Tensor set = in[static_cast<size_t>(a.mask)].ne(0);
    torch::Tensor masked = (ir::attr_choice(op, "mask", "keep", {"keep", "ignore"}, g.name()) == "keep"
                                ? set.logical_not()
                                : set)
                               .view({b, 1, 1, t});
    if (op.attrs.contains("mask_fill"))
      scores = scores + masked.to(scores.scalar_type()) * ir::attr_num(op, "mask_fill", 0, g.name());
    else scores = scores.masked_fill(masked, -std::numeric_limits<double>::infinity());
  }
  torch::Tensor o = torch::matmul(torch::softmax(scores, -1), v);  // [b, heads, s, dh]
  return torch::linear(o.transpose(1, 2).reshape({b, s, h}), w[6], w[7]);
}

// F.cross_entropy with the op's ignore_index and label_smoothing (mean over the labels not ignored).
torch::Tensor cross_entropy(const ir::Graph& g, const ir::Op& op, const torch::Tensor& logits,
                            const torch::Tensor& labels) {
  return torch::cross_entropy_loss(logits, labels, {}, at::Reduction::Mean,
                                   ir::attr_int(op, "ignore_index", -100, g.name()),
                                   ir::attr_num(op, "label_smoothing", 0.0, g.name()));
}

// torchvision's shifted_window_attention (Swin v1), step by step as PyTorch computes it (ir/model.h).
torch::Tensor window_attention(const ir::Graph& g, const ir::Op& op, const torch::Tensor& x,
                               const std::vector<torch::Tensor>& w) {
  const int64_t heads = ir::attr_int(op, "heads", std::nullopt, g.name());
  const std::vector<int64_t> win = ir::attr_ints(op, "window", g.name());
  std::vector<int64_t> shift = op.attrs.contains("shift") ? ir::attr_ints(op, "shift", g.name())
                                                          : std::vector<int64_t>{0, 0};
  const int64_t b = x.size(0), h = x.size(1), wd = x.size(2), c = x.size(3), wh = win[0], ww = win[1];
  const int64_t pad_r = (ww - wd % ww) % ww, pad_b = (wh - h % wh) % wh;
  torch::Tensor xp = torch::constant_pad_nd(x, {0, 0, 0, pad_r, 0, pad_b}, 0.0);
  const int64_t ph = xp.size(1), pw = xp.size(2);
  if (wh >= ph) shift[0] = 0;  // a window as large as the map: nothing to shift
  if (ww >= pw) shift[1] = 0;
  const bool shifted = shift[0] + shift[1] > 0;
  if (shifted) xp = torch::roll(xp, {-shift[0], -shift[1]}, {1, 2});
  const int64_t nw = (ph / wh) * (pw / ww), n = wh * ww, dh = c / heads;
  torch::Tensor xw = xp.view({b, ph / wh, wh, pw / ww, ww, c}).permute({0, 1, 3, 2, 4, 5}).reshape({b * nw, n, c});
  torch::Tensor qkv = torch::linear(xw, w[0], w[1]).reshape({b * nw, n, 3, heads, dh}).permute({2, 0, 3, 1, 4});
  torch::Tensor q = qkv[0] * std::pow(static_cast<double>(dh), -0.5);
  torch::Tensor attn = q.matmul(qkv[1].transpose(-2, -1));
  // relative_position_index[i, j] = (hi - hj + wh - 1) (2 ww - 1) + (wi - wj + ww - 1), i, j in a window
  auto lopts = torch::TensorOptions(torch::kLong).device(x.device());
  torch::Tensor hs = torch::arange(wh, lopts).repeat_interleave(ww), ws = torch::arange(ww, lopts).repeat({wh});
  torch::Tensor index = (hs.unsqueeze(1) - hs.unsqueeze(0) + (wh - 1)) * (2 * ww - 1) +
                        (ws.unsqueeze(1) - ws.unsqueeze(0) + (ww - 1));
  attn = attn + w[4].index_select(0, index.flatten()).view({n, n, heads}).permute({2, 0, 1}).contiguous().unsqueeze(0);
  if (shifted) {  // -100 between tokens of different regions of the rolled map (Swin's attn_mask)
    torch::Tensor region = torch::zeros({ph, pw}, torch::TensorOptions(x.scalar_type()).device(x.device()));
    auto bounds = [](int64_t lo, std::optional<int64_t> hi, int64_t d) {  // Python's [lo:hi] on a length-d axis
      auto norm = [d](int64_t v) { return std::clamp(v < 0 ? v + d : v, int64_t{0}, d); };
      int64_t a = norm(lo), e = hi ? norm(*hi) : d;
      return std::pair<int64_t, int64_t>{a, std::max(a, e)};
    };
    const std::pair<int64_t, std::optional<int64_t>> hsl[3] = {{0, -wh}, {-wh, -shift[0]}, {-shift[0], std::nullopt}};
    const std::pair<int64_t, std::optional<int64_t>> wsl[3] = {{0, -ww}, {-ww, -shift[1]}, {-shift[1], std::nullopt}};
    int64_t count = 0;
    for (const auto& [h0, h1] : hsl)
      for (const auto& [w0, w1] : wsl) {
        auto [ra, rb] = bounds(h0, h1, ph);
        auto [ca, cb] = bounds(w0, w1, pw);
        region.slice(0, ra, rb).slice(1, ca, cb).fill_(static_cast<double>(count++));
      }
    torch::Tensor m = region.view({ph / wh, wh, pw / ww, ww}).permute({0, 2, 1, 3}).reshape({nw, n});
    torch::Tensor diff = m.unsqueeze(1) - m.unsqueeze(2);
    torch::Tensor mask = diff.ne(0).to(attn.scalar_type()) * -100.0;
    attn = (attn.view({b, nw, heads, n, n}) + mask.unsqueeze(1).unsqueeze(0)).view({-1, heads, n, n});
  }
  torch::Tensor o = torch::softmax(attn, -1).matmul(qkv[2]).transpose(1, 2).reshape({b * nw, n, c});
  o = torch::linear(o, w[2], w[3])
          .view({b, ph / wh, pw / ww, wh, ww, c})
          .permute({0, 1, 3, 2, 4, 5})
          .reshape({b, ph, pw, c});
  if (shifted) o = torch::roll(o, {shift[0], shift[1]}, {1, 2});
  return o.slice(1, 0, h).slice(2, 0, wd).contiguous();
}

}  // namespace

torch::Tensor run_op(const ir::Graph& g, OpId id, const std::vector<torch::Tensor>& in,
                     const std::vector<torch::Tensor>& w, const MicroBatchInfo& info, uint64_t seed) {
  const ir::Op& op = g.op(id);
  const std::string& where = g.name();
  auto rank = [&](size_t i) { return static_cast<size_t>(in.at(i).dim()); };
  switch (op.kind) {
    case ir::OpKind::linear: return torch::linear(in[0], w[0], w.size() > 1 ? w[1] : torch::Tensor());
    case ir::OpKind::matmul: return torch::matmul(in[0], in[1]);
    case ir::OpKind::add:
    case ir::OpKind::mul: return elementwise(op, in, w);
    case ir::OpKind::concat: return concat(g, op, in, w);
    case ir::OpKind::slice:
      return in[0].slice(ir::attr_axis(op, "axis", std::nullopt, rank(0), where),
                         ir::attr_int(op, "start", std::nullopt, where), ir::attr_int(op, "end", std::nullopt, where),
                         ir::attr_int(op, "step", 1, where));
    case ir::OpKind::gather:
      return in[0].index_select(
          ir::attr_axis(op, "axis", std::nullopt, rank(0), where),
          torch::tensor(ir::attr_ints(op, "indices", where), torch::TensorOptions(torch::kLong)).to(in[0].device()));
    case ir::OpKind::relu: return torch::relu(in[0]);
    case ir::OpKind::gelu: return torch::gelu(in[0]);  // exact (erf) form
    case ir::OpKind::sigmoid: return torch::sigmoid(in[0]);
    case ir::OpKind::tanh: return torch::tanh(in[0]);
    case ir::OpKind::clip: {
      auto bound = [&](const char* key) {
        return op.attrs.contains(key) ? c10::optional<c10::Scalar>(ir::attr_num(op, key, 0, where)) : c10::nullopt;
      };
      return torch::clamp(in[0], bound("min"), bound("max"));
    }
    case ir::OpKind::hardsigmoid: {
      double alpha = ir::attr_num(op, "alpha", 1.0 / 6, where), beta = ir::attr_num(op, "beta", 0.5, where);
      return torch::clamp(in[0] * alpha + beta, 0.0, 1.0);
    }
    case ir::OpKind::hardswish: return torch::hardswish(in[0]);
    case ir::OpKind::pad: return pad(in[0], ir::attr_ints(op, "pads", where), ir::attr_num(op, "value", 0, where));
    case ir::OpKind::softmax: return torch::softmax(in[0], ir::attr_axis(op, "axis", -1, rank(0), where));
    case ir::OpKind::layernorm:
      return torch::layer_norm(in[0], {in[0].size(-1)}, w[0], w[1], ir::attr_num(op, "eps", 1e-5, where));
    case ir::OpKind::dropout: return dropout(g, op, in[0], info, seed);
    case ir::OpKind::embedding_bag: {
      int64_t b = in[0].size(0), bag = in[0].size(1);
      torch::Tensor offsets = torch::arange(0, b * bag, bag, torch::TensorOptions(torch::kLong).device(in[0].device()));
      return std::get<0>(torch::embedding_bag(w[0], in[0].reshape({-1}), offsets, false, /*sum*/ 0));
    }
    case ir::OpKind::embedding: {
      torch::Tensor idx = in[0];
      if (op.attrs.contains("offsets"))  // per column of the last dim (or one for all), as x + offsets
        idx = idx +
              torch::tensor(ir::attr_ints(op, "offsets", where), torch::TensorOptions(torch::kLong)).to(idx.device());
      torch::Tensor y = torch::embedding(w[0], idx);
      if (w.size() == 1) return y;
      return y + w[1].narrow(0, 0, in[0].size(1));  // learned positions 0..seq-1, broadcast over the batch
    }
    case ir::OpKind::attention: return attention(g, op, in, w);
    case ir::OpKind::window_attention: return window_attention(g, op, in[0], w);
    case ir::OpKind::conv2d: return conv2d(g, op, in[0], w);
    case ir::OpKind::batchnorm:  // training mode: statistics of this micro-batch
      return torch::batch_norm(in[0], w[0], w[1], {}, {}, true, 0.1, ir::attr_num(op, "eps", 1e-5, where), false);
    case ir::OpKind::conv_transpose2d: return conv_transpose2d(g, op, in[0], w);
    case ir::OpKind::maxpool:
    case ir::OpKind::avgpool: return pool2d(g, op, in[0]);
    case ir::OpKind::resize: return resize(g, op, in[0]);
    case ir::OpKind::global_avgpool: return in[0].mean({2, 3});
    case ir::OpKind::flatten: return in[0].flatten(1);
    case ir::OpKind::reshape: {
      std::vector<int64_t> shape{in[0].size(0)};
      for (int64_t d : ir::attr_ints(op, "shape", where)) shape.push_back(d);
      return in[0].reshape(shape);
    }
    case ir::OpKind::transpose: return in[0].permute(ir::attr_ints(op, "perm", where));
    case ir::OpKind::mean:
    case ir::OpKind::sum: {
      int64_t axis = ir::attr_axis(op, "axis", std::nullopt, rank(0), where);
      bool keep = ir::attr_bool(op, "keepdim", false, where);
      return op.kind == ir::OpKind::mean ? in[0].mean(axis, keep) : in[0].sum(axis, keep);
    }
    case ir::OpKind::mse_loss: return torch::mse_loss(in[0], in[1]);
    case ir::OpKind::bce_with_logits: return torch::binary_cross_entropy_with_logits(in[0], in[1]);
    case ir::OpKind::cross_entropy: return cross_entropy(g, op, in[0], in[1]);
  }
  GP_ASSERT(false, "unhandled op kind {}", ir::to_string(op.kind));
  return {};
}

}  // namespace gp::runtime
