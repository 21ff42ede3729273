// graphpipe: the command-line entry point. Dispatches to the registered subcommands.
#include <algorithm>
#include <cstdio>
#include <vector>

#include "cli/command.h"
#include "support/error.h"

namespace gp::cli {
namespace {
std::vector<std::pair<int, Setup>>& registry() {
  static std::vector<std::pair<int, Setup>> r;
  return r;
}
}  // namespace

Registrar::Registrar(int order, Setup setup) { registry().emplace_back(order, std::move(setup)); }

}  // namespace gp::cli

int main(int argc, char** argv) {
  CLI::App app{
      "GraphPipe: graph pipeline parallel training.\n"
      "Plan a multi-branch model onto devices as a DAG of pipeline stages, simulate the schedule,\n"
      "and train it for real with LibTorch. See README.md and docs/."};
  app.require_subcommand(1);
  app.set_help_all_flag("--help-all", "Show help for every subcommand");
  auto& reg = gp::cli::registry();
  std::stable_sort(reg.begin(), reg.end(), [](auto& a, auto& b) { return a.first < b.first; });
  for (auto& [order, setup] : reg) setup(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int rc = app.exit(e);
    return rc == 0 ? 0 : 2;
  } catch (const gp::UserError& e) {
    std::fprintf(stderr, "graphpipe: error: %s\n", e.what());
    return 2;
  } catch (const gp::RuntimeFailure& e) {
    std::fprintf(stderr, "graphpipe: failed: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "graphpipe: failed: %s\n", e.what());
    return 1;
  }
  return 0;
}
