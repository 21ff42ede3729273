// `graphpipe model export|info`: write a model as graphpipe.model/1, or describe it (size, FLOPs,
// activation memory, op kinds, branch structure from the series-parallel tree, Graphviz output).
#include <cstdio>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <memory>
#include <optional>

#include "cli/command.h"
#include "importers/model_json.h"
#include "importers/onnx_import.h"
#include "importers/resolve.h"
#include "models/inspect.h"
#include "support/json.h"

namespace gp::cli {
namespace {

struct ModelArgs {
  std::string spec, out, dot;
  bool json = false;
};

void run_export(const ModelArgs& a) {
  ir::Graph g = importers::load_graph(a.spec);  // validates before writing
  importers::write_model_json(a.out, g.model());
  if (a.json) {
    Json out = {{"format", "graphpipe.model_export/1"}, {"out", a.out}, {"name", g.name()}, {"num_ops", g.num_ops()}};
    std::printf("%s\n", out.dump(1).c_str());
  } else {
    std::printf("wrote %s: model %s, %zu ops\n", a.out.c_str(), g.name().c_str(), g.num_ops());
  }
}

bool is_onnx(const std::string& spec) { return spec.size() > 5 && spec.compare(spec.size() - 5, 5, ".onnx") == 0; }

// How an ONNX file's parameters were read: every shared initializer and the decision, and the
// parameters without values (docs/onnx.md, "Default exports and ties").
Json params_json(const importers::OnnxImportReport& r) {
  Json shared = Json::array();
  for (const auto& n : r.shared)
    shared.push_back(
        {{"initializer", n.initializer}, {"names", n.names}, {"kind", n.kind}, {"trained_as_one", n.trained_as_one}});
  Json j = {{"ties_mode", r.ties_mode}, {"shared", shared}, {"without_values", r.without_values}};
  if (r.dynamo) {
    Json dropouts = Json::array();
    for (const auto& d : r.dynamo->recovered_dropouts)
      dropouts.push_back({{"op", d.op}, {"module", d.module}, {"p", d.p}});
    j["dynamo"] = {{"restored_biases", r.dynamo->restored_biases},
                   {"unfolded_weights", r.dynamo->unfolded_weights},
                   {"folded_values", r.dynamo->folded_values},
                   {"ungathered_tables", r.dynamo->ungathered_tables},
                   {"recovered_dropouts", dropouts}};
  }
  return j;
}

void print_params(const importers::OnnxImportReport& r) {
  std::printf("ties         %s (--ties auto|keep|split; \"exact\": the file's graphpipe.export metadata names them)\n",
              r.ties_mode.c_str());
  for (const auto& n : r.shared) {
    std::string also = n.names.empty() ? "" : fmt::format(" ({})", fmt::join(n.names, ", "));
    std::printf("  %-16s %s%s: %s\n", n.kind.c_str(), n.initializer.c_str(), also.c_str(),
                n.trained_as_one ? "one parameter" : "separate parameters");
  }
  if (!r.without_values.empty())
    std::printf("no values    %zu parameter input(s) (export_params=False): %s\n", r.without_values.size(),
                fmt::format("{}", fmt::join(r.without_values, ", ")).c_str());
  if (!r.dynamo) return;
  auto line = [](const char* what, const std::vector<std::string>& v) {
    if (!v.empty()) std::printf("  %-16s %s\n", what, fmt::format("{}", fmt::join(v, ", ")).c_str());
  };
  std::printf("dynamo       read from the exporter's metadata (torch.onnx.export, dynamo=True)\n");
  line("restored bias", r.dynamo->restored_biases);
  line("untransposed", r.dynamo->unfolded_weights);
  line("folded value", r.dynamo->folded_values);
  line("ungathered", r.dynamo->ungathered_tables);
  std::vector<std::string> dropouts;
  for (const auto& d : r.dynamo->recovered_dropouts)
    dropouts.push_back(fmt::format("{} (module {}): p {:.6g}", d.op, d.module.empty() ? "-" : d.module, d.p));
  line("dropout", dropouts);
}

void run_info(const ModelArgs& a) {
  // An ONNX file is imported once, its parameter report kept (load_graph imports it the same way).
  std::optional<importers::OnnxImportReport> report;
  ir::Graph g = is_onnx(a.spec) ? ir::Graph::build(importers::import_onnx(a.spec, &report.emplace()), a.spec)
                                : importers::load_graph(a.spec);
  models::ModelSummary s = models::summarize(g);
  models::SpStructure sp = models::sp_structure(g);
  std::string structure = models::describe_structure(g, sp);
  if (!a.dot.empty()) write_text_file(a.dot, models::to_dot(g, sp));
  if (a.json) {
    Json out = {{"format", "graphpipe.model_info/1"},
                {"name", s.name},
                {"num_ops", s.num_ops},
                {"num_inputs", s.num_inputs},
                {"params", s.params},
                {"param_bytes", s.param_bytes},
                {"fwd_flops_per_sample", s.fwd_flops},
                {"bwd_flops_per_sample", s.bwd_flops},
                {"saved_activation_bytes_per_sample", s.saved_bytes},
                {"ops_per_kind", s.ops_per_kind},
                {"series_parallel", sp.series_parallel},
                {"spine_parallel_widths", sp.spine_parallel_widths()},
                {"max_parallel_width", sp.max_parallel_width()},
                {"structure", structure}};
    if (!sp.series_parallel) out["sp_failure"] = sp.failure;
    if (report) out["onnx_parameters"] = params_json(*report);
    if (!a.dot.empty()) out["dot"] = a.dot;
    std::printf("%s\n", out.dump(1).c_str());
    return;
  }
  std::string kinds;
  for (const auto& [k, n] : s.ops_per_kind) kinds += fmt::format("{}{} {}", kinds.empty() ? "" : ", ", k, n);
  std::printf("model        %s\n", s.name.c_str());
  std::printf("ops          %s (graph inputs: %zu)\n", models::thousands(s.num_ops).c_str(), s.num_inputs);
  std::printf("parameters   %s (%s, %s)\n", models::thousands(s.params).c_str(),
              models::si(static_cast<double>(s.params), "").c_str(),
              models::si(static_cast<double>(s.param_bytes), "B").c_str());
  std::printf("forward      %s per sample\n", models::si(s.fwd_flops, "FLOP").c_str());
  std::printf("backward     %s per sample\n", models::si(s.bwd_flops, "FLOP").c_str());
  std::printf("activations  %s per sample saved for backward\n", models::si(s.saved_bytes, "B").c_str());
  std::printf("op kinds     %s\n", kinds.c_str());
  std::printf("%s\n", structure.c_str());
  if (report) print_params(*report);
  if (!a.dot.empty()) std::printf("wrote %s (render: dot -Tpng %s -o graph.png)\n", a.dot.c_str(), a.dot.c_str());
}

Registrar reg(11, [](CLI::App& root) {
  auto* model = root.add_subcommand("model", "Export or describe one model");
  model->require_subcommand(1);
  auto args = std::make_shared<ModelArgs>();

  auto* exp = model->add_subcommand("export", "Write a model's operator graph as graphpipe.model/1 JSON");
  exp->add_option("--model", args->spec, "Model spec: builtin[:k=v,...] or a .json/.onnx file")->required();
  exp->add_option("--out", args->out, "Output file (.json)")->required();
  exp->add_flag("--json", args->json, "Print a JSON result");
  exp->callback([args] { run_export(*args); });

  auto* info = model->add_subcommand("info", "Describe a model: size, FLOPs, memory, branch structure");
  info->add_option("--model", args->spec, "Model spec: builtin[:k=v,...] or a .json/.onnx file")->required();
  info->add_flag("--json", args->json, "Print a graphpipe.model_info/1 JSON document");
  info->add_option("--dot", args->dot, "Also write a Graphviz file (one cluster per parallel branch)");
  info->callback([args] { run_info(*args); });
});

}  // namespace
}  // namespace gp::cli
