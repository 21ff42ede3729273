// Atomic, checksummed checkpoints of a stage's parameters + optimizer state, shared by run_single,
// the pipeline workers and `graphpipe checkpoint`. Include only from runtime .cpp files (LibTorch).
//
// Files: `<dir>/stage<S>-rank<R>.pt` for pipeline worker R holding stage S, `<dir>/single.pt` for
// `train --single` (checkpoint_path with stage < 0). Each is a LibTorch archive holding the
// parameter names, the parameters (`p0`, `p1`, ...), the optimizer state, the number of completed
// steps and a manifest (graphpipe.checkpoint/1 JSON, itself checksummed): the run's identity
// (checkpoint_manifest.h) and an XXH64 checksum, shape and dtype of every parameter and optimizer
// state tensor. Every read verifies the checksums (UserError naming the file and tensor); files
// written before manifests existed load with a one-line warning. A file is written to
// `<file>.tmp`, fsynced, and renamed into place, so a failed or interrupted save leaves the
// previous checkpoint intact.
#pragma once
#include <torch/torch.h>

#include <string>
#include <utility>
#include <vector>

#include "runtime/exec/stage_module.h"
#include "support/json.h"

namespace gp::runtime {

std::string checkpoint_path(const std::string& dir, int stage, int rank);

/// What a checkpoint file holds besides the optimizer state.
struct CheckpointContents {
  int64_t steps_done = 0;
  std::vector<std::pair<std::string, torch::Tensor>> params;  // "op/param" names, in file order
  /// read_checkpoint only: the optimizer state by "op/param#field" (optimizer_state_tensors).
  std::vector<std::pair<std::string, torch::Tensor>> optimizer_state;
  Json manifest;                 // null for a file written before manifests (nothing verified)
  int64_t verified_tensors = 0;  // tensors whose checksum was checked and matched
  bool has_manifest() const { return !manifest.is_null(); }
};

/// Writes `<path>.tmp` and fsyncs it; `identity` (checkpoint_manifest.h, may be null) goes into the
/// manifest. On any failure (a full disk: ENOSPC) the temporary file is removed and RuntimeFailure
/// says what happened (and, when `path` exists, that it is untouched).
/// Fault injection for tests: GP_FAULT="rank=R,kind=enospc,step=S" makes the save after step S of
/// rank R (identity "rank", 0 for --single) fail with ENOSPC after its first 4 KiB.
void write_checkpoint_tmp(const std::string& path, const StageModule& m, torch::optim::Optimizer& opt,
                          int64_t steps_done, const Json& identity);
/// Renames `<path>.tmp` into place and fsyncs the directory.
void commit_checkpoint(const std::string& path);

/// fsyncs the directory holding `path`, so a file renamed into it survives a machine crash;
/// RuntimeFailure naming the directory otherwise.
void sync_parent_dir(const std::string& path);
/// Removes `<path>.tmp` if present.
void abandon_checkpoint(const std::string& path) noexcept;
/// write_checkpoint_tmp + commit_checkpoint; `steps_done` is the number of optimizer steps done.
void save_checkpoint(const std::string& path, const StageModule& m, torch::optim::Optimizer& opt, int64_t steps_done,
                     const Json& identity = Json());

/// Reads a checkpoint without a model (`graphpipe checkpoint`), verifying every checksum
/// (parameters and optimizer state). UserError when the file is unreadable, not a graphpipe
/// checkpoint, or corrupt (naming the tensor).
CheckpointContents read_checkpoint(const std::string& path);

/// Loads into `m`'s parameters (in place) and `opt`; returns steps_done. UserError when the file
/// is missing, unreadable or corrupt, was written for another run than `identity` (when both are
/// known: names the first difference), or holds different parameters (names or shapes) than `m`.
int64_t load_checkpoint(const std::string& path, StageModule& m, torch::optim::Optimizer& opt,
                        const Json& identity = Json());

/// The identity stored in a checkpoint's manifest (no checksum verification); null when the file
/// has none. UserError when the file is unreadable.
Json read_checkpoint_identity(const std::string& path);

}  // namespace gp::runtime
