// --model SPEC resolution: builtin specs, .json files, missing files (ONNX has its own tests).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <unistd.h>

#include "importers/model_json.h"
#include "importers/resolve.h"
#include "models/zoo.h"
#include "support/error.h"

namespace gp::importers {
namespace {

using ::testing::HasSubstr;

std::string error_of(const std::string& spec) {
  try {
    load_model(spec);
  } catch (const UserError& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(Resolve, BuiltinSpec) {
  const std::string spec = "candle-uno:branches=2,layers=1,hidden=8";
  EXPECT_EQ(load_model(spec), models::build_builtin(spec));
  ir::Graph g = load_graph(spec);
  EXPECT_EQ(g.name(), spec);
  EXPECT_EQ(g.num_ops(), 11u);
}

TEST(Resolve, JsonFile) {
  auto path =
      (std::filesystem::temp_directory_path() / ("gp_resolve_" + std::to_string(::getpid()) + ".json")).string();
  ir::Model m = models::build_builtin("gpt:layers=1,seq=4,hidden=8,heads=2,ffn=16,vocab=10");
  write_model_json(path, m);
  EXPECT_EQ(load_model(path), m);
  EXPECT_EQ(load_graph(path).num_ops(), m.ops.size());
  std::filesystem::remove(path);
}

TEST(Resolve, Errors) {
  EXPECT_EQ(error_of("/nonexistent/m.json"), "/nonexistent/m.json: cannot open file");
  EXPECT_THAT(error_of("model.onnx"), HasSubstr("model.onnx: cannot open the ONNX file"));
  EXPECT_THAT(error_of("m.JSON"), HasSubstr("unknown model \"m.JSON\""));
}

}  // namespace
}  // namespace gp::importers
