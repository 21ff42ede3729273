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
  bool identical() const { return report.empty(); }
};

/// Compares the parameters of two checkpoints bit for bit: two files, or two directories file by
/// file (same file names). UserError when they do not hold the same parameters (names, shapes).
CheckpointDiff diff_checkpoints(const std::string& a, const std::string& b);

}  // namespace gp::runtime
