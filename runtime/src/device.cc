#include "device.h"

#include <pthread.h>

#include <chrono>
#include <mutex>
#include <vector>

#include "config.h"
#include "graph.h"

namespace axon::rt {
namespace {

// How long process exit waits for workers to finish their current task
// before detaching them.
constexpr auto kShutdownGrace = std::chrono::seconds(5);

struct Registry {
  explicit Registry(int n) : slots(n) {}
  std::mutex create_mu;
  std::vector<std::atomic<Device*>> slots;
  bool shut_down = false;  // guarded by create_mu
};

// Never destroyed, so calls from other static destructors stay valid.
Registry& registry() {
  static Registry* r = new Registry(device_count());
  return *r;
}

void shutdown_workers() {
  Registry& reg = registry();
  std::vector<StreamState*> streams;
  {
    std::lock_guard lk(reg.create_mu);
    reg.shut_down = true;
    for (auto& slot : reg.slots)
      if (Device* dev = slot.load(std::memory_order_acquire))
        for (auto& s : dev->streams) streams.push_back(s.get());
  }
  for (StreamState* s : streams) s->request_stop();
  const auto deadline = std::chrono::steady_clock::now() + kShutdownGrace;
  for (StreamState* s : streams) s->finish_stop(deadline);
}

// Stops and joins the workers when the process exits, so no thread runs
// stream work while the rest of the program is being torn down.
struct WorkerReaper {
  ~WorkerReaper() { shutdown_workers(); }
};

thread_local int t_current_device = 0;

std::atomic<bool> g_used{false};      // a device was created in this process
std::atomic<bool> g_bad_fork{false};  // we are a fork child of such a process

void mark_fork_child() { g_bad_fork.store(g_used.load()); }

}  // namespace

Device::Device(int index, size_t capacity) : index(index), capacity(capacity) {
  for (int id = 0; id < kStreamsPerDevice; ++id)
    streams[id] = std::make_unique<StreamState>(index, id);
}

Device& device(int d) {
  check_device(d);
  if (g_bad_fork.load(std::memory_order_relaxed)) {
    throw Error(
        "Cannot re-initialize axon in forked subprocess. To use axon with "
        "multiprocessing, you must use the 'spawn' start method (the device's "
        "worker threads do not survive fork()).");
  }
  Registry& reg = registry();
  if (Device* dev = reg.slots[d].load(std::memory_order_acquire)) return *dev;
  std::lock_guard lk(reg.create_mu);
  if (Device* dev = reg.slots[d].load(std::memory_order_acquire)) return *dev;
  static WorkerReaper reaper;  // armed before the first worker can exist
  static const int fork_hook = pthread_atfork(nullptr, nullptr, &mark_fork_child);
  (void)fork_hook;
  g_used.store(true);
  auto* dev = new Device(d, config().device_memory);
  if (reg.shut_down)
    for (auto& s : dev->streams) s->request_stop();
  reg.slots[d].store(dev, std::memory_order_release);
  return *dev;
}

Device* created_device(int d) noexcept {
  if (d < 0 || d >= device_count()) return nullptr;
  return registry().slots[d].load(std::memory_order_acquire);
}

int device_count() noexcept { return config().device_count; }

bool launch_blocking() noexcept { return config().launch_blocking; }

bool in_bad_fork() noexcept { return g_bad_fork.load(); }

void check_device(int d) {
  const int n = device_count();
  if (d >= 0 && d < n) return;
  if (n == 0) {
    throw InvalidDeviceError("Invalid device index: axon:" + std::to_string(d) +
                             "; no axon device is available");
  }
  throw InvalidDeviceError("Invalid device index: axon:" + std::to_string(d) +
                           "; the device count is " + std::to_string(n) +
                           " (valid indices are 0.." + std::to_string(n - 1) + ")");
}

DeviceProperties get_device_properties(int d) {
  check_device(d);
  const Config& c = config();
  return DeviceProperties{"Axon simulated device", c.device_memory, c.cores_per_device,
                          c.cores_per_device, true, c.visible[static_cast<size_t>(d)]};
}

int current_device() noexcept { return t_current_device; }

void set_device(int d) {
  check_device(d);
  t_current_device = d;
}

void device_wait(int d) {
  check_device(d);
  if (Device* dev = created_device(d))
    for (auto& s : dev->streams) s->wait_all();
}

void device_synchronize(int d) {
  check_device(d);
  check_device_not_capturing(d, "device_synchronize");
  Device* dev = created_device(d);
  if (dev == nullptr) return;
  for (auto& s : dev->streams) s->wait_all();
  // Every failure pending on any of the device's streams, reported once: the
  // first raised, the others listed; all are cleared (and marked reported on
  // each stream they were pending on).
  std::vector<PendingFailure> failures;
  uint64_t dropped = 0;
  for (auto& s : dev->streams) {
    auto mine = s->take_failures(&dropped);
    failures.insert(failures.end(), mine.begin(), mine.end());
  }
  if (!failures.empty() || dropped > 0) throw_failures(std::move(failures), "", dropped);
}

}  // namespace axon::rt
