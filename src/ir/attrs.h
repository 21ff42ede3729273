// Typed, checked access to an op's attrs (internal to the IR library and its users).
#pragma once
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
int64_t attr_axis(const Op& op, const char* key, std::optional<int64_t> dflt, size_t rank,
                  const std::string& where);

}  // namespace gp::ir
