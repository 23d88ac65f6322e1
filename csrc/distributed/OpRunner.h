// OpRunner: how ProcessGroupAxon's collectives run.  Each group has one
// communication stream per device (its own: a collective never queues behind
// another group's or a user's stream).  run() orders that stream after the
// caller's current stream, records the tensors' use on it with the caching
// allocator, queues the collective's body (an Op) as stream work and returns
// a WorkAxon; a synchronous collective with both streams idle runs on the
// calling thread instead.  Between startCoalescing() and endCoalescing() the
// Ops are collected and run as one stream task.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/Stream.h>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <axon/comm.h>

namespace at::axon {

// The body of a collective: what runs on the communication stream (or the
// calling thread) with the group's transport.
using OpBody = std::function<void(::axon::comm::ShmGroup&)>;

// A collective as queued while coalescing, or run at once.
struct Op {
  const char* name;
  bool p2p = false;
  ::axon::comm::P2POp p2p_op{};  // p2p: a send or a recv, batched with its neighbours
  OpBody body;
  // A collective the caller does not run asynchronously, up to the group's
  // inline limit (see OpRunner::syncInline): when both streams are idle it
  // runs on the calling thread.
  bool may_run_inline = false;
};

class OpRunner {
 public:
  // inline_bytes: the largest synchronous collective that may run on the
  // calling thread (axon::comm::inline_bytes).
  OpRunner(int rank, std::shared_ptr<::axon::comm::ShmGroup> shm,
           std::chrono::milliseconds timeout, size_t inline_bytes);

  void setTimeout(std::chrono::milliseconds timeout) { timeout_ = timeout; }
  ::axon::comm::ShmGroup& transport() const { return *shm_; }

  // Whether a collective of `bytes` may run on the calling thread.
  bool syncInline(bool async_op, size_t bytes) const {
    return !async_op && bytes <= inline_bytes_;
  }

  // Runs `op` on device's communication stream after the caller's current
  // stream (`tensors`: every tensor it reads or writes; `outputs`: its
  // result).  Raises at once if the group failed earlier.
  c10::intrusive_ptr<c10d::Work> run(c10::DeviceIndex device, c10d::OpType type,
                                     const char* name, std::vector<at::Tensor> tensors,
                                     std::vector<at::Tensor> outputs, Op op);

  bool coalescing() const { return coalescing_; }
  void startCoalescing();
  // Runs the Ops collected since startCoalescing() as one, then `finish`
  // (may be empty) on the same stream task.
  c10::intrusive_ptr<c10d::Work> endCoalescing(c10::DeviceIndex device,
                                               std::function<void()> finish);

  // Waits for the stream work queued so far, without consuming its errors.
  void drain();

 private:
  c10::Stream commStream(c10::DeviceIndex device);

  int rank_;
  std::shared_ptr<::axon::comm::ShmGroup> shm_;
  std::chrono::milliseconds timeout_;
  size_t inline_bytes_;
  std::map<c10::DeviceIndex, c10::Stream> streams_;
  bool coalescing_ = false;
  std::vector<Op> coalesced_;
  std::vector<at::Tensor> coalesced_tensors_, coalesced_outputs_;
};

}  // namespace at::axon
