// Keeping a woken thread off a busy core.  Linux often places a woken thread
// on its waker's core (or leaves it on the core it last ran on, now held by
// another thread); there it runs only when that thread is preempted, until
// the load balancer moves one of them, which can take milliseconds.  A team
// helper woken by its loop's caller moves itself off such a core (move_off).
// Cores numbered from kMaxTrackedCpus on are not tracked.
#pragma once

#include <cstdint>

#ifdef __linux__
#include <sched.h>
#endif

namespace axon::rt {

constexpr int kMaxTrackedCpus = 64;

// The bit of the core the calling thread runs on; 0 when not known or not tracked.
inline uint64_t current_cpu_bit() {
#ifdef __linux__
  const int cpu = sched_getcpu();
  if (cpu >= 0 && cpu < kMaxTrackedCpus) return uint64_t{1} << cpu;
#endif
  return 0;
}

// When the calling thread runs on a core of `busy` (bits), moves it to one
// of its allowed cores outside `busy`, if there is one, and gives it back
// its whole affinity (it stays there until the scheduler moves it); whether
// it moved.  Two sched_setaffinity calls, only on a busy core.
inline bool move_off(uint64_t busy) {
#ifdef __linux__
  const uint64_t here = current_cpu_bit();
  if ((here & busy) == 0) return false;
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  if (sched_getaffinity(0, sizeof(allowed), &allowed) != 0) return false;
  cpu_set_t to;
  CPU_ZERO(&to);
  bool any = false;
  for (int c = 0; c < kMaxTrackedCpus && c < CPU_SETSIZE; ++c) {
    if (CPU_ISSET(c, &allowed) && !(busy & (uint64_t{1} << c))) {
      CPU_SET(c, &to);
      any = true;
    }
  }
  if (!any || sched_setaffinity(0, sizeof(to), &to) != 0) return false;  // moves it at once
  if (sched_setaffinity(0, sizeof(allowed), &allowed) != 0) {
    sched_setaffinity(0, sizeof(allowed), &allowed);  // once more: never left narrowed
  }
  return true;
#else
  (void)busy;
  return false;
#endif
}

}  // namespace axon::rt
