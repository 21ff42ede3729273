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

}  // namespace gp::runtime
