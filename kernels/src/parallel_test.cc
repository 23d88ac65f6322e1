#include <atomic>
#include <thread>
#include <vector>

#include "axon/kernels/parallel.h"
#include "test_util.h"

namespace axon::kernels {
namespace {

std::atomic<int> g_backend_calls{0};

void counting_backend(int64_t begin, int64_t end, int64_t grain, void* ctx, ParallelBody body) {
  ++g_backend_calls;
  testing::ThreadBackend::run(begin, end, grain, ctx, body);
}

TEST(ParallelFor, SerialByDefault) {
  set_parallel_backend(nullptr);
  std::vector<std::pair<int64_t, int64_t>> chunks;
  const std::thread::id caller = std::this_thread::get_id();
  parallel_for(3, 1000, 10, [&](int64_t b, int64_t e) {
    EXPECT_EQ(std::this_thread::get_id(), caller);
    chunks.emplace_back(b, e);
  });
  EXPECT_EQ(chunks, (std::vector<std::pair<int64_t, int64_t>>{{3, 1000}}));
}

TEST(ParallelFor, EmptyRangeRunsNothing) {
  int calls = 0;
  parallel_for(5, 5, 1, [&](int64_t, int64_t) { ++calls; });
  parallel_for(5, 2, 1, [&](int64_t, int64_t) { ++calls; });
  EXPECT_EQ(calls, 0);
}

TEST(ParallelFor, UsesTheInstalledBackendAndCoversTheRangeOnce) {
  set_parallel_backend(&counting_backend);
  g_backend_calls = 0;
  std::vector<std::atomic<int>> hits(1000);
  parallel_for(0, 1000, 7, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) ++hits[i];
  });
  EXPECT_EQ(g_backend_calls, 1);
  for (const auto& h : hits) EXPECT_EQ(h, 1);
  // A range no longer than the grain runs inline.
  parallel_for(0, 7, 7, [&](int64_t, int64_t) {});
  EXPECT_EQ(g_backend_calls, 1);
  set_parallel_backend(nullptr);
  parallel_for(0, 1000, 7, [&](int64_t, int64_t) {});
  EXPECT_EQ(g_backend_calls, 1);
}

}  // namespace
}  // namespace axon::kernels
