// Cluster presets (datasheet figures), graphpipe.cluster/1 files, and taking the first N devices.
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <thread>

#include "cost/calibration.h"
#include "cost/cost_model.h"

namespace gp::cost {
namespace {

constexpr double GB = 1e9;
constexpr double GiB = 1024.0 * 1024.0 * 1024.0;
constexpr double TFLOPS = 1e12;
constexpr const char* kFormat = "graphpipe.cluster/1";

// All GPU presets assume fp32 training (the IR's default dtype) with the fp16 tensor-core peak
// recorded for `mixed_precision: true`. A fixed ~5 us per op covers the CUDA launch and the
// framework's dispatch. Link latencies are NCCL-level estimates, not datasheet figures.
constexpr double kGpuKernelOverhead = 5e-6;

/// Memory a GPU's tensors cannot use (DeviceSpec::memory_reserve_bytes): the CUDA context with the
/// framework's kernels and the cuBLAS/cuDNN workspaces, about 1 GiB with PyTorch (the context alone
/// is 0.3-0.9 GB depending on the CUDA version and lazy module loading), plus 5% of the device for
/// the caching allocator's fragmentation. An estimate, not measured here (docs/cost-model.md).
double gpu_reserve(double memory_bytes) { return 1 * GiB + 0.05 * memory_bytes; }

/// Efficiency curves of the GPU presets: the DeepBench V100 fit (efficiency.h). The A100 and H100
/// presets keep the same curves (N0 in rows): no public per-kernel data of the same kind was fitted
/// for them. A larger GPU likely needs more rows to fill, so their small-batch times are optimistic.
EfficiencyTable gpu_efficiency(const char* device) {
  EfficiencyTable t = v100_efficiency();
  if (std::string(device) != "V100")
    t.source = fmt::format("{} (the V100 curves, N0 in rows; not fitted to the {})", t.source, device);
  return t;
}

// A GPU cluster preset from its datasheet figures. Every GPU preset shares the per-kernel overhead,
// the memory reserve rule and the link latencies (5 us NVLink, 10 us InfiniBand).
struct GpuPreset {
  const char* name;
  int devices_per_node;
  const char* device;
  double memory_bytes, fp32_flops, tensor_flops, hbm_Bps;
  const char* curves;  // gpu_efficiency's key
  double nvlink_Bps;   // per direction between two GPUs of a node
  double nic_Bps;      // one GPU's flow between nodes
  double node_Bps;     // a node's injection bandwidth
};

Cluster gpu_cluster(const GpuPreset& g) {
  Cluster c;
  c.name = g.name;
  c.devices_per_node = g.devices_per_node;
  c.device = {g.device,           g.memory_bytes,          g.fp32_flops, g.tensor_flops, g.hbm_Bps,
              kGpuKernelOverhead, gpu_efficiency(g.curves)};
  c.device.memory_reserve_bytes = gpu_reserve(g.memory_bytes);
  c.intra = {g.nvlink_Bps, 5e-6};
  c.inter = {g.nic_Bps, 10e-6};
  c.node_injection_Bps = g.node_Bps;
  return c;
}

/// IBM AC922 "Summit" node, restricted to 4 V100s per node as CONTRACT.md specifies (the real
/// node has 6). V100 SXM2 datasheet: 15.7 TFLOP/s fp32, 125 TFLOP/s tensor, 900 GB/s HBM2, 16 GB.
/// NVLink 2.0 on Summit: 2 bricks x 25 GB/s = 50 GB/s per direction between GPU pairs.
/// Network: dual-rail EDR InfiniBand, 2 x 100 Gb/s = 25 GB/s injection per node; one GPU's flow
/// uses one rail (12.5 GB/s).
Cluster summit() {
  return gpu_cluster(
      {"summit", 4, "V100-16GB", 16 * GiB, 15.7 * TFLOPS, 125 * TFLOPS, 900 * GB, "V100", 50 * GB, 12.5 * GB, 25 * GB});
}

/// NVIDIA DGX A100 (80 GB): A100 SXM4 datasheet 19.5 TFLOP/s fp32, 312 TFLOP/s fp16 tensor,
/// 2039 GB/s HBM2e. NVLink 3 through NVSwitch: 600 GB/s bidirectional = 300 GB/s per direction.
/// 8 x 200 Gb/s HDR InfiniBand (one NIC per GPU): 25 GB/s per GPU, 200 GB/s per node.
Cluster dgx_a100() {
  return gpu_cluster({"dgx-a100", 8, "A100-80GB", 80 * GiB, 19.5 * TFLOPS, 312 * TFLOPS, 2039 * GB, "A100", 300 * GB,
                      25 * GB, 200 * GB});
}

/// NVIDIA DGX H100: H100 SXM5 datasheet 67 TFLOP/s fp32, 989 TFLOP/s fp16 tensor (dense),
/// 3350 GB/s HBM3. NVLink 4: 900 GB/s bidirectional = 450 GB/s per direction.
/// 8 x 400 Gb/s NDR InfiniBand (one NIC per GPU): 50 GB/s per GPU, 400 GB/s per node.
Cluster dgx_h100() {
  return gpu_cluster({"dgx-h100", 8, "H100-80GB", 80 * GiB, 67 * TFLOPS, 989 * TFLOPS, 3350 * GB, "H100", 450 * GB,
                      50 * GB, 400 * GB});
}

/// NVIDIA DGX H200: H200 SXM datasheet 141 GB HBM3e (decimal GB) at 4.8 TB/s, 67 TFLOP/s fp32,
/// 989 TFLOP/s fp16/bf16 tensor (dense; tf32 494). NVLink 4 as on the H100: 900 GB/s bidirectional =
/// 450 GB/s per direction. 8 x 400 Gb/s NDR InfiniBand (one NIC per GPU): 50 GB/s per GPU, 400 GB/s
/// per node. Same V100 curves as the other GPU presets (not fitted to the H200).
Cluster h200() {
  return gpu_cluster(
      {"h200", 8, "H200-141GB", 141 * GB, 67 * TFLOPS, 989 * TFLOPS, 4800 * GB, "H200", 450 * GB, 50 * GB, 400 * GB});
}

/// This machine: one node whose "devices" are worker processes, one LibTorch thread each. Without a
/// calibration (active_calibration(): `graphpipe calibrate`, cached per machine) these are fixed,
/// conservative figures for one thread; with one, the measured rates of this machine (GEMM rate and
/// its N0, bandwidth of memory-bound ops, per-op overhead, loopback link). With more workers than
/// cores the workers share them: each gets cores/workers of a core's FLOP/s and bandwidth, and its
/// per-op overhead (CPU time too) stretches by workers/cores. docs/cost-model.md ("The cpu preset").
constexpr double kCpuCoreFlops = 50e9;        // one core, one thread, fp32 GEMM (AVX2/AVX-512 FMA)
constexpr double kCpuCoreMemBw = 10 * GB;     // a core's share of DRAM bandwidth
constexpr double kCpuKernelOverhead = 10e-6;  // LibTorch dispatch + autograd bookkeeping per op
constexpr double kCpuLinkBw = 2 * GB;         // loopback TCP through Gloo
constexpr double kCpuLinkLatency = 50e-6;
/// A worker process's own resident memory (LibTorch, Gloo, the binary): 178-188 MB measured for workers
/// of small models whose tensors peak below 7 MB (`train` prints the resident peak); with the allocator's
/// free lists we reserve 200 MB per device.
constexpr double kCpuWorkerBytes = 200e6;

}  // namespace

Cluster cpu_preset(int devices, const CpuCalibration* k) {
  int cores = std::max(1u, std::thread::hardware_concurrency());
  int n = std::max(devices, cores);
  double share = std::min(1.0, static_cast<double>(cores) / n);
  double ram = static_cast<double>(::sysconf(_SC_PHYS_PAGES)) * ::sysconf(_SC_PAGE_SIZE);
  Cluster c;
  c.name = "cpu";
  c.devices_per_node = n;
  if (!k) {
    c.device = {fmt::format("cpu core ({} cores)", cores),
                ram / n,
                kCpuCoreFlops * share,
                kCpuCoreFlops * share,
                kCpuCoreMemBw * share,
                kCpuKernelOverhead};
    c.intra = {kCpuLinkBw, kCpuLinkLatency};
  } else {
    // 2+ workers wait for each other's cores: they compute at the measured lockstep pace.
    const int workers = devices > 0 ? devices : cores;
    const double pace = share / (workers >= 2 ? std::max(1.0, k->lockstep) : 1.0);
    c.device = {fmt::format("cpu core ({} cores; {}, calibrated {})", cores, k->cpu_model, k->measured_at),
                ram / n,
                k->gemm_flops * pace,
                k->gemm_flops * pace,
                k->mem_bandwidth_Bps * pace,
                k->kernel_overhead_s / pace,
                calibrated_efficiency(*k)};
    c.device.sgd_step_s_per_param = k->sgd_step_s_per_param / pace;  // CPU time, as kernel_overhead_s
    c.device.adam_step_s_per_param = k->adam_step_s_per_param / pace;
    c.device.sgd_step_s_per_tensor = k->sgd_step_s_per_tensor / pace;
    c.device.adam_step_s_per_tensor = k->adam_step_s_per_tensor / pace;
    c.device.sequence_overhead_s = k->sequence_overhead_s / pace;
    c.device.sequence_s_per_weight_byte = k->sequence_s_per_weight_byte / pace;
    c.device.sequence_s_per_activation_byte = k->sequence_s_per_activation_byte / pace;
    c.device.pass_fwd_s = k->pass_fwd_s / pace;
    c.device.pass_bwd_s = k->pass_bwd_s / pace;
    for (const auto& [kind, s] : k->kind_overhead_s) c.device.kind_overhead_s[kind] = s / pace;
    for (auto [from, to] :
         {std::pair{&k->kind_pace, &c.device.kind_pace}, std::pair{&k->kind_in_sequence, &c.device.kind_in_sequence}})
      for (const auto& [kind, points] : *from)
        for (const PacePoint& p : points) (*to)[kind].push_back({p.elems, p.fwd_s / pace, p.bwd_s / pace});
    for (auto* table : {&c.device.efficiency.f32, &c.device.efficiency.f16})
      for (EfficiencyCurve& curve : *table) curve.overhead_s /= pace;  // CPU time, as kernel_overhead_s
    // With a worker on every core, a message waits for a core as well: the link measured with every
    // core busy, where it was (issue 35).
    const bool busy = workers >= cores && k->busy_link_latency_s > 0;
    const LinkSpec idle{k->link_bandwidth_Bps * share, k->link_latency_s / share};
    c.intra = busy ? LinkSpec{idle.bandwidth_Bps, k->busy_link_latency_s / share} : idle;
    if (busy) c.intra.cpu = k->busy_message_cpu.scaled(1 / share);  // on the workers' own cores
    // The all-reduce at the end of a data-parallel step, measured right after both workers computed
    // (its latency per ring step), at the bandwidth the all-reduce itself reached between idle
    // processes (it reduces and copies as well as sends: 2.0 GB/s where a message reached 4.5); the
    // idle link where not measured.
    const double reduce_bw = k->reduce_bandwidth_Bps() * share;
    if (busy)
      c.collective_intra = k->busy_allreduce_latency_s > 0 ? LinkSpec{reduce_bw, k->busy_allreduce_latency_s / share}
                                                           : LinkSpec{reduce_bw, idle.latency_s};
  }
  c.device.memory_reserve_bytes = kCpuWorkerBytes;
  c.inter = c.intra;          // one node: never used
  c.gloo_collectives = true;  // the runtime trains on CPUs with c10d Gloo
  return c;
}

namespace {

bool finite_positive(double v) { return std::isfinite(v) && v > 0; }

double positive(const JsonAt& j) {
  double v = j.num();
  if (!finite_positive(v)) j.fail(fmt::format("must be a positive number, found {}", j.json().dump()));
  return v;
}

double non_negative(const JsonAt& j) {
  double v = j.num();
  if (!std::isfinite(v) || v < 0) j.fail(fmt::format("must be a non-negative number, found {}", j.json().dump()));
  return v;
}

int positive_int(const JsonAt& j) {
  int64_t v = j.i64();
  if (v < 1 || v > 1'000'000) j.fail(fmt::format("must be an integer in [1, 1000000], found {}", v));
  return static_cast<int>(v);
}

LinkSpec link_from_json(const JsonAt& j) {
  j.expect_object();
  LinkSpec l{positive(j.at("bandwidth_Bps")), non_negative(j.at("latency_s"))};
  if (j.has("cpu")) l.cpu = message_cpu_from_json(j.at("cpu"));  // optional: 0 where absent
  return l;
}

Json link_to_json(const LinkSpec& l) {
  Json j = {{"bandwidth_Bps", l.bandwidth_Bps}, {"latency_s", l.latency_s}};
  if (l.cpu.any()) j["cpu"] = message_cpu_to_json(l.cpu);
  return j;
}

}  // namespace

std::vector<std::string> cluster_preset_names() { return {"summit", "dgx-a100", "dgx-h100", "h200", "cpu"}; }

std::string local_cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("model name", 0) == 0) {
      auto colon = line.find(':');
      auto start = colon == std::string::npos ? std::string::npos : line.find_first_not_of(' ', colon + 1);
      if (start != std::string::npos) return line.substr(start);
      break;
    }
  }
  return "unknown CPU";
}

