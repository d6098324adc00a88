// The logger: arguments untouched when the level is off, warnings limited per
// call site with a count of what was dropped, RDMASHIM_LOG_FILE, the pid
// of each line's process.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include "util/log.h"

namespace rdmashim::log {
namespace {

std::string read_all(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

int count_lines(const std::string& text) {
  int n = 0;
  for (char c : text) n += c == '\n';
  return n;
}

class LogFile : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/rdmashim-log-test-XXXXXX";
    int fd = mkstemp(tmpl);
    ASSERT_GE(fd, 0);
    close(fd);
    path_ = tmpl;
    set_file(path_.c_str());
  }
  void TearDown() override {
    set_file(nullptr);
    set_level(kWarn);
    unlink(path_.c_str());
  }
  std::string path_;
};

TEST(Log, ArgumentsAreNotEvaluatedWhenTheLevelIsOff) {
  int calls = 0;
  auto touched = [&] { return ++calls; };
  set_level(kOff);
  RDMASHIM_WARN("%d", touched());
  set_level(kWarn);
  RDMASHIM_INFO("%d", touched());
  RDMASHIM_DEBUG("%d", touched());
  EXPECT_EQ(calls, 0);
  set_level(kWarn);
}

TEST(RateLimitTest, BurstThenDropsThenCountsTheDropped) {
  RateLimit limit;
  uint64_t t = 1'000'000'000, dropped = 99;
  for (uint32_t i = 0; i < RateLimit::kBurst; ++i) {
    ASSERT_TRUE(limit.admit(t + i, &dropped));
    EXPECT_EQ(dropped, 0u);
  }
  for (int i = 0; i < 7; ++i) EXPECT_FALSE(limit.admit(t + 100 + i, &dropped));
  // Still inside the window: dropped.
  EXPECT_FALSE(limit.admit(t + RateLimit::kWindowNs - 1, &dropped));
  // A new window lets a line through and reports the 8 dropped ones.
  ASSERT_TRUE(limit.admit(t + RateLimit::kWindowNs, &dropped));
  EXPECT_EQ(dropped, 8u);
  ASSERT_TRUE(limit.admit(t + RateLimit::kWindowNs + 1, &dropped));
  EXPECT_EQ(dropped, 0u);
}

TEST_F(LogFile, LinesGoToTheFileWithPidAndLevel) {
  set_level(kInfo);
  RDMASHIM_INFO("fd %d (client) -> %s", 7, "shm");
  std::string text = read_all(path_);
  EXPECT_EQ(text, "rdmashim[" + std::to_string(getpid()) + "] info: fd 7 (client) -> shm\n");
}

TEST_F(LogFile, RepeatedWarningsAreLimitedPerCallSite) {
  for (int i = 0; i < 25; ++i) RDMASHIM_WARN("repeated %d", i);
  RDMASHIM_WARN("another site");
  std::string text = read_all(path_);
  EXPECT_EQ(count_lines(text), static_cast<int>(RateLimit::kBurst) + 1) << text;
  EXPECT_NE(text.find("repeated 9\n"), std::string::npos);
  EXPECT_EQ(text.find("repeated 10\n"), std::string::npos);
  EXPECT_NE(text.find("another site\n"), std::string::npos);
}

TEST_F(LogFile, InfoLinesAreNeverDropped) {
  set_level(kInfo);
  for (int i = 0; i < 50; ++i) RDMASHIM_INFO("connection %d", i);
  EXPECT_EQ(count_lines(read_all(path_)), 50);
}

TEST_F(LogFile, ErrnoIsPreserved) {
  errno = EAGAIN;
  RDMASHIM_WARN("keeps errno");
  EXPECT_EQ(errno, EAGAIN);
}

// Each line names its process: the pid is asked once, and again in a forked child.
TEST_F(LogFile, LinesNameTheirProcessAlsoAfterFork) {
  set_level(kInfo);
  RDMASHIM_INFO("parent");
  pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    RDMASHIM_INFO("child");
    _exit(0);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  std::string text = read_all(path_);
  EXPECT_NE(text.find("rdmashim[" + std::to_string(getpid()) + "] info: parent"), std::string::npos) << text;
  EXPECT_NE(text.find("rdmashim[" + std::to_string(child) + "] info: child"), std::string::npos) << text;
}

}  // namespace
}  // namespace rdmashim::log
