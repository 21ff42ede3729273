// Typed, checked access to an op's attrs (internal to the IR library and its users).
#pragma once
#include <initializer_list>
#include <optional>
#include <string>

#include "ir/model.h"

namespace gp::ir {

/// Integer attribute; missing -> dflt (or an error naming op and key when there is no default).
int64_t attr_int(const Op& op, const char* key, std::optional<int64_t> dflt, const std::string& where);
double attr_num(const Op& op, const char* key, double dflt, const std::string& where);
bool attr_bool(const Op& op, const char* key, bool dflt, const std::string& where);
std::vector<int64_t> attr_ints(const Op& op, const char* key, const std::string& where);
/// Normalises an axis attribute against a rank (negative counts from the end); must be >= 1.
int64_t attr_axis(const Op& op, const char* key, std::optional<int64_t> dflt, size_t rank, const std::string& where);

/// conv2d geometry from its attrs (kernel / stride / dilation an integer or [h, w]; padding an
/// integer, [h, w] or [top, left, bottom, right]); checked: positive sizes, padding >= 0, groups
/// dividing `in_channels` and out_channels. Errors name the op and the attribute.
struct ConvGeometry {
  int64_t kh = 1, kw = 1, sh = 1, sw = 1, dh = 1, dw = 1;
  int64_t pt = 0, pl = 0, pb = 0, pr = 0;  // top, left, bottom, right
  int64_t groups = 1;
  int64_t oph = 0, opw = 0;  // conv_transpose2d's output_padding (rows, cols)
  bool symmetric() const { return pt == pb && pl == pr; }
};
ConvGeometry conv_geometry(const Op& op, int64_t in_channels, const std::string& where);

/// maxpool / avgpool geometry (kernel, stride = kernel, padding, dilation: an integer or [h, w]);
/// checked: positive sizes, 0 <= padding <= half the dilated window, dilation only on maxpool.
struct PoolGeometry {
  int64_t kh = 1, kw = 1, sh = 1, sw = 1, ph = 0, pw = 0, dh = 1, dw = 1;
  bool ceil_mode = false;
  bool count_include_pad = true;  // avgpool: PyTorch's default
};
PoolGeometry pool_geometry(const Op& op, const std::string& where);

/// A string attribute; missing -> dflt; an error naming op and key when it is not one of `allowed`.
std::string attr_choice(const Op& op, const char* key, const char* dflt, std::initializer_list<const char*> allowed,
                        const std::string& where);

/// Data movement (slice, gather, reshape, flatten, transpose): ops whose output keeps the input's
/// dtype, so index tensors (ids[:, k]) may pass through them as i64.
inline bool moves_data(OpKind k) {
  return k == OpKind::slice || k == OpKind::gather || k == OpKind::reshape || k == OpKind::flatten ||
         k == OpKind::transpose;
}

/// An attention op's inputs: the queries' source x (input 0); with attrs.cross the keys' and values'
/// source (input 1, [B, seq_kv, hidden]); then an optional padding mask over the keys. kv: the index
/// of the keys' source (0 for self-attention); mask: the mask's index, -1 when there is none.
struct AttentionInputs {
  int kv = 0, mask = -1;
};
AttentionInputs attention_inputs(const Op& op, const std::string& where);

/// The per-sample shape of an add / mul / concat's learned parameter operand (attrs.param), or
/// nothing when the op has none.
std::optional<Shape> param_shape(const Op& op, const std::string& where);

/// NumPy broadcasting of equal-rank shapes (each dim equal, or 1 in some); nothing when they do not
/// broadcast.
std::optional<Shape> broadcast(const std::vector<Shape>& shapes);

}  // namespace gp::ir
