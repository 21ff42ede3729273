// libFuzzer target: ONNX files through importers::import_onnx (the bytes are written to a temp
// file: the importer's API takes a path). Any outcome but success or gp::UserError is a bug.
#include <unistd.h>

#include <cstdio>
#include <string>

#include "fuzz/fuzz_common.h"
#include "importers/onnx_import.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path = "/tmp/gp_fuzz_onnx_" + std::to_string(::getpid()) + ".onnx";
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) __builtin_trap();
  if (size > 0 && std::fwrite(data, 1, size, f) != size) __builtin_trap();
  std::fclose(f);
  try {
    gp::ir::Model m = gp::importers::import_onnx(path);
    gp::ir::Graph g = gp::ir::Graph::build(m);
    (void)g;
  } catch (const gp::UserError&) {
  }
  return 0;
}
