// The median the timing code takes of repeated measurements (op timing, the calibration, the pass
// bench): one definition for all of them.
#pragma once
#include <algorithm>
#include <cstddef>
#include <vector>

#include "support/error.h"

namespace gp {

/// The median of `v`: its middle value, or the mean of the two middle values for an even count.
/// `v` must not be empty.
inline double median(std::vector<double> v) {
  GP_ASSERT(!v.empty(), "median of no values");
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace gp
