// For runtime tests that run the built graphpipe binary: a per-test scratch directory and a
// bounded run of the binary inside it (GP_BINARY is defined by the test target).
#pragma once
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>

namespace gp::runtime::testing {

struct Proc {
  int code = -1;
  std::string out, err;
  double seconds = 0;
};

inline std::string slurp(const std::filesystem::path& p) {
  std::ifstream f(p);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

/// A test with its own empty directory `dir_` (named after the prefix, the pid and the test),
/// removed afterwards.
class ScratchDirTest : public ::testing::Test {
 protected:
  explicit ScratchDirTest(std::string prefix) : prefix_(std::move(prefix)) {}
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() / (prefix_ + std::to_string(::getpid()) + "_" +
                                                     ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  /// Runs `[ENV] graphpipe ARGS` in `dir_`, killed after `limit_s` seconds.
  Proc graphpipe(const std::string& args, const std::string& env = "", int limit_s = 60) {
    return run(std::string(GP_BINARY) + " " + args, env, limit_s);
  }
  /// Runs `[ENV] COMMAND` (a shell command line) in `dir_`, killed after `limit_s` seconds.
  Proc run(const std::string& command, const std::string& env = "", int limit_s = 60) {
    const std::filesystem::path out = dir_ / ("out" + std::to_string(runs_)),
                                err = dir_ / ("err" + std::to_string(runs_));
    ++runs_;
    const std::string cmd = "cd " + dir_.string() + " && env " + env + " timeout -s KILL " + std::to_string(limit_s) +
                            " " + command + " >" + out.string() + " 2>" + err.string();
    const auto t0 = std::chrono::steady_clock::now();
    const int st = std::system(cmd.c_str());
    Proc r;
    r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    r.code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    r.out = slurp(out);
    r.err = slurp(err);
    return r;
  }

  std::filesystem::path dir_;

 private:
  std::string prefix_;
  int runs_ = 0;
};

}  // namespace gp::runtime::testing
