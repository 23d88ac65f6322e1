#include "AxonIpc.h"

#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "AxonRuntime.h"

namespace at::axon::ipc {
namespace {

// A reference-counter slot (one per shared storage), in memory the sender
// and its receivers map (lock-free 64-bit atomics on the mapped pages):
//   [0]     handed out and not yet opened (or held by an anonymous receiver)
//   [1..7]  holders: (pid << 32) | count, one per receiving process, so that
//           a sender can tell the receivers that died without releasing.
// A receiver that finds no free holder entry stays counted in [0].
constexpr size_t kWords = 8;
constexpr size_t kSlots = 1024;  // per file (64 KiB); another file when all are taken
constexpr size_t kFileBytes = kSlots * kWords * sizeof(int64_t);
constexpr int64_t kCountMask = 0xffffffff;

int64_t load(int64_t* w) { return __atomic_load_n(w, __ATOMIC_ACQUIRE); }
void add(int64_t* w, int64_t n) { __atomic_add_fetch(w, n, __ATOMIC_ACQ_REL); }
bool cas(int64_t* w, int64_t* expected, int64_t desired) {
  return __atomic_compare_exchange_n(w, expected, desired, false, __ATOMIC_ACQ_REL,
                                     __ATOMIC_ACQUIRE);
}

bool alive(pid_t pid) { return kill(pid, 0) == 0 || errno == EPERM; }

// Whether a receiver still holds the slot's storage (or may still open it).
bool held(int64_t* slot) {
  if (load(slot) > 0) return true;
  for (size_t i = 1; i < kWords; ++i) {
    const int64_t v = load(slot + i);
    if ((v & kCountMask) != 0 && alive(static_cast<pid_t>(v >> 32))) return true;
  }
  return false;
}

// A receiver opened the storage: moves one count from [0] to its holder
// entry; returns the entry (0: none free, it stays counted in [0]).
size_t acquire(int64_t* slot) {
  const int64_t me = static_cast<int64_t>(getpid());
  for (size_t i = 1; i < kWords; ++i) {
    int64_t v = load(slot + i);
    while ((v >> 32) == me || (v & kCountMask) == 0) {
      const int64_t want = (v >> 32) == me ? v + 1 : (me << 32) | 1;
      if (cas(slot + i, &v, want)) {
        add(slot, -1);
        return i;
      }
    }
  }
  return 0;
}

// ---------------------------------------------------------------- sender

struct CounterFile {
  int fd = -1;
  uint64_t inode = 0;
  int64_t* slots = nullptr;
  std::vector<size_t> free;  // slots not in use
};

struct SentData;

struct SenderState {
  std::mutex mu;
  std::vector<std::unique_ptr<CounterFile>> files;  // kept until exit
  std::vector<SentData*> limbo;
  size_t live = 0;
};

// Never destroyed: storages may be freed by static destructors at exit.
SenderState& sender() {
  static auto* s = new SenderState;
  return *s;
}

// The context of a shared storage's data in the sender: the original data
// (the caching allocator's block) and the counter of receivers holding it.
struct SentData {
  c10::DataPtr original;
  CounterFile* file = nullptr;
  size_t slot = 0;
  int64_t* counter() const { return file->slots + slot * kWords; }
};

// Under sender().mu.
std::pair<CounterFile*, size_t> takeSlot() {
  SenderState& s = sender();
  for (auto& f : s.files) {
    if (!f->free.empty()) {
      size_t slot = f->free.back();
      f->free.pop_back();
      return {f.get(), slot};
    }
  }
  auto f = std::make_unique<CounterFile>();
  f->fd = memfd_create("axon-ipc-refcounts", MFD_CLOEXEC);
  TORCH_CHECK(f->fd >= 0, "axon: cannot share a tensor: memfd_create: ", std::strerror(errno));
  void* p = MAP_FAILED;
  struct stat st;
  if (ftruncate(f->fd, static_cast<off_t>(kFileBytes)) == 0 && fstat(f->fd, &st) == 0) {
    p = mmap(nullptr, kFileBytes, PROT_READ | PROT_WRITE, MAP_SHARED, f->fd, 0);
    f->inode = static_cast<uint64_t>(st.st_ino);
  }
  if (p == MAP_FAILED) {
    const int err = errno;
    close(f->fd);
    TORCH_CHECK(false, "axon: cannot share a tensor: reference-counter file: ", std::strerror(err));
  }
  f->slots = static_cast<int64_t*>(p);
  for (size_t i = kSlots; i-- > 1;) f->free.push_back(i);
  s.files.push_back(std::move(f));
  return {s.files.back().get(), 0};
}

// Frees a SentData (its original data goes back to the allocator).  Not
// under sender().mu: the allocator's deleter may take its own locks.
void destroy(SentData* d) {
  {
    std::lock_guard<std::mutex> lock(sender().mu);
    d->file->free.push_back(d->slot);
  }
  delete d;
}

// The deleter of a shared storage's data in the sender.
void sentDelete(void* ctx) {
  auto* d = static_cast<SentData*>(ctx);
  {
    std::lock_guard<std::mutex> lock(sender().mu);
    --sender().live;
    if (held(d->counter())) {
      sender().limbo.push_back(d);  // receivers still map it
      return;
    }
  }
  destroy(d);
}

// ---------------------------------------------------------------- receiver

// The senders' counter files mapped here, kept (64 KiB each): a receiver can
// release its count even after the sender closed or exited.
int64_t* mapCounter(int pid, int fd, uint64_t inode, size_t slot) {
  static std::mutex mu;
  static auto* files = new std::map<std::tuple<int, int, uint64_t>, int64_t*>;
  TORCH_CHECK(slot < kSlots, "axon: invalid IPC reference-counter slot ", slot);
  std::lock_guard<std::mutex> lock(mu);
  auto key = std::make_tuple(pid, fd, inode);
  auto it = files->find(key);
  if (it == files->end()) {
    int local = -1;
    std::string why;
    void* p = rt::map_process_memory(pid, fd, kFileBytes, inode, &local, &why);
    TORCH_CHECK(p != nullptr, "axon: cannot open the shared tensor of process ", pid,
                " (is it still running?): its reference counters: ", why);
    close(local);  // the mapping keeps the file
    it = files->emplace(key, static_cast<int64_t*>(p)).first;
  }
  return it->second + slot * kWords;
}

struct Received {
  void* ptr;
  int device;
  int64_t* counter;  // the slot
  size_t entry;      // its holder entry, or 0
};

void receivedDelete(void* ctx) {
  auto* r = static_cast<Received*>(ctx);
  try {
    // This process's work on the memory must be done before the sender may
    // reuse it (CUDA synchronises the current stream here).
    rt::device_wait(r->device);
  } catch (...) {  // a bad fork, or teardown: nothing ran here then
  }
  try {
    rt::memory_close(r->ptr);
  } catch (...) {  // deleters must not throw
  }
  add(r->counter + r->entry, -1);  // the count is the low bits of a holder entry
  delete r;
}

}  // namespace

Handle share(c10::StorageImpl& storage) {
  const c10::Device device = storage.device();
  TORCH_CHECK(device.type() == kAxon, "axon IPC: expected an axon storage, got ", device);
  TORCH_CHECK(storage.nbytes() > 0 && storage.data() != nullptr,
              "axon IPC: an empty storage has no memory to share");
  rt::MemoryExport ex;
  TORCH_CHECK(rt::memory_export(storage.data(), &ex),
              "Cannot share an axon tensor with another process: its memory is private to this "
              "process (device memory is private with AXON_SHAREABLE_MEMORY=0, or when the host "
              "refused shared memory for it); unset AXON_SHAREABLE_MEMORY to share axon "
              "tensors, or move the tensor to the CPU with tensor.cpu() to send it");
  // The receiver must see what was enqueued before (CUDA records an event the
  // receiver waits for; the simulated device's events do not cross processes).
  rt_call([&] { rt::device_synchronize(device.index()); });
  collect();

  Handle h;
  h.device = device.index();
  h.pid = static_cast<int>(getpid());
  h.fd = ex.fd;
  h.id = ex.id;
  h.inode = ex.inode;
  h.alloc_size = ex.size;
  h.offset = ex.offset;
  h.nbytes = storage.nbytes();

  SenderState& s = sender();
  std::lock_guard<std::mutex> lock(s.mu);
  SentData* d;
  if (storage.data_ptr().get_deleter() == &sentDelete) {
    d = static_cast<SentData*>(storage.data_ptr().get_context());  // shared before
    add(d->counter(), 1);
  } else {
    auto [file, slot] = takeSlot();
    d = new SentData;
    d->file = file;
    d->slot = slot;
    for (size_t i = 1; i < kWords; ++i) __atomic_store_n(d->counter() + i, 0, __ATOMIC_RELAXED);
    __atomic_store_n(d->counter(), 1, __ATOMIC_RELEASE);
    void* data = storage.mutable_data();
    d->original = storage.set_data_ptr(c10::DataPtr(data, d, &sentDelete, device));
    ++s.live;
  }
  h.counter_fd = d->file->fd;
  h.counter_inode = d->file->inode;
  h.counter_slot = d->slot;
  return h;
}

c10::Storage open(const Handle& h) {
  TORCH_CHECK(h.offset <= h.alloc_size && h.nbytes <= h.alloc_size - h.offset,
              "axon IPC: invalid handle (", h.nbytes, " bytes at offset ", h.offset,
              " of a ", h.alloc_size, "-byte allocation)");
  int64_t* counter = mapCounter(h.pid, h.counter_fd, h.counter_inode, h.counter_slot);
  rt::MemoryExport ex;
  ex.fd = h.fd;
  ex.id = h.id;
  ex.inode = h.inode;
  ex.size = h.alloc_size;
  ex.offset = h.offset;
  void* ptr = nullptr;
  try {
    ptr = rt_call([&] {
      try {
        return rt::memory_import(h.device, h.pid, ex);
      } catch (const rt::InvalidDeviceError& e) {
        throw rt::InvalidDeviceError(std::string(e.what()) +
                                     " (the receiving process must have the sender's device)");
      }
    });
  } catch (...) {
    add(counter, -1);  // this receiver will never hold it
    throw;
  }
  const c10::Device device(kAxon, static_cast<c10::DeviceIndex>(h.device));
  auto* r = new Received{ptr, h.device, counter, acquire(counter)};
  c10::DataPtr data(ptr, r, &receivedDelete, device);
  return c10::Storage(c10::make_intrusive<c10::StorageImpl>(
      c10::StorageImpl::use_byte_size_t(), static_cast<int64_t>(h.nbytes), std::move(data),
      /*allocator=*/nullptr, /*resizable=*/false));
}

void releaseCounter(int pid, int counter_fd, uint64_t counter_inode, size_t slot) {
  add(mapCounter(pid, counter_fd, counter_inode, slot), -1);
}

bool collect() {
  std::vector<SentData*> done;
  {
    SenderState& s = sender();
    std::lock_guard<std::mutex> lock(s.mu);
    auto keep = s.limbo.begin();
    for (SentData* d : s.limbo) {
      if (held(d->counter())) {
        *keep++ = d;
      } else {
        done.push_back(d);
      }
    }
    s.limbo.erase(keep, s.limbo.end());
  }
  for (SentData* d : done) destroy(d);
  return !done.empty();
}

SentStats sentStats() {
  std::lock_guard<std::mutex> lock(sender().mu);
  return SentStats{sender().live, sender().limbo.size()};
}

}  // namespace at::axon::ipc
