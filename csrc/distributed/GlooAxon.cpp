// ProcessGroupGlooAxon: gloo process groups on axon tensors.
//
// A "gloo" group (init_process_group("gloo"), new_group(backend="gloo")) has
// backends for the cpu and cuda device types only, so c10d finds no backend
// for a collective on axon tensors or for barrier(device_ids=[rank]) ("No
// backend type associated with device type axon").  torch_axon.distributed
// registers this backend for device type axon on such groups; it hands the
// call to the group's own gloo backend.
//
// Axon memory is host-addressable: each axon tensor travels as a host view (a
// CPU tensor over the same bytes, aten/HostView.h) once the current stream of
// its device has drained, so gloo reads what the caller's stream wrote and
// writes the results straight into device memory from its own threads.
// Work::wait() blocks the host until gloo is done (as for gloo on CPU
// tensors), so stream work the caller queues afterwards sees the results.
// The axon tensors stay referenced until gloo has finished with them (InFlight).
#include "GlooAxon.h"

#include <algorithm>
#include <mutex>
#include <set>

#include <ATen/core/ivalue.h>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include "../aten/HostView.h"
#include "../core/AxonRuntime.h"

namespace at::axon {

// The host views of one call's axon tensors, and the way back.
class HostViews {
 public:
  at::Tensor view(const at::Tensor& t) {
    if (!t.defined() || t.device().type() != kAxon) return t;
    devices_.insert(t.device().index());
    at::Tensor v = hostView(t);
    pairs_.emplace_back(v, t);
    return v;
  }
  std::vector<at::Tensor> view(const std::vector<at::Tensor>& ts) {
    std::vector<at::Tensor> out;
    out.reserve(ts.size());
    for (const auto& t : ts) out.push_back(view(t));
    return out;
  }
  std::vector<std::vector<at::Tensor>> view(const std::vector<std::vector<at::Tensor>>& tss) {
    std::vector<std::vector<at::Tensor>> out;
    out.reserve(tss.size());
    for (const auto& ts : tss) out.push_back(view(ts));
    return out;
  }

  // Waits for the current stream of every device whose tensors take part.
  void sync() const {
    for (c10::DeviceIndex d : devices_) syncCurrentStream(d);
  }

  // The axon tensor a host view stands for (other tensors unchanged).
  at::Tensor back(const at::Tensor& v) const {
    for (const auto& [host, dev] : pairs_)
      if (host.is_same(v)) return dev;
    return v;
  }
  std::vector<at::Tensor> back(const std::vector<at::Tensor>& vs) const {
    std::vector<at::Tensor> out;
    out.reserve(vs.size());
    for (const auto& v : vs) out.push_back(back(v));
    return out;
  }
  c10::IValue back(const c10::IValue& v) const {
    if (v.isTensor()) return back(v.toTensor());
    if (v.isTensorList()) {
      c10::List<at::Tensor> out;
      for (const at::Tensor& t : v.toTensorVector()) out.push_back(back(t));
      return out;
    }
    if (v.isList()) {
      auto in = v.toList();
      c10::impl::GenericList out(in.elementType());
      for (const c10::IValue& e : in) out.push_back(back(e));
      return out;
    }
    return v;
  }

 private:
  std::set<c10::DeviceIndex> devices_;
  std::vector<std::pair<at::Tensor, at::Tensor>> pairs_;  // host view, axon tensor
};

// The backend's unfinished gloo work with the host views (and so the axon
// tensors) it uses: they stay referenced until gloo has finished with them,
// even if the caller drops the Work, so the caching allocator cannot hand
// their memory to other stream work while gloo still reads or writes it.
// Finished entries are dropped whenever the backend takes a call and whenever
// a Work is waited for, so a collective's tensors are not kept after it.
class InFlight {
 public:
  void add(c10::intrusive_ptr<c10d::Work> work, std::shared_ptr<HostViews> views) {
    std::lock_guard<std::mutex> lock(mu_);
    entries_.emplace_back(std::move(work), std::move(views));
  }
  // (gloo's barrier also waits for, and rethrows the error of, every earlier
  // work still referenced: for gloo on CPU tensors only the caller holds it.)
  void prune() {
    std::vector<std::pair<c10::intrusive_ptr<c10d::Work>, std::shared_ptr<HostViews>>> done;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto finished = std::stable_partition(entries_.begin(), entries_.end(),
                                            [](const auto& p) { return !p.first->isCompleted(); });
      done.assign(std::make_move_iterator(finished), std::make_move_iterator(entries_.end()));
      entries_.erase(finished, entries_.end());
    }
    // `done` releases its tensors here, outside the lock.
  }
  void clear() {
    std::lock_guard<std::mutex> lock(mu_);
    entries_.clear();
  }

 private:
  std::mutex mu_;
  std::vector<std::pair<c10::intrusive_ptr<c10d::Work>, std::shared_ptr<HostViews>>> entries_;
};

