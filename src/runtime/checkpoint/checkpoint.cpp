// Checkpoint save (to a temporary file with our own checked writes, then rename) and load, with a
// checksummed manifest verified on every read.
#include "runtime/checkpoint/checkpoint.h"

#include <fmt/ranges.h>
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <mutex>

#include "runtime/checkpoint/checkpoint_manifest.h"
#include "runtime/exec/optim.h"
#include "runtime/base/fault.h"
#include "support/checksum.h"
#include "support/error.h"

namespace gp::runtime {

std::string checkpoint_path(const std::string& dir, int stage, int rank) {
  if (stage < 0) return (std::filesystem::path(dir) / "single.pt").string();
  return (std::filesystem::path(dir) / fmt::format("stage{}-rank{}.pt", stage, rank)).string();
}

namespace {

namespace fs = std::filesystem;

// LibTorch's archives go through TorchScript's serializer, whose type-name mangler is shared
// process-wide without a lock (ThreadSanitizer found the race when ranks run as threads of one
// process, as in the tests): one archive at a time per process.
std::mutex& archive_mutex() {
  static std::mutex m;
  return m;
}

std::string first_line(std::string s) {
  if (auto nl = s.find('\n'); nl != std::string::npos) s.resize(nl);  // c10 appends a backtrace
  return s;
}

uint64_t tensor_checksum(const torch::Tensor& t) {
  torch::Tensor c = t.detach().to(torch::kCPU).contiguous();
  return xxh64(c.data_ptr(), c.nbytes());
}

Json tensor_entries(const std::vector<std::pair<std::string, torch::Tensor>>& ts) {
  Json out = Json::array();
  for (const auto& [name, t] : ts)
    out.push_back({{"name", name},
                   {"shape", t.sizes().vec()},
                   {"dtype", std::string(c10::toString(t.scalar_type()))},
                   {"xxh64", hex64(tensor_checksum(t))}});
  return out;
}

std::vector<std::string> names_of(const std::vector<std::pair<std::string, torch::Tensor>>& ts) {
  std::vector<std::string> out;
  for (const auto& [n, t] : ts) out.push_back(n);
  return out;
}

/// Checks `ts` against the manifest's list `key` ("params" or "optimizer_state"); returns how many
/// tensors were verified. UserError naming the file and the first tensor that differs.
int64_t verify_tensors(const std::string& path, const Json& manifest, const char* key, const char* what,
                       const std::vector<std::pair<std::string, torch::Tensor>>& ts) {
  const Json& list = manifest.at(key);
  for (size_t i = 0; i < std::max(list.size(), ts.size()); ++i) {
    GP_CHECK(i < list.size() && i < ts.size(),
             "{}: corrupt checkpoint: it holds {} {} tensors but its manifest lists {} (first unmatched: \"{}\")", path,
             ts.size(), what, list.size(), i < ts.size() ? ts[i].first : list[i].value("name", std::string("?")));
    const Json& e = list[i];
    const auto& [name, t] = ts[i];
    GP_CHECK(e.value("name", std::string()) == name,
             "{}: corrupt checkpoint: {} tensor {} is \"{}\" but its manifest lists \"{}\"", path, what, i, name,
             e.value("name", std::string()));
    GP_CHECK(e.at("shape") == Json(t.sizes().vec()),
             "{}: corrupt checkpoint: tensor \"{}\" has shape {} but its manifest says {}", path, name,
             Json(t.sizes().vec()).dump(), e.at("shape").dump());
    std::string got = hex64(tensor_checksum(t)), want = e.value("xxh64", std::string());
    GP_CHECK(got == want,
             "{}: corrupt checkpoint: tensor \"{}\" ({}, {} bytes) fails its checksum (xxh64 {}, the manifest "
             "says {}); the file changed after it was written",
             path, name, what, t.nbytes(), got, want);
  }
  return static_cast<int64_t>(ts.size());
}

/// GP_FAULT="rank=R,kind=enospc,step=S": the save after step S (steps_done S + 1) of rank R fails.
bool injected_enospc(int rank, int64_t steps_done) {
  const char* spec = std::getenv("GP_FAULT");
  if (!spec || !*spec) return false;
  std::optional<FaultSpec> f = parse_fault(spec);
  return f && f->kind == "enospc" && f->rank == rank && f->step + 1 == steps_done;
}

/// The archive writer: checked write(2) calls, so ENOSPC and EIO are seen and named. After a failure
/// it drops the rest and still reports success to LibTorch: LibTorch 1.13's archive writer, told of
/// a failed write, throws, and its destructor throws again while finishing the zip, which
/// terminates the process (found with a full tmpfs). The caller checks `error` afterwards.
struct CheckedWriter {
  int fd = -1;
  size_t written = 0;
  int error = 0;            // errno of the first failure
  int64_t fail_after = -1;  // fault injection: ENOSPC once this many bytes are written
  size_t operator()(const void* buf, size_t n) {
    const char* p = static_cast<const char*>(buf);
    size_t left = n;
    while (left > 0 && error == 0) {
      size_t chunk = left;
      if (fail_after >= 0) {
        if (written >= static_cast<size_t>(fail_after)) {
          error = ENOSPC;
          break;
        }
        chunk = std::min(chunk, static_cast<size_t>(fail_after) - written);
      }
      ssize_t w = ::write(fd, p, chunk);
      if (w < 0) {
        if (errno != EINTR) error = errno;
        continue;
      }
      p += w;
      left -= static_cast<size_t>(w);
      written += static_cast<size_t>(w);
    }
    return n;
  }
};

}  // namespace

void write_checkpoint_tmp(const std::string& path, const StageModule& m, torch::optim::Optimizer& opt,
                          int64_t steps_done, const Json& identity) {
  std::lock_guard<std::mutex> lock(archive_mutex());
  fs::path p(path);
  std::error_code dir_error;
  if (p.has_parent_path()) fs::create_directories(p.parent_path(), dir_error);
  if (dir_error)
    throw RuntimeFailure(fmt::format("{}: could not save the checkpoint after {} steps: cannot create {}: {}", path,
                                     steps_done, p.parent_path().string(), dir_error.message()));
  auto named = m.named_parameters();
  std::vector<std::pair<std::string, torch::Tensor>> params;
  torch::serialize::OutputArchive ar;
  c10::List<std::string> names;
  for (size_t i = 0; i < named.size(); ++i) {
    names.push_back(named[i].first);
    params.emplace_back(named[i].first, named[i].second.detach());
    ar.write(fmt::format("p{}", i), params.back().second, /*is_buffer=*/true);
  }
  ar.write("names", c10::IValue(names));
  ar.write("steps_done", c10::IValue(steps_done));
  torch::serialize::OutputArchive opt_ar;
  opt.save(opt_ar);
  ar.write("optimizer", opt_ar);
  Json manifest = {{"format", kCheckpointFormat},
                   {"steps_done", steps_done},
                   {"optimizer", optimizer_kind(opt)},
                   {"identity", identity},
                   {"params", tensor_entries(params)},
                   {"optimizer_state", tensor_entries(optimizer_state_tensors(opt, names_of(params)))}};
  std::string text = manifest.dump();
  ar.write("manifest", c10::IValue(text));
  ar.write("manifest_xxh64", c10::IValue(hex64(xxh64_text(text))));

  const std::string tmp = path + ".tmp";
  ::unlink(tmp.c_str());  // never write through a stale file or link
  CheckedWriter w;
  w.fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  int rank = identity.is_object() ? identity.value("rank", 0) : 0;
  if (injected_enospc(rank, steps_done)) w.fail_after = 4096;
  std::string failure;
  if (w.fd < 0) {
    failure = std::strerror(errno);
  } else {
    try {
      ar.save_to([&w](const void* buf, size_t n) { return w(buf, n); });
    } catch (const std::exception& e) {
      failure = first_line(e.what());
    }
    if (w.error) failure = std::strerror(w.error);
    if (failure.empty() && ::fsync(w.fd) != 0) failure = fmt::format("fsync: {}", std::strerror(errno));
    if (::close(w.fd) != 0 && failure.empty()) failure = fmt::format("close: {}", std::strerror(errno));
  }
  if (failure.empty()) return;
  ::unlink(tmp.c_str());
  throw RuntimeFailure(fmt::format(
      "{}: could not save the checkpoint after {} steps: {} (writing {}, {} bytes written); removed the partial "
      "file{}",
      path, steps_done, failure, tmp, w.written,
      fs::exists(path) ? fmt::format(", the previous checkpoint {} is intact", path) : std::string()));
}

void sync_parent_dir(const std::string& path) {
  const fs::path p(path);
  const fs::path dir = p.has_parent_path() ? p.parent_path() : fs::path(".");
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) throw RuntimeFailure(fmt::format("{}: cannot open to sync: {}", dir.string(), std::strerror(errno)));
  int rc = ::fsync(fd);
  int err = errno;
  ::close(fd);
  if (rc != 0) throw RuntimeFailure(fmt::format("{}: fsync failed: {}", dir.string(), std::strerror(err)));
}

