// ./axoncomm_bench [ranks] [MiB] [staged|shared] [bf16]: all_reduce of
// float32 (or bfloat16) between threads, each with its own mapping of the
// segment, against single-thread memcpy; "shared": the buffers are memfds (as
// device memory is), so the all_reduce works on them directly.  The data is
// not zero (all-zero buffers run measurably faster on this machine), and the
// float32 result is checked afterwards.
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "axon/comm.h"

using namespace axon::comm;

int main(int argc, char** argv) {
  int n = argc > 1 ? std::atoi(argv[1]) : 2;
  size_t mib = argc > 2 ? std::atoi(argv[2]) : 32;
  size_t bytes = mib << 20;
  bool shared = argc > 3 && std::string(argv[3]) == "shared";
  bool bf16 = argc > 4 && std::string(argv[4]) == "bf16";
  DType dt = bf16 ? DType::kBFloat16 : DType::kFloat32;
  size_t es = bf16 ? 2 : 4;
  std::string name = "axon-comm-bench-" + std::to_string(getpid());
  constexpr int kIters = 5;
  using Clock = std::chrono::steady_clock;
  // Per iteration and rank: start and end.  An iteration lasts from the first
  // rank's start to the last rank's end (a rank that leaves the barrier late
  // must not shorten it).
  std::vector<std::vector<Clock::time_point>> start(kIters, std::vector<Clock::time_point>(n)),
      end = start;
  std::vector<std::thread> ts;
  for (int r = 0; r < n; ++r) {
    ts.emplace_back([&, r] {
      if (r) std::this_thread::sleep_for(std::chrono::milliseconds(50));
      ShmGroup g(name, r, n, Config{});
      g.attach_all();
      int fd = memfd_create("bench", MFD_CLOEXEC);
      if (ftruncate(fd, static_cast<off_t>(bytes)) != 0) std::abort();
      float* v = static_cast<float*>(
          mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
      // Mantissas with every bit in use (bfloat16 reads the halves of these floats).
      for (size_t i = 0; i < bytes / 4; ++i) v[i] = static_cast<float>((i * 7 + r) % 1000) * 0.37f + 0.001f;
      SharedBuffer sb{fd, static_cast<uint64_t>(r + 1), bytes, 0};
      const SharedBuffer* sp = shared ? &sb : nullptr;
      g.all_reduce(v, bytes / es, dt, ReduceOp::kSum, 1.0, sp);
      for (int i = 0; i < kIters; ++i) {
        g.barrier();
        start[i][r] = Clock::now();
        g.all_reduce(v, bytes / es, dt, ReduceOp::kSum, 1.0, sp);
        end[i][r] = Clock::now();
      }
      // Check: rank r contributes r + 1 + i % 1013 (float32 only; a period
      // prime to the vector width and slice rounding shows a misplaced slice).
      if (!bf16) {
        for (size_t i = 0; i < bytes / es; ++i) v[i] = static_cast<float>(r + 1 + i % 1013);
        g.all_reduce(v, bytes / es, dt, ReduceOp::kSum, 1.0, sp);
        for (size_t i = 0; i < bytes / es; ++i) {
          float want = static_cast<float>(n * (n + 1) / 2 + n * (i % 1013));
          if (v[i] != want) {
            std::fprintf(stderr, "rank %d: element %zu is %g, expected %g\n", r, i, v[i], want);
            std::abort();
          }
        }
      }
      g.barrier();
      munmap(v, bytes);
      close(fd);
    });
  }
  for (auto& t : ts) t.join();
  std::vector<double> secs;
  for (int i = 0; i < kIters; ++i) {
    secs.push_back(std::chrono::duration<double>(
        *std::max_element(end[i].begin(), end[i].end()) -
        *std::min_element(start[i].begin(), start[i].end())).count());
  }
  std::sort(secs.begin(), secs.end());
  const double med = secs[secs.size() / 2];
  double bus = bytes * 2.0 * (n - 1) / n / med;
  std::printf("%s %s all_reduce %d ranks %zu MiB: %.2f ms, bus %.2f GB/s; memcpy %.2f GB/s\n", shared ? "shared" : "staged", bf16 ? "bf16" : "fp32", n, mib,
              med * 1e3, bus / 1e9, memcpy_bandwidth(bytes, 5) / 1e9);
}
