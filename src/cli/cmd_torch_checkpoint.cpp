// `graphpipe checkpoint show|diff`: look into --checkpoint-dir files without a plan or a model.
#include <cstdio>
#include <cstdlib>
#include <memory>

#include "cli/command.h"
#include "runtime/checkpoint_tool.h"

namespace gp::cli {
namespace {

Registrar reg(70, [](CLI::App& root) {
  auto* ck = root.add_subcommand("checkpoint", "Inspect or compare training checkpoints (--checkpoint-dir)");
  ck->require_subcommand(1);

  auto path = std::make_shared<std::string>();
  auto* show = ck->add_subcommand("show", "Steps done and every parameter's shape and norm, per file");
  show->add_option("path", *path, "A checkpoint file (.pt) or a --checkpoint-dir directory")->required();
  show->callback([path] { std::fputs(runtime::describe_checkpoints(*path).c_str(), stdout); });

  auto a = std::make_shared<std::string>(), b = std::make_shared<std::string>();
  auto* diff = ck->add_subcommand(
      "diff",
      "Compare the weights of two checkpoints bit for bit (two files, or two directories file by\n"
      "file). Exit 0 when identical, 1 when any value or step count differs.");
  diff->add_option("a", *a, "First checkpoint file or directory")->required();
  diff->add_option("b", *b, "Second checkpoint file or directory")->required();
  diff->callback([a, b] {
    runtime::CheckpointDiff d = runtime::diff_checkpoints(*a, *b);
    std::fputs(d.shared.c_str(), stdout);  // copies of shared parameters on several stages
    if (d.identical()) {
      std::printf("identical: %d file(s), %lld tensors, %lld values, same step counts\n", d.files,
                  static_cast<long long>(d.tensors), static_cast<long long>(d.values));
      return;
    }
    std::fputs(d.report.c_str(), stdout);
    std::printf("DIFFERENT: %lld of %lld values differ (max |a-b| %.3g) in %d file(s)\n",
                static_cast<long long>(d.differing_values), static_cast<long long>(d.values), d.max_abs, d.files);
    std::fflush(stdout);
    std::exit(1);
  });
});

}  // namespace
}  // namespace gp::cli
