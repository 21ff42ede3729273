// Internal (LibTorch): the per-step statistics of a pipelined run (loss, step time, data time), gathered
// from every rank and reported by rank 0 (the printed line, --log), kept off the critical path between
// steps. Used by execute_worker (pipeline.cpp); include only from runtime .cpp files.
#pragma once
#include <torch/torch.h>

#include <algorithm>
#include <array>
#include <deque>
#include <fstream>
#include <map>
#include <memory>
#include <vector>

#include "runtime/comm/comm.h"
#include "runtime/pipeline/pipeline.h"

namespace gp::runtime {

/// The tag of batch `batch`'s statistics message to rank 0: bit 28, which no transfer tag sets (their
/// sample index stays below kMaxMiniBatchSamples << 6 = 2^28), and the batch modulo 8 (at most four
/// batches of them are posted at once).
inline int stats_tag(int64_t batch) { return (1 << 28) | static_cast<int>(batch & 7); }

static_assert((kMaxMiniBatchSamples << 6) <= (int64_t{1} << 28) && kMaxTensorsPerEdge <= 64,
              "transfer tags would reach the statistics tags' bit");

/// Steps per statistics message (StepStats): 1, or where a plan for the cpu preset predicts steps
/// shorter than 50 ms, as many as make 50 ms (at most 8): step lines then come up to two batches late.
int stats_batch_steps(double predicted_step_s, bool cpu_preset_plan);

/// The median step time, leaving out the first step (one-time costs) when there are others.
double median_step_time(std::vector<double> t);

/// Per-step statistics of every rank (its loss share, start and end clocks, data seconds), reported
/// one step late: rank 0 prints each step and appends it to --log; every rank's WorkerResult gets every
/// step's figures by the end (flush()).
///
/// Over Gloo (tags) each other rank sends its rows to rank 0 point to point, one message per batch of
/// stats_batch_steps() steps, and rank 0 keeps the receives of the next two batches posted, so a batch
/// costs one network latency and nobody but rank 0 waits for it (rank 0 waits for batch b-1's rows
/// at the end of batch b, which have normally arrived already); at the end one all-reduce hands every
/// rank the figures. A message per step cost 2-5 ms of an 18-24 ms step of 2 data-parallel workers
/// on 2 cores (the step's pace without any: 17.5-19.9 ms; Gloo's send and posted receive took 0.3-1.9
/// ms each; issue 35). It used to be one all-reduce per step: a Gloo ring costs 4 (ranks - 1) network
/// latencies and runs on one collective thread, so on a slow link (20 ms) it outlasted the step and set
/// the pace of training (issue 37, docs/runtime.md). Backends that match messages by order (NCCL,
/// gloo-pairs) keep that per-step all-reduce, waited for one step later.
class StepStats {
 public:
  StepStats(const TrainOptions& opt, const PreparedRun& run, const WorkerIo& io, WorkerResult& res,
            detail::Communicator& world, int64_t first_step);
  /// This step's figures of this rank; reports the previous step's (rank 0 waits for its rows).
  void submit(int64_t step, double loss, double t_start, double t_end, double data_s);
  /// Reports the step still in flight and hands every rank every step's figures.
  void flush();
  /// The median time from one step's end (its last rank's) to the next one's, the first step left out:
  /// the pace of training. Below the median step time (iteration_time_s) when the ranks start their steps
  /// at different times: a stage that waits for its input starts its step (and its clock) early, and
  /// a step's time, from its first rank's start to its last rank's end, counts that wait; the simulator's
  /// iteration time is this pace. 0 with fewer than 3 steps. Rank 0 only.
  double median_period() const;

 private:
  using Row = std::array<double, 4>;  // loss, end, -start, data seconds
  struct Reduced {                    // the per-step all-reduce (backends without tags)
    int64_t step;
    std::vector<torch::Tensor> table;  // rank r's row at [r]
    detail::Pending pending;
  };
  bool gathers() const { return gather_; }
  int64_t batch_of(int64_t step) const { return (step - first_) / batch_; }
  int64_t batch_start(int64_t b) const { return first_ + b * batch_; }
  int64_t batch_end(int64_t b) const { return std::min<int64_t>(batch_start(b + 1), opt_.steps); }
  void post(int64_t batch);
  void report_gathered(int64_t batch);
  void report(int64_t step, const std::vector<Row>& rows);
  void hand_out();

  const TrainOptions& opt_;
  const PreparedRun& run_;
  const WorkerIo& io_;
  WorkerResult& res_;
  detail::Communicator& world_;
  bool gather_;
  int64_t first_;  // the first step of this run (--resume: after the saved ones)
  int batch_;      // steps per statistics message (gathered)
  std::ofstream log_;
  std::vector<double> ends_;                                   // each reported step's end (its last rank's clock)
  std::map<int64_t, Row> own_;                                 // rank 0: its rows of steps not yet reported
  std::map<int64_t, std::vector<detail::PostedRecv>> posted_;  // rank 0: the rows of ranks 1.. by batch
  std::vector<Row> batch_rows_;                                // ranks 1..: this batch's rows so far
  std::deque<detail::Pending> sends_;                          // ranks 1..: batches in flight to rank 0
  int64_t unreported_ = -1;                                    // the batch submitted and not yet reported
  int64_t submitted_ = 0;                                      // steps submitted by this rank
  std::unique_ptr<Reduced> reduced_;  // not std::optional: GCC 12 warned maybe-uninitialized on its move
};

}  // namespace gp::runtime
