// graphpipe.model/1: exact round trips of every builtin, and one-line errors for malformed files.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <unistd.h>

#include "importers/model_json.h"
#include "models/tests/presets.h"
#include "models/zoo.h"
#include "support/error.h"

namespace gp::importers {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

std::string tmp_path(const std::string& name) {
  auto dir = std::filesystem::temp_directory_path() / ("gp_model_json_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  return (dir / name).string();
}

TEST(ModelJson, EveryBuiltinRoundTripsExactly) {
  std::vector<std::string> specs = models::testing::small_presets();
  specs.push_back("mmt");  // defaults too: a few hundred ops
  specs.push_back("inception");
  for (const auto& spec : specs) {
    ir::Model m = models::build_builtin(spec);
    EXPECT_EQ(model_from_json(model_to_json(m), "mem"), m) << spec;
    std::string path = tmp_path("rt.json");
    write_model_json(path, m);
    EXPECT_EQ(read_model_json(path), m) << spec;
    // The written file is the same document model_to_json builds.
    EXPECT_EQ(read_json_file(path), model_to_json(m)) << spec;
  }
}

TEST(ModelJson, WritesContractFields) {
  Json j = model_to_json(models::build_builtin("candle-uno:branches=2,layers=1,hidden=8"));
  EXPECT_EQ(j["format"], "graphpipe.model/1");
  EXPECT_EQ(j["name"], "candle-uno:branches=2,layers=1,hidden=8");
  EXPECT_EQ(j["inputs"][0], (Json{{"name", "tower0.input"}, {"shape", {-1, 8}}, {"dtype", "f32"}}));
  EXPECT_EQ(j["ops"][0], (Json{{"name", "tower0.l0.fc"},
                               {"kind", "linear"},
                               {"inputs", {"tower0.input"}},
                               {"output_shape", {-1, 8}},
                               {"dtype", "f32"},
                               {"attrs", {{"out_features", 8}}}}));
  EXPECT_EQ(j["outputs"], (Json{"loss"}));
}

// A valid two-op model to mutate: x[4] -> fc (linear 3) -> loss (cross_entropy with label).
Json base() {
  return Json::parse(R"({"format": "graphpipe.model/1", "name": "tiny",
    "inputs": [{"name": "x", "shape": [-1, 4], "dtype": "f32"},
               {"name": "label", "shape": [-1], "dtype": "i64"}],
    "ops": [{"name": "fc", "kind": "linear", "inputs": ["x"], "output_shape": [-1, 3],
             "attrs": {"out_features": 3}},
            {"name": "loss", "kind": "cross_entropy", "inputs": ["fc", "label"], "output_shape": []}],
    "outputs": ["loss"]})");
}

std::string error_of_text(const std::string& text) {
  std::string path = tmp_path("bad.json");
  {
    std::FILE* f = std::fopen(path.c_str(), "w");
    std::fputs(text.c_str(), f);
    std::fclose(f);
  }
  try {
    read_model_json(path);
  } catch (const UserError& e) {
    std::string msg = e.what();
    EXPECT_THAT(msg, StartsWith(path + ": ")) << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << "one line: " << msg;
    return msg.substr(path.size() + 2);
  }
  return "(no error)";
}
std::string error_of(const Json& j) { return error_of_text(j.dump()); }

TEST(ModelJson, BaseIsValidAndDefaultsApply) {
  std::string path = tmp_path("ok.json");
  write_json_file(path, base());
  ir::Model m = read_model_json(path);
  EXPECT_EQ(m.ops[1].attrs, Json::object());
  EXPECT_EQ(m.ops[0].dtype, ir::DType::f32);
  EXPECT_EQ(m.inputs[1].dtype, ir::DType::i64);
}

TEST(ModelJson, NotJson) { EXPECT_THAT(error_of_text("{\"format\": "), StartsWith("not valid JSON")); }

TEST(ModelJson, WrongFormat) {
  Json j = base();
  j["format"] = "graphpipe.plan/1";
  EXPECT_EQ(error_of(j), "format: format is \"graphpipe.plan/1\", expected \"graphpipe.model/1\"");
  j.erase("format");
  EXPECT_EQ(error_of(j), "(top): missing \"format\" (expected \"graphpipe.model/1\")");
  EXPECT_EQ(error_of_text("[1, 2]"), "(top): expected an object, found array");
}

TEST(ModelJson, MissingAndMistypedFields) {
  Json j = base();
  j.erase("ops");
  EXPECT_EQ(error_of(j), "(top): missing required field \"ops\"");
  j = base();
  j["ops"][1].erase("output_shape");
  EXPECT_EQ(error_of(j), "ops[1]: missing required field \"output_shape\"");
  j = base();
  j["inputs"] = Json::object();
  EXPECT_EQ(error_of(j), "inputs: expected an array, found object");
  j = base();
  j["ops"][0]["attrs"] = Json::array();
  EXPECT_EQ(error_of(j), "ops[0].attrs: expected an object, found array");
  j = base();
  j["inputs"][0]["shape"] = {-1, 0};
  EXPECT_EQ(error_of(j), "inputs[0].shape[1]: dimension 1 is 0: dimensions are positive (-1 only as dim 0, the batch)");
  j = base();
  j["ops"][0]["inputs"][0] = 7;
  EXPECT_EQ(error_of(j), "ops[0].inputs[0]: expected a string, found 7");
}

TEST(ModelJson, UnknownOpInput) {
  Json j = base();
  j["ops"][1]["inputs"][0] = "enc.l3";
  EXPECT_EQ(error_of(j), "ops[1].inputs[0]: unknown op \"enc.l3\" (no op or graph input has that name)");
  j = base();
  j["outputs"][0] = "nope";
  EXPECT_EQ(error_of(j), "outputs[0]: unknown op \"nope\" (outputs name ops)");
  j["outputs"][0] = "x";
  EXPECT_EQ(error_of(j), "outputs[0]: unknown op \"x\" (outputs name ops)");
}

TEST(ModelJson, DuplicateName) {
  Json j = base();
  j["ops"][1]["name"] = "fc";
  EXPECT_EQ(error_of(j), "ops[1].name: duplicate name \"fc\" (also ops[0])");
  j = base();
  j["ops"][0]["name"] = "x";
  EXPECT_EQ(error_of(j), "ops[0].name: duplicate name \"x\" (also inputs[0])");
}

TEST(ModelJson, UnknownKindListsValidKinds) {
  Json j = base();
  j["ops"][0]["kind"] = "lstm";
  std::string msg = error_of(j);
  EXPECT_THAT(msg, StartsWith("ops[0].kind: "));
  EXPECT_THAT(msg, HasSubstr("lstm"));
  EXPECT_THAT(msg, HasSubstr("linear"));
  EXPECT_THAT(msg, HasSubstr("cross_entropy"));
}

TEST(ModelJson, UnknownDtype) {
  Json j = base();
  j["inputs"][0]["dtype"] = "f64";
  std::string msg = error_of(j);
  EXPECT_THAT(msg, StartsWith("inputs[0].dtype: "));
  EXPECT_THAT(msg, HasSubstr("f64"));
  EXPECT_THAT(msg, HasSubstr("bf16"));
}

TEST(ModelJson, Cycle) {
  Json j = base();
  // fc -> a -> b -> a: a cycle that still reaches the loss.
  j["ops"].push_back({{"name", "a"}, {"kind", "add"}, {"inputs", {"fc", "b"}}, {"output_shape", {-1, 3}}});
  j["ops"].push_back({{"name", "b"}, {"kind", "relu"}, {"inputs", {"a"}}, {"output_shape", {-1, 3}}});
  j["ops"][1]["inputs"][0] = "b";
  std::string msg = error_of(j);
  EXPECT_THAT(msg, HasSubstr("cycle"));
  EXPECT_THAT(msg, HasSubstr("a"));
  EXPECT_THAT(msg, HasSubstr("b"));
}

TEST(ModelJson, InconsistentOutputShape) {
  Json j = base();
  j["ops"][0]["output_shape"] = {-1, 5};
  std::string msg = error_of(j);
  EXPECT_THAT(msg, HasSubstr("fc"));
  EXPECT_THAT(msg, HasSubstr("5"));
}

}  // namespace
}  // namespace gp::importers
