// graphpipe.model/1 reading (strict, with JSON-path errors) and writing (one op per line).
#include "importers/model_json.h"

#include <fmt/format.h>
#include <unordered_map>

#include "support/error.h"

namespace gp::importers {

namespace {

using OJson = nlohmann::ordered_json;

OJson input_json(const ir::Input& in) {
  return OJson{{"name", in.name}, {"shape", in.shape}, {"dtype", ir::to_string(in.dtype)}};
}

OJson op_json(const ir::Op& op) {
  return OJson{{"name", op.name},
               {"kind", ir::to_string(op.kind)},
               {"inputs", op.inputs},
               {"output_shape", op.output_shape},
               {"dtype", ir::to_string(op.dtype)},
               {"attrs", OJson::parse(op.attrs.dump())}};
}

ir::DType parse_dtype(const JsonAt& j) {
  try {
    return ir::dtype_from_string(j.str());
  } catch (const UserError& e) {
    j.fail(e.what());
  }
}

// A shape whose dimensions are positive; with `batch_dim`, dim 0 may be -1 (the batch).
ir::Shape parse_shape(const JsonAt& j, bool batch_dim = true) {
  ir::Shape s = j.i64_list();
  for (size_t d = 0; d < s.size(); ++d) {
    bool ok = s[d] > 0 || (batch_dim && d == 0 && s[d] == ir::kBatch);
    if (!ok)
      j.at(d).fail(fmt::format("dimension {} is {}: dimensions are positive{}", d, s[d],
                               batch_dim ? " (-1 only as dim 0, the batch)" : ""));
  }
  return s;
}

OJson shared_json(const ir::SharedParam& sp) {
  return OJson{{"name", sp.name}, {"shape", sp.shape}, {"uses", sp.uses}};
}

// "shared_params" (optional): [{"name", "shape" (no batch dim), "uses": ["op/param", ...]}].
void read_shared_params(const JsonAt& doc, ir::Model& m) {
  if (!doc.has("shared_params")) return;
  JsonAt list = doc.at("shared_params");
  for (size_t k = 0; k < list.size(); ++k) {
    JsonAt j = list.at(k);
    j.expect_object();
    ir::SharedParam sp;
    sp.name = j.at("name").str();
    sp.shape = parse_shape(j.at("shape"), /*batch_dim=*/false);
    JsonAt uses = j.at("uses");
    for (size_t u = 0; u < uses.size(); ++u) sp.uses.push_back(uses.at(u).str());
    m.shared_params.push_back(std::move(sp));
  }
}

}  // namespace

Json model_to_json(const ir::Model& m) {
  Json doc = {{"format", kModelFormat}, {"name", m.name}, {"outputs", m.outputs}};
  doc["inputs"] = Json::array();
  for (const auto& in : m.inputs) doc["inputs"].push_back(Json::parse(input_json(in).dump()));
  doc["ops"] = Json::array();
  for (const auto& op : m.ops) doc["ops"].push_back(Json::parse(op_json(op).dump()));
  if (!m.shared_params.empty()) {
    doc["shared_params"] = Json::array();
    for (const auto& sp : m.shared_params) doc["shared_params"].push_back(Json::parse(shared_json(sp).dump()));
  }
  return doc;
}

ir::Model model_from_json(const Json& json, const std::string& file) {
  JsonAt doc(json, file);
  expect_format(doc, kModelFormat);
  ir::Model m;
  m.name = doc.at("name").str();

  // Where each name was defined, for duplicate and unknown-name messages.
  std::unordered_map<std::string, std::string> defined;
  auto define = [&](const JsonAt& at, const std::string& name, const std::string& where) {
    if (name.empty()) at.fail("empty name");
    auto [it, fresh] = defined.emplace(name, where);
    if (!fresh) at.fail(fmt::format("duplicate name \"{}\" (also {})", name, it->second));
  };

  JsonAt inputs = doc.at("inputs");
  for (size_t i = 0; i < inputs.size(); ++i) {
    JsonAt j = inputs.at(i);
    j.expect_object();
    ir::Input in;
    in.name = j.at("name").str();
    define(j.at("name"), in.name, fmt::format("inputs[{}]", i));
    in.shape = parse_shape(j.at("shape"));
    if (j.has("dtype")) in.dtype = parse_dtype(j.at("dtype"));
    m.inputs.push_back(std::move(in));
  }

  JsonAt ops = doc.at("ops");
  for (size_t i = 0; i < ops.size(); ++i) {
    JsonAt j = ops.at(i);
    j.expect_object();
    ir::Op op;
    op.name = j.at("name").str();
    define(j.at("name"), op.name, fmt::format("ops[{}]", i));
    try {
      op.kind = ir::op_kind_from_string(j.at("kind").str());
    } catch (const UserError& e) {
      j.at("kind").fail(e.what());
    }
    JsonAt op_inputs = j.at("inputs");
    for (size_t k = 0; k < op_inputs.size(); ++k) op.inputs.push_back(op_inputs.at(k).str());
    op.output_shape = parse_shape(j.at("output_shape"));
    if (j.has("dtype")) op.dtype = parse_dtype(j.at("dtype"));
    if (j.has("attrs")) {
      j.at("attrs").expect_object();
      op.attrs = j.at("attrs").json();
    }
    m.ops.push_back(std::move(op));
  }

  // Inputs may name ops defined later in the file: resolve once every name is known.
  for (size_t i = 0; i < m.ops.size(); ++i)
    for (size_t k = 0; k < m.ops[i].inputs.size(); ++k)
      if (!defined.count(m.ops[i].inputs[k]))
        ops.at(i).at("inputs").at(k).fail(
            fmt::format("unknown op \"{}\" (no op or graph input has that name)", m.ops[i].inputs[k]));

  JsonAt outputs = doc.at("outputs");
  if (outputs.size() == 0) outputs.fail("a model needs at least one output (its loss op)");
  for (size_t k = 0; k < outputs.size(); ++k) {
    std::string name = outputs.at(k).str();
    auto it = defined.find(name);
    if (it == defined.end() || it->second.rfind("ops[", 0) != 0)
      outputs.at(k).fail(fmt::format("unknown op \"{}\" (outputs name ops)", name));
    m.outputs.push_back(std::move(name));
  }

  read_shared_params(doc, m);

  // Shapes (declared output shapes must equal the inferred ones), attrs, cycles, reachability:
  // the IR's own checks, named by file.
  ir::validate(m, file);
  return m;
}

ir::Model read_model_json(const std::string& path) { return model_from_json(read_json_file(path), path); }

void write_model_json(const std::string& path, const ir::Model& m) {
  // Hand-laid-out so that each input and op sits on one line (readable, diffable).
  std::string s = "{\n \"format\": " + OJson(kModelFormat).dump() + ",\n \"name\": " + OJson(m.name).dump() +
                  ",\n \"inputs\": [";
  for (size_t i = 0; i < m.inputs.size(); ++i) s += (i ? ",\n  " : "\n  ") + input_json(m.inputs[i]).dump();
  s += m.inputs.empty() ? "],\n \"ops\": [" : "\n ],\n \"ops\": [";
  for (size_t i = 0; i < m.ops.size(); ++i) s += (i ? ",\n  " : "\n  ") + op_json(m.ops[i]).dump();
  s += m.ops.empty() ? "],\n" : "\n ],\n";
  s += " \"outputs\": " + OJson(m.outputs).dump();
  for (size_t k = 0; k < m.shared_params.size(); ++k)
    s += (k ? ",\n  " : ",\n \"shared_params\": [\n  ") + shared_json(m.shared_params[k]).dump();
  s += m.shared_params.empty() ? "\n}\n" : "\n ]\n}\n";
  write_text_file(path, s);
}

}  // namespace gp::importers
