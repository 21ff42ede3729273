// Shared helpers for the libFuzzer targets: parse bytes as JSON the way read_json_file does, and
// load the fixed model/plan the plan and schedule fuzzers check against (fuzz/data/).
#pragma once
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "support/json.h"

namespace gp::fuzz {

/// The input as JSON, or nullopt when it is not valid JSON (read_json_file turns that into a
/// UserError; nlohmann's parser itself is not what we fuzz). Exceptions other than parse errors
/// propagate and are reported as crashes.
inline std::optional<Json> parse(const uint8_t* data, size_t size) {
  Json j = Json::parse(data, data + size, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return std::nullopt;
  return j;
}

/// A file under fuzz/data (GP_FUZZ_DATA_DIR is set by fuzz/CMakeLists.txt).
inline std::string data_file(const std::string& name) { return std::string(GP_FUZZ_DATA_DIR) + "/" + name; }

}  // namespace gp::fuzz
