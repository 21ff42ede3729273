// Making a micro-batch's synthetic inputs (Google Benchmark): the runtime's way (windows of a pool
// drawn once per seed, runtime/exec/synthetic.h) against drawing each sample with its own generator
// (the runtime's way until 2026-12-03), on the overhead-heavy mmt's feature inputs at 32 samples: 4
// inputs of 16 x 64 floats (its label, computed from one of them, makes that input a fifth time, both
// ways; not timed here). Where every core has a worker, the inputs are
// made inside the stage's forward, on the step's critical path, and no prediction counts them.
#include <ATen/CPUGeneratorImpl.h>
#include <benchmark/benchmark.h>
#include <torch/torch.h>

#include "models/zoo.h"
#include "runtime/exec/stable_hash.h"
#include "runtime/exec/synthetic.h"

namespace {

constexpr const char* kModel = "mmt:branches=4,layers=1,seq=16,hidden=64,heads=4,ffn=128";

void pool_windows(benchmark::State& state) {
  torch::set_num_threads(1);
  gp::ir::Graph g = gp::ir::Graph::build(gp::models::build_builtin(kModel));
  const auto& inputs = g.model().inputs;
  int64_t step = 0;
  for (auto _ : state) {
    for (size_t i = 0; i < inputs.size(); ++i)
      if (inputs[i].dtype == gp::ir::DType::f32)
        benchmark::DoNotOptimize(gp::runtime::synthetic_input(g, static_cast<int>(i), 0, 32, 1, step));
    ++step;
  }
}

/// The earlier way: one generator per sample and input, and a normal draw into the sample's row.
void generator_per_sample(benchmark::State& state) {
  torch::set_num_threads(1);
  gp::ir::Graph g = gp::ir::Graph::build(gp::models::build_builtin(kModel));
  int64_t step = 0;
  for (auto _ : state) {
    for (const gp::ir::Input& in : g.model().inputs) {
      if (in.dtype != gp::ir::DType::f32) continue;
      torch::Tensor out = torch::empty({32, in.shape.at(1), in.shape.at(2)});
      const uint64_t base = gp::runtime::stable_hash({"input", in.name}, 1);
      for (int64_t s = 0; s < 32; ++s) {
        auto gen = at::make_generator<at::CPUGeneratorImpl>(gp::runtime::stable_hash_ints(base, {s, step}));
        out.select(0, s).normal_(0, 1, gen);
      }
      benchmark::DoNotOptimize(out);
    }
    ++step;
  }
}

BENCHMARK(pool_windows)->Unit(benchmark::kMicrosecond);
BENCHMARK(generator_per_sample)->Unit(benchmark::kMicrosecond);

}  // namespace

BENCHMARK_MAIN();
