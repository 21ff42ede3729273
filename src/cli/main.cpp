// graphpipe: the command-line entry point. Dispatches to the registered subcommands.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "cli/command.h"
#include "support/error.h"
#if GP_WITH_TORCH
#include "runtime/exec/build_info.h"
#endif

namespace gp::cli {
namespace {
std::vector<std::pair<int, Setup>>& registry() {
  static std::vector<std::pair<int, Setup>> r;
  return r;
}
}  // namespace

Registrar::Registrar(int order, Setup setup) { registry().emplace_back(order, std::move(setup)); }

namespace {

/// Every error is one line on stderr (scripts and the CLI contract rely on it): line breaks inside
/// a message become "; ", and anything after a c10 backtrace's first line is dropped.
std::string one_line(std::string s, bool first_line_only = false) {
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  if (first_line_only) {
    if (auto nl = s.find('\n'); nl != std::string::npos) s.resize(nl);
    return s;
  }
  std::string out;
  for (char c : s) {
    if (c == '\n') out += "; ";
    else out += c;
  }
  return out;
}

}  // namespace
}  // namespace gp::cli

int main(int argc, char** argv) {
  CLI::App app{
      "GraphPipe: graph pipeline parallel training.\n"
      "Plan a multi-branch model onto devices as a DAG of pipeline stages, simulate the schedule,\n"
      "and train it for real with LibTorch. See README.md and docs/."};
  app.require_subcommand(1);
  app.set_help_all_flag("--help-all", "Show help for every subcommand");
  app.set_version_flag(
      "--version",
      [] {
        std::string v = "graphpipe " GP_VERSION "\n";
#if GP_WITH_TORCH
        v += gp::runtime::describe(gp::runtime::build_info());
#else
        v += "LibTorch: not built in (GP_WITH_TORCH=OFF): no train, profile or checkpoint\n";
#endif
        v.pop_back();  // CLI11 ends the text with a line break
        return v;
      },
      "Print the graphpipe version, its LibTorch, whether CUDA and NCCL are compiled in, and the GPUs it sees");
  // Read by the ONNX importer of this process and of every worker the launcher starts (they inherit
  // the environment), so all of them read the file alike. Given after any subcommand (fallthrough).
  app.add_option_function<std::string>(
         "--ties", [](const std::string& v) { setenv("GRAPHPIPE_ONNX_TIES", v.c_str(), 1); },
         "ONNX files exported with constant folding: auto (default: initializers the exporter merged are the separate "
         "parameters PyTorch has, a folded transposed copy of a tied weight is that weight), keep (the file as "
         "written) or split (neither tied). Same as GRAPHPIPE_ONNX_TIES; `model info` lists every decision")
      ->check(CLI::IsMember({"auto", "keep", "split"}));
  app.fallthrough();
  // Before the subcommands are added: they copy the root's failure message when created.
  app.failure_message([](const CLI::App*, const CLI::Error& e) {
    return "graphpipe: error: " + gp::cli::one_line(e.what()) + " (see --help)\n";
  });
  auto& reg = gp::cli::registry();
  std::stable_sort(reg.begin(), reg.end(), [](auto& a, auto& b) { return a.first < b.first; });
  for (auto& [order, setup] : reg) setup(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int rc = app.exit(e);
    return rc == 0 ? 0 : 2;
  } catch (const gp::UserError& e) {
    std::fprintf(stderr, "graphpipe: error: %s\n", gp::cli::one_line(e.what()).c_str());
    return 2;
  } catch (const gp::RuntimeFailure& e) {
    std::fprintf(stderr, "graphpipe: failed: %s\n", gp::cli::one_line(e.what()).c_str());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "graphpipe: failed: %s\n", gp::cli::one_line(e.what(), /*first_line_only=*/true).c_str());
    return 1;
  }
  return 0;
}
