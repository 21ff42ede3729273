// Checkpoint generations (checkpoint_set.h): publishing with a pointer written last, finding the
// published generation, cleaning what interrupted saves left, the folder lock, and loading a
// generation by parameter name under another plan (resharding).
#include "runtime/checkpoint/checkpoint_set.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <regex>
#include <sstream>

#include "runtime/checkpoint/checkpoint_manifest.h"
#include "runtime/comm/comm.h"
#include "runtime/exec/optim.h"
#include "support/checksum.h"
#include "support/error.h"

namespace gp::runtime {
namespace {

namespace fs = std::filesystem;

constexpr const char* kLatest = "latest.json";
constexpr const char* kLock = "lock";

std::string hostname() {
  char buf[256] = {};
  ::gethostname(buf, sizeof buf - 1);
  return buf;
}

std::string now_text() {
  std::time_t t = std::time(nullptr);
  char buf[64];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S %Z", std::localtime(&t));
  return buf;
}

/// Writes `text` to `path` as one atomic replacement: `path.<tag>.tmp`, fsync, rename, fsync of the
/// directory. RuntimeFailure naming the file on any failure (the old `path` is then untouched).
void write_atomically(const fs::path& path, const std::string& text, const std::string& tag) {
  const std::string tmp = path.string() + "." + tag + ".tmp";
  std::string failure;
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    failure = std::strerror(errno);
  } else {
    for (size_t done = 0; done < text.size() && failure.empty();) {
      ssize_t w = ::write(fd, text.data() + done, text.size() - done);
      if (w < 0 && errno != EINTR) failure = std::strerror(errno);
      if (w > 0) done += static_cast<size_t>(w);
    }
    if (failure.empty() && ::fsync(fd) != 0) failure = fmt::format("fsync: {}", std::strerror(errno));
    if (::close(fd) != 0 && failure.empty()) failure = fmt::format("close: {}", std::strerror(errno));
    if (failure.empty() && ::rename(tmp.c_str(), path.c_str()) != 0)
      failure = fmt::format("rename: {}", std::strerror(errno));
  }
  if (!failure.empty()) {
    ::unlink(tmp.c_str());
    throw RuntimeFailure(fmt::format("{}: cannot write: {} (writing {})", path.string(), failure, tmp));
  }
  sync_parent_dir(path.string());
}

std::string read_text(const fs::path& p) {
  std::ifstream f(p);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

bool is_flat_file(const std::string& name) {
  static const std::regex re(R"((stage[0-9]+-rank[0-9]+|single)\.pt(\.tmp)?)");
  return std::regex_match(name, re);
}

bool starts_with(const std::string& s, const std::string& p) { return s.rfind(p, 0) == 0; }
bool ends_with(const std::string& s, const std::string& e) {
  return s.size() >= e.size() && s.compare(s.size() - e.size(), e.size(), e) == 0;
}

std::string tensor_hash(const torch::Tensor& t) {
  torch::Tensor c = t.detach().to(torch::kCPU).contiguous();
  return hex64(xxh64(c.data_ptr(), c.nbytes()));
}

std::string describe_holder(const std::string& text) {
  Json j = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return "an unknown process";
  return fmt::format("pid {} on host {} (since {})", j.value("pid", 0), j.value("host", std::string("?")),
                     j.value("started", std::string("?")));
}

std::string read_fd(int fd) {
  std::string out;
  char buf[512];
  for (off_t off = 0;;) {
    ssize_t n = ::pread(fd, buf, sizeof buf, off);
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
    off += n;
  }
  return out;
}

/// The all-reduce every save and resume uses: doubles, max or sum over the world.
std::vector<double> reduce(detail::Communicator& world, std::vector<double> v, detail::Reduce op) {
  std::vector<torch::Tensor> t{torch::tensor(v, torch::kFloat64)};
  world.all_reduce(t, op).wait();
  auto a = t[0].accessor<double, 1>();
  for (size_t i = 0; i < v.size(); ++i) v[i] = a[static_cast<int64_t>(i)];
  return v;
}

std::string latest_of(const std::string& dir) { return (fs::path(dir) / kLatest).string(); }

}  // namespace

void check_written(const std::ostream& f, const char* flag, const std::string& path) {
  if (f.good()) return;
  int err = errno;  // the failed write(2)'s, when the stream saw one
  throw RuntimeFailure(fmt::format("{}: cannot write {}: {}", flag, path, err ? std::strerror(err) : "write failed"));
}

void check_stdout_written() {
  errno = 0;
  if (std::fflush(stdout) == 0 && !std::ferror(stdout)) return;
  int err = errno;
  throw RuntimeFailure(fmt::format("stdout: cannot write the output: {}", err ? std::strerror(err) : "write failed"));
}

void write_file_atomically(const std::string& path, const std::string& bytes, const std::string& tag) {
  write_atomically(path, bytes, tag);
}

std::vector<std::string> Generation::files() const {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(folder, ec))
    if (e.path().extension() == ".pt") out.push_back(e.path().string());
  std::sort(out.begin(), out.end());
  return out;
}

