// Errors: user-facing problems (bad input, impossible request) vs broken invariants.
// A gp::UserError reaches the CLI, which prints its one-line message and exits with code 2.
#pragma once
#include <fmt/format.h>
#include <stdexcept>
#include <string>

namespace gp {

/// Bad input or an impossible request; the message names the file, field and value. Exit code 2.
class UserError : public std::runtime_error {
 public:
  explicit UserError(const std::string& msg) : std::runtime_error(msg) {}
};

/// A failure at run time that is not the user's input (a worker died, a peer timed out). Exit code 1.
class RuntimeFailure : public std::runtime_error {
 public:
  explicit RuntimeFailure(const std::string& msg) : std::runtime_error(msg) {}
};

[[noreturn]] void internal_assert_fail(const char* cond, const char* file, int line, const std::string& msg);

}  // namespace gp

/// GP_CHECK(cond, fmt, args...): throws gp::UserError with a formatted message when cond is false.
#define GP_CHECK(cond, ...)                                       \
  do {                                                            \
    if (!(cond)) throw ::gp::UserError(fmt::format(__VA_ARGS__)); \
  } while (0)

/// GP_ASSERT(cond, fmt, args...): an invariant of our own code; aborts with file:line when broken.
#define GP_ASSERT(cond, ...)                                                                      \
  do {                                                                                            \
    if (!(cond)) ::gp::internal_assert_fail(#cond, __FILE__, __LINE__, fmt::format(__VA_ARGS__)); \
  } while (0)
