// `graphpipe checkpoint show|diff`: reads checkpoints written by --checkpoint-dir without a plan or
// model (parameter names, shapes, values and the step count stored in each file). Every file read
// is verified against its manifest's checksums (read_checkpoint): a corrupt file is exit 2.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>
#include <map>
#include <set>

#include "runtime/launch/checkpoint_tool.h"
#include "runtime/checkpoint/checkpoint_set.h"
#include "runtime/pipeline/pipeline.h"
#include "runtime/checkpoint/checkpoint_manifest.h"
#include "plan/plan.h"
#include "runtime/exec/optim.h"
#include "support/error.h"

namespace gp::runtime {
namespace {

namespace fs = std::filesystem;

CheckpointContents load(const std::string& path) {
  GP_CHECK(fs::is_regular_file(path), "{}: no such checkpoint file", path);
  return read_checkpoint(path);
}

std::vector<std::string> files_of(const std::string& path) {
  GP_CHECK(fs::exists(path), "{}: no such checkpoint file or directory", path);
  if (!fs::is_directory(path)) return {path};
  std::vector<std::string> out;
  std::optional<Generation> gen = published_generation(path);  // a --checkpoint-dir: its published generation
  const std::string folder = gen ? gen->folder : path;
  for (auto& e : fs::directory_iterator(folder))
    if (e.path().extension() == ".pt") out.push_back(e.path().string());
  std::sort(out.begin(), out.end());
  GP_CHECK(!out.empty(), "{}: directory holds no checkpoint (*.pt) files", path);
  return out;
}

/// The stage a checkpoint was written for (manifest identity), -1 when unknown (--single, old files).
int stage_of(const CheckpointContents& c) {
  if (!c.has_manifest()) return -1;
  const Json& id = c.manifest.value("identity", Json());
  return id.is_object() ? id.value("stage", -1) : -1;
}

}  // namespace

std::string shared_copies(const std::string& path) {
  struct Copy {
    std::string file;
    int stage;
    torch::Tensor t;
  };
  std::map<std::string, std::vector<Copy>> by_name;
  for (const auto& f : files_of(path)) {
    CheckpointContents c = load(f);
    for (auto& [n, t] : c.params) by_name[n].push_back({fs::path(f).filename().string(), stage_of(c), t});
  }
  std::string out;
  for (const auto& [name, copies] : by_name) {
    std::set<int> stages;
    for (const Copy& c : copies) stages.insert(c.stage);
    if (stages.size() < 2 || stages.count(-1)) continue;  // replicas of one stage, or not a pipeline
    double max_abs = 0;
    bool same = true;
    std::vector<std::string> where;
    for (const Copy& c : copies) {
      where.push_back(c.file);
      if (c.t.sizes() != copies.front().t.sizes()) {
        same = false;
        max_abs = std::numeric_limits<double>::infinity();
        continue;
      }
      if (c.t.ne(copies.front().t).any().item<bool>()) {
        same = false;
        max_abs = std::max(max_abs, (c.t - copies.front().t).abs().max().item<double>());
      }
    }
    out += fmt::format("shared parameter {}: {} copies ({}) on stages {}: {}\n", name, copies.size(),
                       fmt::join(where, ", "), fmt::join(stages, ", "),
                       same ? "identical" : fmt::format("DIFFERENT (max |a-b| {:.3g})", max_abs));
  }
  return out;
}

std::string describe_checkpoints(const std::string& path) {
  std::string out;
  for (const auto& f : files_of(path)) {
    CheckpointContents l = load(f);
    int64_t total = 0;
    for (auto& [n, t] : l.params) total += t.numel();
    out += fmt::format("{}: {} steps done, {} parameter tensors, {} values\n", f, l.steps_done, l.params.size(), total);
    if (!l.has_manifest()) {
      out += "  integrity: not checked (no checksums: written before graphpipe.checkpoint/1 manifests)\n";
    } else {
      out += fmt::format("  integrity: {} tensors (parameters and optimizer state) match their checksums\n",
                         l.verified_tensors);
      const Json& id = l.manifest.value("identity", Json());
      if (id.is_object() && id.contains("model") && id.contains("plan")) {
        const Json& pl = id["plan"];
        std::string plan = pl.value("kind", "") == "single"
                               ? fmt::format("--single, mini-batch {}", pl.value("mini_batch_size", 0))
                               : fmt::format("plan {} ({} stages on {} devices, mini-batch {}), stage {} rank {}",
                                             pl.value("hash", ""), pl.value("num_stages", 0),
                                             pl.value("num_devices", 0), pl.value("mini_batch_size", 0),
                                             id.value("stage", -1), id.value("rank", 0));
        out += fmt::format("  written for: model {} ({} ops, hash {}), {}, --optimizer {}\n",
                           id["model"].value("name", ""), id["model"].value("ops", 0), id["model"].value("hash", ""),
                           plan, id.value("optimizer", ""));
      }
    }
    for (auto& [n, t] : l.params)
      out += fmt::format("  {:<40} [{}]  norm {:.6g}\n", n, fmt::join(t.sizes(), ", "), t.norm().item<double>());
  }
  return out + shared_copies(path);
}

CheckpointDiff diff_checkpoints(const std::string& a, const std::string& b) {
  CheckpointDiff d;
  std::vector<std::string> fa = files_of(a), fb = files_of(b);
  std::map<std::string, std::string> by_name_b;
  for (auto& f : fb) by_name_b[fs::path(f).filename().string()] = f;
  GP_CHECK(fa.size() == fb.size(), "checkpoint diff: {} holds {} files, {} holds {}", a, fa.size(), b, fb.size());
  for (const auto& f : fa) {
    std::string other = fa.size() == 1 && !fs::is_directory(a) ? fb.front()
                                                               : by_name_b[fs::path(f).filename().string()];
    GP_CHECK(!other.empty(), "checkpoint diff: {} has no counterpart named {} in {}", f,
             fs::path(f).filename().string(), b);
    CheckpointContents x = load(f), y = load(other);
    ++d.files;
    if (x.steps_done != y.steps_done)
      d.report += fmt::format("{}: {} steps done vs {} in {}\n", f, x.steps_done, y.steps_done, other);
    GP_CHECK(x.params.size() == y.params.size(), "checkpoint diff: {} holds {} parameters, {} holds {}", f,
             x.params.size(), other, y.params.size());
    for (size_t i = 0; i < x.params.size(); ++i) {
      const auto& [nx, tx] = x.params[i];
      const auto& [ny, ty] = y.params[i];
      GP_CHECK(nx == ny && tx.sizes() == ty.sizes(), "checkpoint diff: parameter {} is {} [{}] in {} but {} [{}] in {}",
               i, nx, fmt::join(tx.sizes(), ","), f, ny, fmt::join(ty.sizes(), ","), other);
      ++d.tensors;
      d.values += tx.numel();
      int64_t differ = tx.ne(ty).sum().item<int64_t>();
      if (differ == 0) continue;
      double max_abs = (tx - ty).abs().max().item<double>();
      d.differing_values += differ;
      d.max_abs = std::max(d.max_abs, max_abs);
      d.report += fmt::format("{} {}: {} of {} values differ, max |a-b| {:.3g}\n", fs::path(f).filename().string(), nx,
                              differ, tx.numel(), max_abs);
    }
  }
  d.shared = shared_copies(a) + shared_copies(b);
  return d;
}

std::string reshard_checkpoints(const std::string& from, const std::string& plan_path, const std::string& out) {
  std::optional<Generation> gen = published_generation(from);
  GP_CHECK(gen && !gen->flat(), "checkpoint reshard: {} holds no checkpoint generation (no latest.json)", from);
  const Json& was = gen->pointer["run"];
  TrainOptions opt;
  opt.plan_path = plan_path;
  opt.steps = 1;  // prepare_run's checks want a run; nothing trains here
  opt.seed = was.value("seed", uint64_t{1});
  opt.optimizer = was.value("optimizer", std::string("adam"));
  PreparedRun run = prepare_run(opt, /*check_data_values=*/false);
  SetIdentity set = pipeline_set_identity(opt, run.plan, run.graph);
  set.run["data"] = was.value("data", set.run["data"]);  // the run's data: not re-read here
  std::string note = check_resumable(from, set);         // another model or run: exit 2 naming it
  GP_CHECK(!fs::exists(fs::path(out) / "latest.json"),
           "checkpoint reshard: --out {} already holds a checkpoint (latest.json); choose an empty directory", out);
  CheckpointLock lock(out);
  const std::string folder = generation_folder(out, gen->steps_done, new_attempt_token());
  const std::vector<int> stage_of = plan::stage_of_ops(run.plan, run.graph);
  int files = 0;
  int64_t tensors = 0;
  for (const auto& st : run.plan.stages) {
    std::vector<OpId> ops;
    for (size_t i = 0; i < stage_of.size(); ++i)
      if (stage_of[i] == st.id) ops.emplace_back(static_cast<int32_t>(i));
    StageModule m(run.graph, ops, opt.seed, run.weights);
    auto optimizer = make_optimizer(opt.optimizer, m.parameters(), opt.lr, opt.momentum);
    Json initial;
    load_by_name(*gen, m, *optimizer,
                 with_run_fields(pipeline_identity(run.graph, run.plan, st.id, st.devices.at(0), opt.optimizer),
                                 opt.seed, set.run["data"], Json()),
                 &initial);
    for (int d : st.devices) {
      Json id = with_run_fields(pipeline_identity(run.graph, run.plan, st.id, d, opt.optimizer), opt.seed,
                                set.run["data"], initial);  // the initial weights the source run recorded
      save_checkpoint(checkpoint_path(folder, st.id, d), m, *optimizer, gen->steps_done, id);
      ++files;
      tensors += static_cast<int64_t>(m.named_parameters().size());
    }
  }
  publish_generation(out, folder, gen->steps_done, set, "reshard");
  return fmt::format(
      "{}\nwrote {}: {} files ({} parameter tensors with their optimizer state) after {} steps for {} "
      "({} stages on {} devices)\n",
      note.empty() ? "the plan is the one the checkpoint was written for: copied file by file" : note, out, files,
      tensors, gen->steps_done, plan_path, run.plan.stages.size(), run.plan.num_devices);
}

}  // namespace gp::runtime
