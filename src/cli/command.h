// Subcommand registry: each cmd_*.cpp registers its CLI11 subcommand with a static Registrar,
// so commands live next to nothing but their own code. Errors: throw gp::UserError (exit 2) or
// gp::RuntimeFailure (exit 1); main() prints the one-line message.
#pragma once
#include <CLI/CLI.hpp>
#include <functional>
#include <string>

namespace gp::cli {

using Setup = std::function<void(CLI::App& root)>;

struct Registrar {
  /// `order` sorts commands in --help.
  Registrar(int order, Setup setup);
};

}  // namespace gp::cli
