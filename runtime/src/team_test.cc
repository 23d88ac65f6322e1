// The compute team (team.cc): every iteration runs exactly once, in chunks of
// at least the grain, on helpers too; concurrent and nested loops run
// serially; exceptions reach the caller; idle helpers sleep.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <set>
#include <stdexcept>
#include <thread>
#include <vector>

#ifdef __linux__
#include <pthread.h>
#include <sched.h>
#endif

#include "axon/runtime.h"

namespace axon::rt {
namespace {

struct Coverage {
  std::vector<std::atomic<int>> hits;
  std::atomic<int64_t> min_chunk{INT64_MAX};
  std::atomic<int> short_chunks{0};
  int64_t grain = 1, end = 0;
  std::mutex m;
  std::set<std::thread::id> threads;
  explicit Coverage(int64_t n) : hits(n) {}
};

void cover(void* ctx, int64_t b, int64_t e) {
  auto& c = *static_cast<Coverage*>(ctx);
  for (int64_t i = b; i < e; ++i) c.hits[i].fetch_add(1);
  if (e - b < c.grain && e != c.end) c.short_chunks.fetch_add(1);
  {
    std::lock_guard<std::mutex> g(c.m);
    c.threads.insert(std::this_thread::get_id());
  }
  // Long enough that a helper joins.
  const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(200);
  while (std::chrono::steady_clock::now() < until) {
  }
}

TEST(Team, EveryIterationOnceInChunksOfTheGrain) {
  for (int64_t n : {1, 2, 7, 9, 64, 1000, 4097}) {
    for (int64_t grain : {1, 3, 4, 100}) {
      for (int threads : {1, 2, 3, 8}) {
        Coverage c(n);
        c.grain = grain;
        c.end = n;
        team_parallel_for(threads, 0, n, grain, &c, cover);
        for (int64_t i = 0; i < n; ++i)
          ASSERT_EQ(c.hits[i].load(), 1) << "n=" << n << " grain=" << grain << " i=" << i;
        EXPECT_EQ(c.short_chunks.load(), 0) << "n=" << n << " grain=" << grain;
      }
    }
  }
}

TEST(Team, OffsetRangeAndEmptyRange) {
  Coverage c(50);
  c.end = 50;
  team_parallel_for(2, 10, 50, 1, &c, cover);
  for (int64_t i = 0; i < 50; ++i) EXPECT_EQ(c.hits[i].load(), i >= 10 ? 1 : 0);
  team_parallel_for(2, 5, 5, 1, &c, cover);
  team_parallel_for(2, 6, 5, 1, &c, cover);
  for (int64_t i = 0; i < 10; ++i) EXPECT_EQ(c.hits[i].load(), 0);
}

TEST(Team, HelpersRunChunks) {
  const TeamStats before = team_stats();
  bool helped = false;
  for (int attempt = 0; attempt < 50 && !helped; ++attempt) {
    Coverage c(64);
    c.end = 64;
    team_parallel_for(2, 0, 64, 1, &c, cover);
    helped = c.threads.size() > 1;
  }
  EXPECT_TRUE(helped);
  const TeamStats after = team_stats();
  EXPECT_GE(after.helpers, 1);
  EXPECT_GT(after.helper_chunks, before.helper_chunks);
  EXPECT_GT(after.loops, before.loops);
}

TEST(Team, IdleHelpersSleep) {
  Coverage c(8);
  c.end = 8;
  team_parallel_for(2, 0, 8, 1, &c, cover);
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  TeamStats s = team_stats();
  while (s.sleeping < s.helpers && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    s = team_stats();
  }
  EXPECT_EQ(s.sleeping, s.helpers);
  // ... and wake for the next loop.
  Coverage d(64);
  d.end = 64;
  team_parallel_for(2, 0, 64, 1, &d, cover);
  for (int64_t i = 0; i < 64; ++i) ASSERT_EQ(d.hits[i].load(), 1);
}

// team_start starts the helpers a team size needs, once: they sleep until a
// loop comes, and a loop of that size uses them.
TEST(Team, StartedHelpersWaitForLoops) {
  team_start(1);  // no helper needed
  team_start(3);
  const int helpers = team_stats().helpers;
  EXPECT_GE(helpers, 2);
  team_start(3);
  team_start(2);
  EXPECT_EQ(team_stats().helpers, helpers);
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (team_stats().sleeping < helpers && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_EQ(team_stats().sleeping, helpers);
  Coverage c(96);
  c.end = 96;
  team_parallel_for(3, 0, 96, 1, &c, cover);
  for (int64_t i = 0; i < 96; ++i) ASSERT_EQ(c.hits[i].load(), 1);
}

struct Nest {
  std::atomic<int64_t> sum{0};
  std::atomic<int> inner_threads_seen_parallel{0};
};

void inner(void* ctx, int64_t b, int64_t e) {
  auto& n = *static_cast<Nest*>(ctx);
  for (int64_t i = b; i < e; ++i) n.sum.fetch_add(i);
}

void outer(void* ctx, int64_t b, int64_t e) {
  for (int64_t i = b; i < e; ++i) team_parallel_for(2, 0, 100, 1, ctx, inner);
}

TEST(Team, NestedLoopsRunSerially) {
  Nest n;
  const TeamStats before = team_stats();
  team_parallel_for(2, 0, 8, 1, &n, outer);
  EXPECT_EQ(n.sum.load(), 8 * 4950);
  EXPECT_GE(team_stats().serial_loops - before.serial_loops, 8u);
}

TEST(Team, ConcurrentCallersEachCoverTheirLoop) {
  constexpr int kCallers = 4;
  constexpr int kLoops = 300;
  std::vector<std::thread> callers;
  std::atomic<int> bad{0};
  for (int c = 0; c < kCallers; ++c) {
    callers.emplace_back([&, c] {
      for (int l = 0; l < kLoops; ++l) {
        const int64_t n = 1 + (c * 37 + l * 11) % 300;
        std::vector<std::atomic<int>> hits(n);
        team_parallel_for(2 + c % 2, 0, n, 1 + l % 5, &hits, [](void* ctx, int64_t b, int64_t e) {
          auto& h = *static_cast<std::vector<std::atomic<int>>*>(ctx);
          for (int64_t i = b; i < e; ++i) h[i].fetch_add(1);
        });
        for (int64_t i = 0; i < n; ++i)
          if (hits[i].load() != 1) bad.fetch_add(1);
      }
    });
  }
  for (auto& t : callers) t.join();
  EXPECT_EQ(bad.load(), 0);
}

TEST(Team, ManyTinyLoopsBackToBack) {
  // Late helpers must never claim a chunk of a later loop with an earlier
  // loop's fields: each loop writes its own array.
  for (int l = 0; l < 20000; ++l) {
    const int64_t n = 2 + l % 7;
    std::vector<std::atomic<int>> hits(n);
    team_parallel_for(3, 0, n, 1, &hits, [](void* ctx, int64_t b, int64_t e) {
      auto& h = *static_cast<std::vector<std::atomic<int>>*>(ctx);
      for (int64_t i = b; i < e; ++i) h[i].fetch_add(1);
    });
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << "loop " << l;
  }
}

TEST(Team, ExceptionsReachTheCallerAndOtherChunksRun) {
  std::atomic<int> ran{0};
  EXPECT_THROW(team_parallel_for(2, 0, 16, 1, &ran,
                                 [](void* ctx, int64_t b, int64_t) {
                                   static_cast<std::atomic<int>*>(ctx)->fetch_add(1);
                                   if (b == 4) throw std::runtime_error("chunk 4 failed");
                                 }),
               std::runtime_error);
  EXPECT_EQ(ran.load(), 8);  // 2 threads x 4 chunks of 2
  // The team is usable afterwards, without a stale error.
  Coverage c(16);
  c.end = 16;
  EXPECT_NO_THROW(team_parallel_for(2, 0, 16, 1, &c, cover));
}

#ifdef __linux__
// A helper never runs its chunks on the core of the loop's caller: woken
// while every core is busy (here the caller's, and the other one by a
// spinning thread), the scheduler may place it there, where it would run
// only when the caller is preempted; it moves to a core no member holds.
struct Placement {
  std::thread::id caller;
  std::atomic<int> helper_chunks{0}, on_callers_core{0};
  int caller_cpu = -1;
};

void place(void* ctx, int64_t, int64_t) {
  auto& p = *static_cast<Placement*>(ctx);
  if (std::this_thread::get_id() != p.caller) {
    p.helper_chunks.fetch_add(1);
    if (sched_getcpu() == p.caller_cpu) p.on_callers_core.fetch_add(1);
  }
  const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(50);
  while (std::chrono::steady_clock::now() < until) {
  }
}

TEST(Team, HelpersLeaveTheCallersCore) {
  cpu_set_t all;
  CPU_ZERO(&all);
  ASSERT_EQ(sched_getaffinity(0, sizeof(all), &all), 0);
  std::vector<int> cpus;
  for (int c = 0; c < 64; ++c) {
    if (CPU_ISSET(c, &all)) cpus.push_back(c);
  }
  if (cpus.size() < 2) GTEST_SKIP() << "one core: the helpers share it with the caller";
  team_start(2);  // helpers with this thread's (unpinned) affinity
  const auto pin = [](int cpu) {
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(cpu, &one);
    return pthread_setaffinity_np(pthread_self(), sizeof(one), &one) == 0;
  };
  std::atomic<bool> stop{false};
  std::thread busy([&] {  // keeps the other core busy
    if (!pin(cpus[1])) return;
    while (!stop.load(std::memory_order_relaxed)) {
    }
  });
  ASSERT_TRUE(pin(cpus[0]));
  Placement p;
  p.caller = std::this_thread::get_id();
  p.caller_cpu = cpus[0];
  // At least 100 loops, and until the helper has run 20 chunks (on a loaded
  // machine it may get its core rarely), for at most 10 s.
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  for (int loop = 0; loop < 100 || (p.helper_chunks.load() < 20 &&
                                    std::chrono::steady_clock::now() < until);
       ++loop) {
    team_parallel_for(2, 0, 8, 1, &p, place);
    // Long enough that the helper goes to sleep and is woken by the next loop.
    std::this_thread::sleep_for(std::chrono::microseconds(300));
  }
  stop = true;
  busy.join();
  ASSERT_EQ(pthread_setaffinity_np(pthread_self(), sizeof(all), &all), 0);
  EXPECT_EQ(p.on_callers_core.load(), 0) << "of " << p.helper_chunks.load() << " helper chunks";
  EXPECT_GT(p.helper_chunks.load(), 0);
}
#endif

}  // namespace
}  // namespace axon::rt
