// torch 2.x's dynamo exporter folds Swin's relative-position lookup
// table[relative_position_index] into one value [1, heads, N, N] and drops the table
// (tests/fixtures/dynamo_vision/swin_dynamo.onnx, window 4x4, N = 16). The importer reads the table
// back through the one window whose index reproduces every entry (onnx_dynamo.cpp); these tests edit
// that value in the committed file to check the refusals when no window, or more than one, does.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <onnx/onnx_pb.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <functional>
#include <iterator>

#include "importers/onnx_import.h"
#include "importers/tests/onnx_fixtures.h"
#include "support/error.h"

namespace gp::importers {
namespace {

using testing::error_of;
using ::testing::HasSubstr;
namespace fx = testing;

const std::string kVision = GP_DYNAMO_VISION_FIXTURES;

/// swin_dynamo.onnx with its external data inlined and `edit` applied to the float values of the
/// initializer `name` (Swin's first block's folded lookup is "unsqueeze", [1, 2, 16, 16]); saved as a
/// temporary file.
std::string swin_with(const std::string& name, const std::function<void(std::vector<float>&)>& edit,
                      const std::string& tag) {
  onnx::ModelProto m = fx::load_proto(kVision + "/swin_dynamo.onnx");
  std::ifstream f(kVision + "/swin_dynamo.onnx.data", std::ios::binary);
  const std::string data((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  bool edited = false;
  for (auto& t : *m.mutable_graph()->mutable_initializer()) {
    if (t.data_location() == onnx::TensorProto::EXTERNAL) {
      size_t offset = 0, length = 0;
      for (const auto& e : t.external_data()) {
        if (e.key() == "offset") offset = std::stoul(e.value());
        if (e.key() == "length") length = std::stoul(e.value());
      }
      EXPECT_LE(offset + length, data.size()) << t.name();
      t.set_raw_data(data.substr(offset, length));
      t.clear_external_data();
      t.set_data_location(onnx::TensorProto::DEFAULT);
    }
    if (t.name() != name) continue;
    std::vector<float> v(t.raw_data().size() / sizeof(float));
    std::memcpy(v.data(), t.raw_data().data(), v.size() * sizeof(float));
    edit(v);
    t.set_raw_data(std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float)));
    edited = true;
  }
  EXPECT_TRUE(edited) << name;
  return fx::save_temp(m, tag);
}

int window_attentions(const ir::Model& m) {
  int n = 0;
  for (const auto& op : m.ops) n += op.kind == ir::OpKind::window_attention;
  return n;
}

// As exported: every block's table is read back through window 4x4, the only one whose index
// reproduces its 512 random entries.
TEST(OnnxDynamo, SwinsFoldedLookupIsReadBackThroughTheOneWindowThatFits) {
  OnnxImportReport report;
  const ir::Model m = import_onnx(swin_with(
                                      "unsqueeze", [](std::vector<float>&) {}, "swin_as_is"),
                                  &report);
  EXPECT_EQ(window_attentions(m), 4);
  ASSERT_TRUE(report.dynamo);
  ASSERT_EQ(report.dynamo->ungathered_tables.size(), 4u);
  EXPECT_EQ(report.dynamo->ungathered_tables[0],
            "features.1.0.attn.relative_position_bias_table [49, 2] (window 4x4) from unsqueeze");
}

// One entry off by one ulp: two entries that window 4x4's index reads from one table row differ, and
// no other window's index reproduces the random values either. Refused, naming the value, the table
// and the index buffer.
TEST(OnnxDynamo, AFoldedLookupNoWindowReproducesIsRefusedNamingIt) {
  const std::string path = swin_with(
      "unsqueeze", [](std::vector<float>& v) { v[5] = std::nextafter(v[5], 1.0F); }, "swin_no_window");
  const std::string err = error_of(path);
  EXPECT_THAT(err, HasSubstr(path + ": torch.onnx.export's dynamo exporter (dynamo=True) folded the lookup of "
                                    "parameter features.1.0.attn.relative_position_bias_table by buffer "
                                    "features.1.0.attn.relative_position_index into the value \"unsqueeze\" [1, 2, "
                                    "16, 16]"));
  EXPECT_THAT(err, HasSubstr("the table cannot be read back: the index of no window of 16 tokens (1x16, 2x8, 4x4, "
                             "8x2, 16x1) reproduces every entry"));
  EXPECT_THAT(err, HasSubstr("dynamo=False"));
}

// Every entry equal: every window's index reproduces the value, and the tables differ in shape
// (1x16: 31 rows; 2x8 and 8x2: 45; 4x4: 49), so the file does not say which is the model's. Refused,
// listing them (1x16 and 16x1 have one index).
TEST(OnnxDynamo, AFoldedLookupSeveralWindowsReproduceIsRefusedNamingThem) {
  const std::string path = swin_with(
      "unsqueeze", [](std::vector<float>& v) { std::fill(v.begin(), v.end(), 0.25F); }, "swin_all_equal");
  const std::string err = error_of(path);
  EXPECT_THAT(err, HasSubstr("into the value \"unsqueeze\" [1, 2, 16, 16]"));
  EXPECT_THAT(err, HasSubstr("the table cannot be read back: the indexes of windows 1x16 (= 16x1), 2x8, 4x4, 8x2 "
                             "each reproduce every entry"));
  // The lookup of a window 1 x 16, a function of i - j alone (here, per head, entry (i, j) = i - j):
  // every window's index reproduces it too.
  const std::string toeplitz = swin_with(
      "unsqueeze",
      [](std::vector<float>& v) {
        for (size_t k = 0; k < v.size(); ++k)
          v[k] = static_cast<float>(static_cast<int>(k / 16 % 16) - static_cast<int>(k % 16)) +
                 (k < 256 ? 0.0F : 100.0F);
      },
      "swin_1x16");
  EXPECT_THAT(error_of(toeplitz), HasSubstr("the indexes of windows 1x16 (= 16x1), 2x8, 4x4, 8x2 each reproduce "
                                            "every entry"));
}

}  // namespace
}  // namespace gp::importers
