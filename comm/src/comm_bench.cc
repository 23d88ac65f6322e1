// ./axoncomm_bench [ranks] [MiB]: all_reduce of float32 between threads, each
// with its own mapping, against single-thread memcpy.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "axon/comm.h"

using namespace axon::comm;

int main(int argc, char** argv) {
  int n = argc > 1 ? std::atoi(argv[1]) : 2;
  size_t mib = argc > 2 ? std::atoi(argv[2]) : 32;
  size_t bytes = mib << 20;
  std::string name = "axon-comm-bench-" + std::to_string(getpid());
  std::vector<double> secs(n);
  std::vector<std::thread> ts;
  for (int r = 0; r < n; ++r) {
    ts.emplace_back([&, r] {
      if (r) std::this_thread::sleep_for(std::chrono::milliseconds(50));
      ShmGroup g(name, r, n, Config{});
      g.attach_all();
      std::vector<float> v(bytes / 4, 1.0f);
      g.all_reduce(v.data(), v.size(), DType::kFloat32, ReduceOp::kSum);
      std::vector<double> t;
      for (int i = 0; i < 5; ++i) {
        g.barrier();
        auto s = std::chrono::steady_clock::now();
        g.all_reduce(v.data(), v.size(), DType::kFloat32, ReduceOp::kSum);
        t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - s).count());
      }
      std::sort(t.begin(), t.end());
      secs[r] = t[t.size() / 2];
    });
  }
  for (auto& t : ts) t.join();
  double bus = bytes * 2.0 * (n - 1) / n / secs[0];
  std::printf("all_reduce %d ranks %zu MiB: %.2f ms, bus %.2f GB/s; memcpy %.2f GB/s\n", n, mib,
              secs[0] * 1e3, bus / 1e9, memcpy_bandwidth(bytes, 5) / 1e9);
}
