// The worker status file: what a worker writes, the launcher reads back (launch/status_file.h).
#include "runtime/launch/status_file.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>

namespace gp::runtime::detail {
namespace {

std::string temp_status_path(const char* what) {
  return (std::filesystem::temp_directory_path() /
          ("gp_status_" + std::string(what) + "_" + std::to_string(::getpid())))
      .string();
}

TEST(StatusFile, ProgressIsRewrittenInPlaceAndReadBack) {
  const std::string path = temp_status_path("progress");
  {
    StatusFile f(path.c_str());
    ASSERT_TRUE(f.active());
    f.progress(3, "s1 F mb12 with a long name");
    f.progress(4, "s1 B mb0");  // shorter: the padding hides the rest of the previous line
  }
  EXPECT_EQ(std::filesystem::file_size(path), static_cast<uintmax_t>(kStatusErrorOffset));
  WorkerStatus s = read_status_file(path);
  EXPECT_EQ(s.step, 4);
  EXPECT_EQ(s.action, "s1 B mb0");
  EXPECT_EQ(s.peer, -1);
  EXPECT_TRUE(s.error.empty());
  std::filesystem::remove(path);
}

TEST(StatusFile, FailureSitsAfterTheProgressLine) {
  const std::string path = temp_status_path("failure");
  {
    StatusFile f(path.c_str());
    f.progress(0, "s0 send_act ->s1 [0,8)");
    f.failure(2, /*rejected=*/true, "size mismatch\tfrom rank 2");
  }
  WorkerStatus s = read_status_file(path);
  EXPECT_EQ(s.step, 0);
  EXPECT_EQ(s.action, "s0 send_act ->s1 [0,8)");
  EXPECT_EQ(s.peer, 2);
  EXPECT_TRUE(s.rejected);
  EXPECT_EQ(s.error, "size mismatch\tfrom rank 2");  // the message may hold tabs
  {
    StatusFile f(path.c_str());
    f.failure(1, false, "peer closed");
  }
  s = read_status_file(path);
  EXPECT_EQ(s.peer, 1);
  EXPECT_FALSE(s.rejected);
  std::filesystem::remove(path);
}

TEST(StatusFile, NoPathOrNoFileGivesTheDefaults) {
  StatusFile none(nullptr);
  EXPECT_FALSE(none.active());
  none.progress(1, "ignored");
  WorkerStatus s = read_status_file(temp_status_path("missing"));
  EXPECT_EQ(s.step, -1);
  EXPECT_TRUE(s.action.empty());
  EXPECT_EQ(s.peer, -1);
}

}  // namespace
}  // namespace gp::runtime::detail