namespace {

// gloo's Work, reporting the axon tensors instead of their host views.
class WorkGlooAxon : public c10d::Work {
 public:
  WorkGlooAxon(c10::intrusive_ptr<c10d::Work> inner, std::shared_ptr<HostViews> views,
               std::shared_ptr<InFlight> in_flight)
      : c10d::Work(-1, inner->retrieveOpType()),
        inner_(std::move(inner)),
        views_(std::move(views)),
        in_flight_(std::move(in_flight)) {}

  bool isCompleted() override { return inner_->isCompleted(); }
  bool isSuccess() const override { return inner_->isSuccess(); }
  std::exception_ptr exception() const override { return inner_->exception(); }
  int sourceRank() const override { return inner_->sourceRank(); }
  std::vector<at::Tensor> result() override { return views_->back(inner_->result()); }
  // gloo wrote device memory from its threads: once the host has waited,
  // whatever the caller queues next on any stream sees the results.
  void synchronize() override { inner_->synchronize(); }
  bool wait(std::chrono::milliseconds timeout) override {
    const bool done = inner_->wait(timeout);
    in_flight_->prune();
    return done;
  }
  void abort() override { inner_->abort(); }
  uint64_t getSequencenumber() const override { return inner_->getSequencenumber(); }
  float getDuration() const override { return inner_->getDuration(); }

  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override {
    std::lock_guard<std::mutex> lock(mu_);
    if (!future_) {
      auto inner = inner_->getFuture();
      auto fut = c10::make_intrusive<c10::ivalue::Future>(inner->elementType());
      inner->addCallback([fut, views = views_](c10::ivalue::Future& f) {
        if (f.hasError())
          fut->setError(f.exception_ptr());
        else
          fut->markCompleted(views->back(f.value()));
      });
      future_ = fut;
    }
    return future_;
  }