std::optional<Generation> published_generation(const std::string& dir) {
  const fs::path latest = latest_of(dir);
  std::error_code ec;
  if (fs::exists(latest, ec)) {
    Json j = Json::parse(read_text(latest), nullptr, /*allow_exceptions=*/false);
    GP_CHECK(j.is_object() && j.value("format", std::string()) == kCheckpointSetFormat && j.contains("generation") &&
                 j["generation"].is_string() && j.contains("steps_done") && j["steps_done"].is_number_integer(),
             "{}: not a {} pointer (damaged, or written by a newer graphpipe?)", latest.string(), kCheckpointSetFormat);
    Generation g{dir, (fs::path(dir) / j["generation"].get<std::string>()).string(), j["steps_done"].get<int64_t>(), j};
    GP_CHECK(fs::is_directory(g.folder), "{}: names the generation {} but that folder does not exist", latest.string(),
             g.folder);
    return g;
  }
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (is_flat_file(e.path().filename().string()) && e.path().extension() == ".pt")
      return Generation{dir, dir, -1, Json()};
  return std::nullopt;
}

std::string current_checkpoint_file(const std::string& dir, int stage, int rank) {
  std::optional<Generation> g = published_generation(dir);
  return g ? g->file(stage, rank) : checkpoint_path(dir, stage, rank);
}

std::vector<std::string> stale_entries(const std::string& dir) {
  std::optional<Generation> gen;
  try {
    gen = published_generation(dir);
  } catch (const UserError&) {
    return {};  // a damaged pointer: touch nothing
  }
  const std::string current = gen && !gen->flat() ? gen->pointer["generation"].get<std::string>() : "";
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    std::string name = e.path().filename().string();
    bool stale = (starts_with(name, "step-") && e.is_directory() && name != current) ||
                 (starts_with(name, std::string(kLatest) + ".") && ends_with(name, ".tmp")) ||
                 (is_flat_file(name) && (ends_with(name, ".tmp") || !current.empty()));
    if (stale) out.push_back(name);
  }
  std::sort(out.begin(), out.end());
  return out;
}

void remove_stale(const std::string& dir) noexcept {
  try {
    for (const auto& name : stale_entries(dir)) {
      std::error_code ec;
      fs::remove_all(fs::path(dir) / name, ec);  // another process may be removing it too
    }
  } catch (...) {
  }
}

uint32_t new_attempt_token() {
  std::random_device rd;
  std::string seed = fmt::format("{}/{}/{}/{}/{}", hostname(), ::getpid(),
                                 std::chrono::steady_clock::now().time_since_epoch().count(), rd(), rd());
  return static_cast<uint32_t>(xxh64_text(seed));
}

std::string generation_folder(const std::string& dir, int64_t steps_done, uint32_t token) {
  return (fs::path(dir) / fmt::format("step-{:08d}-{:08x}", steps_done, token)).string();
}

// --- the lock ---

