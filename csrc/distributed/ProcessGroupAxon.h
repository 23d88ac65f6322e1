// ProcessGroupAxon: the c10d backend "axon" (torch.distributed on axon devices).
//
// Collectives are stream work.  A call checks its arguments on the host,
// builds the collective's body (axon::comm over shared memory between the
// processes of the host, or, on a group that spans hosts, HostHierarchy's
// gloo layer: MultiHost.h) and hands it to OpRunner (OpRunner.h), which
// orders the group's communication stream after the caller's current stream,
// records the tensors' use on that stream with the caching allocator,
// enqueues the body and returns a WorkAxon (WorkAxon.h) at once.
// Work::wait() makes the caller's current stream wait for the collective, as
// NCCL's does; the host only blocks in barrier() and in an explicit
// synchronisation.  A collective that fails (a peer died or timed out) marks
// the group broken: the error surfaces at the next synchronisation of a
// stream that waited for it, and every later call on the group raises it at
// once.  Transport policy (AXON_COMM_* sizes, segment names, stale segments)
// is axon::comm's (axon/comm_config.h).  Python bindings: Bindings.cpp.
#pragma once

#include <chrono>
#include <memory>
#include <vector>

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <axon/comm.h>

#include "MultiHost.h"
#include "OpRunner.h"

namespace at::axon {

class ProcessGroupAxon : public c10d::Backend {
 public:
  // host_of[r]: the host index of global rank r (empty: one host).  With
  // several hosts, `leaders` is a gloo group of the lowest rank of each host
  // (null on other ranks) and `global` a gloo group of all ranks.
  ProcessGroupAxon(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                   std::chrono::milliseconds timeout, std::vector<int> host_of,
                   c10::intrusive_ptr<c10d::Backend> leaders,
                   c10::intrusive_ptr<c10d::Backend> global);
  ~ProcessGroupAxon() override;

  const std::string getBackendName() const override;
  bool supportsCoalescing() const override { return true; }
  void setTimeout(std::chrono::milliseconds timeout) override;

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
  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(
      std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
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
  // Blocks the host until every rank arrived (like NCCL's barrier, which
  // synchronises the device).
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override;

  void startCoalescing() override;
  c10::intrusive_ptr<c10d::Work> endCoalescing() override;

  // Test hook: whether the group spans several hosts, and this rank's host-local rank.
  bool multiHost() const { return hosts_ != nullptr; }
  int localRank() const { return topology_.local_rank; }

 private:
  // ------------------------------------------------------------ checks
  // (They also bind the group to the device of its first tensor.)
  void checkTensor(const at::Tensor& t, const char* op);
  void checkSameDtypeAndFormat(const at::Tensor& a, const at::Tensor& b, const char* op);
  at::Tensor singleTensor(std::vector<at::Tensor>& ts, const char* op);
  void checkList(const std::vector<at::Tensor>& list, const at::Tensor& like, const char* op,
                 const char* what);
  void checkRoot(int64_t root, const char* op);
  void checkPeer(int peer, const char* op);

  // ------------------------------------------------------------ running
  // The group's device once bound, else the current device.
  c10::DeviceIndex groupDevice() const;
  c10::intrusive_ptr<c10d::Work> enqueue(c10d::OpType type, const char* name,
                                         std::vector<at::Tensor> tensors,
                                         std::vector<at::Tensor> outputs, OpBody body);
  c10::intrusive_ptr<c10d::Work> enqueue(c10d::OpType type, const char* name,
                                         std::vector<at::Tensor> tensors,
                                         std::vector<at::Tensor> outputs, Op op);

  HostTopology topology_;
  std::unique_ptr<HostHierarchy> hosts_;  // null on one host
  std::shared_ptr<::axon::comm::ShmGroup> shm_;
  std::unique_ptr<OpRunner> runner_;
  c10::DeviceIndex device_ = -1;  // bound by the first tensor (checkTensor)
};

}  // namespace at::axon
