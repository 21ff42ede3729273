#include "support/json.h"

#include <cstdio>
#include <fstream>
#include <sstream>
#include <unistd.h>

namespace gp {

void JsonAt::fail(const std::string& msg) const {
  throw UserError(fmt::format("{}: {}: {}", file_, path_.empty() ? "(top)" : path_, msg));
}

std::string JsonAt::child_path(const std::string& key) const { return path_.empty() ? key : path_ + "." + key; }

void JsonAt::expect_object() const {
  if (!j_->is_object()) fail(fmt::format("expected an object, found {}", j_->type_name()));
}
void JsonAt::expect_array() const {
  if (!j_->is_array()) fail(fmt::format("expected an array, found {}", j_->type_name()));
}

bool JsonAt::has(const char* key) const { return j_->is_object() && j_->contains(key); }

JsonAt JsonAt::at(const char* key) const {
  expect_object();
  auto it = j_->find(key);
  if (it == j_->end()) fail(fmt::format("missing required field \"{}\"", key));
  return JsonAt(*it, file_, child_path(key));
}

JsonAt JsonAt::at(size_t index) const {
  expect_array();
  if (index >= j_->size()) fail(fmt::format("index {} out of range", index));
  return JsonAt((*j_)[index], file_, fmt::format("{}[{}]", path_, index));
}

size_t JsonAt::size() const {
  expect_array();
  return j_->size();
}

std::string JsonAt::str() const {
  if (!j_->is_string()) fail(fmt::format("expected a string, found {}", j_->dump()));
  return j_->get<std::string>();
}

int64_t JsonAt::i64() const {
  if (!j_->is_number_integer()) fail(fmt::format("expected an integer, found {}", j_->dump()));
  return j_->get<int64_t>();
}

double JsonAt::num() const {
  if (!j_->is_number()) fail(fmt::format("expected a number, found {}", j_->dump()));
  return j_->get<double>();
}

bool JsonAt::boolean() const {
  if (!j_->is_boolean()) fail(fmt::format("expected true or false, found {}", j_->dump()));
  return j_->get<bool>();
}

std::vector<int64_t> JsonAt::i64_list() const {
  expect_array();
  std::vector<int64_t> out;
  for (size_t i = 0; i < j_->size(); ++i) out.push_back(at(i).i64());
  return out;
}

std::string JsonAt::str_or(const char* key, const std::string& dflt) const { return has(key) ? at(key).str() : dflt; }
int64_t JsonAt::i64_or(const char* key, int64_t dflt) const { return has(key) ? at(key).i64() : dflt; }
double JsonAt::num_or(const char* key, double dflt) const { return has(key) ? at(key).num() : dflt; }

Json read_json_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw UserError(fmt::format("{}: cannot open file", path));
  std::stringstream ss;
  ss << in.rdbuf();
  try {
    return Json::parse(ss.str());
  } catch (const Json::parse_error& e) {
    throw UserError(fmt::format("{}: not valid JSON: {}", path, e.what()));
  }
}

void expect_format(const JsonAt& doc, const std::string& expected) {
  doc.expect_object();
  if (!doc.has("format")) doc.fail(fmt::format("missing \"format\" (expected \"{}\")", expected));
  std::string f = doc.at("format").str();
  if (f != expected) doc.at("format").fail(fmt::format("format is \"{}\", expected \"{}\"", f, expected));
}

void write_text_file(const std::string& path, const std::string& text) {
  std::string tmp = path + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) throw UserError(fmt::format("{}: cannot write file", path));
    out << text;
    out.flush();
    if (!out) throw UserError(fmt::format("{}: write failed", path));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    throw UserError(fmt::format("{}: cannot rename temporary file into place", path));
  }
}

void write_json_file(const std::string& path, const Json& j, int indent) {
  write_text_file(path, j.dump(indent) + "\n");
}

}  // namespace gp
