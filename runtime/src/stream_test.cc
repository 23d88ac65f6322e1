#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <numeric>
#include <set>
#include <stdexcept>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "axon/runtime.h"
#include "test_util.h"

namespace axon::rt {
namespace {

using testing::Gate;

TEST(Stream, PoolRoundRobinsWithinPriority) {
  std::set<int64_t> normal, high;
  for (int i = 0; i < kStreamPoolSize; ++i) {
    const Stream n = stream_from_pool(1, 0);
    const Stream h = stream_from_pool(1, -1);
    EXPECT_EQ(n.device, 1);
    EXPECT_GE(n.id, 1);
    EXPECT_LE(n.id, kStreamPoolSize);
    EXPECT_GT(h.id, kStreamPoolSize);
    EXPECT_LE(h.id, 2 * kStreamPoolSize);
    EXPECT_EQ(stream_priority(n), 0);
    EXPECT_EQ(stream_priority(h), -1);
    normal.insert(n.id);
    high.insert(h.id);
  }
  EXPECT_EQ(normal.size(), size_t{kStreamPoolSize});  // each handed out once per round
  EXPECT_EQ(high.size(), size_t{kStreamPoolSize});
  EXPECT_EQ(stream_priority(Stream{1, 0}), 0);
  EXPECT_GT(stream_from_pool(1, -3).id, kStreamPoolSize);
  EXPECT_LE(stream_from_pool(1, 5).id, kStreamPoolSize);
}

TEST(Stream, DedicatedStreamsAreOutsideThePools) {
  std::set<int64_t> ids;
  for (int i = 0; i < kDedicatedStreams; ++i) {
    const Stream s = stream_dedicated(1);
    EXPECT_GT(s.id, 2 * kStreamPoolSize);
    EXPECT_EQ(stream_priority(s), 0);
    EXPECT_NO_THROW(check_stream(s));
    ids.insert(s.id);
  }
  EXPECT_EQ(ids.size(), size_t{kDedicatedStreams});  // all distinct before any repeats
  for (int i = 0; i < 2 * kStreamPoolSize; ++i) {     // the pools never hand them out
    EXPECT_EQ(ids.count(stream_from_pool(1, i % 2 ? -1 : 0).id), 0u);
  }
}

TEST(Stream, CheckStreamRejectsBadIds) {
  EXPECT_NO_THROW(check_stream(Stream{0, 0}));
  EXPECT_NO_THROW(check_stream(Stream{0, 2 * kStreamPoolSize + kDedicatedStreams - 1}));
  EXPECT_THROW(check_stream(Stream{0, 2 * kStreamPoolSize + kDedicatedStreams + 1}), Error);
  EXPECT_THROW(check_stream(Stream{0, -1}), Error);
  EXPECT_THROW(check_stream(Stream{-1, 0}), InvalidDeviceError);
  EXPECT_THROW(launch(Stream{0, 999}, "x", [] {}), Error);
  EXPECT_THROW(launch(Stream{0, 0}, "x", nullptr), Error);
}

TEST(Stream, LaunchIsAsynchronous) {
  AXON_REQUIRE_DEFAULT_ENV();
  const Stream s{0, 0};
  Gate gate;
  bool ran = false;
  launch(s, "blocked", [&] { gate.wait(); });
  launch(s, "after", [&] { ran = true; });  // returns although the stream is blocked
  EXPECT_FALSE(stream_query(s));
  gate.open();
  stream_synchronize(s);
  EXPECT_TRUE(stream_query(s));
  EXPECT_TRUE(ran);
}

TEST(Stream, UnusedStreamIsIdle) {
  EXPECT_TRUE(stream_query(Stream{2, 7}));
  EXPECT_NO_THROW(stream_synchronize(Stream{2, 7}));
}

TEST(Stream, NativeHandleIsStableAndDistinct) {
  const Stream s = stream_from_pool(1, 0), t = stream_from_pool(1, 0);
  ASSERT_NE(stream_native_handle(s), nullptr);
  EXPECT_EQ(stream_native_handle(s), stream_native_handle(s));
  EXPECT_NE(stream_native_handle(s), stream_native_handle(t));
  EXPECT_NE(stream_native_handle(Stream{1, 0}), stream_native_handle(Stream{2, 0}));
  EXPECT_THROW(stream_native_handle(Stream{99, 0}), InvalidDeviceError);
}

TEST(Stream, RunsInOrder) {
  const Stream s = stream_from_pool(0, 0);
  std::vector<int> order;  // touched only by the stream's worker until synchronized
  for (int i = 0; i < 1000; ++i) launch(s, "append", [&order, i] { order.push_back(i); });
  stream_synchronize(s);
  std::vector<int> expected(1000);
  std::iota(expected.begin(), expected.end(), 0);
  EXPECT_EQ(order, expected);
}

TEST(Stream, ConcurrentLaunchersOnOneStream) {
  const Stream s = stream_from_pool(0, -1);
  constexpr int kThreads = 4, kPerThread = 500;
  long counter = 0;  // plain: the single worker serialises the tasks
  std::vector<std::vector<int>> seen(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kPerThread; ++i)
        launch(s, "count", [&, t, i] {
          ++counter;
          seen[t].push_back(i);
        });
    });
  }
  for (auto& t : threads) t.join();
  stream_synchronize(s);
  EXPECT_EQ(counter, kThreads * kPerThread);
  for (const auto& v : seen) {  // each launcher's own order is kept
    ASSERT_EQ(v.size(), size_t{kPerThread});
    EXPECT_TRUE(std::is_sorted(v.begin(), v.end()));
  }
}

