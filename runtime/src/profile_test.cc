// Task recording (the profiler's device timeline) and busy time
// (utilization): runtime.h, "profiling".
#include <algorithm>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "axon/runtime.h"
#include "test_util.h"

namespace axon::rt {
namespace {

using namespace std::chrono_literals;
using testing::Gate;

void spin_for(std::chrono::microseconds d) {
  const auto until = std::chrono::steady_clock::now() + d;
  while (std::chrono::steady_clock::now() < until) {
  }
}

// Records of one stream, in completion order.
std::vector<TaskRecord> of_stream(const std::vector<TaskRecord>& all, Stream s) {
  std::vector<TaskRecord> out;
  for (const auto& r : all)
    if (r.device == s.device && r.stream == s.id) out.push_back(r);
  return out;
}

// Turns recording on for a test and off (dropping leftovers) after it.
struct Recording {
  Recording() {
    take_task_records();
    set_task_recording(true);
  }
  ~Recording() {
    set_task_recording(false);
    set_launch_correlation(0);
    take_task_records();
  }
};

TEST(Profile, OffByDefaultRecordsNothing) {
  EXPECT_FALSE(task_recording());
  const Stream s{2, 0};
  launch(s, "k", [] {});
  stream_synchronize(s);
  EXPECT_TRUE(of_stream(take_task_records().records, s).empty());
}

TEST(Profile, RecordsKernelsAndCopiesWithStreamTimesAndLauncher) {
  Recording on;
  const Stream s{2, 3};
  void* a = malloc(2, 256);
  void* b = malloc(2, 256);
  const int64_t before = device_clock_ns();
  set_launch_correlation(41);
  launch(s, "sleepy", [] { spin_for(2000us); });
  set_launch_correlation(42);
  memcpy(b, a, 256, s);
  set_launch_correlation(0);
  launch(s, "anonymous", [] {});
  stream_synchronize(s);
  const int64_t after = device_clock_ns();
  const auto recs = of_stream(take_task_records().records, s);
  ASSERT_EQ(recs.size(), 3u);

  EXPECT_EQ(recs[0].name, "sleepy");
  EXPECT_EQ(recs[0].kind, TaskKind::kKernel);
  EXPECT_EQ(recs[0].correlation, 41u);
  EXPECT_EQ(recs[0].seq + 1, recs[1].seq);
  EXPECT_GE(recs[0].end_ns - recs[0].start_ns, 2000000);
  EXPECT_FALSE(recs[0].failed);

  EXPECT_EQ(recs[1].name, "memcpy");
  EXPECT_EQ(recs[1].kind, TaskKind::kCopy);
  EXPECT_EQ(recs[1].correlation, 42u);
  EXPECT_EQ(recs[2].correlation, 0u);
  for (const auto& r : recs) {
    EXPECT_EQ(r.device, 2);
    EXPECT_EQ(r.stream, 3);
    EXPECT_EQ(r.tasks, 1u);
    EXPECT_LE(before, r.launch_ns);
    EXPECT_LE(r.launch_ns, r.start_ns);
    EXPECT_LE(r.start_ns, r.end_ns);
    EXPECT_LE(r.end_ns, after);
  }
  // In order on the stream: each starts after the previous ended.
  EXPECT_LE(recs[0].end_ns, recs[1].start_ns);
  EXPECT_LE(recs[1].end_ns, recs[2].start_ns);
  free(a);
  free(b);
}

TEST(Profile, EachStreamIsItsOwnResourceAndMarkersAreLeftOut) {
  Recording on;
  const Stream s1{2, 4}, s2{2, 5};
  testing::ScopedEvent ev(2);
  launch(s1, "on_s1", [] { spin_for(500us); });
  event_record(ev.e, s1);
  stream_wait_event(s2, ev.e);
  launch(s2, "on_s2", [] {});
  stream_synchronize(s2);
  stream_synchronize(s1);
  const auto all = take_task_records().records;
  const auto r1 = of_stream(all, s1), r2 = of_stream(all, s2);
  ASSERT_EQ(r1.size(), 1u);
  ASSERT_EQ(r2.size(), 1u);
  EXPECT_EQ(r1[0].name, "on_s1");
  EXPECT_EQ(r2[0].name, "on_s2");
  EXPECT_LE(r1[0].end_ns, r2[0].start_ns);  // s2 waited for s1's work
}

TEST(Profile, CorrelationIsPerThreadAndFailuresAreMarked) {
  Recording on;
  const Stream s{2, 6};
  set_launch_correlation(7);
  std::thread other([&] {
    EXPECT_EQ(launch_correlation(), 0u);
    set_launch_correlation(8);
    launch(s, "from_other", [] {});
  });
  other.join();
  EXPECT_EQ(launch_correlation(), 7u);
  launch(s, "boom", [] { throw std::runtime_error("no"); });
  EXPECT_THROW(stream_synchronize(s), AsyncError);
  const auto recs = of_stream(take_task_records().records, s);
  ASSERT_EQ(recs.size(), 2u);
  EXPECT_EQ(recs[0].correlation, 8u);
  EXPECT_FALSE(recs[0].failed);
  EXPECT_EQ(recs[1].correlation, 7u);
  EXPECT_TRUE(recs[1].failed);
}

TEST(Profile, StoppingKeepsTheRunningTaskForTheNextTake) {
  Recording on;
  const Stream s{2, 7};
  Gate started, release;
  launch(s, "long", [&] {
    started.open();
    release.wait();
  });
  started.wait();
  set_task_recording(false);
  launch(s, "after_stop", [] {});
  EXPECT_TRUE(of_stream(take_task_records().records, s).empty());  // still running
  release.open();
  stream_synchronize(s);
  const auto recs = of_stream(take_task_records().records, s);
  ASSERT_EQ(recs.size(), 1u);  // started while recording; after_stop did not
  EXPECT_EQ(recs[0].name, "long");
}

struct Tag : FusibleTask {};
int g_fused_ran = 0;

FusionResult fuse_all(FusibleTask* const*, const uint64_t*, size_t n) noexcept {
  spin_for(300us);
  g_fused_ran += static_cast<int>(n);
  FusionResult r;
  r.ran = n;
  return r;
}

TEST(Profile, AFusedRunIsOneRecordNamingItsTasks) {
  AXON_REQUIRE_DEFAULT_ENV();
  Recording on;
  const Stream s{2, 8};
  Tag t1, t2, t3;
  g_fused_ran = 0;
  set_fusion_hook(&fuse_all);
  Gate gate;
  launch(s, "gate", [&] { gate.wait(); });
  set_launch_correlation(100);
  launch(s, "aten::add", [] {}, &t1);
  set_launch_correlation(101);
  launch(s, "aten::mul", [] {}, &t2);
  launch(s, "aten::relu", [] {}, &t3);
  gate.open();
  stream_synchronize(s);
  set_fusion_hook(nullptr);
  EXPECT_EQ(g_fused_ran, 3);
  const auto recs = of_stream(take_task_records().records, s);
  ASSERT_EQ(recs.size(), 2u);
  EXPECT_EQ(recs[0].name, "gate");
  EXPECT_EQ(recs[1].kind, TaskKind::kFused);
  EXPECT_EQ(recs[1].name, "fused: aten::add, aten::mul, aten::relu");
  EXPECT_EQ(recs[1].tasks, 3u);
  EXPECT_EQ(recs[1].seq, recs[0].seq + 1);
  EXPECT_EQ(recs[1].correlation, 100u);  // its first task's
  EXPECT_GE(recs[1].end_ns - recs[1].start_ns, 300000);
}

// ---- busy time and utilization (always counted, recording or not)

// The coarse clock ticks every few ms: allow a few ticks.
constexpr int64_t kSlackNs = 12 * 1000000;

TEST(Busy, CountsTheTimeAnyStreamRanATaskOnce) {
  const int d = 5;
  const DeviceBusy b0 = device_busy(d);
  const Stream s1{d, 1}, s2{d, 2};
  // Two streams busy for the same 200 ms: 200 ms of busy device, not 400.
  Gate go;
  launch(s1, "a", [&] { go.wait(); spin_for(200ms); });
  launch(s2, "b", [&] { go.wait(); spin_for(200ms); });
  go.open();
  stream_synchronize(s1);
  stream_synchronize(s2);
  const DeviceBusy b1 = device_busy(d);
  const int64_t busy = b1.busy_ns - b0.busy_ns;
  EXPECT_GE(busy, 200 * 1000000 - kSlackNs);
  // Overlapping: not 400 ms (a loaded host may start one of them late).
  EXPECT_LE(busy, 320 * 1000000 + kSlackNs);
  EXPECT_GE(b1.clock_ns - b0.clock_ns, busy - kSlackNs);
  // Markers are not work: a stream waiting on an event is not busy.
  testing::ScopedEvent ev(d);
  Gate hold;
  launch(s1, "hold", [&] { hold.wait(); });
  event_record(ev.e, s1);
  stream_wait_event(s2, ev.e);
  std::this_thread::sleep_for(100ms);  // s1 busy (waiting in a task), s2 waits
  hold.open();
  stream_synchronize(s2);
  const int64_t during = device_busy(d).busy_ns - b1.busy_ns;
  EXPECT_GE(during, 100 * 1000000 - kSlackNs);
  EXPECT_LE(during, 200 * 1000000 + kSlackNs);
}

TEST(Busy, UtilizationIsHighWhileBusyAndLowWhenIdle) {
  const int d = 7;
  const Stream s{d, 9};
  // Counting starts with the first call (it reports nothing yet).
  EXPECT_LE(device_utilization(d), 100);
  // 1.2 s of back-to-back 1 ms kernels.
  for (int i = 0; i < 1200; ++i) launch(s, "k", [] { spin_for(1000us); });
  stream_synchronize(s);
  const int busy = device_utilization(d);
  EXPECT_GE(busy, 85);
  EXPECT_LE(busy, 100);
  std::this_thread::sleep_for(1200ms);
  EXPECT_LE(device_utilization(d), 5);
  // Half busy: 100 ms kernels with 100 ms pauses for 1.2 s.
  for (int i = 0; i < 6; ++i) {
    launch(s, "k", [] { spin_for(100ms); });
    stream_synchronize(s);
    std::this_thread::sleep_for(100ms);
  }
  const int half = device_utilization(d);
  EXPECT_GE(half, 35);
  EXPECT_LE(half, 65);
}

TEST(Busy, InvalidDevice) {
  EXPECT_THROW(device_utilization(-1), InvalidDeviceError);
  EXPECT_THROW(device_busy(device_count()), InvalidDeviceError);
}

}  // namespace
}  // namespace axon::rt