void commit_checkpoint(const std::string& path) {
  fs::path p(path);
  std::error_code ec;
  fs::rename(path + ".tmp", path, ec);
  if (ec) throw RuntimeFailure(fmt::format("{}: cannot rename checkpoint into place: {}", path, ec.message()));
  sync_parent_dir(path);
}

void abandon_checkpoint(const std::string& path) noexcept { ::unlink((path + ".tmp").c_str()); }

void save_checkpoint(const std::string& path, const StageModule& m, torch::optim::Optimizer& opt, int64_t steps_done,
                     const Json& identity) {
  write_checkpoint_tmp(path, m, opt, steps_done, identity);
  commit_checkpoint(path);
}

namespace {

// Tensors land on `device` whatever device wrote them (a checkpoint of a GPU run reads on a CPU).
void open_archive(const std::string& path, torch::serialize::InputArchive& ar,
                  const torch::Device& device = torch::kCPU) {
  try {
    ar.load_from(path, device);
  } catch (const std::exception& e) {
    throw UserError(fmt::format("{}: not a readable checkpoint: {}", path, first_line(e.what())));
  }
}

/// The manifest (null when the file predates manifests), its own checksum verified.
Json read_manifest(const std::string& path, torch::serialize::InputArchive& ar) {
  c10::IValue text, sum;
  if (!ar.try_read("manifest", text)) return Json();
  GP_CHECK(text.isString() && ar.try_read("manifest_xxh64", sum) && sum.isString(),
           "{}: corrupt checkpoint: its manifest is malformed", path);
  GP_CHECK(hex64(xxh64_text(text.toStringRef())) == sum.toStringRef(),
           "{}: corrupt checkpoint: the manifest fails its checksum; the file changed after it was written", path);
  Json m = Json::parse(text.toStringRef(), nullptr, /*allow_exceptions=*/false);
  GP_CHECK(m.is_object() && m.value("format", std::string()) == kCheckpointFormat && m.contains("params") &&
               m.contains("optimizer_state") && m["params"].is_array() && m["optimizer_state"].is_array(),
           "{}: checkpoint manifest is not {} (a newer graphpipe wrote it?)", path, kCheckpointFormat);
  return m;
}

CheckpointContents read_contents_unguarded(const std::string& path, torch::serialize::InputArchive& ar,
                                           const torch::Device& device);

// Opens `path` into `ar` (the caller holds archive_mutex), reads the parameters and step count and
// verifies the parameters' checksums against the manifest. LibTorch's own complaints about a
// damaged archive (c10::Error) become UserErrors naming the file.
CheckpointContents read_contents(const std::string& path, torch::serialize::InputArchive& ar,
                                 const torch::Device& device = torch::kCPU) {
  try {
    return read_contents_unguarded(path, ar, device);
  } catch (const c10::Error& e) {
    throw UserError(fmt::format("{}: corrupt checkpoint: {}", path, first_line(e.what())));
  }
}

CheckpointContents read_contents_unguarded(const std::string& path, torch::serialize::InputArchive& ar,
                                           const torch::Device& device) {
  open_archive(path, ar, device);
  c10::IValue names, steps;
  GP_CHECK(ar.try_read("names", names) && names.isList(), "{}: not a graphpipe checkpoint (no parameter names)", path);
  GP_CHECK(ar.try_read("steps_done", steps) && steps.isInt(), "{}: checkpoint has no step count", path);
  CheckpointContents c;
  c.steps_done = steps.toInt();
  auto list = names.toList();
  for (size_t i = 0; i < list.size(); ++i) {
    torch::Tensor t;
    GP_CHECK(ar.try_read(fmt::format("p{}", i), t, /*is_buffer=*/true), "{}: parameter {} (\"{}\") is missing", path, i,
             list.get(i).toStringRef());
    c.params.emplace_back(list.get(i).toStringRef(), t);
  }
  c.manifest = read_manifest(path, ar);
  if (!c.has_manifest()) {
    std::fprintf(stderr,
                 "graphpipe: warning: %s has no checksums (written before %s manifests); loading it without an "
                 "integrity check\n",
                 path.c_str(), kCheckpointFormat);
    return c;
  }
  GP_CHECK(c.manifest.value("steps_done", int64_t{-1}) == c.steps_done,
           "{}: corrupt checkpoint: {} steps done, but its manifest says {}", path, c.steps_done,
           c.manifest.value("steps_done", int64_t{-1}));
  c.verified_tensors += verify_tensors(path, c.manifest, "params", "parameter", c.params);
  return c;
}

torch::serialize::InputArchive optimizer_archive(const std::string& path, torch::serialize::InputArchive& ar) {
  torch::serialize::InputArchive opt_ar;
  GP_CHECK(ar.try_read("optimizer", opt_ar), "{}: checkpoint has no optimizer state", path);
  return opt_ar;
}

}  // namespace