TEST(Stream, ConcurrentLaunchersOnSeveralStreams) {
  AXON_REQUIRE_DEFAULT_ENV();
  constexpr int kThreads = 4, kPerThread = 300;
  std::atomic<long> counter{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      const Stream s{t % 2, 1 + t};  // two devices, distinct streams
      for (int i = 0; i < kPerThread; ++i) launch(s, "count", [&] { ++counter; });
    });
  }
  for (auto& t : threads) t.join();
  device_synchronize(0);
  device_synchronize(1);
  EXPECT_EQ(counter.load(), kThreads * kPerThread);
}

TEST(Stream, WorkCanLaunchOntoAnotherStream) {
  const Stream a = stream_from_pool(0, 0), b{0, 0};
  Gate done;
  launch(a, "outer", [&] { launch(b, "inner", [&] { done.open(); }); });
  done.wait();
  stream_synchronize(a);
  stream_synchronize(b);
}

TEST(Stream, AsyncErrorSurfacesOnceAndStreamKeepsWorking) {
  const Stream s{3, 0};
  int later = 0;
  launch(s, "my_op", [] { throw std::runtime_error("boom"); });
  launch(s, "second_failure", [] { throw std::runtime_error("listed after the first"); });
  launch(s, "later", [&] { ++later; });
  try {
    stream_synchronize(s);
    FAIL() << "expected AsyncError";
  } catch (const AsyncError& e) {
    EXPECT_EQ(std::string(e.what()),
              "axon: asynchronous error in 'my_op' on axon:3 stream 0: boom\n"
              "1 more asynchronous error since the last synchronization:\n"
              "  axon: asynchronous error in 'second_failure' on axon:3 stream 0: listed after "
              "the first");
  }
  EXPECT_EQ(later, 1);
  EXPECT_NO_THROW(stream_synchronize(s));  // cleared
  launch(s, "again", [&] { ++later; });
  stream_synchronize(s);
  EXPECT_EQ(later, 2);
}

TEST(Stream, NonStandardExceptionIsReported) {
  const Stream s{3, 5};
  launch(s, "weird", [] { throw 42; });
  try {
    stream_synchronize(s);
    FAIL() << "expected AsyncError";
  } catch (const AsyncError& e) {
    EXPECT_EQ(std::string(e.what()),
              "axon: asynchronous error in 'weird' on axon:3 stream 5: unknown exception");
  }
}

TEST(Stream, DeviceSynchronizeReportsErrorsOfAnyStream) {
  const Stream s = stream_from_pool(4, -1);
  launch(s, "pool_op", [] { throw std::logic_error("bad"); });
  EXPECT_THROW(device_synchronize(4), AsyncError);
  EXPECT_NO_THROW(device_synchronize(4));
}

TEST(Stream, SynchronizingOwnStreamFromItsWorkIsAnError) {
  const Stream s{3, 9};
  launch(s, "self_sync", [s] { stream_synchronize(s); });
  try {
    stream_synchronize(s);
    FAIL() << "expected AsyncError";
  } catch (const AsyncError& e) {
    EXPECT_NE(std::string(e.what()).find("waits for its own stream"), std::string::npos);
  }
}

// ------------------------------------------------------------------ memcpy

std::vector<unsigned char> pattern(size_t n) {
  std::vector<unsigned char> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<unsigned char>(i * 7 + 3);
  return v;
}

TEST(Memcpy, HostToDeviceToDeviceToHostAcrossDevices) {
  AXON_REQUIRE_DEFAULT_ENV();
  constexpr size_t n = 10000;
  const auto src = pattern(n);
  std::vector<unsigned char> back(n, 0);
  void* d0 = malloc(0, n);
  void* d1 = malloc(1, n);
  memcpy(d0, src.data(), n, Stream{0, 0});          // H2D, pageable: blocking
  memcpy(d1, d0, n, stream_from_pool(1, 0));         // D2D across devices: async
  device_synchronize(1);
  memcpy(back.data(), d1, n, Stream{1, 0});          // D2H, pageable: blocking
  EXPECT_EQ(back, src);
  free(d0);
  free(d1);
}

