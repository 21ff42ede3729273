// libFuzzer target: graphpipe.model/1 documents through importers::model_from_json, then the IR
// graph build and a write/read round trip. Any outcome but success or gp::UserError is a bug.
#include "fuzz/fuzz_common.h"
#include "importers/model_json.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto doc = gp::fuzz::parse(data, size);
  if (!doc) return 0;
  try {
    gp::ir::Model m = gp::importers::model_from_json(*doc, "fuzz.json");
    gp::ir::Graph g = gp::ir::Graph::build(m);
    (void)g;
    // An accepted model must survive its own round trip exactly.
    gp::ir::Model again = gp::importers::model_from_json(gp::importers::model_to_json(m), "again.json");
    if (!(again == m)) __builtin_trap();
  } catch (const gp::UserError&) {
  }
  return 0;
}
