// `graphpipe checkpoint show|diff|reshard|export`: look into --checkpoint-dir files without a plan or a model,
// or rewrite them for another plan of the same model.
#include <cstdio>
#include <cstdlib>
#include <memory>

#include "cli/command.h"
#include "runtime/launch/checkpoint_tool.h"

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

  auto from = std::make_shared<std::string>(), plan = std::make_shared<std::string>(),
       out = std::make_shared<std::string>();
  auto* reshard = ck->add_subcommand(
      "reshard",
      "Rewrite a checkpoint directory (any plan of a model, or --single) for another plan of the same\n"
      "model: every parameter, shared parameter and optimizer state mapped by name. Resume it with\n"
      "train --plan NEW.json --resume --checkpoint-dir OUT (train --resume under NEW.json does the same\n"
      "in place).");
  reshard->add_option("--from", *from, "Checkpoint directory to read (its latest.json generation)")->required();
  reshard->add_option("--plan", *plan, "The plan to write checkpoints for (graphpipe.plan/1)")->required();
  reshard->add_option("--out", *out, "New checkpoint directory (must not hold a checkpoint)")->required();
  reshard->callback(
      [from, plan, out] { std::fputs(runtime::reshard_checkpoints(*from, *plan, *out).c_str(), stdout); });

  auto source = std::make_shared<std::string>(), format = std::make_shared<std::string>("pt"),
       file = std::make_shared<std::string>();
  auto* exp = ck->add_subcommand(
      "export",
      "Write every parameter (\"op/param\") and optimizer state tensor (\"op/param#field\") of a checkpoint\n"
      "as one file of named tensors: --format pt for torch.load (a dict), npz for numpy.load.");
  exp->add_option("path", *source, "A checkpoint file (.pt) or a --checkpoint-dir directory")->required();
  exp->add_option("--format", *format, "pt or npz")->capture_default_str();
  exp->add_option("--out", *file, "The file to write")->required();
  exp->callback(
      [source, format, file] { std::fputs(runtime::export_checkpoint(*source, *format, *file).c_str(), stdout); });
});

}  // namespace
}  // namespace gp::cli