TEST(Memcpy, OverlappingDeviceCopyWithinOneAllocation) {
  auto* d = static_cast<unsigned char*>(malloc(0, 256));
  for (int i = 0; i < 256; ++i) d[i] = static_cast<unsigned char>(i);
  memcpy(d + 1, d, 200, Stream{0, 0});
  stream_synchronize(Stream{0, 0});
  for (int i = 0; i < 200; ++i) ASSERT_EQ(d[i + 1], i);
  free(d);
}

TEST(Memcpy, PageableCopyWaitsBehindEarlierWork) {
  AXON_REQUIRE_DEFAULT_ENV();
  const Stream s = stream_from_pool(2, 0);
  void* d = malloc(2, 64);
  std::memset(d, 0, 64);
  launch(s, "fill", [d] { std::memset(d, 0x11, 64); });
  unsigned char out[64] = {};
  memcpy(out, d, 64, s);  // returns only after "fill" and the copy ran
  EXPECT_EQ(out[0], 0x11);
  EXPECT_EQ(out[63], 0x11);
  EXPECT_TRUE(stream_query(s));
  free(d);
}

TEST(Memcpy, PinnedCopyIsAsynchronous) {
  AXON_REQUIRE_DEFAULT_ENV();
  const Stream s = stream_from_pool(2, 0);
  constexpr size_t n = 512;
  const auto src = pattern(n);
  auto* pinned = static_cast<unsigned char*>(host_alloc(n));
  void* d = malloc(2, n);
  std::memcpy(d, src.data(), n);
  Gate gate;
  launch(s, "gate", [&] { gate.wait(); });
  memcpy(pinned, d, n, s);  // D2H into pinned memory returns while queued
  EXPECT_FALSE(stream_query(s));
  gate.open();
  stream_synchronize(s);
  EXPECT_EQ(std::memcmp(pinned, src.data(), n), 0);
  host_free(pinned);
  free(d);
}

TEST(Memcpy, ZeroBytesIsNoOp) {
  EXPECT_NO_THROW(memcpy(nullptr, nullptr, 0, Stream{0, 0}));
  EXPECT_THROW(memcpy(nullptr, nullptr, 0, Stream{0, 999}), Error);
  char c = 0;
  EXPECT_THROW(memcpy(&c, nullptr, 1, Stream{0, 0}), Error);
}

TEST(Memcpy, OverrunOfAnAllocationIsRejected) {
  auto* d = static_cast<char*>(malloc(0, 128));
  std::vector<char> host(512);
  EXPECT_THROW(memcpy(host.data(), d + 64, 100, Stream{0, 0}), Error);
  EXPECT_NO_THROW(memcpy(host.data(), d + 64, 64, Stream{0, 0}));
  free(d);
}

TEST(Memcpy, BlockingCopyReportsEarlierAsyncError) {
  const Stream s{5, 3};
  launch(s, "failing", [] { throw std::runtime_error("late"); });
  char a = 1, b = 0;
  EXPECT_THROW(memcpy(&b, &a, 1, s), AsyncError);
  EXPECT_EQ(b, 1);  // the copy itself still ran
  EXPECT_NO_THROW(stream_synchronize(s));
}

// ---- adaptive eager: the fusion hook sees runs of queued fusible tasks

struct TestFusible : FusibleTask {
  int id = 0;
};
std::vector<std::vector<int>> g_fused_runs;  // written by the hook (one worker)
int g_fuse_fail_at = -1;                     // id whose task "fails" in a fused run
int* g_fused_counter = nullptr;

std::vector<uint64_t> g_fused_seqs;

FusionResult test_hook(FusibleTask* const* tasks, const uint64_t* seqs, size_t n) noexcept {
  std::vector<int> ids;
  g_fused_seqs.assign(seqs, seqs + n);
  for (size_t i = 0; i < n; ++i) ids.push_back(static_cast<TestFusible*>(tasks[i])->id);
  g_fused_runs.push_back(ids);
  FusionResult r;
  // Takes at most 3 tasks; each adds its id to the counter, as its fn would.
  r.ran = std::min<size_t>(n, 3);
  for (size_t i = 0; i < r.ran; ++i) {
    if (ids[i] == g_fuse_fail_at) {
      r.failed = i;
      r.error = "fused boom";
      break;
    }
    *g_fused_counter += ids[i];
  }
  return r;
}

