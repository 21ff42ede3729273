#include "runtime/comm/shm_reduce.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <csignal>
#include <cstring>
#include <fstream>
#include <sstream>

#include <fmt/format.h>

namespace gp::runtime::detail {

namespace {

constexpr uint64_t kMagic = 0x67702d73686d3031ULL;  // "gp-shm01"
constexpr int kArrived = 0, kReduced = 1, kCounters = 2;
constexpr auto kSleepSlice = std::chrono::milliseconds(50);
constexpr auto kSpin = std::chrono::microseconds(20);

// One counter per cache line: the rank that owns it stores, the others load and sleep on it.
struct alignas(64) Counter {
  uint32_t value;
  uint32_t sleepers;  // peers asleep on value (futex): the owner wakes them only when there are any
};

struct alignas(64) RankState {
  Counter ctr[kCounters];
  int64_t pid;
  uint64_t start_ticks;  // /proc/PID/stat field 22: tells a live peer from a reused pid
};

// The process's start time in clock ticks since boot, 0 when /proc cannot tell.
uint64_t start_ticks_of(int64_t pid) {
  std::ifstream f(fmt::format("/proc/{}/stat", pid));
  std::string s((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  const auto close = s.rfind(')');  // the command name may hold spaces and parentheses
  if (close == std::string::npos) return 0;
  std::istringstream rest(s.substr(close + 2));
  std::string field;
  for (int i = 3; i <= 22 && (rest >> field); ++i)
    if (i == 22) return std::strtoull(field.c_str(), nullptr, 10);
  return 0;
}

bool process_alive(int64_t pid, uint64_t start_ticks) {
  if (::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) return false;
  return start_ticks == 0 || start_ticks_of(pid) == start_ticks;
}

long futex(uint32_t* addr, int op, uint32_t val, const timespec* ts) {
  return ::syscall(SYS_futex, addr, op, val, ts, nullptr, 0);
}

bool reached(uint32_t v, uint32_t target) { return static_cast<int32_t>(v - target) >= 0; }

size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

template <class T>
void reduce_into(T* out, const char* const* slots, int n, int64_t lo, int64_t hi, ShmOp op) {
  const T* s0 = reinterpret_cast<const T*>(slots[0]);
  std::copy(s0 + lo, s0 + hi, out + lo);
  for (int p = 1; p < n; ++p) {
    const T* s = reinterpret_cast<const T*>(slots[p]);
    if (op == ShmOp::sum)
      for (int64_t i = lo; i < hi; ++i) out[i] += s[i];
    else
      for (int64_t i = lo; i < hi; ++i) out[i] = std::max(out[i], s[i]);
  }
}

struct Header {
  uint64_t magic, nonce;
  int64_t size, slot_bytes;
  // RankState[size] follows, at states_offset()
};

size_t states_offset() { return round_up(sizeof(Header), 64); }
size_t slots_offset(int size) {
  return round_up(states_offset() + sizeof(RankState) * static_cast<size_t>(size), 4096);
}
size_t segment_bytes(int size, int64_t slot_bytes) {
  return slots_offset(size) + static_cast<size_t>(size + 1) * static_cast<size_t>(slot_bytes);
}
RankState* states(void* base) { return reinterpret_cast<RankState*>(static_cast<char*>(base) + states_offset()); }

}  // namespace

char* ShmReducer::slot(int r) const {
  return static_cast<char*>(base_) + slots_offset(size_) + static_cast<size_t>(r) * static_cast<size_t>(slot_bytes_);
}

ShmReducer::ShmReducer(std::string name, void* base, size_t bytes, int rank, int size, int64_t slot_bytes)
    : name_(std::move(name)), base_(base), bytes_(bytes), rank_(rank), size_(size), slot_bytes_(slot_bytes) {
  RankState& me = states(base_)[rank_];
  me.pid = ::getpid();
  me.start_ticks = start_ticks_of(me.pid);
}

ShmReducer::~ShmReducer() { ::munmap(base_, bytes_); }

int64_t ShmReducer::dtype_bytes(ShmDtype d) { return d == ShmDtype::f32 || d == ShmDtype::i32 ? 4 : 8; }

std::unique_ptr<ShmReducer> ShmReducer::create(int size, uint64_t nonce, int64_t slot_bytes, std::string* why) {
  const std::string name = fmt::format("/gp-ar-{}-{:016x}", ::getpid(), nonce);
  const size_t bytes = segment_bytes(size, slot_bytes);
  const int fd = ::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0) {
    *why = fmt::format("shm_open {}: {}", name, std::strerror(errno));
    return nullptr;
  }
  // Reserved now, so a full /dev/shm is this error, not a SIGBUS at the first write.
  const int err = ::posix_fallocate(fd, 0, static_cast<off_t>(bytes));
  void* base = err == 0 ? ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0) : MAP_FAILED;
  ::close(fd);
  if (base == MAP_FAILED) {
    *why = fmt::format("{} bytes of shared memory ({}): {}", bytes, name, std::strerror(err != 0 ? err : errno));
    ::shm_unlink(name.c_str());
    return nullptr;
  }
  auto* h = static_cast<Header*>(base);
  h->nonce = nonce;
  h->size = size;
  h->slot_bytes = slot_bytes;
  __atomic_store_n(&h->magic, kMagic, __ATOMIC_RELEASE);
  return std::unique_ptr<ShmReducer>(new ShmReducer(name, base, bytes, 0, size, slot_bytes));
}

std::unique_ptr<ShmReducer> ShmReducer::open(const std::string& name, int rank, int size, uint64_t nonce,
                                             std::string* why) {
  const int fd = ::shm_open(name.c_str(), O_RDWR, 0600);
  if (fd < 0) {
    *why = fmt::format("shm_open {}: {} (another host?)", name, std::strerror(errno));
    return nullptr;
  }
  struct stat st {};
  void* base = MAP_FAILED;
  if (::fstat(fd, &st) == 0 && static_cast<size_t>(st.st_size) >= slots_offset(size))
    base = ::mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  if (base == MAP_FAILED) {
    *why = fmt::format("{}: too small or not mappable", name);
    return nullptr;
  }
  const auto* h = static_cast<const Header*>(base);
  const auto bytes = static_cast<size_t>(st.st_size);
  if (__atomic_load_n(&h->magic, __ATOMIC_ACQUIRE) != kMagic || h->nonce != nonce || h->size != size ||
      h->slot_bytes <= 0 || segment_bytes(size, h->slot_bytes) != bytes) {
    ::munmap(base, bytes);
    *why = fmt::format("{}: not this group's segment", name);
    return nullptr;
  }
  return std::unique_ptr<ShmReducer>(new ShmReducer(name, base, bytes, rank, size, h->slot_bytes));
}

void ShmReducer::unlink() { ::shm_unlink(name_.c_str()); }

void ShmReducer::wait_all(int which, uint32_t target, std::chrono::steady_clock::time_point deadline,
                          std::chrono::milliseconds timeout) const {
  RankState* st = states(base_);
  for (int p = 0; p < size_; ++p) {
    if (p == rank_) continue;
    Counter& c = st[p].ctr[which];
    const auto spin_end = std::chrono::steady_clock::now() + kSpin;
    uint32_t v = __atomic_load_n(&c.value, __ATOMIC_ACQUIRE);
    while (!reached(v, target) && std::chrono::steady_clock::now() < spin_end) {
      for (int i = 0; i < 32 && !reached(v, target); ++i) {
        __builtin_ia32_pause();
        v = __atomic_load_n(&c.value, __ATOMIC_ACQUIRE);
      }
    }
    while (!reached(v, target)) {
      const auto now = std::chrono::steady_clock::now();
      if (now >= deadline)
        throw ShmError(fmt::format("shared-memory all-reduce over {} ranks: timed out after {} ms waiting for rank {}",
                                   size_, timeout.count(), p),
                       p, true);
      if (!process_alive(st[p].pid, st[p].start_ticks))
        throw ShmError(
            fmt::format("shared-memory all-reduce over {} ranks: rank {} (pid {}) exited", size_, p, st[p].pid), p,
            false);
      const auto slice = std::min<std::chrono::steady_clock::duration>(kSleepSlice, deadline - now);
      const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(slice).count();
      const timespec ts{static_cast<time_t>(ns / 1000000000), static_cast<long>(ns % 1000000000)};
      __atomic_fetch_add(&c.sleepers, 1, __ATOMIC_SEQ_CST);
      v = __atomic_load_n(&c.value, __ATOMIC_SEQ_CST);
      if (!reached(v, target)) futex(&c.value, FUTEX_WAIT, v, &ts);
      __atomic_fetch_sub(&c.sleepers, 1, __ATOMIC_SEQ_CST);
      v = __atomic_load_n(&c.value, __ATOMIC_ACQUIRE);
    }
  }
}

void ShmReducer::all_reduce(void* data, int64_t count, ShmDtype dtype, ShmOp op, std::chrono::milliseconds timeout) {
  if (broken_) throw ShmError("shared-memory all-reduce: this group failed before", -1, false);
  const int64_t esz = dtype_bytes(dtype);
  const int64_t per_chunk = slot_bytes_ / esz;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  RankState& me = states(base_)[rank_];
  std::vector<const char*> slots(static_cast<size_t>(size_));
  for (int p = 0; p < size_; ++p) slots[static_cast<size_t>(p)] = slot(p);
  auto publish = [&](int which, uint32_t s) {
    Counter& c = me.ctr[which];
    __atomic_store_n(&c.value, s, __ATOMIC_SEQ_CST);
    if (__atomic_load_n(&c.sleepers, __ATOMIC_SEQ_CST) != 0) futex(&c.value, FUTEX_WAKE, INT_MAX, nullptr);
  };
  try {
    for (int64_t off = 0; off < count; off += per_chunk) {
      const int64_t n = std::min(per_chunk, count - off);
      const uint32_t s = ++seq_;
      char* mine = static_cast<char*>(data) + off * esz;
      std::memcpy(slot(rank_), mine, static_cast<size_t>(n * esz));
      publish(kArrived, s);
      wait_all(kArrived, s, deadline, timeout);
      const int64_t lo = n * rank_ / size_, hi = n * (rank_ + 1) / size_;
      char* out = slot(size_);
      switch (dtype) {
        case ShmDtype::f32: reduce_into(reinterpret_cast<float*>(out), slots.data(), size_, lo, hi, op); break;
        case ShmDtype::f64: reduce_into(reinterpret_cast<double*>(out), slots.data(), size_, lo, hi, op); break;
        case ShmDtype::i32: reduce_into(reinterpret_cast<int32_t*>(out), slots.data(), size_, lo, hi, op); break;
        case ShmDtype::i64: reduce_into(reinterpret_cast<int64_t*>(out), slots.data(), size_, lo, hi, op); break;
      }
      publish(kReduced, s);
      wait_all(kReduced, s, deadline, timeout);
      std::memcpy(mine, out, static_cast<size_t>(n * esz));
    }
  } catch (const ShmError&) {
    broken_ = true;
    throw;
  }
}

}  // namespace gp::runtime::detail
