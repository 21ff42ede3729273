// Torch-free API to time one operator's forward and backward with LibTorch on this machine; the
// profiler (`graphpipe profile`) builds graphpipe.profile/1 from it.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "ir/model.h"

namespace gp::runtime {

struct OpTiming {
  double fwd_s = 0;  // median forward time of one call at the given batch
  double bwd_s = 0;  // median backward time (input and weight gradients) of one call
};

/// Runs op `op` of `g` alone at per-device batch `batch`: inputs are synthetic tensors of the
/// op's input shapes (inputs produced by other ops require grad, as inside a pipeline stage),
/// `warmup` untimed calls, then the median of `repeats` timed forward and backward calls.
/// `cpu_clock`: time with the calling thread's CPU clock instead of the wall clock (with one intra-op
/// thread LibTorch runs the op, forward and backward, on the calling thread), so that time the thread
/// spends descheduled by other jobs on a shared machine does not count.
/// `device` "cuda" (--device): parameters and inputs on the GPU (runtime's select_device, local rank
/// 0), each timed span between two device synchronizations, so it holds the kernels' time (and the
/// host's launch time where that is longer); cpu_clock needs "cpu".
OpTiming time_op(const ir::Graph& g, OpId op, int64_t batch, int warmup, int repeats, bool cpu_clock = false,
                 const std::string& device = "cpu");

/// Same at several batch sizes, building the op's parameters once (large embedding tables).
std::vector<OpTiming> time_op(const ir::Graph& g, OpId op, const std::vector<int64_t>& batches, int warmup, int repeats,
                              bool cpu_clock = false, const std::string& device = "cpu");

/// The whole model (every op, as `train --single` runs it) at each batch: forward to the loss,
/// then backward from it, `warmup` untimed and the median of `repeats` timed calls. Against the sum
/// of its ops timed one by one (time_op) it shows what ops cost in sequence and not alone (cold
/// weights, activations that leave the caches, the autograd engine's own work).
std::vector<OpTiming> time_model(const ir::Graph& g, const std::vector<int64_t>& batches, int warmup, int repeats,
                                 bool cpu_clock = false, const std::string& device = "cpu");

struct OptimizerTiming {
  int64_t params = 0;  // parameters stepped (every parameter of the model)
  double step_s = 0;   // median time of one optimizer step over all of them
};

/// One step of each of the runtime's optimizers `names` ("sgd", "adam": make_optimizer) over every
/// parameter of `g` with random gradients, on one copy of the model, with the gradients' finiteness
/// check before it as a training step runs it: `warmup` untimed, the median of `repeats`; one entry
/// per name, in order.
std::vector<OptimizerTiming> time_optimizers(const ir::Graph& g, const std::vector<std::string>& names, int warmup,
                                             int repeats, bool cpu_clock = false, const std::string& device = "cpu");

/// "cuda: <GPU model> (device 0, LibTorch V)" for --device cuda (UserError where CUDA is not
/// available); "" for "cpu".
std::string accelerator_description(const std::string& device);

/// Sets LibTorch's intra-op thread count (>= 1) for this process, bounds OpenBLAS's pool to it, and
/// calls keep_freed_heap(): every training, profiling and calibrating process starts here.
void set_torch_threads(int threads);
/// Makes glibc keep freed tensor buffers (up to 32 MiB each) in the process instead of unmapping
/// them, so a training step does not fault its activations in again (idempotent).
void keep_freed_heap();
int torch_threads();
/// The LibTorch version this binary was built with ("2.1.2").
std::string torch_version();

}  // namespace gp::runtime