TEST(Fusion, HookRunsQueuedFusibleTasksAndEventsSplitRuns) {
  const Stream s{4, 0};
  std::vector<TestFusible> tags(7);
  for (int i = 0; i < 7; ++i) tags[i].id = i + 1;
  int counter = 0;
  g_fused_counter = &counter;
  g_fused_runs.clear();
  set_fusion_hook(&test_hook);
  Gate gate;
  launch(s, "gate", [&] { gate.wait(); });
  // Tasks' own fns: run only when the hook does not take them.
  for (int i = 0; i < 5; ++i) {
    launch(s, "op", [&counter, i] { counter += 100 * (i + 1); }, &tags[i]);
  }
  testing::ScopedEvent ev(4);
  event_record(ev.e, s);  // a marker: ends the run
  launch(s, "op", [&counter] { counter += 600; }, &tags[5]);
  launch(s, "op", [&counter] { counter += 700; }, &tags[6]);
  gate.open();
  stream_synchronize(s);
  set_fusion_hook(nullptr);
  // [1..5] offered: 1-3 fused, then [4, 5] fused; the marker; [6, 7] fused.
  ASSERT_EQ(g_fused_runs.size(), 3u);
  EXPECT_EQ(g_fused_runs[0], (std::vector<int>{1, 2, 3, 4, 5}));
  EXPECT_EQ(g_fused_runs[1], (std::vector<int>{4, 5}));
  EXPECT_EQ(g_fused_runs[2], (std::vector<int>{6, 7}));
  EXPECT_EQ(counter, 1 + 2 + 3 + 4 + 5 + 6 + 7);
  EXPECT_TRUE(event_query(ev.e));
  // gate 1, ops 2..6, marker 7, ops 8 and 9.
  EXPECT_EQ(g_fused_seqs, (std::vector<uint64_t>{8, 9}));
  EXPECT_EQ(stream_launched(s), 9u);
}

TEST(Fusion, FailureInAFusedRunNamesItsTask) {
  const Stream s{4, 1};
  std::vector<TestFusible> tags(3);
  for (int i = 0; i < 3; ++i) tags[i].id = i + 1;
  int counter = 0;
  g_fused_counter = &counter;
  g_fuse_fail_at = 2;
  set_fusion_hook(&test_hook);
  Gate gate;
  launch(s, "gate", [&] { gate.wait(); });
  launch(s, "first_op", [] {}, &tags[0]);
  launch(s, "second_op", [] {}, &tags[1]);
  launch(s, "third_op", [] {}, &tags[2]);
  gate.open();
  try {
    stream_synchronize(s);
    FAIL() << "expected AsyncError";
  } catch (const AsyncError& e) {
    EXPECT_EQ(std::string(e.what()),
              "axon: asynchronous error in 'second_op' on axon:4 stream 1: fused boom");
  }
  set_fusion_hook(nullptr);
  g_fuse_fail_at = -1;
  EXPECT_TRUE(stream_query(s));
}

TEST(Fusion, WithoutAHookFusibleTasksRunOneByOne) {
  const Stream s{4, 2};
  TestFusible a, b;
  int counter = 0;
  Gate gate;
  launch(s, "gate", [&] { gate.wait(); });
  launch(s, "op", [&] { counter += 1; }, &a);
  launch(s, "op", [&] { counter += 10; }, &b);
  gate.open();
  stream_synchronize(s);
  EXPECT_EQ(counter, 11);
}

namespace {
std::atomic<int> g_idle_calls{0};
std::atomic<std::thread::id> g_idle_worker{};
// Calls from the test stream's worker only (other tests' workers may go idle).
void count_idle() noexcept {
  if (std::this_thread::get_id() == g_idle_worker.load()) g_idle_calls.fetch_add(1);
}
}  // namespace

TEST(Stream, IdleHookRunsOnceWhenTheWorkerGoesToSleep) {
  const Stream s{5, 0};
  stream_synchronize(s);
  set_idle_hook(&count_idle);
  // Queued work runs back to back without the hook; idle after the last task,
  // the worker calls it once before sleeping.
  Gate gate;
  std::atomic<bool> in_gate{false};
  launch(s, "gate", [&] {
    g_idle_worker = std::this_thread::get_id();
    in_gate = true;
    gate.wait();
  });
  for (int i = 0; i < 50; ++i) launch(s, "op", [] {});
  while (!in_gate.load()) std::this_thread::yield();
  const int before = g_idle_calls.load();  // the worker waits in the gate
  gate.open();
  stream_synchronize(s);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (g_idle_calls.load() == before && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(20));  // no further calls
  set_idle_hook(nullptr);
  EXPECT_EQ(g_idle_calls.load(), before + 1);
}

}  // namespace
}  // namespace axon::rt
