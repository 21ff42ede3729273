// Reading and writing model files in the `graphpipe.model/1` format (see CONTRACT.md):
// read_model_json(write_model_json(m)) == m exactly.
#pragma once
#include <string>

#include "ir/model.h"
#include "support/json.h"

namespace gp::importers {

inline constexpr const char* kModelFormat = "graphpipe.model/1";

/// The model as a `graphpipe.model/1` document.
Json model_to_json(const ir::Model& m);

/// Parses a document strictly; errors name `file` and the JSON path (`ops[17].inputs[0]: unknown
/// op "enc.l3"`). Checks names (unique, inputs resolve, outputs are ops) itself, then runs
/// ir::validate (shapes, attrs, cycles) with `file` as the prefix.
ir::Model model_from_json(const Json& doc, const std::string& file);

/// File wrappers; a missing file or invalid JSON is a UserError naming the file.
ir::Model read_model_json(const std::string& path);
void write_model_json(const std::string& path, const ir::Model& m);

}  // namespace gp::importers
