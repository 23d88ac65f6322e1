// OpRunner (see OpRunner.h).
#include "OpRunner.h"

#include <c10/core/Event.h>
#include <c10/core/StreamGuard.h>

#include "../core/AxonRuntime.h"
#include "../core/AxonStream.h"
#include "../core/CachingAllocator.h"
#include "CommTypes.h"
#include "WorkAxon.h"

namespace at::axon {
namespace {

namespace comm = ::axon::comm;

// Runs a collective's body on the transport, reporting its failure to
// `state` and (so that no rank waits for the others in vain) to every rank.
template <typename F>
void runOp(comm::ShmGroup& shm, OpState& state, std::chrono::milliseconds timeout,
           const char* name, F&& body) {
  try {
    shm.set_timeout(timeout);
    body();
  } catch (const std::exception& e) {
    std::string message = e.what();
    if (message.rfind("axon process group", 0) != 0) {
      message = std::string("axon process group: ") + name + " failed: " + message;
    }
    state.setError(message);
    // Whatever failed (the transport, or gloo between hosts), the ranks may
    // now be at different steps: the group is done for, here and for peers.
    shm.abort(message);
    throw std::runtime_error(message);
  }
}

c10::intrusive_ptr<c10::ivalue::Future> tensorListFuture(std::vector<c10::Device> devices = {}) {
  return c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()),
                                                  std::move(devices));
}

// On the communication stream, before the collective: when the work it
// waited for (the caller's stream up to `ready`: the producers of its inputs)
// failed and nobody reported that yet, its inputs are garbage.  It must not
// send them: it fails here, and the group's abort gives every other rank the
// same error instead of a result computed from them.  (Only what `ready`
// carries: a failure of other work on the communication stream, which groups
// may share, is not this collective's.)
void refuseFailedInputs(comm::ShmGroup& shm, OpState& state, const c10::Event& ready, int rank,
                        const char* name) {
  const std::string upstream = ::axon::rt::event_pending_failure(
      static_cast<::axon::rt::Event*>(ready.eventId()));
  if (upstream.empty()) return;
  const std::string message = std::string("axon process group: ") + name + " on rank " +
                              std::to_string(rank) +
                              " refused to run: the work that produced its inputs failed: " +
                              upstream;
  state.setError(message);
  shm.abort(message);
  throw std::runtime_error(message);
}

}  // namespace

OpRunner::OpRunner(int rank, std::shared_ptr<comm::ShmGroup> shm,
                   std::chrono::milliseconds timeout, size_t inline_bytes)
    : rank_(rank), shm_(std::move(shm)), timeout_(timeout), inline_bytes_(inline_bytes) {}

c10::Stream OpRunner::commStream(c10::DeviceIndex device) {
  auto it = streams_.find(device);
  if (it != streams_.end()) return it->second;
  // A stream of the group's own: a collective never queues behind another
  // group's (a 2-D mesh's groups can be entered in different orders by
  // different ranks) or behind a user's pool stream.
  c10::Stream s = to_c10(rt_call([&] { return ::axon::rt::stream_dedicated(device); }));
  streams_.emplace(device, s);
  return s;
}

