#include "StreamWork.h"

#include <stdexcept>

#include <algorithm>
#include <atomic>
#include <omp.h>
#include <memory>
#include <mutex>
#include <vector>

#include "AxonStream.h"

namespace at::axon {

// Finished work is released by the host, not by the stream worker: the last
// reference to a tensor may own its Python object, whose release takes the
// GIL, which the host may be holding while it waits for the stream.
// Launches release it in batches (a lock and a swap per batch, not per kernel);
// synchronisations and the allocator's out-of-memory path release it all.
namespace {
constexpr size_t kReleaseBatch = 32;
std::mutex finished_mutex;
std::vector<std::unique_ptr<std::function<void()>>> finished;
std::atomic<size_t> num_finished{0};

void release_if_at_least(size_t n) {
  const size_t have = num_finished.load(std::memory_order_acquire);
  if (have == 0 || have < n) return;
  std::vector<std::unique_ptr<std::function<void()>>> done;
  {
    std::lock_guard<std::mutex> lock(finished_mutex);
    done.swap(finished);
    num_finished.store(0, std::memory_order_release);
  }
}
}  // namespace

void releaseFinishedWork() { release_if_at_least(1); }

namespace {

// The OpenMP team size of the calling stream worker for its next kernel:
// `threads`, or (0) the process default.  Set only when it changes.
void set_kernel_threads(int threads) {
  thread_local const int all = omp_get_max_threads();
  thread_local int current = all;
  const int want = threads > 0 ? std::min(threads, all) : all;
  if (want != current) {
    omp_set_num_threads(want);
    current = want;
  }
}

}  // namespace

void launch(c10::DeviceIndex device, const char* name, std::function<void()> fn, int threads) {
  release_if_at_least(kReleaseBatch);
  rt::Stream s = current_rt_stream(device);
  // The stream's task holds a plain pointer, which std::function stores
  // without another allocation; the work object itself moves to `finished`
  // once it has run.  (Work a stream drops at process exit, or a launch the
  // runtime refuses, is not freed.)
  auto* work = new std::function<void()>(std::move(fn));
  rt_call([&] {
    rt::launch(s, name, [work, threads] {
      struct Retire {
        std::function<void()>* w;
        ~Retire() {
          std::lock_guard<std::mutex> lock(finished_mutex);
          finished.emplace_back(w);
          num_finished.store(finished.size(), std::memory_order_release);
        }
      } retire{work};
      set_kernel_threads(threads);
      try {
        (*work)();
      } catch (const c10::Error& e) {
        // The runtime keeps the message for a later synchronising call; the
        // C++ backtrace of a worker thread would only bury it.
        throw std::runtime_error(e.what_without_backtrace());
      }
    });
  });
}

}  // namespace at::axon