 private:
  c10::intrusive_ptr<c10d::Work> inner_;
  std::shared_ptr<HostViews> views_;
  std::shared_ptr<InFlight> in_flight_;
  std::mutex mu_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

}  // namespace

ProcessGroupGlooAxon::ProcessGroupGlooAxon(c10::intrusive_ptr<c10d::Backend> gloo)
    : c10d::Backend(gloo->getRank(), gloo->getSize()),
      gloo_(std::move(gloo)),
      in_flight_(std::make_shared<InFlight>()) {}

template <typename F>
c10::intrusive_ptr<c10d::Work> ProcessGroupGlooAxon::run(const std::shared_ptr<HostViews>& views,
                                                         F&& call) {
  prune();
  views->sync();
  return track(call(), views);
}

void ProcessGroupGlooAxon::prune() { in_flight_->prune(); }

c10::intrusive_ptr<c10d::Work> ProcessGroupGlooAxon::track(c10::intrusive_ptr<c10d::Work> inner,
                                                           std::shared_ptr<HostViews> views) {
  if (!inner) return inner;
  if (!inner->isCompleted()) in_flight_->add(inner, views);
  return c10::make_intrusive<WorkGlooAxon>(std::move(inner), std::move(views), in_flight_);
}

c10::intrusive_ptr<c10d::Backend::Options> ProcessGroupGlooAxon::getBackendOptions() {
  return gloo_->getBackendOptions();
}
bool ProcessGroupGlooAxon::supportsCoalescing() const { return gloo_->supportsCoalescing(); }
void ProcessGroupGlooAxon::setTimeout(std::chrono::milliseconds timeout) {
  gloo_->setTimeout(timeout);
}
void ProcessGroupGlooAxon::setSequenceNumberForGroup() { gloo_->setSequenceNumberForGroup(); }
uint64_t ProcessGroupGlooAxon::getSequenceNumberForGroup() {
  return gloo_->getSequenceNumberForGroup();
}
void ProcessGroupGlooAxon::startCoalescing() { gloo_->startCoalescing(); }
c10::intrusive_ptr<c10d::Work> ProcessGroupGlooAxon::endCoalescing() {
  prune();
  return track(gloo_->endCoalescing(), std::make_shared<HostViews>());
}

c10::intrusive_ptr<c10d::Work> ProcessGroupGlooAxon::broadcast(
    std::vector<at::Tensor>& tensors, const c10d::BroadcastOptions& opts) {
  auto v = std::make_shared<HostViews>();
  auto t = v->view(tensors);
  return run(v, [&] { return gloo_->broadcast(t, opts); });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupGlooAxon::allreduce(
    std::vector<at::Tensor>& tensors, const c10d::AllreduceOptions& opts) {
  auto v = std::make_shared<HostViews>();
  auto t = v->view(tensors);
  return run(v, [&] { return gloo_->allreduce(t, opts); });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupGlooAxon::allreduce_coalesced(
    std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) {
  auto v = std::make_shared<HostViews>();
  auto t = v->view(tensors);
  return run(v, [&] { return gloo_->allreduce_coalesced(t, opts); });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupGlooAxon::reduce(std::vector<at::Tensor>& tensors,
                                                            const c10d::ReduceOptions& opts) {
  auto v = std::make_shared<HostViews>();
  auto t = v->view(tensors);
  return run(v, [&] { return gloo_->reduce(t, opts); });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupGlooAxon::allgather(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  auto v = std::make_shared<HostViews>();
  auto o = v->view(outputs);
  auto i = v->view(inputs);
  return run(v, [&] { return gloo_->allgather(o, i, opts); });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupGlooAxon::_allgather_base(
    at::Tensor& output, at::Tensor& input, const c10d::AllgatherOptions& opts) {
  auto v = std::make_shared<HostViews>();
  auto o = v->view(output);
  auto i = v->view(input);
  return run(v, [&] { return gloo_->_allgather_base(o, i, opts); });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupGlooAxon::allgather_coalesced(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  auto v = std::make_shared<HostViews>();
  auto o = v->view(outputs);
  auto i = v->view(inputs);
  return run(v, [&] { return gloo_->allgather_coalesced(o, i, opts); });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupGlooAxon::allgather_into_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  auto v = std::make_shared<HostViews>();
  auto o = v->view(outputs);
  auto i = v->view(inputs);
  return run(v, [&] { return gloo_->allgather_into_tensor_coalesced(o, i, opts); });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupGlooAxon::gather(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::GatherOptions& opts) {
  auto v = std::make_shared<HostViews>();
  auto o = v->view(outputs);
  auto i = v->view(inputs);
  return run(v, [&] { return gloo_->gather(o, i, opts); });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupGlooAxon::scatter(
    std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
    const c10d::ScatterOptions& opts) {
  auto v = std::make_shared<HostViews>();
  auto o = v->view(outputs);
  auto i = v->view(inputs);
  return run(v, [&] { return gloo_->scatter(o, i, opts); });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupGlooAxon::reduce_scatter(
    std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
    const c10d::ReduceScatterOptions& opts) {
  auto v = std::make_shared<HostViews>();
  auto o = v->view(outputs);
  auto i = v->view(inputs);
  return run(v, [&] { return gloo_->reduce_scatter(o, i, opts); });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupGlooAxon::_reduce_scatter_base(
    at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) {
  auto v = std::make_shared<HostViews>();
  auto o = v->view(output);
  auto i = v->view(input);
  return run(v, [&] { return gloo_->_reduce_scatter_base(o, i, opts); });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupGlooAxon::reduce_scatter_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::ReduceScatterOptions& opts) {
  auto v = std::make_shared<HostViews>();
  auto o = v->view(outputs);
  auto i = v->view(inputs);
  return run(v, [&] { return gloo_->reduce_scatter_tensor_coalesced(o, i, opts); });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupGlooAxon::alltoall_base(
    at::Tensor& output, at::Tensor& input, std::vector<int64_t>& output_split_sizes,
    std::vector<int64_t>& input_split_sizes, const c10d::AllToAllOptions& opts) {
  auto v = std::make_shared<HostViews>();
  auto o = v->view(output);
  auto i = v->view(input);
  return run(v, [&] {
    return gloo_->alltoall_base(o, i, output_split_sizes, input_split_sizes, opts);
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupGlooAxon::alltoall(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllToAllOptions& opts) {
  auto v = std::make_shared<HostViews>();
  auto o = v->view(outputs);
  auto i = v->view(inputs);
  return run(v, [&] { return gloo_->alltoall(o, i, opts); });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupGlooAxon::send(std::vector<at::Tensor>& tensors,
                                                          int dst, int tag) {
  auto v = std::make_shared<HostViews>();
  auto t = v->view(tensors);
  return run(v, [&] { return gloo_->send(t, dst, tag); });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupGlooAxon::recv(std::vector<at::Tensor>& tensors,
                                                          int src, int tag) {
  auto v = std::make_shared<HostViews>();
  auto t = v->view(tensors);
  return run(v, [&] { return gloo_->recv(t, src, tag); });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupGlooAxon::recvAnysource(
    std::vector<at::Tensor>& tensors, int tag) {
  auto v = std::make_shared<HostViews>();
  auto t = v->view(tensors);
  return run(v, [&] { return gloo_->recvAnysource(t, tag); });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupGlooAxon::barrier(const c10d::BarrierOptions& opts) {
  prune();
  return track(gloo_->barrier(opts), std::make_shared<HostViews>());
}

void ProcessGroupGlooAxon::monitoredBarrier(const c10d::BarrierOptions& opts,
                                            bool wait_all_ranks) {
  gloo_->monitoredBarrier(opts, wait_all_ranks);
}

void ProcessGroupGlooAxon::abort() {
  gloo_->abort();
  in_flight_->clear();
}

void ProcessGroupGlooAxon::shutdown() {
  gloo_->shutdown();
  in_flight_->clear();
}

}  // namespace at::axon
