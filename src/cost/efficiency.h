// Efficiency curves: the fraction of a device's peak FLOP/s that one kernel reaches, as a function of
// its work per call (rows) and the size of its weight operand, per op class and precision. The curves
// for the GPU presets are fitted to DeepBench's V100 kernels (scripts/fit_efficiency.py); the op
// classes and the rows of each op come from op_work(). See docs/cost-model.md ("Efficiency").
#pragma once
#include <array>
#include <string>

#include "ir/model.h"
#include "support/json.h"

namespace gp::cost {

/// e(N; S) = emax * N / (N + N0(S)),  N0(S) = n0_rows * (clamp(S, min, max) / ref)^-shape_exponent.
/// N = rows per call, S = weight elements. n0_rows = 0 is a flat efficiency (emax at any size);
/// min/max 0 mean no clamp. A GEMM needs about N0 rows to reach half of emax; small weight matrices
/// need more (shape_exponent > 0).
struct EfficiencyCurve {
  double emax = 1;
  double n0_rows = 0;
  double shape_exponent = 0;
  double ref_weight_elems = 1048576;  // N0(S) = n0_rows at S = ref (1024 x 1024)
  double min_weight_elems = 0;        // S is clamped to the fitted range
  double max_weight_elems = 0;
  /// Fixed time per call (forward, and again backward) of an op with work of this class, on top of
  /// the device's kernel_overhead_s (an op with parts of two classes pays the larger): LibTorch's
  /// extra kernels and autograd nodes (a linear's bias and its backward's two GEMMs, attention's
  /// dozen kernels). 0 on every preset but the calibrated `cpu` one (graphpipe calibrate fits it).
  double overhead_s = 0;

  /// The rows at which this curve reaches emax/2 for a weight of `weight_elems`.
  double n0_at(double weight_elems) const;
  /// Efficiency of one call with `rows` rows (> 0) and a weight of `weight_elems` elements.
  double at(double rows, double weight_elems) const;
  bool operator==(const EfficiencyCurve&) const = default;
};

/// Op classes with one efficiency curve each. gemm: linear, matmul. attention: the attention op's
/// projections and batched matmuls. conv: conv2d. other: elementwise, norms, reductions, losses
/// (memory bound in practice: the roofline's bandwidth term decides them).
enum class WorkClass { gemm, attention, conv, other };
inline constexpr int kWorkClasses = 4;
const char* to_string(WorkClass c);
WorkClass work_class(ir::OpKind k);

/// One curve per class and precision (f32: the fp32 peak; f16: the tensor-core peak).
/// The default is the flat table the cost model used before the curves (0.7 gemm, 0.5 attention,
/// 0.6 conv, 0.25 other, at any size): file clusters without an "efficiency" field and the cpu preset.
struct EfficiencyTable {
  std::string source = "flat";
  std::array<EfficiencyCurve, kWorkClasses> f32 = {EfficiencyCurve{0.7}, EfficiencyCurve{0.5}, EfficiencyCurve{0.6},
                                                   EfficiencyCurve{0.25}};
  std::array<EfficiencyCurve, kWorkClasses> f16 = f32;

  const EfficiencyCurve& curve(WorkClass c, bool f16_peak) const { return (f16_peak ? f16 : f32)[static_cast<int>(c)]; }
  bool operator==(const EfficiencyTable&) const = default;
};

/// The DeepBench V100 fit (gemm and conv; attention uses the gemm curves, other stays flat).
EfficiencyTable v100_efficiency();

/// `{"source": ..., "f32": {"gemm": {"emax": ..., "n0_rows": ..., ...}, ...}, "f16": {...}}`.
Json efficiency_to_json(const EfficiencyTable& t);
/// Reads the same; a missing class keeps the flat default, a missing curve field its default.
/// Errors name the file and JSON path.
EfficiencyTable efficiency_from_json(const JsonAt& j);

/// A part of one op's work that runs at one class's efficiency, per sample.
struct WorkPart {
  WorkClass cls = WorkClass::other;
  double fwd_flops = 0;
  double bwd_flops = 0;
  double rows = 1;          // rows per sample (a call at batch b has b * rows rows)
  double weight_elems = 0;  // the weight operand's elements (GEMM: in x out features)
};

/// An op's work split by class, and the roofline's extra bytes. Per-sample FLOPs of the parts add up
/// to the IR's fwd_flops / bwd_flops.
///   linear, matmul: one gemm part, rows = output elements / output features, S = in x out.
///   conv2d: one conv part, rows = output pixels (the implicit GEMM's rows), S = out x in x k x k.
///   attention [seq, hidden], heads h: projections (8 seq hidden^2 FLOPs forward, rows = seq,
///     S = hidden^2) and the rest (batched QK^T and PV matmuls + softmax; rows = h * seq,
///     S = seq * hidden / h), both of class attention.
///   others: one part of class other (rows = output elements; the other curves are flat).
/// `elems`: the per-sample elements of the op's largest input or output (DeviceSpec::kind_s_per_elem).
struct OpWork {
  std::array<WorkPart, 2> parts{};
  int num_parts = 0;
  double extra_bytes = 0;              // bytes moved per sample beyond inputs and output (attention scores)
  bool view = false;                   // flatten, reshape: no kernel touches the data
  ir::OpKind kind = ir::OpKind::relu;  // for DeviceSpec::kind_overhead_s
  double elems = 0;                    // per sample: its largest tensor's elements (inputs, output)
};
OpWork op_work(const ir::Graph& g, OpId op);

}  // namespace gp::cost
