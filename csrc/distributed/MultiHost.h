// The hosts of a ProcessGroupAxon and the collectives between them.
//
// HostTopology: which global ranks share this host (and its shared-memory
// transport).  HostHierarchy, on groups that span several hosts: all_reduce,
// broadcast and barrier are hierarchical (shared memory within the host, gloo
// between the hosts' leaders, the lowest rank of each host, on CPU views of
// the device buffers: device memory is host-addressable); the other
// collectives run on a gloo group over all ranks.  Its methods build the
// collectives' bodies (OpBody), which ProcessGroupAxon runs on its
// communication stream like the shared-memory ones; they take arguments
// ProcessGroupAxon has checked already.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include <ATen/core/Tensor.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>

#include "CommTypes.h"
#include "OpRunner.h"

namespace at::axon {

struct HostTopology {
  // host_of[r]: the host index of global rank r (empty: all on one host).
  HostTopology(int rank, int size, std::vector<int> host_of);

  // The rank in the leaders' group of the leader of `rank`'s host (hosts are
  // ordered by their lowest rank, as the Python side creates that group).
  int leaderIndexOf(int rank) const { return host_order.at(host_of.at(rank)); }

  std::vector<int> host_of;
  std::map<int, int> host_order;  // host index -> its position by lowest rank
  std::vector<int> local_ranks;   // the global ranks on this host
  int local_rank = 0;             // this rank's position in local_ranks
  bool multi_host = false;
};

class HostHierarchy {
 public:
  // leaders: a gloo group of the hosts' leaders (null on other ranks);
  // global: a gloo group of all ranks.
  HostHierarchy(const HostTopology& topology, int rank, int size,
                c10::intrusive_ptr<c10d::Backend> leaders,
                c10::intrusive_ptr<c10d::Backend> global);

  // Hierarchical: shared memory within the host, gloo between the leaders.
  OpBody broadcast(const at::Tensor& t, int root) const;
  OpBody allreduce(const at::Tensor& t, const Reduction& r, const c10d::ReduceOp& reduce_op) const;
  OpBody barrier() const;

  // gloo over all ranks, on CPU views.
  OpBody allreduceCoalesced(const std::vector<at::Tensor>& tensors,
                            const c10d::ReduceOp& reduce_op) const;
  OpBody reduce(const at::Tensor& t, const c10d::ReduceOptions& opts) const;
  OpBody allgather(const std::vector<at::Tensor>& outputs, const at::Tensor& input) const;
  OpBody allgatherBase(const at::Tensor& output, const at::Tensor& input) const;
  OpBody allgatherIntoTensorCoalesced(const std::vector<at::Tensor>& outputs,
                                      const std::vector<at::Tensor>& inputs) const;
  OpBody allgatherCoalesced(const std::vector<std::vector<at::Tensor>>& outputs,
                            const std::vector<at::Tensor>& inputs) const;
  OpBody gather(const std::vector<std::vector<at::Tensor>>& outputs, const at::Tensor& input,
                const c10d::GatherOptions& opts) const;
  OpBody scatter(const at::Tensor& output, const std::vector<std::vector<at::Tensor>>& inputs,
                 const c10d::ScatterOptions& opts) const;
  OpBody reduceScatter(const at::Tensor& output, const std::vector<at::Tensor>& inputs,
                       const c10d::ReduceOp& reduce_op) const;
  OpBody reduceScatterBase(const at::Tensor& output, const at::Tensor& input,
                           const c10d::ReduceOp& reduce_op) const;
  OpBody reduceScatterTensorCoalesced(const std::vector<at::Tensor>& outputs,
                                      const std::vector<at::Tensor>& inputs,
                                      const c10d::ReduceOp& reduce_op) const;
  OpBody alltoallBase(const at::Tensor& output, const at::Tensor& input,
                      const std::vector<int64_t>& output_split_sizes,
                      const std::vector<int64_t>& input_split_sizes) const;
  OpBody alltoall(const std::vector<at::Tensor>& outputs,
                  const std::vector<at::Tensor>& inputs) const;
  // A send is posted without waiting for the receiver; a receive inside a
  // coalesced batch is waited for at the batch's end.
  // `body` preceded by a comparison of the call's signature across all ranks
  // (a gloo all_gather of a few numbers): ranks that called different
  // collectives (kind, dtype, size, reduction, root) all get the same
  // "do not match" error instead of wrong data, a hang or gloo aborting the
  // process; on one host the shared-memory group compares them.
  OpBody checked(std::vector<int64_t> signature, OpBody body) const;

  OpBody send(const at::Tensor& t, int dst) const;
  OpBody recv(const at::Tensor& t, int src) const;

  // Coalescing: receives posted from startCoalescing() on are waited for by
  // the function endCoalescing() returns (run at the end of the batch).
  void startCoalescing();
  std::function<void()> endCoalescing();

  // Waits for the sends still in flight (the group is going).
  void waitForSends();

 private:
  // gloo has no AVG or PREMUL_SUM: SUM, then scale by the returned factor
  // (NaN: none).
  std::pair<c10d::ReduceOp, double> glooReduce(const c10d::ReduceOp& reduce_op,
                                               const at::Tensor& t) const;
  // Runs fn on the gloo group of all ranks and waits for the Work it returns
  // (fn returns null when it waited itself to post-process).
  OpBody onGlobal(std::function<c10::intrusive_ptr<c10d::Work>(c10d::Backend&)> fn) const;

  int rank_, size_;
  HostTopology topology_;
  c10::intrusive_ptr<c10d::Backend> leaders_, global_;
  // gloo receives posted inside a coalesced batch, waited for at its end.
  std::shared_ptr<std::vector<c10::intrusive_ptr<c10d::Work>>> pending_recvs_;
  // gloo sends in flight and their data.
  struct Sends {
    std::mutex mu;
    std::vector<std::pair<c10::intrusive_ptr<c10d::Work>, at::Tensor>> works;
  };
  std::shared_ptr<Sends> sends_ = std::make_shared<Sends>();
};

}  // namespace at::axon