Cluster take_devices(Cluster c, int devices, const std::string& where) {
  GP_CHECK(devices >= 0, "{}: --devices must be positive, got {}", where, devices);
  if (devices == 0) return c;
  GP_CHECK(devices <= c.num_devices(), "{}: --devices {} exceeds the cluster's {} devices", where, devices,
           c.num_devices());
  c.num_nodes = (devices + c.devices_per_node - 1) / c.devices_per_node;
  c.devices = devices;
  return c;
}

Cluster load_cluster(const std::string& spec, int devices) {
  GP_CHECK(devices >= 0, "--devices must be positive, got {}", devices);
  Cluster c;
  if (spec == "cpu") {
    const std::optional<CpuCalibration>& k = active_calibration();
    c = cpu_preset(devices, k ? &*k : nullptr);
  } else if (spec == "summit" || spec == "dgx-a100" || spec == "dgx-h100" || spec == "h200") {
    c = spec == "summit" ? summit() : spec == "dgx-a100" ? dgx_a100() : spec == "dgx-h100" ? dgx_h100() : h200();
    // Presets have as many nodes as the request needs; without --devices, one node.
    int n = devices > 0 ? devices : c.devices_per_node;
    c.num_nodes = (n + c.devices_per_node - 1) / c.devices_per_node;
    if (n % c.devices_per_node != 0) c.devices = n;
    return c;
  } else {
    bool looks_like_file = spec.find('/') != std::string::npos || spec.find('.') != std::string::npos;
    GP_CHECK(looks_like_file || ::access(spec.c_str(), R_OK) == 0,
             "unknown cluster \"{}\": expected one of summit, dgx-a100, dgx-h100, h200, cpu, or a "
             "graphpipe.cluster/1 .json file",
             spec);
    c = cluster_from_json(read_json_file(spec), spec);
  }
  return take_devices(std::move(c), devices, spec);
}

