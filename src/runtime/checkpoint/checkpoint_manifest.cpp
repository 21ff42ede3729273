// Checkpoint identities: hashes of the model and plan plus the sizes a user recognises, so a
// mismatch on --resume names what changed.
#include "runtime/checkpoint/checkpoint_manifest.h"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>

#include "importers/model_json.h"
#include "support/checksum.h"
#include "support/error.h"

namespace gp::runtime {

std::string model_hash(const ir::Graph& g) { return hex64(xxh64_text(importers::model_to_json(g.model()).dump())); }

std::string plan_hash(const plan::Plan& p) {
  Json stages = Json::array();
  for (const auto& st : p.stages)
    stages.push_back(
        {{"id", st.id}, {"ops", st.ops}, {"devices", st.devices}, {"micro_batch_size", st.micro_batch_size}});
  Json j = {{"mini_batch_size", p.mini_batch_size}, {"num_devices", p.num_devices}, {"stages", stages}};
  return hex64(xxh64_text(j.dump()));
}

namespace {

Json model_identity(const ir::Graph& g) { return {{"name", g.name()}, {"ops", g.num_ops()}, {"hash", model_hash(g)}}; }

}  // namespace

Json pipeline_identity(const ir::Graph& g, const plan::Plan& p, int stage, int rank, const std::string& optimizer) {
  Json st = nullptr;
  if (stage >= 0 && stage < static_cast<int>(p.stages.size())) {
    const plan::Stage& s = p.stages[stage];
    st = {{"id", s.id}, {"ops", s.ops.size()}, {"devices", s.devices}, {"micro_batch_size", s.micro_batch_size}};
  }
  return {{"model", model_identity(g)},
          {"plan",
           {{"kind", "pipeline"},
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

Json with_run_fields(Json identity, uint64_t seed, const Json& data, const Json& initial_weights) {
  identity["seed"] = seed;
  identity["data"] = data;
  if (!initial_weights.is_null()) identity["initial_weights"] = initial_weights;
  return identity;
}

namespace {

/// XXH64 of one data file: name, size and contents (a large file: size, first MiB, 64 spread MiB).
std::string file_hash(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  GP_CHECK(f.good(), "--data: cannot read {} to record it in checkpoints", path);
  f.seekg(0, std::ios::end);
  const int64_t size = f.tellg();
  constexpr int64_t kMiB = 1 << 20, kWhole = 256 * kMiB;
  std::vector<uint64_t> parts{static_cast<uint64_t>(size)};
  std::vector<char> buf(kMiB);
  auto hash_at = [&](int64_t off, int64_t n) {
    f.seekg(off);
    f.read(buf.data(), n);
    GP_CHECK(f.gcount() == n, "--data: {} changed while being read", path);
    parts.push_back(xxh64(buf.data(), static_cast<size_t>(n)));
  };
  if (size <= kWhole) {
    for (int64_t off = 0; off < size; off += kMiB) hash_at(off, std::min(kMiB, size - off));
  } else {
    hash_at(0, kMiB);
    for (int i = 1; i <= 64; ++i) hash_at((size - kMiB) / 64 * i, kMiB);
  }
  return hex64(xxh64(parts.data(), parts.size() * sizeof(uint64_t)));
}

}  // namespace

Json data_identity(const std::string& data_dir, bool shuffle, const ir::Graph& g) {
  if (data_dir.empty()) return {{"kind", "synthetic"}};
  std::string all;
  for (const auto& in : g.model().inputs) {
    std::filesystem::path f = std::filesystem::path(data_dir) / (in.name + ".npy");
    if (std::filesystem::exists(f)) all += in.name + ":" + file_hash(f.string()) + ";";
  }
  return {{"kind", "npy"}, {"shuffle", shuffle}, {"hash", hex64(xxh64_text(all))}};
}

Json model_op_hashes(const ir::Graph& g) {
  Json out = Json::array();
  const Json model = importers::model_to_json(g.model());  // not a temporary: the loop reads into it
  for (const Json& op : model.at("ops")) out.push_back({op.value("name", std::string()), hex64(xxh64_text(op.dump()))});
  return out;
}

std::string first_op_difference(const Json& saved_ops, const Json& now_ops) {
  std::map<std::string, std::string> saved, now;
  for (const Json& e : saved_ops) saved[e[0].get<std::string>()] = e[1].get<std::string>();
  for (const Json& e : now_ops) now[e[0].get<std::string>()] = e[1].get<std::string>();
  for (const Json& e : now_ops) {
    std::string name = e[0].get<std::string>();
    auto it = saved.find(name);
    if (it == saved.end()) return fmt::format("op {}: in this run's model but not in the checkpoint's", name);
    if (it->second != now[name])
      return fmt::format("op {}: its kind, inputs, shape or attributes differ from the checkpoint's model", name);
  }
  for (const Json& e : saved_ops)
    if (!now.count(e[0].get<std::string>()))
      return fmt::format("op {}: in the checkpoint's model but not in this run's", e[0].get<std::string>());
  return "";
}

Json initial_weights_identity(const std::vector<std::pair<std::string, std::string>>& param_hashes) {
  Json params = Json::object();
  std::string all;
  for (const auto& [name, h] : param_hashes) {
    params[name] = h;
    all += name + ":" + h + ";";
  }
  return {{"xxh64", hex64(xxh64_text(all))}, {"params", params}};
}

std::string identity_difference(const Json& saved, const Json& now, IdentityScope scope) {
  enum Level { model_level, plan_layout, per_file };
  struct Field {
    const char* pointer;
    const char* what;
    Level level;
    bool optional;  // not recorded by checkpoints written before it existed
  };
  static const Field fields[] = {
      {"/model/name", "model name", model_level, false},
      {"/model/ops", "model op count", model_level, false},
      {"/model/hash", "model (ops, shapes or attributes; hash)", model_level, false},
      {"/seed", "--seed", model_level, true},
      {"/data/kind", "training data (--data DIR or synthetic)", model_level, true},
      {"/data/shuffle", "--shuffle", model_level, true},
      {"/data/hash", "training data (the --data files' names and contents; hash)", model_level, true},
      {"/plan/mini_batch_size", "plan mini_batch_size", model_level, false},
      {"/plan/kind", "run kind (--single or --plan)", plan_layout, false},
      {"/plan/num_devices", "plan num_devices", plan_layout, false},
      {"/plan/num_stages", "plan stage count", plan_layout, false},
      {"/plan/stage/ops", "this file's stage op count", per_file, false},
      {"/plan/stage/devices", "this file's stage devices", per_file, false},
      {"/plan/stage/micro_batch_size", "this file's stage micro_batch_size", per_file, false},
      {"/plan/hash", "plan (stage ops, devices or micro-batch sizes; hash)", plan_layout, false},
      {"/stage", "stage", per_file, false},
      {"/rank", "rank", per_file, false},
      {"/initial_weights/xxh64", "this file's initial weights (--seed or the model file's weights; hash)", per_file,
       true},
      {"/optimizer", "--optimizer", model_level, false},
  };
  for (const Field& f : fields) {
    if (scope == IdentityScope::plan && f.level == per_file) continue;
    if (scope == IdentityScope::model && f.level != model_level) continue;
    Json::json_pointer ptr(f.pointer);
    if (f.optional && !saved.contains(ptr)) continue;
    Json a = saved.contains(ptr) ? saved.at(ptr) : Json(nullptr);
    Json b = now.contains(ptr) ? now.at(ptr) : Json(nullptr);
    if (a == b) continue;
    auto show = [](const Json& v) { return v.is_string() ? v.get<std::string>() : v.dump(); };
    return fmt::format("{}: {} in the checkpoint, {} in this run", f.what, show(a), show(b));
  }
  return "";
}

}  // namespace gp::runtime
