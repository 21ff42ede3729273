// Checkpoint generations: what `--checkpoint-dir D` holds, and how a save is published, found again
// on --resume (under the same or another plan of the model) and kept apart from another run's.
// Include only from runtime .cpp files (LibTorch).
//
//   D/latest.json                     the pointer: which generation is complete (written last)
//   D/step-00000006-1a2b3c4d/         a generation: every rank's file after 6 steps
//       stage0-rank0.pt stage1-rank1.pt ...   (single.pt for --single; format: checkpoint.h)
//   D/lock                            held (flock) by the run using D: pid, host, start time
//
// A save writes every file of step k into a new folder named after k and this attempt's token,
// then (every rank, after all voted that their file is durable) renames latest.json.<token>.tmp
// over latest.json, and only after everyone published removes the older generations. A crash at
// any instant therefore leaves latest.json naming a generation whose every file is complete;
// folders of interrupted saves, older generations a crash kept and temporaries are "stale": named
// on --resume and removed once every rank has loaded (and by every save). A directory of the layout before generations (D/stage<S>-rank<R>.pt, D/single.pt, no
// latest.json) still resumes; the first save replaces it by a generation.
#pragma once
#include <torch/torch.h>

#include <cstdint>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "plan/plan.h"
#include "runtime/checkpoint/checkpoint.h"
#include "runtime/base/train.h"
#include "support/json.h"

namespace gp::runtime {

namespace detail {
class Communicator;
}

/// RuntimeFailure "FLAG: cannot write PATH: <errno text>" when `f` failed (a full disk: ENOSPC, a
/// full device, EIO): every output the user asked for is checked after each write (--log, --trace).
void check_written(const std::ostream& f, const char* flag, const std::string& path);
/// The same for stdout (train --json > FILE): flushes it, RuntimeFailure when a write failed.
void check_stdout_written();

/// Replaces `path` by `bytes` atomically (`path.<tag>.tmp`, checked writes, fsync, rename, fsync of
/// the directory); RuntimeFailure naming the file on any failure, `path` then untouched.
void write_file_atomically(const std::string& path, const std::string& bytes, const std::string& tag);

/// latest.json's format tag.
inline constexpr const char* kCheckpointSetFormat = "graphpipe.checkpoint-set/1";

/// The generation `latest.json` names (or a directory of the layout before generations).
struct Generation {
  std::string dir;     // the --checkpoint-dir
  std::string folder;  // the folder holding the files (== dir for the old flat layout)
  int64_t steps_done = 0;
  Json pointer;  // latest.json; null for the old flat layout
  bool flat() const { return pointer.is_null(); }
  std::string file(int stage, int rank) const { return checkpoint_path(folder, stage, rank); }
  /// The checkpoint files of the generation (*.pt in folder), sorted.
  std::vector<std::string> files() const;
};

/// The published generation of `dir`; nullopt when `dir` holds none. UserError naming latest.json
/// when it is malformed or names a folder that does not exist.
std::optional<Generation> published_generation(const std::string& dir);

/// The file of (stage, rank) in dir's published generation; checkpoint_path(dir, ...) (the flat
/// layout) when dir holds no latest.json.
std::string current_checkpoint_file(const std::string& dir, int stage, int rank);

/// What the folder holds besides the published generation, latest.json and the lock that a save
/// of ours left: folders of saves that never completed, temporaries, files of the flat layout that
/// a generation replaced. Names relative to `dir`.
std::vector<std::string> stale_entries(const std::string& dir);
/// Removes stale_entries(dir) (errors ignored: several processes may clean at once).
void remove_stale(const std::string& dir) noexcept;

/// 8 hex digits unique to this attempt (host, pid, clock, random device).
uint32_t new_attempt_token();
/// dir/step-<steps_done, 8 digits>-<token, 8 hex>
std::string generation_folder(const std::string& dir, int64_t steps_done, uint32_t token);

/// The run-level identity latest.json records (`run_identity`: pipeline_identity(..., -1, 0, ...)
/// with_run_fields; `files`: the file names the generation must hold; `ops`: model_op_hashes).
struct SetIdentity {
  Json run;
  std::vector<std::string> files;
  Json ops;
};

/// The lock of a --checkpoint-dir, held while a run uses it (flock on D/lock: the kernel releases
/// it when the holder dies). Taking it when another live process holds it is a UserError naming
/// that process (pid, host, start); a lock file left by a process that died is taken over with a
/// note on stderr.
class CheckpointLock {
 public:
  CheckpointLock() = default;
  explicit CheckpointLock(const std::string& dir);
  CheckpointLock(CheckpointLock&& o) noexcept : fd_(o.fd_), path_(std::move(o.path_)) { o.fd_ = -1; }
  CheckpointLock& operator=(CheckpointLock&& o) noexcept;
  CheckpointLock(const CheckpointLock&) = delete;
  CheckpointLock& operator=(const CheckpointLock&) = delete;
  ~CheckpointLock() { release(); }
  void release() noexcept;  // removes the lock file (held) and closes it

