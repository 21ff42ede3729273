// The worker status file (GP_STATUS_FILE): a worker writes its progress and, when it fails, why;
// the local launcher reads it to name the failing rank and action. The one definition of its layout.
#pragma once
#include <cstdint>
#include <string>

namespace gp::runtime::detail {

/// Layout: bytes [0, kStatusErrorOffset) hold the progress line "step<TAB>action", space-padded to
/// the full size and ending in '\n' (rewritten in place before each action); from
/// kStatusErrorOffset, once the worker fails, "peer<TAB>kind<TAB>message\n" (kind "rejected" when
/// this rank rejected a message the peer sent, "-" otherwise).
inline constexpr int64_t kStatusErrorOffset = 256;

/// The writing side (a worker). Inactive (every call a no-op) without a path or when it cannot open.
class StatusFile {
 public:
  explicit StatusFile(const char* path);
  ~StatusFile();
  StatusFile(const StatusFile&) = delete;
  StatusFile& operator=(const StatusFile&) = delete;
  bool active() const { return fd_ >= 0; }
  void progress(int64_t step, const std::string& action);
  void failure(int peer, bool rejected, const std::string& msg);

 private:
  int fd_ = -1;
};

/// The reading side (the launcher): what a status file says.
struct WorkerStatus {
  long step = -1;
  std::string action;     // "" when the worker had not reached its first action
  int peer = -1;          // the rank a peer failure blames
  bool rejected = false;  // this rank rejected a message from `peer` (wrong size or dtype)
  std::string error;
};
/// Reads `path`; a missing or empty file gives the defaults.
WorkerStatus read_status_file(const std::string& path);

}  // namespace gp::runtime::detail
