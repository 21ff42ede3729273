// Shared by the ONNX importer tests: the committed fixtures (tests/fixtures/onnx), the numbers
// PyTorch recorded for them (expected.json), and reading / writing (mutated) models as protobuf.
#pragma once
#include <gtest/gtest.h>
#include <onnx/onnx_pb.h>

#include <filesystem>
#include <fstream>
#include <string>

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

}  // namespace gp::importers::testing