CheckpointLock::CheckpointLock(const std::string& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  GP_CHECK(!ec, "--checkpoint-dir {}: cannot create it: {}", dir, ec.message());
  path_ = (fs::path(dir) / kLock).string();
  for (int attempt = 0;; ++attempt) {
    int fd = ::open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    GP_CHECK(fd >= 0, "{}: cannot create the lock of --checkpoint-dir: {}", path_, std::strerror(errno));
    if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
      int err = errno;
      std::string holder = read_fd(fd);
      ::close(fd);
      if (err == EWOULDBLOCK)
        throw UserError(
            fmt::format("--checkpoint-dir {} is in use by another run: {} holds {}; wait for it to end or "
                        "use another directory",
                        dir, describe_holder(holder), path_));
      throw RuntimeFailure(fmt::format("{}: cannot lock: {}", path_, std::strerror(err)));
    }
    struct stat a {
    }, b{};
    if (::fstat(fd, &a) == 0 && ::stat(path_.c_str(), &b) == 0 && a.st_ino == b.st_ino && a.st_dev == b.st_dev) {
      fd_ = fd;
      break;
    }
    ::close(fd);  // the holder removed the file between our open and flock: lock the new one
    GP_ASSERT(attempt < 1000, "{}: cannot take the lock: the file keeps being replaced", path_);
  }
  std::string old = read_fd(fd_);
  if (!old.empty())
    std::fprintf(stderr, "graphpipe: note: took over the lock %s left by %s, which is no longer running\n",
                 path_.c_str(), describe_holder(old).c_str());
  std::string me = Json{{"pid", ::getpid()}, {"host", hostname()}, {"started", now_text()}}.dump() + "\n";
  if (::ftruncate(fd_, 0) != 0 || ::pwrite(fd_, me.data(), me.size(), 0) != static_cast<ssize_t>(me.size()))
    throw RuntimeFailure(fmt::format("{}: cannot write the lock: {}", path_, std::strerror(errno)));
}

CheckpointLock& CheckpointLock::operator=(CheckpointLock&& o) noexcept {
  if (this != &o) {
    release();
    fd_ = o.fd_;
    path_ = std::move(o.path_);
    o.fd_ = -1;
  }
  return *this;
}

void CheckpointLock::release() noexcept {
  if (fd_ < 0) return;
  ::unlink(path_.c_str());  // while still holding it: a process waiting on the old file retries
  ::close(fd_);
  fd_ = -1;
}

// --- saving ---

uint32_t agree_token(detail::Communicator& world) {
  double mine = world.rank() == 0 ? double(new_attempt_token()) : 0.0;
  return static_cast<uint32_t>(reduce(world, {mine}, detail::Reduce::sum)[0]);
}

Json initial_weights_of(const StageModule& m) {
  std::vector<std::pair<std::string, std::string>> hashes;
  for (const auto& [n, t] : m.named_parameters()) hashes.emplace_back(n, tensor_hash(t));
  return initial_weights_identity(hashes);
}

SetIdentity pipeline_set_identity(const TrainOptions& opt, const plan::Plan& p, const ir::Graph& g) {
  SetIdentity s;
  s.run = with_run_fields(pipeline_identity(g, p, -1, 0, opt.optimizer), opt.seed,
                          data_identity(opt.data_dir, opt.shuffle, g), Json());
  for (const auto& st : p.stages)
    for (int d : st.devices) s.files.push_back(fs::path(checkpoint_path("", st.id, d)).filename().string());
  s.ops = model_op_hashes(g);
  return s;
}

SetIdentity single_set_identity(const TrainOptions& opt, const ir::Graph& g) {
  SetIdentity s;
  s.run = with_run_fields(single_identity(g, opt.batch, opt.optimizer), opt.seed,
                          data_identity(opt.data_dir, opt.shuffle, g), Json());
  s.files = {"single.pt"};
  s.ops = model_op_hashes(g);
  return s;
}

CheckpointSaver pipeline_saver(const TrainOptions& opt, const plan::Plan& p, const ir::Graph& g, int rank,
                               int local_rank, int stage, StageModule* m, torch::optim::Optimizer* optimizer,
                               detail::Communicator& world) {
  CheckpointSaver s;
  s.dir = opt.checkpoint_dir;
  s.stage = stage;
  s.rank = rank;
  s.module = m;
  s.optimizer = optimizer;
  s.set = pipeline_set_identity(opt, p, g);
  if (m)
    s.identity = with_run_fields(pipeline_identity(g, p, stage, rank, opt.optimizer), opt.seed, s.set.run["data"],
                                 initial_weights_of(*m));
  s.world = &world;
  s.cleans = local_rank == 0;
  s.token = agree_token(world);
  return s;
}