 private:
  int fd_ = -1;
  std::string path_;
};

/// One rank's (or --single's) view of a checkpoint directory during a run.
struct CheckpointSaver {
  std::string dir;
  int stage = -1, rank = 0;       // the file this process writes (stage -1: single.pt)
  StageModule* module = nullptr;  // null on a rank without a stage
  torch::optim::Optimizer* optimizer = nullptr;
  Json identity;  // this file's (with_run_fields)
  SetIdentity set;
  detail::Communicator* world = nullptr;  // null for --single
  bool cleans = true;                     // removes stale entries after publishing (one process per host)
  uint32_t token = 0;                     // agree_token() for pipelines
};

/// Rank 0's new_attempt_token, given to every rank (one all-reduce).
uint32_t agree_token(detail::Communicator& world);

/// The initial-weights record of `m` (initial_weights_identity of its parameters now).
Json initial_weights_of(const StageModule& m);
/// latest.json's record of a pipelined run of `p` / of `train --single` (opt: --seed, --data,
/// --shuffle, --optimizer, --batch).
SetIdentity pipeline_set_identity(const TrainOptions& opt, const plan::Plan& p, const ir::Graph& g);
SetIdentity single_set_identity(const TrainOptions& opt, const ir::Graph& g);
/// A rank's saver (collective: agrees on the token over `world`); module/optimizer null without a stage.
CheckpointSaver pipeline_saver(const TrainOptions& opt, const plan::Plan& p, const ir::Graph& g, int rank,
                               int local_rank, int stage, StageModule* m, torch::optim::Optimizer* optimizer,
                               detail::Communicator& world);
CheckpointSaver single_saver(const TrainOptions& opt, const ir::Graph& g, StageModule& m,
                             torch::optim::Optimizer& optimizer);

/// Saves generation `steps_done`: writes this process's file into the new folder, votes (every
/// rank, over `world`) that every file is durable, publishes latest.json, waits for everyone to
/// publish, then removes stale entries. A rank that cannot write (a full disk) throws
/// RuntimeFailure naming its file; the others CommError naming it; latest.json keeps naming the
/// previous generation, which is intact.
void save_generation(const CheckpointSaver& s, int64_t steps_done);

/// --resume: loads this process's stage from the generation rank 0 finds in s.dir (every rank
/// uses rank 0's) and returns its steps_done. Under the plan that wrote it each rank loads its own
/// file, checked against s.identity; under another plan of the same model (other stages, devices,
/// micro-batches, or --single <-> --plan) every parameter, shared parameter and optimizer state is
/// loaded by name from the generation's files. UserError (naming the file and the field, or the op)
/// when there is no checkpoint, it belongs to another run or model, or a file is damaged.
int64_t resume_generation(const CheckpointSaver& s);

/// The launcher's check before any worker starts: UserError when s.dir has no checkpoint to resume,
/// one of another run or model, or the same plan's generation lacks a file. Returns "" or, when the
/// checkpoint was written under another plan, a one-line note that it will be resharded.
std::string check_resumable(const std::string& dir, const SetIdentity& set);

/// Loads `m`'s parameters and `opt`'s state by name from the files of `gen` (any plan of the same
/// model), verifying checksums, identities (model scope) and that copies of a parameter held by
/// several files (replicas, shared parameters) are identical. `identity` is this stage's.
/// With `initial`, fills it with the files' record of each loaded parameter's initial value
/// (initial_weights_identity of them, in `m`'s order; null when the files predate the record).
void load_by_name(const Generation& gen, StageModule& m, torch::optim::Optimizer& opt, const Json& identity,
                  Json* initial = nullptr);

/// Writes latest.json (atomically) naming `folder` as the generation of `steps_done`.
void publish_generation(const std::string& dir, const std::string& folder, int64_t steps_done, const SetIdentity& set,
                        const std::string& tag);

}  // namespace gp::runtime
