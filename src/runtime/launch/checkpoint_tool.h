// Inspecting and comparing checkpoints (`graphpipe checkpoint show|diff`), torch-free interface.
#pragma once
#include <cstdint>
#include <string>

namespace gp::runtime {

/// One paragraph per checkpoint file (`path` is a file or a --checkpoint-dir directory): steps done,
/// parameter count, integrity (how many tensors matched their checksums) and what the file was
/// written for, then each parameter's name, shape and L2 norm. UserError for unreadable or corrupt
/// files (naming the tensor whose checksum fails).
std::string describe_checkpoints(const std::string& path);

struct CheckpointDiff {
  int files = 0;
  int64_t tensors = 0, values = 0, differing_values = 0;
  double max_abs = 0;
  std::string report;  // one line per differing parameter or step count; empty when bit-identical
  std::string shared;  // shared_copies() of a, then of b (empty when no parameter is on two stages)
  bool identical() const { return report.empty(); }
};

/// Parameters that the files of a --checkpoint-dir hold on different stages (a shared parameter
/// whose users sit on several stages: one copy per holding stage): one line each, saying whether
/// the copies are bit-identical (they must be; the max |a-b| when not). Empty when there is none.
std::string shared_copies(const std::string& path);

/// Compares the parameters of two checkpoints bit for bit: two files, or two directories file by
/// file (same file names). UserError when they do not hold the same parameters (names, shapes).
CheckpointDiff diff_checkpoints(const std::string& a, const std::string& b);

/// `graphpipe checkpoint reshard`: the published generation of checkpoint directory `from` (any plan
/// of a model, or --single) rewritten for the plan in `plan_path` (same model, seed, data, mini-batch
/// and optimizer; other stages, devices, replicas, micro-batches) as a new checkpoint directory
/// `out` that `train --plan PLAN --resume --checkpoint-dir OUT` resumes. Every parameter, shared
/// parameter and optimizer state is mapped by name. UserError (exit 2) naming the field or the op
/// when the plan is of another model or run, or `out` already holds a checkpoint. Returns a summary.
std::string reshard_checkpoints(const std::string& from, const std::string& plan_path, const std::string& out);

/// `graphpipe checkpoint export`: every parameter ("op/param") and optimizer state tensor
/// ("op/param#field") of a checkpoint file or directory (its published generation), copies of one
/// name stored once, as one file that `torch.load` (format "pt": a pickled dict of tensors) or
/// `numpy.load` (format "npz": a zip of .npy files; bfloat16 as float32) reads. Every checksum is
/// verified first. Returns a summary line.
std::string export_checkpoint(const std::string& path, const std::string& format, const std::string& out);

}  // namespace gp::runtime