CheckpointSaver single_saver(const TrainOptions& opt, const ir::Graph& g, StageModule& m,
                             torch::optim::Optimizer& optimizer) {
  CheckpointSaver s;
  s.dir = opt.checkpoint_dir;
  s.module = &m;
  s.optimizer = &optimizer;
  s.set = single_set_identity(opt, g);
  s.identity = with_run_fields(single_identity(g, opt.batch, opt.optimizer), opt.seed, s.set.run["data"],
                               initial_weights_of(m));
  s.token = new_attempt_token();
  return s;
}

void publish_generation(const std::string& dir, const std::string& folder, int64_t steps_done, const SetIdentity& set,
                        const std::string& tag) {
  Json pointer = {{"format", kCheckpointSetFormat},
                  {"steps_done", steps_done},
                  {"generation", fs::path(folder).filename().string()},
                  {"files", set.files},
                  {"run", set.run},
                  {"model_ops", set.ops}};
  write_atomically(latest_of(dir), pointer.dump() + "\n", tag);
}

void save_generation(const CheckpointSaver& s, int64_t steps_done) {
  const std::string folder = generation_folder(s.dir, steps_done, s.token);
  const std::string file = checkpoint_path(folder, s.stage, s.rank);
  std::string failure;
  if (s.module) {
    try {
      save_checkpoint(file, *s.module, *s.optimizer, steps_done, s.identity);
    } catch (const std::exception& e) {  // every rank must still vote
      failure = e.what();
    }
  }
  int failed = failure.empty() ? -1 : s.rank;
  if (s.world)
    failed = static_cast<int>(reduce(*s.world, {failure.empty() ? 0.0 : double(s.rank + 1)}, detail::Reduce::max)[0]) -
             1;
  if (failed >= 0) {
    if (s.module) {
      ::unlink(file.c_str());
      abandon_checkpoint(file);
      ::rmdir(folder.c_str());  // the last rank to leave it removes the folder
    }
    std::string kept = "there is no earlier checkpoint";
    try {
      if (auto prev = published_generation(s.dir); prev && !prev->flat())
        kept = fmt::format("{} still names the complete checkpoint of step {}", latest_of(s.dir), prev->steps_done);
      else if (prev) kept = fmt::format("the previous checkpoint files in {} are intact", s.dir);
    } catch (const UserError&) {
    }
    if (!failure.empty()) throw RuntimeFailure(fmt::format("{}; no rank published its checkpoint: {}", failure, kept));
    throw detail::CommError(
        fmt::format("rank {} could not write its checkpoint after {} steps; {}", failed, steps_done, kept), failed,
        /*timed_out=*/false);
  }
  publish_generation(s.dir, folder, steps_done, s.set, fmt::format("{:08x}-r{}", s.token, s.rank));
  if (s.world) reduce(*s.world, {0.0}, detail::Reduce::sum);  // everyone published: older ones may go
  if (s.cleans) remove_stale(s.dir);
}

// --- resuming ---

namespace {

std::string different_run(const std::string& where, const Json& pointer, const SetIdentity& set) {
  std::string diff = identity_difference(pointer.value("run", Json()), set.run, IdentityScope::model);
  if (diff.empty()) return "";
  if (diff.rfind("model", 0) == 0 && pointer.contains("model_ops")) {
    std::string op = first_op_difference(pointer["model_ops"], set.ops);
    if (!op.empty()) diff = "a different model: " + op;
  }
  return fmt::format(
      "{}: the checkpoint was written by a different run: {}; resume with the model, --seed, --data, "
      "mini-batch and --optimizer it was written with, or start a new --checkpoint-dir",
      where, diff);
}

std::string plan_summary(const Json& run) {
  const Json& p = run.value("plan", Json::object());
  if (p.value("kind", std::string()) == "single")
    return fmt::format("--single (mini-batch {})", p.value("mini_batch_size", 0));
  return fmt::format("a plan of {} stages on {} devices (hash {})", p.value("num_stages", 0), p.value("num_devices", 0),
                     p.value("hash", std::string()));
}

}  // namespace

