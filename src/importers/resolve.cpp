// Model-spec resolution: JSON files, ONNX files (importers/onnx_import.h) and builtin specs.
#include "importers/resolve.h"

#include "importers/model_json.h"
#include "importers/onnx_import.h"
#include "importers/weights.h"
#include "models/zoo.h"
#include "support/error.h"

namespace gp::importers {

namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

#if !GP_WITH_ONNX
// Built with -DGP_WITH_ONNX=OFF (no libonnx, e.g. scripts/build-gpu.sh on a machine without it).
[[noreturn]] static void no_onnx(const std::string& spec) {
  throw UserError(
      fmt::format("{}: this graphpipe was built without the ONNX importer (-DGP_WITH_ONNX=OFF); "
                  "use a build with libonnx, or export the model to graphpipe.model/1 JSON there",
                  spec));
}
ir::Model import_onnx(const std::string& spec, OnnxImportReport*) { no_onnx(spec); }
ParamValues import_onnx_weights(const std::string& spec, ir::Model*) { no_onnx(spec); }
#endif

ir::Model load_model(const std::string& spec) {
  if (ends_with(spec, ".json")) return read_model_json(spec);
  if (ends_with(spec, ".onnx")) return import_onnx(spec);
  return models::build_builtin(spec);
}

ir::Graph load_graph(const std::string& spec) { return ir::Graph::build(load_model(spec), spec); }

ParamValues load_weights(const std::string& spec) {
  if (ends_with(spec, ".onnx")) return import_onnx_weights(spec);
  return {};
}

ir::Graph load_graph(const std::string& spec, ParamValues& weights) {
  if (!ends_with(spec, ".onnx")) {
    weights.clear();
    return load_graph(spec);
  }
  ir::Model m;
  weights = import_onnx_weights(spec, &m);
  return ir::Graph::build(std::move(m), spec);
}

}  // namespace gp::importers
