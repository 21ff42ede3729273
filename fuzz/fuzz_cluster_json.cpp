// libFuzzer target: graphpipe.cluster/1 documents through cost::cluster_from_json, then the
// operations every cluster goes through (take_devices, a cost model over a tiny model, p2p times)
// and a to_json/from_json round trip. Any outcome but success or gp::UserError is a bug.
#include "cost/cost_model.h"
#include "fuzz/fuzz_common.h"
#include "importers/model_json.h"

namespace {
const gp::ir::Graph& tiny_graph() {
  static const gp::ir::Graph g = gp::ir::Graph::build(
      gp::importers::read_model_json(gp::fuzz::data_file("model_chain.json")));
  return g;
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto doc = gp::fuzz::parse(data, size);
  if (!doc) return 0;
  try {
    gp::cost::Cluster c = gp::cost::cluster_from_json(*doc, "fuzz.json");
    gp::cost::Cluster again = gp::cost::cluster_from_json(gp::cost::cluster_to_json(c), "again.json");
    (void)again;
    int n = c.num_devices();
    if (n < 1) __builtin_trap();  // the parser promised at least one device
    gp::cost::Cluster used = gp::cost::take_devices(c, n > 4 ? 4 : n, "fuzz");
    gp::cost::CostModel cm(tiny_graph(), used);
    for (int a = 0; a < used.num_devices(); ++a)
      for (int b = 0; b < used.num_devices(); ++b) (void)cm.p2p_time(a, b, 1e6);
    for (int op = 0; op < static_cast<int>(tiny_graph().num_ops()); ++op) (void)cm.op_step_time(gp::OpId(op), 3);
  } catch (const gp::UserError&) {
  }
  return 0;
}
