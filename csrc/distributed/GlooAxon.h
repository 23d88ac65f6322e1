// ProcessGroupGlooAxon: the backend of gloo groups for device type axon
// (gloo collectives on host views of axon tensors; see GlooAxon.cpp).
#pragma once

#include <chrono>
#include <memory>
#include <vector>

#include <torch/csrc/distributed/c10d/Backend.hpp>

namespace at::axon {

class HostViews;  // one call's host views of axon tensors (GlooAxon.cpp)
class InFlight;   // unfinished gloo work and the tensors it uses (GlooAxon.cpp)

// Bound as torch_axon._C._distributed.ProcessGroupGlooAxon (Bindings.cpp).
class ProcessGroupGlooAxon : public c10d::Backend {
 public:
  explicit ProcessGroupGlooAxon(c10::intrusive_ptr<c10d::Backend> gloo);

  const std::string getBackendName() const override { return "gloo"; }
  c10::intrusive_ptr<c10d::Backend::Options> getBackendOptions() override;
  bool supportsCoalescing() const override;
  void setTimeout(std::chrono::milliseconds timeout) override;
  void setSequenceNumberForGroup() override;
  uint64_t getSequenceNumberForGroup() override;
  void startCoalescing() override;
  c10::intrusive_ptr<c10d::Work> endCoalescing() override;

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
      std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors,
                                        const c10d::ReduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(
      std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs,
                                        std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs,
                                         std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(
      at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& output_split_sizes,
                                               std::vector<int64_t>& input_split_sizes,
                                               const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs,
                                          std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst,
                                      int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src,
                                      int tag) override;
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors,
                                               int tag) override;
  // gloo's barrier involves no tensor; the device only chose this backend.
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override;
  void monitoredBarrier(const c10d::BarrierOptions& opts, bool wait_all_ranks) override;
  void abort() override;
  void shutdown() override;

  // The gloo backend this one hands the calls to.
  c10::intrusive_ptr<c10d::Backend> gloo() const { return gloo_; }

 private:
  // Waits for the current streams of the views' devices, makes the call,
  // and keeps the views until gloo has finished.
  template <typename F>
  c10::intrusive_ptr<c10d::Work> run(const std::shared_ptr<HostViews>& views, F&& call);
  void prune();
  c10::intrusive_ptr<c10d::Work> track(c10::intrusive_ptr<c10d::Work> inner,
                                       std::shared_ptr<HostViews> views);

  c10::intrusive_ptr<c10d::Backend> gloo_;
  std::shared_ptr<InFlight> in_flight_;
};

}  // namespace at::axon
