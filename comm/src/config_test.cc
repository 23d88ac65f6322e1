// Transport policy tests (axon/comm_config.h): AXON_COMM_* parsing, segment
// names and the removal of stale segments from /dev/shm.
//
// The runtime warns about a bad value once per variable and process: each
// variable gets a bad value in one test only.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <limits>
#include <set>
#include <string>

#include <gtest/gtest.h>

#include "axon/comm_config.h"

using namespace axon::comm;

namespace {

// Sets (or, with nullptr, unsets) an environment variable for one scope.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) {
      old_ = old;
      had_ = true;
    }
    if (value != nullptr) {
      ::setenv(name, value, 1);
    } else {
      ::unsetenv(name);
    }
  }
  ~ScopedEnv() {
    if (had_) {
      ::setenv(name_.c_str(), old_.c_str(), 1);
    } else {
      ::unsetenv(name_.c_str());
    }
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  std::string name_, old_;
  bool had_ = false;
};

// A process id that belonged to a process that has exited (and been reaped).
pid_t dead_pid() {
  pid_t pid = fork();
  if (pid == 0) _exit(0);
  int status = 0;
  waitpid(pid, &status, 0);
  return pid;
}

bool segment_exists(const std::string& name) {
  int fd = shm_open(("/" + name).c_str(), O_RDONLY, 0600);
  if (fd < 0) return false;
  close(fd);
  return true;
}

void create_segment(const std::string& name) {
  int fd = shm_open(("/" + name).c_str(), O_CREAT | O_RDWR, 0600);
  ASSERT_GE(fd, 0) << name;
  close(fd);
}

}  // namespace

TEST(CommConfig, DefaultsWithoutTheEnvironment) {
  ScopedEnv a("AXON_COMM_SLOT_BYTES", nullptr), b("AXON_COMM_P2P_BYTES", nullptr),
      c("AXON_COMM_SMALL_BYTES", nullptr);
  Config c0 = config_from_env(std::chrono::milliseconds(1234));
  EXPECT_EQ(c0.slot_bytes, size_t{4} << 20);
  EXPECT_EQ(c0.p2p_bytes, size_t{1} << 20);
  EXPECT_EQ(c0.small_bytes, size_t{256} << 10);
  EXPECT_EQ(c0.timeout, std::chrono::milliseconds(1234));
  EXPECT_EQ(c0.peer_map_entries, Config{}.peer_map_entries);
  EXPECT_EQ(c0.peer_map_bytes, Config{}.peer_map_bytes);
}

TEST(CommConfig, ParsesSizesWithSuffixes) {
  ScopedEnv a("AXON_COMM_SLOT_BYTES", "8MiB"), b("AXON_COMM_P2P_BYTES", "65536"),
      c("AXON_COMM_SMALL_BYTES", "0");  // 0: every all_reduce takes the large path
  Config cfg = config_from_env(std::chrono::milliseconds(10));
  EXPECT_EQ(cfg.slot_bytes, size_t{8} << 20);
  EXPECT_EQ(cfg.p2p_bytes, size_t{65536});
  EXPECT_EQ(cfg.small_bytes, size_t{0});
}

TEST(CommConfig, BlankMeansUnset) {
  ScopedEnv a("AXON_COMM_SLOT_BYTES", "  "), b("AXON_COMM_SMALL_BYTES", "");
  Config cfg = config_from_env(std::chrono::milliseconds(10));
  EXPECT_EQ(cfg.slot_bytes, Config{}.slot_bytes);
  EXPECT_EQ(cfg.small_bytes, Config{}.small_bytes);
}

TEST(CommConfig, BadValuesWarnOnceAndKeepTheDefault) {
  ScopedEnv a("AXON_COMM_SLOT_BYTES", "abc"), b("AXON_COMM_P2P_BYTES", "0"),
      c("AXON_COMM_SMALL_BYTES", "-5");
  ::testing::internal::CaptureStderr();
  Config cfg = config_from_env(std::chrono::milliseconds(10));
  Config again = config_from_env(std::chrono::milliseconds(10));  // no second warning
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(cfg.slot_bytes, Config{}.slot_bytes);
  EXPECT_EQ(cfg.p2p_bytes, Config{}.p2p_bytes);
  EXPECT_EQ(cfg.small_bytes, Config{}.small_bytes);
  EXPECT_EQ(again.slot_bytes, Config{}.slot_bytes);
  EXPECT_EQ(err,
            "axon: ignoring AXON_COMM_SLOT_BYTES='abc' (expected a size such as 1048576 or "
            "4MiB, at least 1); using 4194304\n"
            "axon: ignoring AXON_COMM_P2P_BYTES='0' (expected a size such as 1048576 or "
            "4MiB, at least 1); using 1048576\n"
            "axon: ignoring AXON_COMM_SMALL_BYTES='-5' (expected a size such as 1048576 or "
            "4MiB); using 262144\n");
}

