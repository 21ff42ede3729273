// Efficiency curves (the DeepBench V100 fit), their JSON form, and each op's work split by class.
#include "cost/efficiency.h"

#include <algorithm>
#include <cmath>

#include "cost/cost_model.h"

namespace gp::cost {
namespace {

#include "cost/efficiency_v100.inc"

constexpr std::array<const char*, kWorkClasses> kClassNames = {"gemm", "attention", "conv", "other"};

bool is_view(ir::OpKind k) { return k == ir::OpKind::flatten || k == ir::OpKind::reshape; }

Json curve_to_json(const EfficiencyCurve& c) {
  Json j = {{"emax", c.emax},
            {"n0_rows", c.n0_rows},
            {"shape_exponent", c.shape_exponent},
            {"ref_weight_elems", c.ref_weight_elems},
            {"min_weight_elems", c.min_weight_elems},
            {"max_weight_elems", c.max_weight_elems}};
  if (c.overhead_s > 0) j["overhead_s"] = c.overhead_s;  // written only where set: other files unchanged
  return j;
}

double field(const JsonAt& j, const char* key, double dflt, bool positive) {
  if (!j.has(key)) return dflt;
  JsonAt v = j.at(key);
  double x = v.num();
  if (!std::isfinite(x) || x < 0 || (positive && x == 0))
    v.fail(fmt::format("must be a {} number, found {}", positive ? "positive" : "non-negative", v.json().dump()));
  return x;
}

EfficiencyCurve curve_from_json(const JsonAt& j, EfficiencyCurve c) {
  j.expect_object();
  c.emax = field(j, "emax", c.emax, true);
  if (c.emax > 1) j.at("emax").fail(fmt::format("must be at most 1 (a fraction of peak), found {}", c.emax));
  c.n0_rows = field(j, "n0_rows", c.n0_rows, false);
  c.shape_exponent = field(j, "shape_exponent", c.shape_exponent, false);
  c.ref_weight_elems = field(j, "ref_weight_elems", c.ref_weight_elems, true);
  c.min_weight_elems = field(j, "min_weight_elems", c.min_weight_elems, false);
  c.max_weight_elems = field(j, "max_weight_elems", c.max_weight_elems, false);
  c.overhead_s = field(j, "overhead_s", c.overhead_s, false);
  if (c.max_weight_elems > 0 && c.max_weight_elems < c.min_weight_elems)
    j.at("max_weight_elems").fail(fmt::format("must not be below min_weight_elems {}", c.min_weight_elems));
  return c;
}

}  // namespace

double EfficiencyCurve::n0_at(double weight_elems) const {
  if (n0_rows <= 0 || shape_exponent == 0) return n0_rows;
  double s = std::max(weight_elems, min_weight_elems);
  if (max_weight_elems > 0) s = std::min(s, max_weight_elems);
  if (s <= 0) s = ref_weight_elems;  // no weight and no clamp: the reference size
  return n0_rows * std::pow(s / ref_weight_elems, -shape_exponent);
}

double EfficiencyCurve::at(double rows, double weight_elems) const {
  double n0 = n0_at(weight_elems);
  if (n0 <= 0) return emax;
  return emax * rows / (rows + n0);
}

const char* to_string(WorkClass c) { return kClassNames[static_cast<int>(c)]; }

WorkClass work_class(ir::OpKind k) {
  switch (k) {
    case ir::OpKind::linear:
    case ir::OpKind::matmul: return WorkClass::gemm;
    case ir::OpKind::attention: return WorkClass::attention;
    case ir::OpKind::conv2d:
    case ir::OpKind::conv_transpose2d: return WorkClass::conv;
    default: return WorkClass::other;
  }
}

EfficiencyTable v100_efficiency() {
  EfficiencyTable t;
  t.source = "DeepBench V100 fit (scripts/fit_efficiency.py)";
  auto set = [&](WorkClass c, EfficiencyCurve f32, EfficiencyCurve f16) {
    t.f32[static_cast<int>(c)] = f32;
    t.f16[static_cast<int>(c)] = f16;
  };
  set(WorkClass::gemm, kV100GemmFP32, kV100GemmFP16);
  // DeepBench has no batched or attention kernels: the attention op's GEMMs use the GEMM fit.
  set(WorkClass::attention, kV100GemmFP32, kV100GemmFP16);
  set(WorkClass::conv, kV100ConvFP32, kV100ConvFP16);
  return t;  // other: flat 0.25 (memory bound; DeepBench has no elementwise kernels)
}

Json efficiency_to_json(const EfficiencyTable& t) {
  Json f32 = Json::object(), f16 = Json::object();
  for (int c = 0; c < kWorkClasses; ++c) {
    f32[kClassNames[c]] = curve_to_json(t.f32[c]);
    f16[kClassNames[c]] = curve_to_json(t.f16[c]);
  }
  return {{"source", t.source}, {"f32", f32}, {"f16", f16}};
}

EfficiencyTable efficiency_from_json(const JsonAt& j) {
  j.expect_object();
  EfficiencyTable t;
  t.source = j.str_or("source", "file");
  for (const char* prec : {"f32", "f16"}) {
    if (!j.has(prec)) continue;
    JsonAt p = j.at(prec);
    p.expect_object();
    for (const auto& [key, value] : p.json().items()) {
      auto it = std::find(kClassNames.begin(), kClassNames.end(), key);
      if (it == kClassNames.end())
        p.at(key.c_str()).fail(fmt::format("unknown op class \"{}\": expected gemm, attention, conv or other", key));
      auto& curves = std::string(prec) == "f32" ? t.f32 : t.f16;
      int c = static_cast<int>(it - kClassNames.begin());
      curves[c] = curve_from_json(p.at(key.c_str()), curves[c]);
    }
  }
  return t;
}

OpWork op_work(const ir::Graph& g, OpId id) {
  const ir::Op& op = g.op(id);
  const ir::OpCosts& c = g.costs(id);
  OpWork w;
  w.extra_bytes = extra_bytes_per_sample(g, id);
  w.view = is_view(op.kind);
  w.kind = op.kind;
  const double out_elems = op.output_shape.empty() ? 0.0 : static_cast<double>(ir::per_sample_elems(op.output_shape));
  w.elems = out_elems;
  for (const std::string& in : op.inputs) {
    const OpId p = g.find(in);
    const ir::Input* gi = p.valid() ? nullptr : g.find_input(in);
    const ir::Shape* s = p.valid() ? &g.op(p).output_shape : gi ? &gi->shape : nullptr;
    if (s && !s->empty()) w.elems = std::max(w.elems, static_cast<double>(ir::per_sample_elems(*s)));
  }
  WorkClass cls = work_class(op.kind);
  auto add = [&](double fwd, double bwd, double rows, double weight) {
    if (fwd <= 0 && bwd <= 0) return;
    w.parts[w.num_parts++] = {cls, fwd, bwd, std::max(rows, 1.0), weight};
  };
  if ((cls == WorkClass::gemm || cls == WorkClass::conv) && out_elems > 0) {
    // Rows of the GEMM: output elements / output features (last dim; conv: channels, dim 1).
    double features = static_cast<double>(cls == WorkClass::conv ? op.output_shape[1] : op.output_shape.back());
    double rows = out_elems / features;
    add(c.fwd_flops, c.bwd_flops, rows, c.fwd_flops / (2 * rows));  // 2 * rows * S FLOPs forward
  } else if (cls == WorkClass::attention && op.output_shape.size() == 3) {
    double seq = static_cast<double>(op.output_shape[1]), hidden = static_cast<double>(op.output_shape[2]);
    double heads = static_cast<double>(op.attrs.value("heads", int64_t{1}));
    double keys = static_cast<double>(g.attention_keys(id));
    // Q, K, V and output projections: 4 GEMMs of [seq, hidden] x [hidden, hidden] (K and V over the
    // keys' source [keys, hidden] in cross-attention).
    double proj = std::min(4 * (seq + keys) * hidden * hidden, c.fwd_flops);
    double proj_bwd = std::min(2 * proj, c.bwd_flops);
    add(proj, proj_bwd, (seq + keys) / 2, hidden * hidden);
    // Scores and weighted sum: per head [seq, d] x [d, keys] and [seq, keys] x [keys, d], batched.
    add(c.fwd_flops - proj, c.bwd_flops - proj_bwd, heads * seq, keys * hidden / heads);
  } else {
    add(c.fwd_flops, c.bwd_flops, out_elems, 0);
  }
  return w;
}

}  // namespace gp::cost
