// Strict JSON reading with error messages that name the file and the JSON path of the problem,
// e.g. `model.json: ops[17].inputs[0]: unknown op "enc.l3"`.
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "support/error.h"

namespace gp {

using Json = nlohmann::json;

/// A cursor into a parsed document that remembers its file name and path for error messages.
class JsonAt {
 public:
  JsonAt(const Json& j, std::string file, std::string path = "")
      : j_(&j), file_(std::move(file)), path_(std::move(path)) {}

  const Json& json() const { return *j_; }
  const std::string& file() const { return file_; }
  const std::string& path() const { return path_; }

  /// Throws UserError "FILE: PATH: message".
  [[noreturn]] void fail(const std::string& msg) const;

  bool has(const char* key) const;
  JsonAt at(const char* key) const;  // required member (object expected)
  JsonAt at(size_t index) const;     // array element
  size_t size() const;               // array length (array expected)
  void expect_object() const;
  void expect_array() const;

  std::string str() const;
  int64_t i64() const;
  double num() const;
  bool boolean() const;
  std::vector<int64_t> i64_list() const;

  // Optional members with defaults.
  std::string str_or(const char* key, const std::string& dflt) const;
  int64_t i64_or(const char* key, int64_t dflt) const;
  double num_or(const char* key, double dflt) const;

 private:
  std::string child_path(const std::string& key) const;
  const Json* j_;
  std::string file_;
  std::string path_;
};

/// Reads and parses a JSON file; a missing file or a syntax error is a UserError naming the file.
Json read_json_file(const std::string& path);

/// Checks doc["format"] == expected, else UserError naming the file and the value found.
void expect_format(const JsonAt& doc, const std::string& expected);

/// Writes `j` (pretty-printed) to `path` atomically (temp file + rename); UserError on failure.
void write_json_file(const std::string& path, const Json& j, int indent = 1);

/// Writes text to a file atomically; UserError on failure.
void write_text_file(const std::string& path, const std::string& text);

}  // namespace gp
