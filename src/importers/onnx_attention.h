// Internal to the ONNX importer: what an attention block applies between its score MatMul and its
// Softmax (the scale, a causal mask, a padding mask from a data input), read from the exported
// graph so the IR's attention op (attrs causal / mask / mask_fill, input 1) computes the same.
#pragma once
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "importers/onnx_graph.h"

namespace gp::importers::onnx_detail {

/// The score path of the attention block whose Softmax is node `softmax`, and its masks.
struct AttentionMasks {
  int score_mm = -1;                // the MatMul of two activations whose result the Softmax reads
  std::vector<int> path;            // nodes from the score MatMul's output to the Softmax (excluded both)
  bool causal = false;              // a constant mask hiding keys j > query i
  std::string mask_input;           // a data input [B, S] read as a padding mask over the keys, or ""
  std::string mask_mode;            // "keep" (keys with m != 0 take part) or "ignore"
  std::optional<double> mask_fill;  // a finite value added to masked keys' scores (else -inf)
  std::set<std::string> operands;   // mask tensors entering the score path (not the block's inputs)
  std::vector<int> prep;            // activation nodes computing a padding mask's operand from its input
  std::optional<double> scale;      // the product of the constant factors on Q, K and the scores, if known
  int factors = 0;                  // how many constant factors there are (0: an unscaled score path)
  std::string error;                // why the masks or the path cannot be read ("" when they can)
  bool found() const { return score_mm >= 0; }
};

/// Reads the score path backward from the Softmax's input: Reshape / Cast / Identity, Mul or Div by
/// a constant (the scale), Add of a mask, Where(cond, fill, scores) (masked_fill), up to a MatMul of
/// two activations. `seq` is the key length. A constant mask must be causal (0 where key <= query,
/// -inf or <= -1e4 elsewhere); a mask computed from one data input m [B, S] through elementwise
/// and unit-dimension ops must give 0 for m = 1 and a negative fill for m = 0 ("keep") or the
/// reverse ("ignore"). `error` names the node that does not fit.
AttentionMasks scan_attention_masks(const Net& net, int softmax, int64_t seq);

/// The single value of a constant (non-activation) tensor evaluated through the folded nodes (all
/// elements equal), or nothing.
std::optional<double> constant_value(const Net& net, const std::string& t);

}  // namespace gp::importers::onnx_detail
