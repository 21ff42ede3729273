// Shared by the ONNX importer tests: the committed fixtures (tests/fixtures/onnx), the numbers
// PyTorch recorded for them (expected.json), and reading / writing (mutated) models as protobuf.
#pragma once
#include <gtest/gtest.h>
#include <onnx/onnx_pb.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <string>

#include "importers/onnx_import.h"
#include "support/error.h"
#include "support/json.h"

namespace gp::importers::testing {

inline const std::string kDir = GP_ONNX_FIXTURES;

inline Json expected() {
  std::ifstream f(kDir + "/expected.json");
  return Json::parse(f);
}

inline onnx::ModelProto load_proto(const std::string& path) {
  onnx::ModelProto m;
  std::ifstream f(path, std::ios::binary);
  EXPECT_TRUE(m.ParseFromIstream(&f)) << path;
  return m;
}

/// Writes `m` to a temporary file named after `name`; returns its path.
inline std::string save_temp(const onnx::ModelProto& m, const std::string& name) {
  std::string path = (std::filesystem::temp_directory_path() / ("gp_onnx_" + name + ".onnx")).string();
  std::ofstream f(path, std::ios::binary);
  EXPECT_TRUE(m.SerializeToOstream(&f)) << path;
  return path;
}

/// The one-line error importing `path` gives, or "(no error)".
inline std::string error_of(const std::string& path) {
  try {
    import_onnx(path);
  } catch (const UserError& e) {
    return e.what();
  }
  return "(no error)";
}

/// How many IR ops of each kind the model has.
inline std::map<std::string, int> kind_counts(const ir::Model& m) {
  std::map<std::string, int> c;
  for (const auto& op : m.ops) c[ir::to_string(op.kind)] += 1;
  return c;
}

}  // namespace gp::importers::testing
