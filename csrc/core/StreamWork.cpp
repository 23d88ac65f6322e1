#include "StreamWork.h"

#include <atomic>
#include <memory>
#include <mutex>
#include <vector>

#include "AxonStream.h"

namespace at::axon {

// Finished work is released by the host, not by the stream worker: the last
// reference to a tensor may own its Python object, whose release takes the
// GIL, which the host may be holding while it waits for the stream.
namespace {
std::mutex finished_mutex;
std::vector<std::shared_ptr<std::function<void()>>> finished;
std::atomic<bool> have_finished{false};
}  // namespace

void releaseFinishedWork() {
  if (!have_finished.load(std::memory_order_acquire)) return;
  std::vector<std::shared_ptr<std::function<void()>>> done;
  {
    std::lock_guard<std::mutex> lock(finished_mutex);
    done.swap(finished);
    have_finished.store(false, std::memory_order_release);
  }
}

void launch(c10::DeviceIndex device, const char* name, std::function<void()> fn) {
  releaseFinishedWork();
  rt::Stream s = current_rt_stream(device);
  auto work = std::make_shared<std::function<void()>>(std::move(fn));
  rt_call([&] {
    rt::launch(s, name, [work]() mutable {
      struct Retire {
        std::shared_ptr<std::function<void()>>& w;
        ~Retire() {
          std::lock_guard<std::mutex> lock(finished_mutex);
          finished.push_back(std::move(w));
          have_finished.store(true, std::memory_order_release);
        }
      } retire{work};
      (*work)();
    });
  });
}

}  // namespace at::axon
