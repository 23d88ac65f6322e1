// Transport policy (see axon/comm_config.h).
#include "axon/comm_config.h"

#include <dirent.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <limits>
#include <random>
#include <thread>

#include "axon/env.h"

namespace axon::comm {

Config config_from_env(std::chrono::milliseconds timeout) {
  Config c;
  c.slot_bytes = rt::env_bytes("AXON_COMM_SLOT_BYTES", c.slot_bytes, 1);
  c.p2p_bytes = rt::env_bytes("AXON_COMM_P2P_BYTES", c.p2p_bytes, 1);
  c.small_bytes = rt::env_bytes("AXON_COMM_SMALL_BYTES", c.small_bytes);
  c.timeout = timeout;
  return c;
}

size_t usable_cores() {
  size_t cores = 0;
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0) cores = static_cast<size_t>(CPU_COUNT(&set));
  if (cores == 0) cores = std::max(1u, std::thread::hardware_concurrency());
  return cores;
}

size_t default_inline_bytes(size_t local_ranks, size_t cores) {
  return local_ranks >= cores ? std::numeric_limits<size_t>::max() : size_t{4} << 20;
}

size_t inline_bytes(size_t local_ranks) {
  return rt::env_bytes("AXON_COMM_INLINE_BYTES",
                       default_inline_bytes(local_ranks, usable_cores()));
}

std::string new_segment_name() {
  static std::atomic<int> counter{0};
  std::random_device rd;
  return std::string(kSegmentPrefix) + std::to_string(getpid()) + "-" +
         std::to_string(counter++) + "-" + std::to_string(rd());
}

pid_t segment_creator(std::string_view name) {
  if (!name.starts_with(kSegmentPrefix)) return 0;
  const std::string rest(name.substr(kSegmentPrefix.size()));
  const long pid = std::strtol(rest.c_str(), nullptr, 10);
  return pid > 0 && pid <= INT_MAX ? static_cast<pid_t>(pid) : 0;
}

std::vector<std::string> remove_stale_segments() {
  std::vector<std::string> removed;
  DIR* dir = opendir("/dev/shm");
  if (dir == nullptr) return removed;
  while (dirent* e = readdir(dir)) {
    const std::string n = e->d_name;
    const pid_t pid = segment_creator(n);
    if (pid > 0 && kill(pid, 0) != 0 && errno == ESRCH) {
      if (shm_unlink(("/" + n).c_str()) == 0) removed.push_back(n);
    }
  }
  closedir(dir);
  return removed;
}

}  // namespace axon::comm