TEST(CommConfig, InlineBytesDefaultDependsOnSpareCores) {
  constexpr size_t kAny = std::numeric_limits<size_t>::max();
  EXPECT_EQ(default_inline_bytes(1, 2), size_t{4} << 20);
  EXPECT_EQ(default_inline_bytes(2, 4), size_t{4} << 20);
  EXPECT_EQ(default_inline_bytes(2, 2), kAny);  // no core to spare
  EXPECT_EQ(default_inline_bytes(4, 2), kAny);
  EXPECT_GE(usable_cores(), size_t{1});
  ScopedEnv e("AXON_COMM_INLINE_BYTES", nullptr);
  EXPECT_EQ(inline_bytes(1), default_inline_bytes(1, usable_cores()));
  EXPECT_EQ(inline_bytes(64), default_inline_bytes(64, usable_cores()));
}

TEST(CommConfig, InlineBytesFromTheEnvironment) {
  {
    ScopedEnv e("AXON_COMM_INLINE_BYTES", "0");  // 0: always the communication stream
    EXPECT_EQ(inline_bytes(1), size_t{0});
  }
  {
    ScopedEnv e("AXON_COMM_INLINE_BYTES", "1.5KiB");
    EXPECT_EQ(inline_bytes(64), size_t{1536});
  }
  ScopedEnv e("AXON_COMM_INLINE_BYTES", "lots");
  ::testing::internal::CaptureStderr();
  const size_t got = inline_bytes(1);
  const std::string err = ::testing::internal::GetCapturedStderr();
  const size_t fallback = default_inline_bytes(1, usable_cores());
  EXPECT_EQ(got, fallback);
  EXPECT_EQ(err, "axon: ignoring AXON_COMM_INLINE_BYTES='lots' (expected a size such as "
                 "1048576 or 4MiB); using " + std::to_string(fallback) + "\n");
}

TEST(CommSegments, NamesCarryTheCreatorsPid) {
  const std::string a = new_segment_name(), b = new_segment_name();
  EXPECT_NE(a, b);
  const std::string prefix = "axon-pg-" + std::to_string(getpid()) + "-";
  EXPECT_EQ(a.rfind(prefix, 0), 0u) << a;
  EXPECT_EQ(b.rfind(prefix, 0), 0u) << b;
  EXPECT_EQ(a.find('/'), std::string::npos);  // a POSIX shm name without the slash
  EXPECT_EQ(segment_creator(a), getpid());
  EXPECT_EQ(segment_creator("axon-pg-123-0-0"), 123);
  EXPECT_EQ(segment_creator("axon-pg-0-0-0"), 0);
  EXPECT_EQ(segment_creator("axon-pg-x"), 0);
  EXPECT_EQ(segment_creator("axon-pg-99999999999999999999-0"), 0);
  EXPECT_EQ(segment_creator("axon-comm-test-123-0"), 0);  // not a process group's
  EXPECT_EQ(segment_creator("sem.axon-pg-123"), 0);
}

TEST(CommSegments, StaleSegmentsAreRemovedLiveOnesStay) {
  const pid_t dead = dead_pid();
  const std::string stale = "axon-pg-" + std::to_string(dead) + "-0-0";
  const std::string live = "axon-pg-" + std::to_string(getpid()) + "-stale-test-0";
  const std::string other = "axon-comm-test-" + std::to_string(dead) + "-stale";
  ASSERT_NO_FATAL_FAILURE(create_segment(stale));
  ASSERT_NO_FATAL_FAILURE(create_segment(live));
  ASSERT_NO_FATAL_FAILURE(create_segment(other));
  ASSERT_TRUE(segment_exists(stale));

  const std::vector<std::string> removed = remove_stale_segments();

  EXPECT_FALSE(segment_exists(stale)) << "the segment of a dead creator was left behind";
  EXPECT_NE(std::find(removed.begin(), removed.end(), stale), removed.end());
  EXPECT_TRUE(segment_exists(live)) << "the segment of a live process was removed";
  EXPECT_EQ(std::find(removed.begin(), removed.end(), live), removed.end());
  EXPECT_TRUE(segment_exists(other)) << "a segment that is not a process group's was removed";
  shm_unlink(("/" + live).c_str());
  shm_unlink(("/" + other).c_str());
  shm_unlink(("/" + stale).c_str());
}