std::string check_resumable(const std::string& dir, const SetIdentity& set) {
  GP_CHECK(fs::is_directory(dir),
           "--resume: checkpoint directory {} does not exist (--resume needs a checkpoint "
           "written with --checkpoint-dir)",
           dir);
  std::optional<Generation> g = published_generation(dir);
  GP_CHECK(g.has_value(),
           "--resume: {} holds no checkpoint (no {} and no stage<S>-rank<R>.pt or single.pt); --resume needs a "
           "checkpoint written with --checkpoint-dir",
           dir, kLatest);
  if (g->flat()) {
    for (const auto& f : set.files)
      GP_CHECK(fs::exists(fs::path(dir) / f), "--resume: checkpoint {} does not exist", (fs::path(dir) / f).string());
    return "";
  }
  std::string other = different_run(latest_of(dir), g->pointer, set);
  GP_CHECK(other.empty(), "{}", other);
  if (identity_difference(g->pointer["run"], set.run, IdentityScope::plan).empty()) {
    for (const auto& f : set.files)
      GP_CHECK(fs::exists(fs::path(g->folder) / f), "{}: names the generation {}, which lacks its file {}",
               latest_of(dir), g->folder, f);
    return "";
  }
  return fmt::format(
      "resharding: the checkpoint of step {} in {} was written under {}; loading every parameter and "
      "its optimizer state by name into {}",
      g->steps_done, dir, plan_summary(g->pointer["run"]), plan_summary(set.run));
}

void load_by_name(const Generation& gen, StageModule& m, torch::optim::Optimizer& opt, const Json& identity,
                  Json* initial) {
  struct Copy {
    torch::Tensor t;
    std::string file;
    Json initial;  // the file's record of its initial value (hex XXH64), null when not recorded
  };
  std::map<std::string, Copy> params;
  std::map<std::string, torch::Tensor> state;
  std::vector<std::string> files = gen.files();
  GP_CHECK(!files.empty(), "{}: the generation holds no checkpoint files", gen.folder);
  for (const auto& f : files) {
    CheckpointContents c = read_checkpoint(f);  // every checksum verified
    GP_CHECK(c.has_manifest(),
             "{}: has no manifest (written before {}); it cannot be loaded by name under another plan", f,
             kCheckpointFormat);
    GP_CHECK(gen.flat() || c.steps_done == gen.steps_done, "{}: {} steps done, but {} says {}", f, c.steps_done,
             latest_of(gen.dir), gen.steps_done);
    const Json fid = c.manifest.value("identity", Json());
    std::string diff = identity_difference(fid, identity, IdentityScope::model);
    GP_CHECK(diff.empty(), "{}: the checkpoint was written by a different run: {}", f, diff);
    const Json init = fid.is_object() && fid.contains("initial_weights")
                          ? fid["initial_weights"].value("params", Json())
                          : Json();
    for (auto& [n, t] : c.params) {
      auto it = params.find(n);
      if (it == params.end()) {
        params[n] = {t, f, init.is_object() && init.contains(n) ? init[n] : Json()};
        continue;
      }
      GP_CHECK(it->second.t.sizes() == t.sizes() && it->second.t.equal(t),
               "{}: parameter {} differs from its copy in {} (replicas and shared parameters hold equal copies)", f, n,
               it->second.file);
    }
    for (auto& [n, t] : c.optimizer_state) state.emplace(n, t);
  }
  const Json mine = identity.contains("initial_weights") ? identity["initial_weights"].value("params", Json()) : Json();
  torch::NoGradGuard no_grad;
  std::vector<std::string> names;
  std::vector<std::pair<std::string, std::string>> recorded;
  bool all_recorded = true;
  for (auto& [n, p] : m.named_parameters()) {
    names.push_back(n);
    const std::string op = n.substr(0, n.find('/'));
    auto it = params.find(n);
    GP_CHECK(it != params.end(), "{}: no file holds parameter {} of op {} (a checkpoint of another model?)", gen.folder,
             n, op);
    GP_CHECK(it->second.t.sizes() == p.sizes(), "{}: parameter {} of op {} has shape {} in the checkpoint but {} here",
             it->second.file, n, op, fmt::format("{}", fmt::join(it->second.t.sizes(), "x")),
             fmt::format("{}", fmt::join(p.sizes(), "x")));
    if (!it->second.initial.is_null() && mine.is_object() && mine.contains(n))
      GP_CHECK(it->second.initial == mine[n],
               "{}: parameter {} of op {} started from other initial weights (initial_weights {} in the checkpoint, {} "
               "in this run)",
               it->second.file, n, op, it->second.initial.dump(), mine[n].dump());
    p.copy_(it->second.t);
    if (it->second.initial.is_string()) recorded.emplace_back(n, it->second.initial.get<std::string>());
    else all_recorded = false;
  }
  set_optimizer_state(opt, names, state, gen.folder);
  if (initial) *initial = all_recorded ? initial_weights_identity(recorded) : Json();
}

