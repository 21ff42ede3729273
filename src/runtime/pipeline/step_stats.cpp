#include "runtime/pipeline/step_stats.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "runtime/checkpoint/checkpoint_set.h"
#include "runtime/data/data_feed.h"
#include "support/error.h"

namespace gp::runtime {

double median_step_time(std::vector<double> t) {
  if (t.size() > 1) t.erase(t.begin());
  if (t.empty()) return 0;
  std::sort(t.begin(), t.end());
  return t.size() % 2 ? t[t.size() / 2] : (t[t.size() / 2 - 1] + t[t.size() / 2]) / 2;
}

int stats_batch_steps(double predicted_step_s, bool cpu_preset_plan) {
  if (!cpu_preset_plan || !(predicted_step_s > 0)) return 1;
  return static_cast<int>(std::clamp(std::ceil(0.05 / predicted_step_s), 1.0, 8.0));
}

StepStats::StepStats(const TrainOptions& opt, const PreparedRun& run, const WorkerIo& io, WorkerResult& res,
                     detail::Communicator& world, int64_t first_step)
    : opt_(opt),
      run_(run),
      io_(io),
      res_(res),
      world_(world),
      gather_(world.kind() == CommKind::gloo && world.size() > 1),
      first_(first_step),
      // Plans for this machine's cpu preset predict its steps; others (another cluster, a profile
      // of other hardware) may predict steps far shorter than they run here.
      batch_(gather_ ? stats_batch_steps(run.plan.predicted.iteration_time_s, run.plan.cluster_spec == "cpu") : 1) {
  if (io.rank == 0 && !opt.log_path.empty()) {
    log_.open(opt.log_path, opt.resume ? std::ios::app : std::ios::trunc);
    GP_CHECK(log_.good(), "--log: cannot open {} for writing", opt.log_path);
  }
  if (gather_ && io.rank == 0) {
    post(0);
    post(1);
  }
}

void StepStats::post(int64_t batch) {
  if (batch_start(batch) >= opt_.steps || posted_.count(batch)) return;
  auto& recvs = posted_[batch];
  for (int r = 1; r < world_.size(); ++r)
    recvs.push_back(world_.post_recv({batch_, 4}, torch::kFloat64, r, stats_tag(batch)));
}

void StepStats::submit(int64_t step, double loss, double t_start, double t_end, double data_s) {
  const Row row{loss, t_end, -t_start, data_s};
  ++submitted_;
  if (!gathers()) {  // one all-reduce per step: every rank fills its row of a world x 4 table
    auto next = std::make_unique<Reduced>(Reduced{step, {torch::zeros({world_.size(), 4}, torch::kFloat64)}, {}});
    for (size_t i = 0; i < row.size(); ++i) next->table[0][world_.rank()][static_cast<int64_t>(i)] = row[i];
    next->pending = world_.all_reduce(next->table, detail::Reduce::sum);
    flush();
    reduced_ = std::move(next);
    return;
  }
  const int64_t b = batch_of(step);
  const bool batch_done = step + 1 >= batch_end(b);
  if (io_.rank != 0) {
    batch_rows_.push_back(row);
    if (!batch_done) return;
    auto t = torch::zeros({batch_, 4}, torch::kFloat64);  // a short last batch: zero rows after its own
    auto a = t.accessor<double, 2>();
    for (size_t i = 0; i < batch_rows_.size(); ++i)
      for (size_t c = 0; c < row.size(); ++c) a[static_cast<int64_t>(i)][static_cast<int64_t>(c)] = batch_rows_[i][c];
    batch_rows_.clear();
    sends_.push_back(world_.send(t, 0, stats_tag(b)));
    while (sends_.size() > 4) {  // long delivered: rank 0 posts each batch's receives two batches ahead
      sends_.front().wait();
      sends_.pop_front();
    }
    return;
  }
  own_[step] = row;
  if (!batch_done) return;
  post(b + 2);
  if (unreported_ >= 0) report_gathered(unreported_);
  unreported_ = b;
}

void StepStats::flush() {
  if (!gathers()) {
    if (!reduced_) return;
    reduced_->pending.wait();
    auto t = reduced_->table[0].accessor<double, 2>();
    std::vector<Row> rows(static_cast<size_t>(t.size(0)));
    for (int64_t r = 0; r < t.size(0); ++r) rows[static_cast<size_t>(r)] = {t[r][0], t[r][1], t[r][2], t[r][3]};
    const int64_t step = reduced_->step;
    reduced_.reset();
    report(step, rows);
    return;
  }
  if (io_.rank == 0 && unreported_ >= 0) report_gathered(unreported_);
  unreported_ = -1;
  for (; !sends_.empty(); sends_.pop_front()) sends_.front().wait();
  hand_out();
}

void StepStats::report_gathered(int64_t batch) {
  auto recvs = posted_.find(batch);
  GP_ASSERT(recvs != posted_.end(), "batch {}'s statistics were never posted", batch);
  std::vector<torch::Tensor> theirs;
  for (auto& r : recvs->second) theirs.push_back(r.wait());
  posted_.erase(recvs);
  for (int64_t step = batch_start(batch); step < batch_end(batch); ++step) {
    auto own = own_.find(step);
    GP_ASSERT(own != own_.end(), "step {}'s statistics were never submitted", step);
    std::vector<Row> rows(static_cast<size_t>(world_.size()));
    rows[0] = own->second;
    own_.erase(own);
    const int64_t i = step - batch_start(batch);
    for (size_t r = 1; r < rows.size(); ++r) {
      auto a = theirs[r - 1].accessor<double, 2>();
      rows[r] = {a[i][0], a[i][1], a[i][2], a[i][3]};
    }
    report(step, rows);
  }
}

/// The step's figures from every rank's row: the loss summed in rank order, the latest end, the
/// earliest start and the longest data time; rank 0 prints the line and appends it to --log.
void StepStats::report(int64_t step, const std::vector<Row>& rows) {
  double loss = 0, end = rows[0][1], neg_start = rows[0][2], data = rows[0][3];
  for (const Row& r : rows) {
    loss += r[0];
    end = std::max(end, r[1]);
    neg_start = std::max(neg_start, r[2]);
    data = std::max(data, r[3]);
  }
  double dt = end + neg_start;
  ends_.push_back(end);
  res_.step_losses.push_back(loss);
  res_.step_times_s.push_back(dt);
  res_.step_data_s.push_back(data);
  StepReport rep{step, loss, dt, run_.data.get(), run_.plan.mini_batch_size, res_.step_data_s.back(), nullptr};
  // Reported up to two batches late: this step's evaluation need not be the last one made.
  for (auto e = res_.evals.rbegin(); e != res_.evals.rend() && e->first >= step; ++e)
    if (e->first == step) rep.eval = &e->second;
  if (io_.rank != 0) return;
  if (io_.print && !opt_.json) {
    std::printf("%s\n", step_text(rep).c_str());
    if (rep.eval) std::printf("%s\n", eval_line(step, *rep.eval).c_str());
    std::fflush(stdout);
  }
  if (log_.is_open()) {
    log_ << step_json(rep).dump() << "\n";
    log_.flush();
    check_written(log_, "--log", opt_.log_path);
  }
}

/// Gathered statistics reached rank 0 alone: one all-reduce of its per-step figures (the other ranks
/// add zeros, so every value arrives unchanged) gives every rank the same step_losses, step_times_s
/// and step_data_s.
void StepStats::hand_out() {
  const int64_t n = submitted_;
  submitted_ = 0;
  if (n == 0) return;
  std::vector<torch::Tensor> table{torch::zeros({n, 3}, torch::kFloat64)};
  if (io_.rank == 0) {
    GP_ASSERT(res_.step_losses.size() >= static_cast<size_t>(n), "{} steps reported of {}", res_.step_losses.size(), n);
    const size_t first = res_.step_losses.size() - static_cast<size_t>(n);
    auto t = table[0].accessor<double, 2>();
    for (int64_t i = 0; i < n; ++i) {
      const size_t k = first + static_cast<size_t>(i);
      t[i][0] = res_.step_losses[k];
      t[i][1] = res_.step_times_s[k];
      t[i][2] = res_.step_data_s[k];
    }
  }
  world_.all_reduce(table, detail::Reduce::sum).wait();
  if (io_.rank == 0) return;
  auto t = table[0].accessor<double, 2>();
  for (int64_t i = 0; i < n; ++i) {
    res_.step_losses.push_back(t[i][0]);
    res_.step_times_s.push_back(t[i][1]);
    res_.step_data_s.push_back(t[i][2]);
  }
}

double StepStats::median_period() const {
  std::vector<double> d;
  for (size_t i = 1; i < ends_.size(); ++i) d.push_back(ends_[i] - ends_[i - 1]);
  return d.empty() ? 0.0 : median_step_time(d);
}

}  // namespace gp::runtime
