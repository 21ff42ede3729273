// Torch-free: an all-reduce through shared memory between the ranks of one group that run on one
// host. Gloo's all-reduce goes through loopback TCP: on a 2-core VM 2.4 MB took 3.5 ms (median; its
// fastest 0.8 ms) where copying it through memory takes a tenth of that. The Gloo communicator uses
// this for a group whose ranks all mapped the same segment (comm_gloo.cpp; `train --local-all-reduce`).
//
// The segment: a header (per rank: three counters and its pid), then one input slot per rank and one
// output slot, each `slot_bytes`. An all-reduce runs in chunks of at most slot_bytes; per chunk every
// rank copies its chunk into its slot (counter `arrived`), reduces its 1/n share of the elements over
// all slots in rank order into the output slot (`reduced`), then copies the whole output back
// (`done`). The sum's order is the same on every rank, so all ranks end with the same bits. Waits spin
// briefly, then sleep on a futex; each is bounded by the timeout, and a peer whose process exited
// is noticed within 50 ms (ShmError names it).
#pragma once
#include <chrono>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>

namespace gp::runtime::detail {

enum class ShmDtype { f32, f64, i32, i64 };
enum class ShmOp { sum, max };

/// A failed shared-memory all-reduce: a peer timed out or exited. `peer`: the group rank waited on.
class ShmError : public std::runtime_error {
 public:
  ShmError(const std::string& msg, int peer, bool timed_out)
      : std::runtime_error(msg), peer_(peer), timed_out_(timed_out) {}
  int peer() const { return peer_; }
  bool timed_out() const { return timed_out_; }

 private:
  int peer_;
  bool timed_out_;
};

class ShmReducer {
 public:
  /// Slot size for create(): 1 MiB per rank and one more for the output.
  static constexpr int64_t kDefaultSlotBytes = int64_t{1} << 20;

  /// Rank 0: creates and maps a new segment for `size` ranks, stamped with `nonce`; its name is
  /// name(). nullptr and `why` when the system refuses (no /dev/shm, no space).
  static std::unique_ptr<ShmReducer> create(int size, uint64_t nonce, int64_t slot_bytes, std::string* why);
  /// Ranks 1..size-1: maps the segment rank 0 created; nullptr and `why` when it cannot be opened or
  /// is not that segment (another host's name, another nonce or size).
  static std::unique_ptr<ShmReducer> open(const std::string& name, int rank, int size, uint64_t nonce,
                                          std::string* why);
  ~ShmReducer();
  ShmReducer(const ShmReducer&) = delete;
  ShmReducer& operator=(const ShmReducer&) = delete;

  const std::string& name() const { return name_; }
  /// Removes the segment's name (rank 0, once every rank has mapped it): nothing is left in /dev/shm
  /// however the processes end.
  void unlink();

  /// Reduces `count` elements at `data` in place over every rank of the group. Collective: every rank
  /// calls it with the same count, dtype and op, in the same order. ShmError on a timeout or a
  /// peer that exited; the segment is unusable after that.
  void all_reduce(void* data, int64_t count, ShmDtype dtype, ShmOp op, std::chrono::milliseconds timeout);

  static int64_t dtype_bytes(ShmDtype d);

 private:
  ShmReducer(std::string name, void* base, size_t bytes, int rank, int size, int64_t slot_bytes);
  char* slot(int r) const;  // r == size_: the output slot
  void wait_all(int which, uint32_t target, std::chrono::steady_clock::time_point deadline,
                std::chrono::milliseconds timeout) const;

  std::string name_;
  void* base_;
  size_t bytes_;
  int rank_, size_;
  int64_t slot_bytes_;
  uint32_t seq_ = 0;
  bool broken_ = false;
};

}  // namespace gp::runtime::detail