Json cluster_to_json(const Cluster& c) {
  Json j = {{"format", kFormat},
            {"name", c.name},
            {"num_nodes", c.num_nodes},
            {"devices_per_node", c.devices_per_node},
            {"num_devices", c.num_devices()},
            {"device",
             {{"name", c.device.name},
              {"memory_bytes", c.device.memory_bytes},
              {"peak_flops_f32", c.device.peak_flops_f32},
              {"peak_flops_f16", c.device.peak_flops_f16},
              {"mem_bandwidth_Bps", c.device.mem_bandwidth_Bps},
              {"kernel_overhead_s", c.device.kernel_overhead_s},
              {"memory_reserve_bytes", c.device.memory_reserve_bytes},
              {"efficiency", efficiency_to_json(c.device.efficiency)}}},
            {"intra", link_to_json(c.intra)},
            {"inter", link_to_json(c.inter)},
            {"node_injection_Bps", c.node_injection_Bps},
            {"mixed_precision", c.mixed_precision}};
  if (c.gloo_collectives) j["collectives"] = "gloo";  // written only when not the default (nccl)
  if (c.collective_intra.bandwidth_Bps > 0) j["collective_intra"] = link_to_json(c.collective_intra);
  if (c.device.sgd_step_s_per_param > 0 || c.device.adam_step_s_per_param > 0)  // measured: the calibrated cpu preset
    j["device"]["optimizer_step_s_per_param"] = {{"sgd", c.device.sgd_step_s_per_param},
                                                 {"adam", c.device.adam_step_s_per_param}};
  if (c.device.sgd_step_s_per_tensor > 0 || c.device.adam_step_s_per_tensor > 0)
    j["device"]["optimizer_step_s_per_tensor"] = {{"sgd", c.device.sgd_step_s_per_tensor},
                                                  {"adam", c.device.adam_step_s_per_tensor}};
  if (c.device.sequence_overhead_s > 0 || c.device.sequence_s_per_weight_byte > 0 ||
      c.device.sequence_s_per_activation_byte > 0) {  // the calibrated cpu preset
    j["device"]["in_sequence"] = {{"overhead_s", c.device.sequence_overhead_s},
                                  {"s_per_weight_byte", c.device.sequence_s_per_weight_byte}};
    if (c.device.sequence_s_per_activation_byte > 0)
      j["device"]["in_sequence"]["s_per_activation_byte"] = c.device.sequence_s_per_activation_byte;
  }
  if (c.device.pass_fwd_s > 0 || c.device.pass_bwd_s > 0)
    j["device"]["pass"] = {{"fwd_s", c.device.pass_fwd_s}, {"bwd_s", c.device.pass_bwd_s}};
  if (!c.device.kind_overhead_s.empty())
    j["device"]["kind_overhead_s"] = kind_overheads_to_json(c.device.kind_overhead_s);
  if (!c.device.kind_pace.empty()) j["device"]["kind_pace"] = kind_pace_to_json(c.device.kind_pace);
  if (!c.device.kind_in_sequence.empty())
    j["device"]["kind_in_sequence"] = kind_pace_to_json(c.device.kind_in_sequence);
  return j;
}