CheckpointContents read_checkpoint(const std::string& path) {
  std::lock_guard<std::mutex> lock(archive_mutex());
  torch::serialize::InputArchive ar;
  CheckpointContents c = read_contents(path, ar);
  if (!c.has_manifest()) return c;
  // The optimizer state is verified by loading it into a fresh optimizer of the same kind over
  // copies of the parameters: no knowledge of LibTorch's archive layout needed.
  std::vector<torch::Tensor> params;
  for (auto& [n, t] : c.params) params.push_back(t.detach().clone());
  std::string kind = c.manifest.value("optimizer", std::string());
  GP_CHECK(kind == "adam" || kind == "sgd", "{}: checkpoint manifest names an unknown optimizer \"{}\"", path, kind);
  auto opt = make_optimizer(kind, params, 1e-3, 0.9);
  torch::serialize::InputArchive opt_ar = optimizer_archive(path, ar);
  try {
    opt->load(opt_ar);
  } catch (const std::exception& e) {
    throw UserError(
        fmt::format("{}: corrupt checkpoint: its optimizer state does not load: {}", path, first_line(e.what())));
  }
  c.optimizer_state = optimizer_state_tensors(*opt, names_of(c.params));
  c.verified_tensors += verify_tensors(path, c.manifest, "optimizer_state", "optimizer state", c.optimizer_state);
  return c;
}

