// libFuzzer target: ONNX files through importers::import_onnx and, for models that import, the
// initializer decoding of import_onnx_weights (the bytes are written to a temp file: the
// importer's API takes a path). Any outcome but success or gp::UserError is a bug.
#include <unistd.h>

#include <cstdio>
#include <string>

#include "fuzz/fuzz_common.h"
#include "importers/onnx_import.h"
#include "importers/weights.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path = "/tmp/gp_fuzz_onnx_" + std::to_string(::getpid()) + ".onnx";
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) __builtin_trap();
  if (size > 0 && std::fwrite(data, 1, size, f) != size) __builtin_trap();
  std::fclose(f);
  try {
    gp::ir::Model m = gp::importers::import_onnx(path);
    gp::ir::Graph g = gp::ir::Graph::build(m);
    gp::importers::ParamValues w = gp::importers::import_onnx_weights(path);
    for (const auto& [key, v] : w) {  // every value must have exactly its shape's element count
      size_t n = 1;
      for (int64_t d : v.shape) n *= static_cast<size_t>(d);
      if (n != v.data.size()) __builtin_trap();
    }
  } catch (const gp::UserError&) {
  }
  return 0;
}