Cluster cluster_from_json(const Json& json, const std::string& file) { return cluster_from_json(JsonAt(json, file)); }

Cluster cluster_from_json(const JsonAt& j) {
  expect_format(j, kFormat);
  Cluster c;
  c.name = j.at("name").str();
  if (c.name.empty()) j.at("name").fail("must not be empty");
  c.num_nodes = positive_int(j.at("num_nodes"));
  c.devices_per_node = positive_int(j.at("devices_per_node"));
  int full = c.num_nodes * c.devices_per_node;
  if (j.has("num_devices")) {
    JsonAt nd = j.at("num_devices");
    int n = positive_int(nd);
    int min_n = (c.num_nodes - 1) * c.devices_per_node + 1;
    if (n < min_n || n > full)
      nd.fail(fmt::format("{} devices do not fit {} nodes of {} (expected {}..{})", n, c.num_nodes, c.devices_per_node,
                          min_n, full));
    if (n != full) c.devices = n;
  }
  JsonAt d = j.at("device");
  d.expect_object();
  c.device.name = d.at("name").str();
  c.device.memory_bytes = positive(d.at("memory_bytes"));
  c.device.peak_flops_f32 = positive(d.at("peak_flops_f32"));
  c.device.peak_flops_f16 = d.has("peak_flops_f16") ? positive(d.at("peak_flops_f16")) : c.device.peak_flops_f32;
  c.device.mem_bandwidth_Bps = positive(d.at("mem_bandwidth_Bps"));
  c.device.kernel_overhead_s = d.has("kernel_overhead_s") ? non_negative(d.at("kernel_overhead_s")) : 0;
  if (d.has("memory_reserve_bytes")) {
    c.device.memory_reserve_bytes = non_negative(d.at("memory_reserve_bytes"));
    if (c.device.memory_reserve_bytes >= c.device.memory_bytes)
      d.at("memory_reserve_bytes")
          .fail(fmt::format("must be below memory_bytes ({}), found {}", c.device.memory_bytes,
                            c.device.memory_reserve_bytes));
  }
  if (d.has("efficiency")) c.device.efficiency = efficiency_from_json(d.at("efficiency"));
  if (d.has("optimizer_step_s_per_param")) {
    JsonAt o = d.at("optimizer_step_s_per_param");
    o.expect_object();
    c.device.sgd_step_s_per_param = non_negative(o.at("sgd"));
    c.device.adam_step_s_per_param = non_negative(o.at("adam"));
  }
  if (d.has("optimizer_step_s_per_tensor")) {
    JsonAt o = d.at("optimizer_step_s_per_tensor");
    o.expect_object();
    c.device.sgd_step_s_per_tensor = non_negative(o.at("sgd"));
    c.device.adam_step_s_per_tensor = non_negative(o.at("adam"));
  }
  if (d.has("in_sequence")) {
    JsonAt q = d.at("in_sequence");
    q.expect_object();
    c.device.sequence_overhead_s = non_negative(q.at("overhead_s"));
    c.device.sequence_s_per_weight_byte = non_negative(q.at("s_per_weight_byte"));
    if (q.has("s_per_activation_byte"))
      c.device.sequence_s_per_activation_byte = non_negative(q.at("s_per_activation_byte"));
  }
  if (d.has("pass")) {
    JsonAt q = d.at("pass");
    q.expect_object();
    c.device.pass_fwd_s = non_negative(q.at("fwd_s"));
    c.device.pass_bwd_s = non_negative(q.at("bwd_s"));
  }
  if (d.has("kind_overhead_s")) c.device.kind_overhead_s = kind_overheads_from_json(d.at("kind_overhead_s"));
  if (d.has("kind_pace")) c.device.kind_pace = kind_pace_from_json(d.at("kind_pace"));
  if (d.has("kind_in_sequence")) c.device.kind_in_sequence = kind_pace_from_json(d.at("kind_in_sequence"), true);
  c.intra = link_from_json(j.at("intra"));
  // A single-node cluster never uses the inter-node link; it may be omitted there.
  if (c.num_nodes > 1 || j.has("inter")) c.inter = link_from_json(j.at("inter"));
  else c.inter = c.intra;
  if (j.has("collective_intra")) c.collective_intra = link_from_json(j.at("collective_intra"));
  c.node_injection_Bps = j.has("node_injection_Bps") ? non_negative(j.at("node_injection_Bps")) : 0;
  c.mixed_precision = j.has("mixed_precision") ? j.at("mixed_precision").boolean() : false;
  if (j.has("collectives")) {
    const std::string coll = j.at("collectives").str();
    if (coll != "nccl" && coll != "gloo")
      j.at("collectives").fail(fmt::format("expected \"nccl\" or \"gloo\", found \"{}\"", coll));
    c.gloo_collectives = coll == "gloo";
  }
  return c;
}

Optimizer optimizer_from_string(const std::string& s) {
  if (s == "sgd") return Optimizer::sgd;
  if (s == "adam") return Optimizer::adam;
  throw UserError(fmt::format("unknown optimizer \"{}\": expected sgd or adam", s));
}

const char* to_string(Optimizer o) { return o == Optimizer::sgd ? "sgd" : "adam"; }

}  // namespace gp::cost
