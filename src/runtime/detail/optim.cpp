// Optimizer construction and atomic checkpoint save/load.
#include "runtime/detail/optim.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <mutex>

#include "support/error.h"

namespace gp::runtime {

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const std::string& name, std::vector<torch::Tensor> params,
                                                        double lr, double momentum) {
  GP_CHECK(lr > 0, "--lr must be positive, found {}", lr);
  if (name == "sgd") {
    GP_CHECK(momentum >= 0 && momentum < 1, "--momentum must be in [0, 1), found {}", momentum);
    return std::make_unique<torch::optim::SGD>(std::move(params), torch::optim::SGDOptions(lr).momentum(momentum));
  }
  if (name == "adam") return std::make_unique<torch::optim::Adam>(std::move(params), torch::optim::AdamOptions(lr));
  throw UserError(fmt::format("--optimizer: unknown optimizer \"{}\" (valid: sgd, adam)", name));
}

std::string checkpoint_path(const std::string& dir, int stage, int rank) {
  if (stage < 0) return (std::filesystem::path(dir) / "single.pt").string();
  return (std::filesystem::path(dir) / fmt::format("stage{}-rank{}.pt", stage, rank)).string();
}

namespace {

// LibTorch's archives go through TorchScript's serializer, whose type-name mangler is shared
// process-wide without a lock (ThreadSanitizer found the race when ranks run as threads of one
// process, as in the tests): one archive at a time per process.
std::mutex& archive_mutex() {
  static std::mutex m;
  return m;
}

// Flushes a written file (or directory) to disk, so a checkpoint renamed into place survives a
// machine crash, not only a process crash.
void sync_path(const std::filesystem::path& p, bool directory) {
  int fd = ::open(p.c_str(), directory ? O_RDONLY | O_DIRECTORY : O_RDONLY);
  if (fd < 0) throw RuntimeFailure(fmt::format("{}: cannot open to sync: {}", p.string(), std::strerror(errno)));
  int rc = ::fsync(fd);
  int err = errno;
  ::close(fd);
  if (rc != 0) throw RuntimeFailure(fmt::format("{}: fsync failed: {}", p.string(), std::strerror(err)));
}

}  // namespace

void save_checkpoint(const std::string& path, const StageModule& m, torch::optim::Optimizer& opt,
                     int64_t steps_done) {
  std::lock_guard<std::mutex> lock(archive_mutex());
  std::filesystem::path p(path);
  if (p.has_parent_path()) std::filesystem::create_directories(p.parent_path());
  torch::serialize::OutputArchive ar;
  c10::List<std::string> names;
  auto named = m.named_parameters();
  for (size_t i = 0; i < named.size(); ++i) {
    names.push_back(named[i].first);
    ar.write(fmt::format("p{}", i), named[i].second.detach(), /*is_buffer=*/true);
  }
  ar.write("names", c10::IValue(names));
  ar.write("steps_done", c10::IValue(steps_done));
  torch::serialize::OutputArchive opt_ar;
  opt.save(opt_ar);
  ar.write("optimizer", opt_ar);
  std::string tmp = path + ".tmp";
  ar.save_to(tmp);
  sync_path(tmp, false);
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) throw RuntimeFailure(fmt::format("{}: cannot rename checkpoint into place: {}", path, ec.message()));
  sync_path(p.has_parent_path() ? p.parent_path() : std::filesystem::path("."), true);
}

namespace {

// Opens `path` into `ar` (the caller holds archive_mutex) and reads the parameters and step count.
CheckpointContents read_contents(const std::string& path, torch::serialize::InputArchive& ar) {
  try {
    ar.load_from(path);
  } catch (const std::exception& e) {
    std::string what = e.what();
    if (auto nl = what.find('\n'); nl != std::string::npos) what.resize(nl);  // c10 appends a backtrace
    throw UserError(fmt::format("{}: not a readable checkpoint: {}", path, what));
  }
  c10::IValue names, steps;
  GP_CHECK(ar.try_read("names", names) && names.isList(), "{}: not a graphpipe checkpoint (no parameter names)", path);
  GP_CHECK(ar.try_read("steps_done", steps) && steps.isInt(), "{}: checkpoint has no step count", path);
  CheckpointContents c;
  c.steps_done = steps.toInt();
  auto list = names.toList();
  for (size_t i = 0; i < list.size(); ++i) {
    torch::Tensor t;
    GP_CHECK(ar.try_read(fmt::format("p{}", i), t, /*is_buffer=*/true), "{}: parameter {} (\"{}\") is missing", path,
             i, list.get(i).toStringRef());
    c.params.emplace_back(list.get(i).toStringRef(), t);
  }
  return c;
}

}  // namespace

CheckpointContents read_checkpoint(const std::string& path) {
  std::lock_guard<std::mutex> lock(archive_mutex());
  torch::serialize::InputArchive ar;
  return read_contents(path, ar);
}

int64_t load_checkpoint(const std::string& path, StageModule& m, torch::optim::Optimizer& opt) {
  GP_CHECK(std::filesystem::exists(path), "{}: checkpoint not found (--resume needs a checkpoint written by "
           "--checkpoint-dir)", path);
  std::lock_guard<std::mutex> lock(archive_mutex());
  torch::serialize::InputArchive ar;
  CheckpointContents saved = read_contents(path, ar);
  auto named = m.named_parameters();
  GP_CHECK(saved.params.size() == named.size(), "{}: checkpoint holds {} parameters, this stage has {}", path,
           saved.params.size(), named.size());
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < named.size(); ++i) {
    const auto& [name, t] = saved.params[i];
    GP_CHECK(name == named[i].first, "{}: parameter {} is \"{}\" in the checkpoint but \"{}\" here", path, i, name,
             named[i].first);
    GP_CHECK(t.sizes() == named[i].second.sizes(), "{}: parameter \"{}\" has shape {} in the checkpoint but {} here",
             path, name, fmt::format("{}", fmt::join(t.sizes(), "x")),
             fmt::format("{}", fmt::join(named[i].second.sizes(), "x")));
    named[i].second.copy_(t);
  }
  torch::serialize::InputArchive opt_ar;
  GP_CHECK(ar.try_read("optimizer", opt_ar), "{}: checkpoint has no optimizer state", path);
  try {
    opt.load(opt_ar);
  } catch (const std::exception& e) {
    throw UserError(fmt::format("{}: optimizer state does not match --optimizer: {}", path, e.what()));
  }
  return saved.steps_done;
}

}  // namespace gp::runtime
