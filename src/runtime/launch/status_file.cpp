#include "runtime/launch/status_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>

namespace gp::runtime::detail {

StatusFile::StatusFile(const char* path) {
  if (path) fd_ = ::open(path, O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
}

StatusFile::~StatusFile() {
  if (fd_ >= 0) ::close(fd_);
}

void StatusFile::progress(int64_t step, const std::string& action) {
  if (fd_ < 0) return;
  char buf[kStatusErrorOffset];
  int n = std::snprintf(buf, sizeof buf, "%lld\t%s", static_cast<long long>(step), action.c_str());
  std::fill(buf + std::min<int>(n, sizeof buf - 1), buf + sizeof buf, ' ');
  buf[sizeof buf - 1] = '\n';
  (void)!::pwrite(fd_, buf, sizeof buf, 0);
}

void StatusFile::failure(int peer, bool rejected, const std::string& msg) {
  if (fd_ < 0) return;
  std::string s = std::to_string(peer) + (rejected ? "\trejected\t" : "\t-\t") + msg + "\n";
  (void)!::pwrite(fd_, s.data(), s.size(), kStatusErrorOffset);
}

WorkerStatus read_status_file(const std::string& path) {
  WorkerStatus s;
  std::ifstream f(path, std::ios::binary);
  std::string all((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  const size_t split = kStatusErrorOffset;
  std::string head = all.substr(0, std::min(all.size(), split));
  if (auto tab = head.find('\t'); tab != std::string::npos) {
    s.step = std::strtol(head.c_str(), nullptr, 10);
    s.action = head.substr(tab + 1);
    while (!s.action.empty() && (s.action.back() == ' ' || s.action.back() == '\n')) s.action.pop_back();
  }
  if (all.size() > split) {
    std::string tail = all.substr(split);
    if (auto tab = tail.find('\t'), tab2 = tail.find('\t', tab + 1); tab2 != std::string::npos) {
      s.peer = std::atoi(tail.c_str());
      s.rejected = tail.compare(tab + 1, tab2 - tab - 1, "rejected") == 0;
      s.error = tail.substr(tab2 + 1);
      while (!s.error.empty() && s.error.back() == '\n') s.error.pop_back();
    }
  }
  return s;
}

}  // namespace gp::runtime::detail
