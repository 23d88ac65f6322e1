// ./axoncomm_bench [ranks] [MiB] [staged|shared]: all_reduce of float32
// between threads, each with its own mapping of the segment, against
// single-thread memcpy; "shared": the buffers are memfds (as device memory
// is), so the all_reduce works on them directly.
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
  std::vector<double> secs(n);
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
      std::memset(v, 0, bytes);
      SharedBuffer sb{fd, static_cast<uint64_t>(r + 1), bytes, 0};
      const SharedBuffer* sp = shared ? &sb : nullptr;
      g.all_reduce(v, bytes / es, dt, ReduceOp::kSum, 1.0, sp);
      std::vector<double> t;
      for (int i = 0; i < 5; ++i) {
        g.barrier();
        auto s = std::chrono::steady_clock::now();
        g.all_reduce(v, bytes / es, dt, ReduceOp::kSum, 1.0, sp);
        t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - s).count());
      }
      std::sort(t.begin(), t.end());
      secs[r] = t[t.size() / 2];
      g.barrier();
      munmap(v, bytes);
      close(fd);
    });
  }
  for (auto& t : ts) t.join();
  double bus = bytes * 2.0 * (n - 1) / n / secs[0];
  std::printf("%s %s all_reduce %d ranks %zu MiB: %.2f ms, bus %.2f GB/s; memcpy %.2f GB/s\n", shared ? "shared" : "staged", bf16 ? "bf16" : "fp32", n, mib,
              secs[0] * 1e3, bus / 1e9, memcpy_bandwidth(bytes, 5) / 1e9);
}
