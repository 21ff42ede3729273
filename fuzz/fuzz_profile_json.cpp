// libFuzzer target: graphpipe.profile/1 documents through cost::profile_from_json, lookups at
// several batches, and a cost model that uses the profile over a tiny model. Any outcome but
// success or gp::UserError is a bug.
#include <memory>

#include "cost/cost_model.h"
#include "cost/profile.h"
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
    auto prof = std::make_shared<gp::cost::Profile>(gp::cost::profile_from_json(*doc, "fuzz.json"));
    gp::cost::Profile again = gp::cost::profile_from_json(gp::cost::profile_to_json(*prof), "again.json");
    (void)again;
    for (const auto& [sig, m] : prof->ops)
      for (int64_t b : {1, 2, 3, 7, 64, 1000}) (void)prof->lookup(sig, b);
    gp::cost::CostModel cm(tiny_graph(), gp::cost::load_cluster("summit", 4), gp::cost::Optimizer::adam, prof);
    for (int op = 0; op < static_cast<int>(tiny_graph().num_ops()); ++op)
      for (int64_t b : {1, 3, 8}) (void)cm.op_time(gp::OpId(op), b);
    (void)cm.p2p_time(0, 1, 1e6);
  } catch (const gp::UserError&) {
  }
  return 0;
}
