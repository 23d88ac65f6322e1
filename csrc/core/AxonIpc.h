// Sharing axon storages between the processes of a host (torch.multiprocessing),
// as CUDA IPC does (torch/csrc/CudaIPCTypes.h, StorageSharing.cpp).
//
// The sender exports the allocation holding a storage (rt::memory_export: a
// memfd) and hands out a Handle; the receiver maps the same pages
// (rt::memory_import) as a storage of its own on the same device index.  Keep
// alive: each shared storage gets a slot in a reference-counter file (a memfd
// the receivers map too).  The slot counts the handles handed out and not yet
// opened, and per receiving process (by pid) the storages it holds; the
// sender's storage data is wrapped so that, when the sender drops it while a
// receiver may still use it, the block waits in a "limbo" list instead of
// returning to the caching allocator.  A receiver's storage deleter waits for
// its device's work, unmaps and decrements its count; collect()
// (torch.axon.ipc_collect, also run at each share) frees the limbo blocks
// that no living receiver holds: released, or held by a process that died.
// A handle never opened (its message lost, or its receiver died before
// unpickling it) keeps its block until the sender exits, as with CUDA.
#pragma once

#include <c10/core/Storage.h>

#include <cstddef>
#include <cstdint>

namespace at::axon::ipc {

struct Handle {
  int device = 0;
  int pid = 0;              // the process that exported the allocation
  int fd = -1;              // its memfd there
  uint64_t id = 0;          // the allocation's id there
  uint64_t inode = 0;       // the memfd's inode
  size_t alloc_size = 0;    // bytes of the allocation
  size_t offset = 0;        // of the storage's data in it
  size_t nbytes = 0;        // of the storage
  int counter_fd = -1;      // the reference-counter file (a memfd of the sender)
  uint64_t counter_inode = 0;
  size_t counter_slot = 0;  // int64 slot in it
};

// Sender: synchronises the storage's device (its writes are then visible to
// the receiver), wraps the storage's data for keep-alive, and adds one
// expected receiver to its counter.  Errors (TORCH_CHECK) for private memory
// (AXON_SHAREABLE_MEMORY=0) and empty storages.
Handle share(c10::StorageImpl& storage);

// Receiver: a storage of this process on h.device mapping the sender's
// memory; not resizable.  Its deleter waits for the device, unmaps, and
// releases the counter.
c10::Storage open(const Handle& h);

// Receiver that already holds the storage (its cache): gives the sender's
// new count back at once.
void releaseCounter(int pid, int counter_fd, uint64_t counter_inode, size_t slot);

// Sender: frees the limbo blocks no living receiver holds; true if any.
bool collect();

struct SentStats {
  size_t live = 0;   // shared storages the sender still holds
  size_t limbo = 0;  // dropped by the sender, waiting for receivers
};
SentStats sentStats();

}  // namespace at::axon::ipc