c10::intrusive_ptr<c10d::Work> OpRunner::run(c10::DeviceIndex device, c10d::OpType type,
                                             const char* name, std::vector<at::Tensor> tensors,
                                             std::vector<at::Tensor> outputs, Op op) {
  if (std::string broken = shm_->broken(); !broken.empty()) {
    throwDistError(std::string("ProcessGroupAxon: cannot run ") + name +
                   ": the process group failed earlier: " + broken);
  }
  if (!op.p2p && op.body && !tensors.empty()) {
    // Byte-moving calls (broadcast, all_gather, ...) carry the dtype of
    // their tensors in the signature the ranks compare, every call their
    // memory layout.
    op.body = [tag = dtypeTag(tensors[0]), layout = layoutTag(tensors[0]),
               body = std::move(op.body)](comm::ShmGroup& g) {
      g.set_dtype_tag(tag);
      g.set_layout_tag(layout);
      body(g);
    };
  }
  if (coalescing_) {
    coalesced_.push_back(std::move(op));
    coalesced_tensors_.insert(coalesced_tensors_.end(), tensors.begin(), tensors.end());
    coalesced_outputs_.insert(coalesced_outputs_.end(), outputs.begin(), outputs.end());
    // The operation runs at endCoalescing(); its Work is that call's.
    auto state = std::make_shared<OpState>();
    c10::Event done(kAxon);
    auto future = tensorListFuture();
    future->markCompleted(c10::IValue(std::vector<at::Tensor>{}));
    return c10::make_intrusive<WorkAxon>(rank_, type, name, device, state, std::move(done),
                                         future, std::vector<at::Tensor>{});
  }
  c10::Stream current = getCurrentAxonStream(device);
  c10::Stream comm_stream = commStream(device);
  if (op.may_run_inline && !op.p2p && ::axon::rt::stream_query(to_rt(current)) &&
      ::axon::rt::stream_query(to_rt(comm_stream)) &&
      ::axon::rt::stream_pending_failure(to_rt(current)).empty()) {
    // Latency: a synchronous collective with nothing queued before it runs
    // here, on the calling thread, instead of waking the stream workers (3
    // thread switches per rank on few cores, ~150-200 us here).  Stream
    // order is kept: both streams are idle, so its inputs are final, and
    // it is done before anything queued after it.
    auto state = std::make_shared<OpState>();
    try {
      runOp(*shm_, *state, timeout_, name, [&] { op.body(*shm_); });
    } catch (const std::exception& e) {
      throwDistError(e.what());
    }
    auto future = tensorListFuture();
    future->markCompleted(c10::IValue(outputs));
    return c10::make_intrusive<WorkAxon>(rank_, type, name, device, state, c10::Event(kAxon),
                                         future, std::move(outputs), true);
  }
  // The collective runs after the work that produced its inputs.
  auto ready = std::make_shared<c10::Event>(kAxon);
  ready->record(current);
  ready->block(comm_stream);
  // Memory freed by the caller meanwhile is not reused before the collective ran.
  for (const auto& t : tensors) {
    if (t.numel() > 0) getCachingAllocator()->recordStream(t.storage().data_ptr(), comm_stream);
  }
  auto state = std::make_shared<OpState>();
  auto shm = shm_;
  auto timeout = timeout_;
  std::function<void()> task;
  const int rank = rank_;
  if (op.p2p) {
    comm::P2POp p = op.p2p_op;
    task = [shm, state, p, timeout, name, ready, rank] {
      // A receive only writes its buffer: what failed before it is not sent.
      if (p.send) refuseFailedInputs(*shm, *state, *ready, rank, name);
      runOp(*shm, *state, timeout, name, [&] { shm->send_recv_batch({p}); });
    };
  } else {
    auto body = std::move(op.body);
    task = [shm, state, body, timeout, name, ready, rank] {
      refuseFailedInputs(*shm, *state, *ready, rank, name);
      runOp(*shm, *state, timeout, name, [&] { body(*shm); });
    };
  }
  rt_call([&] { ::axon::rt::launch(to_rt(comm_stream), name, std::move(task)); });
  c10::Event end(kAxon);
  end.record(comm_stream);
  // A future completed "on the communication stream": its users' streams
  // wait for the collective (DDP's communication hooks use it).
  auto future = tensorListFuture({c10::Device(kAxon, device)});
  {
    c10::StreamGuard guard(comm_stream);
    future->markCompleted(c10::IValue(outputs));
  }
  return c10::make_intrusive<WorkAxon>(rank_, type, name, device, state, std::move(end), future,
                                       std::move(outputs));
}

void OpRunner::startCoalescing() {
  coalescing_ = true;
  coalesced_.clear();
  coalesced_tensors_.clear();
  coalesced_outputs_.clear();
}

c10::intrusive_ptr<c10d::Work> OpRunner::endCoalescing(c10::DeviceIndex device,
                                                       std::function<void()> finish) {
  coalescing_ = false;
  std::vector<Op> ops = std::move(coalesced_);
  coalesced_.clear();
  Op all{"coalesced", false, {}, [ops, finish](comm::ShmGroup& g) {
    // Consecutive point-to-point operations progress together.
    std::vector<comm::P2POp> batch;
    for (const Op& o : ops) {
      if (o.p2p) {
        batch.push_back(o.p2p_op);
        continue;
      }
      if (!batch.empty()) {
        g.send_recv_batch(batch);
        batch.clear();
      }
      o.body(g);
    }
    if (!batch.empty()) g.send_recv_batch(batch);
    if (finish) finish();
  }};
  return run(device, c10d::OpType::COALESCED, "coalesced", std::move(coalesced_tensors_),
             std::move(coalesced_outputs_), std::move(all));
}

void OpRunner::drain() {
  for (auto& [dev, stream] : streams_) {
    ::axon::rt::Event* done = nullptr;
    try {
      done = ::axon::rt::event_create(stream.device_index());
      ::axon::rt::event_record(done, to_rt(stream));
      ::axon::rt::event_wait(done);
    } catch (...) {
    }
    if (done != nullptr) ::axon::rt::event_destroy(done);
  }
}

}  // namespace at::axon
