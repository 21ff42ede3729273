// Checkpoint identities: hashes of the model and plan plus the sizes a user recognises, so a
// mismatch on --resume names what changed.
#include "runtime/checkpoint_manifest.h"

#include <fmt/format.h>

#include "importers/model_json.h"
#include "support/checksum.h"

namespace gp::runtime {

std::string model_hash(const ir::Graph& g) {
  return hex64(xxh64_text(importers::model_to_json(g.model()).dump()));
}

std::string plan_hash(const plan::Plan& p) {
  Json stages = Json::array();
  for (const auto& st : p.stages)
    stages.push_back({{"id", st.id}, {"ops", st.ops}, {"devices", st.devices}, {"micro_batch_size", st.micro_batch_size}});
  Json j = {{"mini_batch_size", p.mini_batch_size}, {"num_devices", p.num_devices}, {"stages", stages}};
  return hex64(xxh64_text(j.dump()));
}

namespace {

Json model_identity(const ir::Graph& g) {
  return {{"name", g.name()}, {"ops", g.num_ops()}, {"hash", model_hash(g)}};
}

}  // namespace

Json pipeline_identity(const ir::Graph& g, const plan::Plan& p, int stage, int rank, const std::string& optimizer) {
  Json st = nullptr;
  if (stage >= 0 && stage < static_cast<int>(p.stages.size())) {
    const plan::Stage& s = p.stages[stage];
    st = {{"id", s.id}, {"ops", s.ops.size()}, {"devices", s.devices}, {"micro_batch_size", s.micro_batch_size}};
  }
  return {{"model", model_identity(g)},
          {"plan", {{"kind", "pipeline"},
                    {"mini_batch_size", p.mini_batch_size},
                    {"num_devices", p.num_devices},
                    {"num_stages", p.stages.size()},
                    {"hash", plan_hash(p)},
                    {"stage", st}}},
          {"stage", stage},
          {"rank", rank},
          {"optimizer", optimizer}};
}

Json single_identity(const ir::Graph& g, int batch, const std::string& optimizer) {
  return {{"model", model_identity(g)},
          {"plan", {{"kind", "single"}, {"mini_batch_size", batch}}},
          {"stage", -1},
          {"rank", 0},
          {"optimizer", optimizer}};
}

std::string identity_difference(const Json& saved, const Json& now, bool plan_level_only) {
  struct Field {
    const char* pointer;
    const char* what;
    bool per_file;
  };
  static const Field fields[] = {
      {"/model/name", "model name", false},
      {"/model/ops", "model op count", false},
      {"/model/hash", "model (ops, shapes or attributes; hash)", false},
      {"/plan/kind", "run kind (--single or --plan)", false},
      {"/plan/mini_batch_size", "plan mini_batch_size", false},
      {"/plan/num_devices", "plan num_devices", false},
      {"/plan/num_stages", "plan stage count", false},
      {"/plan/stage/ops", "this file's stage op count", true},
      {"/plan/stage/devices", "this file's stage devices", true},
      {"/plan/stage/micro_batch_size", "this file's stage micro_batch_size", true},
      {"/plan/hash", "plan (stage ops, devices or micro-batch sizes; hash)", false},
      {"/stage", "stage", true},
      {"/rank", "rank", true},
      {"/optimizer", "--optimizer", false},
  };
  for (const Field& f : fields) {
    if (plan_level_only && f.per_file) continue;
    Json::json_pointer ptr(f.pointer);
    Json a = saved.contains(ptr) ? saved.at(ptr) : Json(nullptr);
    Json b = now.contains(ptr) ? now.at(ptr) : Json(nullptr);
    if (a == b) continue;
    auto show = [](const Json& v) { return v.is_string() ? v.get<std::string>() : v.dump(); };
    return fmt::format("{}: {} in the checkpoint, {} in this run", f.what, show(a), show(b));
  }
  return "";
}

}  // namespace gp::runtime