int64_t resume_generation(const CheckpointSaver& s) {
  // Rank 0's view decides which generation every rank loads: kind (0 none or error, 1 generation,
  // 2 flat), steps, token.
  std::optional<Generation> gen;
  std::string error;
  std::vector<double> v{0, 0, 0};
  std::string note;
  if (s.rank == 0) {
    try {
      note = check_resumable(s.dir, s.set);
      gen = published_generation(s.dir);
      if (gen && !gen->flat()) {
        std::string name = gen->pointer["generation"].get<std::string>();
        v = {1, double(gen->steps_done), double(std::stoul(name.substr(name.rfind('-') + 1), nullptr, 16))};
      } else {
        v = {2, 0, 0};
      }
      std::vector<std::string> stale = stale_entries(s.dir);
      if (!stale.empty())
        std::fprintf(stderr,
                     "graphpipe: warning: %s holds %zu %s left by an interrupted save (%s); this run removes %s "
                     "once every rank has resumed\n",
                     s.dir.c_str(), stale.size(), stale.size() == 1 ? "entry" : "entries",
                     fmt::format("{}", fmt::join(stale, ", ")).c_str(), stale.size() == 1 ? "it" : "them");
    } catch (const UserError& e) {
      error = e.what();
    }
  }
  if (s.world) v = reduce(*s.world, v, detail::Reduce::sum);
  if (!error.empty()) throw UserError(error);
  if (v[0] == 0) throw detail::CommError("rank 0 found no checkpoint to resume in " + s.dir, 0, false);
  if (s.rank != 0) {
    gen = published_generation(s.dir);  // this rank's view, for the pointer's record of the run
    if (v[0] == 2) {
      gen = Generation{s.dir, s.dir, -1, Json()};
    } else {
      std::string folder = generation_folder(s.dir, static_cast<int64_t>(v[1]), static_cast<uint32_t>(v[2]));
      GP_CHECK(gen && !gen->flat(), "{}: rank 0 resumes {} but this rank sees no {}", s.dir, folder, kLatest);
      gen->folder = folder;  // rank 0's choice (both are complete when the views differ)
      gen->steps_done = static_cast<int64_t>(v[1]);
    }
  }
  int64_t steps = -1;
  if (s.module) {
    if (gen->flat()) {
      steps = load_checkpoint(gen->file(s.stage, s.rank), *s.module, *s.optimizer, s.identity);
    } else if (identity_difference(gen->pointer["run"], s.set.run, IdentityScope::plan).empty()) {
      std::string f = gen->file(s.stage, s.rank);
      steps = load_checkpoint(f, *s.module, *s.optimizer, s.identity);
      GP_CHECK(steps == gen->steps_done, "{}: {} steps done, but {} says {}", f, steps, latest_of(s.dir),
               gen->steps_done);
    } else {
      if (s.rank == 0 && !note.empty()) std::printf("%s\n", note.c_str());
      load_by_name(*gen, *s.module, *s.optimizer, s.identity);
      steps = gen->steps_done;
    }
  }
  if (s.world) {
    std::vector<double> r = reduce(*s.world, {s.module ? double(steps) : -1e18, s.module ? -double(steps) : -1e18},
                                   detail::Reduce::max);
    if (r[0] != -r[1])
      throw RuntimeFailure(
          fmt::format("--resume: checkpoints in {} stopped after different steps ({} .. {})", s.dir, -r[1], r[0]));
    steps = static_cast<int64_t>(r[0]);
  }
  // Everyone loaded the published generation and nobody saves yet: what interrupted saves left
  // (older generations included) can go now, even when no step remains to save.
  if (s.cleans) remove_stale(s.dir);
  return steps;
}

}  // namespace gp::runtime
