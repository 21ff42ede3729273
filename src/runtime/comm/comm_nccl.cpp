// c10d's NCCL process group as the backend of the pairwise communicator (comm_pairwise.cpp).
// Compiled only against a CUDA LibTorch (GP_HAVE_NCCL); runs only where each rank owns a GPU.
#ifndef USE_C10D_NCCL
#define USE_C10D_NCCL
#endif
#include <fmt/format.h>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>

#include "runtime/comm/comm.h"

namespace gp::runtime::detail {

c10::intrusive_ptr<c10d::Backend> make_nccl_backend(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                                    const CommOptions& o) {
  limit_flight_recorder();
  auto opts = c10d::ProcessGroupNCCL::Options::create();
  opts->timeout = o.timeout;  // the watchdog aborts a collective or transfer that outlives it
  c10::intrusive_ptr<c10d::Backend> pg;
  guarded(fmt::format("NCCL group of rank {} of {}", rank, size), -1,
          [&] { pg = c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, size, opts); });
  return pg;
}

}  // namespace gp::runtime::detail

namespace gp::runtime::detail {
std::string nccl_version() { return c10d::getNcclVersion(); }
}  // namespace gp::runtime::detail
