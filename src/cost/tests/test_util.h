// Helpers shared by the cost tests: a made-up cluster with round numbers and error capture.
#pragma once
#include <string>

#include "cost/cost_model.h"

namespace gp::cost::testing {

/// 2 nodes x 4 devices; peak 1 TFLOP/s fp32 (8 with f16), 100 GB/s memory, 10 us per kernel;
/// intra 100 GB/s + 10 us; inter 10 GB/s + 100 us; node injection 20 GB/s.
inline Cluster made_up_cluster() {
  Cluster c;
  c.name = "made-up";
  c.num_nodes = 2;
  c.devices_per_node = 4;
  c.device = {"toy", 1e9, 1e12, 8e12, 1e11, 1e-5};
  c.intra = {1e11, 1e-5};
  c.inter = {1e10, 1e-4};
  c.node_injection_Bps = 2e10;
  return c;
}

/// The UserError message `f` throws, or "" when it does not throw.
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const UserError& e) {
    return e.what();
  }
  return "";
}

}  // namespace gp::cost::testing
