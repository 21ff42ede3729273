// `graphpipe models [--json]`: list the builtin models with their parameters and defaults.
#include <cstdio>
#include <fmt/format.h>
#include <memory>

#include "cli/command.h"
#include "models/zoo.h"
#include "support/json.h"

namespace gp::cli {
namespace {

void run_models(bool json) {
  const auto& models = models::builtin_models();
  if (json) {
    Json out = {{"format", "graphpipe.models/1"}, {"models", Json::array()}};
    for (const auto& m : models) {
      Json params = Json::array();
      for (const auto& p : m.params)
        params.push_back({{"name", p.name}, {"default", p.default_value}, {"help", p.help}});
      out["models"].push_back({{"name", m.name}, {"description", m.description}, {"params", params}});
    }
    std::printf("%s\n", out.dump(1).c_str());
    return;
  }
  for (const auto& m : models) {
    std::printf("%s\n  %s\n", m.name.c_str(), m.description.c_str());
    for (const auto& p : m.params)
      std::printf("    %-20s %s\n", fmt::format("{}={}", p.name, p.default_value).c_str(), p.help.c_str());
  }
  std::printf(
      "\nA spec overrides parameters: --model mmt:branches=2,layers=2,hidden=64,seq=16,heads=4,ffn=128\n"
      "A model file also works: --model path.json (graphpipe.model/1) or path.onnx\n");
}

Registrar reg(10, [](CLI::App& root) {
  auto* cmd = root.add_subcommand("models", "List builtin models, their parameters and defaults");
  auto json = std::make_shared<bool>(false);
  cmd->add_flag("--json", *json, "Print a graphpipe.models/1 JSON document");
  cmd->callback([json] { run_models(*json); });
});

}  // namespace
}  // namespace gp::cli