Json read_checkpoint_identity(const std::string& path) {
  std::lock_guard<std::mutex> lock(archive_mutex());
  torch::serialize::InputArchive ar;
  open_archive(path, ar);
  Json m = read_manifest(path, ar);
  return m.is_null() ? Json() : m.value("identity", Json());
}

int64_t load_checkpoint(const std::string& path, StageModule& m, torch::optim::Optimizer& opt, const Json& identity) {
  GP_CHECK(fs::exists(path), "{}: checkpoint not found (--resume needs a checkpoint written by --checkpoint-dir)",
           path);
  std::lock_guard<std::mutex> lock(archive_mutex());
  torch::serialize::InputArchive ar;
  CheckpointContents saved = read_contents(path, ar, m.device());  // the optimizer state loads where it is used
  if (saved.has_manifest() && !identity.is_null()) {
    const Json& was = saved.manifest.value("identity", Json());
    if (!was.is_null()) {
      std::string diff = identity_difference(was, identity);
      GP_CHECK(diff.empty(),
               "{}: the checkpoint was written by a different run: {}; resume with the model, plan and --optimizer it "
               "was written with, or start a new --checkpoint-dir",
               path, diff);
    }
  }
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
  torch::serialize::InputArchive opt_ar = optimizer_archive(path, ar);
  // LibTorch's load also replaces the hyper-parameters (lr, betas, momentum) by the file's: this run's
  // flags apply on --resume, so they are put back.
  std::vector<std::unique_ptr<torch::optim::OptimizerOptions>> flags;
  for (const auto& group : opt.param_groups()) flags.push_back(group.options().clone());
  try {
    opt.load(opt_ar);
  } catch (const std::exception& e) {
    throw UserError(fmt::format("{}: optimizer state does not match --optimizer: {}", path, first_line(e.what())));
  }
  for (size_t i = 0; i < flags.size(); ++i) opt.param_groups()[i].set_options(std::move(flags[i]));
  if (saved.has_manifest())
    verify_tensors(path, saved.manifest, "optimizer_state", "optimizer state",
                   optimizer_state_tensors(opt, names_of(saved.params)));
  return saved.steps_done;
}

}  // namespace gp::runtime
