#include "support/error.h"

#include <cstdio>
#include <cstdlib>

namespace gp {

void internal_assert_fail(const char* cond, const char* file, int line, const std::string& msg) {
  std::fprintf(stderr, "graphpipe: internal error at %s:%d: %s (%s)\n", file, line, msg.c_str(), cond);
  std::abort();
}

}  // namespace gp
