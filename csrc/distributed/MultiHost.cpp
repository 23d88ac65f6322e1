// The hosts of a ProcessGroupAxon and the collectives between them (see
// MultiHost.h).
#include "MultiHost.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>

namespace at::axon {
namespace {

namespace comm = ::axon::comm;
using WorkPtr = c10::intrusive_ptr<c10d::Work>;

// t *= factor in place (NaN: nothing to scale).
void scaleBy(const at::Tensor& t, double factor) {
  if (std::isnan(factor) || t.numel() == 0) return;
  comm::DType dt = toCommDType(t.scalar_type(), "scale");
  const void* src = t.data_ptr();
  comm::reduce(dt, comm::ReduceOp::kPremulSum, t.data_ptr(), &src, 1, commCount(t), factor);
}

// gloo's reduce_scatter_tensor(_coalesced) in torch 2.13 always sums (it
// drops the op); this is what it does, with the op.
void reduceScatterViaAllreduce(c10d::Backend& g, at::Tensor& out, const at::Tensor& in,
                               const c10d::ReduceOp& op, int rank, int size) {
  std::vector<at::Tensor> buf = {in.clone()};
  c10d::AllreduceOptions ao;
  ao.reduceOp = op;
  g.allreduce(buf, ao)->wait();
  out.copy_(buf[0].chunk(size)[rank]);
}

std::vector<std::vector<at::Tensor>> cpuViewLists(const std::vector<std::vector<at::Tensor>>& ls) {
  std::vector<std::vector<at::Tensor>> out;
  for (const auto& l : ls) out.push_back(cpuViews(l));
  return out;
}

}  // namespace

// ---------------------------------------------------------------- topology

HostTopology::HostTopology(int rank, int size, std::vector<int> hosts) {
  if (hosts.empty()) hosts.assign(size, 0);
  TORCH_CHECK(static_cast<int>(hosts.size()) == size,
              "ProcessGroupAxon: host_of must have one entry per rank");
  const int my_host = hosts[rank];
  host_of = hosts;
  std::vector<int> firsts;  // hosts in the order of their lowest rank
  for (int r = 0; r < size; ++r) {
    if (std::find(firsts.begin(), firsts.end(), hosts[r]) == firsts.end()) {
      firsts.push_back(hosts[r]);
    }
  }
  for (size_t i = 0; i < firsts.size(); ++i) host_order[firsts[i]] = static_cast<int>(i);
  for (int r = 0; r < size; ++r) {
    if (hosts[r] == my_host) local_ranks.push_back(r);
    if (hosts[r] != my_host) multi_host = true;
  }
  local_rank = static_cast<int>(std::find(local_ranks.begin(), local_ranks.end(), rank) -
                                local_ranks.begin());
}

// ---------------------------------------------------------------- hierarchy

HostHierarchy::HostHierarchy(const HostTopology& topology, int rank, int size,
                             c10::intrusive_ptr<c10d::Backend> leaders,
                             c10::intrusive_ptr<c10d::Backend> global)
    : rank_(rank), size_(size), topology_(topology) {
  TORCH_CHECK(global, "ProcessGroupAxon: ranks on several hosts need a gloo group");
  TORCH_CHECK(topology.local_rank != 0 || leaders,
              "ProcessGroupAxon: host leaders need a gloo group");
  leaders_ = std::move(leaders);
  global_ = std::move(global);
}

OpBody HostHierarchy::broadcast(const at::Tensor& t, int root) const {
  // The root's host: a host broadcast from the root (its leader gets it);
  // leaders: gloo broadcast from the root host's leader; other hosts: a host
  // broadcast from their leader.
  const auto& local = topology_.local_ranks;
  auto it = std::find(local.begin(), local.end(), root);
  bool root_host = it != local.end();
  int local_root = root_host ? static_cast<int>(it - local.begin()) : 0;
  int root_leader_index = topology_.leaderIndexOf(root);
  auto leaders = leaders_;
  at::Tensor view = cpuView(t);
  std::optional<comm::SharedBuffer> shared = sharedBuffer(t);
  char* p = dataPtr(t);
  size_t n = byteCount(t);
  return [=](comm::ShmGroup& g) mutable {
    const comm::SharedBuffer* sp = shared ? &*shared : nullptr;
    if (root_host) g.broadcast(p, n, local_root, sp);
    if (g.rank() == 0) {
      std::vector<at::Tensor> v = {view};
      c10d::BroadcastOptions b;
      b.rootRank = root_leader_index;
      leaders->broadcast(v, b)->wait();
    }
    if (!root_host) g.broadcast(p, n, 0, sp);
  };
}

OpBody HostHierarchy::allreduce(const at::Tensor& t, const Reduction& r,
                                const c10d::ReduceOp& reduce_op) const {
  // Host sum at the leader, leaders' all_reduce over gloo, host broadcast.
  bool scaled = r.op == comm::ReduceOp::kAvg || r.op == comm::ReduceOp::kPremulSum;
  comm::ReduceOp local = scaled ? comm::ReduceOp::kSum : r.op;
  double factor = r.op == comm::ReduceOp::kAvg ? 1.0 / size_ : r.factor;
  c10d::AllreduceOptions gopts;
  gopts.reduceOp = scaled ? c10d::ReduceOp(c10d::ReduceOp::SUM) : reduce_op;
  comm::DType dt = toCommDType(t.scalar_type(), "all_reduce");
  char* p = dataPtr(t);
  size_t n = commCount(t);
  auto leaders = leaders_;
  at::Tensor view = cpuView(t);
  size_t bytes = byteCount(t);
  std::optional<comm::SharedBuffer> shared = sharedBuffer(t);
  return [=](comm::ShmGroup& g) mutable {
    g.reduce(p, n, dt, local, 0);
    if (g.rank() == 0) {
      std::vector<at::Tensor> v = {view};
      leaders->allreduce(v, gopts)->wait();
      if (scaled) {
        const void* src = p;
        comm::reduce(dt, comm::ReduceOp::kPremulSum, p, &src, 1, n, factor);
      }
    }
    g.broadcast(p, bytes, 0, shared ? &*shared : nullptr);
  };
}

OpBody HostHierarchy::barrier() const {
  auto leaders = leaders_;
  return [leaders](comm::ShmGroup& g) {
    g.barrier();
    if (g.rank() == 0) leaders->barrier()->wait();
    g.barrier();
  };
}

std::pair<c10d::ReduceOp, double> HostHierarchy::glooReduce(const c10d::ReduceOp& reduce_op,
                                                            const at::Tensor& t) const {
  Reduction r = toCommReduction(reduce_op, t, "reduction");
  if (r.op == comm::ReduceOp::kAvg) return {c10d::ReduceOp(c10d::ReduceOp::SUM), 1.0 / size_};
  if (r.op == comm::ReduceOp::kPremulSum) return {c10d::ReduceOp(c10d::ReduceOp::SUM), r.factor};
  return {reduce_op, std::numeric_limits<double>::quiet_NaN()};
}

OpBody HostHierarchy::checked(std::vector<int64_t> signature, OpBody body) const {
  auto global = global_;
  const int size = size_;
  return [global, size, signature = std::move(signature), body = std::move(body)](
             comm::ShmGroup& g) {
    const int64_t len = static_cast<int64_t>(signature.size());
    at::Tensor mine = at::empty({len}, at::TensorOptions().dtype(at::kLong));
    std::copy(signature.begin(), signature.end(), mine.data_ptr<int64_t>());
    std::vector<at::Tensor> all;
    for (int r = 0; r < size; ++r) all.push_back(at::empty({len}, mine.options()));
    std::vector<std::vector<at::Tensor>> outputs = {all};
    std::vector<at::Tensor> inputs = {mine};
    global->allgather(outputs, inputs)->wait();
    // [op type, dtype, elements, reduction, root, layout tag]; -1: not compared
    auto describe = [](const int64_t* s) {
      std::string d = c10d::opTypeToString(static_cast<c10d::OpType>(s[0]));
      if (s[1] >= 0) d += std::string(" of ") + comm::dtype_name(static_cast<comm::DType>(s[1]));
      if (s[2] >= 0) d += ", " + std::to_string(s[2]) + " elements";
      static const char* const kOps[] = {"SUM", "AVG", "PRODUCT", "MIN", "MAX",
                                         "BAND", "BOR", "BXOR", "PREMUL_SUM"};
      if (s[3] >= 0) d += std::string(", ") + (s[3] < 9 ? kOps[s[3]] : "reduction");
      if (s[4] >= 0) d += ", root " + std::to_string(s[4]);
      if (s[5] > 0) d += ", " + comm::ShmGroup::layout_name(static_cast<int32_t>(s[5]));
      return d;
    };
    const int64_t* first = outputs[0][0].data_ptr<int64_t>();
    for (int r = 1; r < size; ++r) {
      const int64_t* other = outputs[0][r].data_ptr<int64_t>();
      if (!std::equal(first, first + len, other)) {
        throw std::runtime_error(
            "ProcessGroupAxon: collectives do not match across ranks: rank 0 called " +
            describe(first) + " but rank " + std::to_string(r) + " called " + describe(other) +
            " (every rank must call the same collectives in the same order, with the same "
            "sizes, dtypes, memory formats, ops and roots)");
      }
    }
    body(g);
  };
}

OpBody HostHierarchy::onGlobal(std::function<WorkPtr(c10d::Backend&)> fn) const {
  auto global = global_;
  return [global, fn](comm::ShmGroup&) {
    // fn waits itself when it post-processes (returns null).
    if (auto w = fn(*global)) w->wait();
  };
}

OpBody HostHierarchy::allreduceCoalesced(const std::vector<at::Tensor>& tensors,
                                         const c10d::ReduceOp& reduce_op) const {
  auto [gop, factor] = glooReduce(reduce_op, tensors[0]);
  c10d::AllreduceCoalescedOptions o;
  o.reduceOp = gop;
  return onGlobal([v = cpuViews(tensors), o, factor](c10d::Backend& g) mutable {
    auto w = g.allreduce_coalesced(v, o);
    w->wait();
    for (auto& t : v) scaleBy(t, factor);
    return WorkPtr();
  });
}

OpBody HostHierarchy::reduce(const at::Tensor& t, const c10d::ReduceOptions& opts) const {
  auto [gop, factor] = glooReduce(opts.reduceOp, t);
  c10d::ReduceOptions o = opts;
  o.reduceOp = gop;
  bool is_root = rank_ == static_cast<int>(opts.rootRank);
  return onGlobal([v = cpuViews({t}), o, factor, is_root](c10d::Backend& g) mutable {
    // On a copy: gloo uses non-root buffers as scratch, NCCL (and the
    // shared-memory path) leave them alone.
    std::vector<at::Tensor> buf = {v[0].clone()};
    g.reduce(buf, o)->wait();
    if (is_root) {
      v[0].copy_(buf[0]);
      scaleBy(v[0], factor);
    }
    return WorkPtr();
  });
}

OpBody HostHierarchy::allgather(const std::vector<at::Tensor>& outputs,
                                const at::Tensor& input) const {
  std::vector<std::vector<at::Tensor>> vo = {cpuViews(outputs)};
  return onGlobal([vo, vi = cpuViews({input})](c10d::Backend& g) mutable {
    return g.allgather(vo, vi);
  });
}

OpBody HostHierarchy::allgatherBase(const at::Tensor& output, const at::Tensor& input) const {
  return onGlobal([vo = cpuView(output), vi = cpuView(input)](c10d::Backend& g) mutable {
    return g._allgather_base(vo, vi);
  });
}

OpBody HostHierarchy::allgatherIntoTensorCoalesced(const std::vector<at::Tensor>& outputs,
                                                   const std::vector<at::Tensor>& inputs) const {
  return onGlobal([vo = cpuViews(outputs), vi = cpuViews(inputs)](c10d::Backend& g) mutable {
    WorkPtr w;
    for (size_t i = 0; i < vi.size(); ++i) {
      w = g._allgather_base(vo[i], vi[i]);
      w->wait();
    }
    return WorkPtr();
  });
}

OpBody HostHierarchy::allgatherCoalesced(const std::vector<std::vector<at::Tensor>>& outputs,
                                         const std::vector<at::Tensor>& inputs) const {
  return onGlobal([vo = cpuViewLists(outputs), vi = cpuViews(inputs)](c10d::Backend& g) mutable {
    return g.allgather_coalesced(vo, vi);
  });
}

OpBody HostHierarchy::gather(const std::vector<std::vector<at::Tensor>>& outputs,
                             const at::Tensor& input, const c10d::GatherOptions& opts) const {
  return onGlobal([vo = cpuViewLists(outputs), vi = cpuViews({input}),
                   opts](c10d::Backend& g) mutable { return g.gather(vo, vi, opts); });
}

OpBody HostHierarchy::scatter(const at::Tensor& output,
                              const std::vector<std::vector<at::Tensor>>& inputs,
                              const c10d::ScatterOptions& opts) const {
  return onGlobal([vo = cpuViews({output}), vi = cpuViewLists(inputs),
                   opts](c10d::Backend& g) mutable { return g.scatter(vo, vi, opts); });
}

OpBody HostHierarchy::reduceScatter(const at::Tensor& output,
                                    const std::vector<at::Tensor>& inputs,
                                    const c10d::ReduceOp& reduce_op) const {
  auto [gop, factor] = glooReduce(reduce_op, output);
  c10d::ReduceScatterOptions o;
  o.reduceOp = gop;
  std::vector<std::vector<at::Tensor>> vi = {cpuViews(inputs)};
  return onGlobal([vo = cpuViews({output}), vi, o, factor](c10d::Backend& g) mutable {
    auto w = g.reduce_scatter(vo, vi, o);
    w->wait();
    scaleBy(vo[0], factor);
    return WorkPtr();
  });
}

OpBody HostHierarchy::reduceScatterBase(const at::Tensor& output, const at::Tensor& input,
                                        const c10d::ReduceOp& reduce_op) const {
  auto [gop, factor] = glooReduce(reduce_op, output);
  return onGlobal([vo = cpuView(output), vi = cpuView(input), gop = gop, factor = factor,
                   rank = rank_, size = size_](c10d::Backend& g) mutable {
    reduceScatterViaAllreduce(g, vo, vi, gop, rank, size);
    scaleBy(vo, factor);
    return WorkPtr();
  });
}

OpBody HostHierarchy::reduceScatterTensorCoalesced(const std::vector<at::Tensor>& outputs,
                                                   const std::vector<at::Tensor>& inputs,
                                                   const c10d::ReduceOp& reduce_op) const {
  auto [gop, factor] = glooReduce(reduce_op, outputs[0]);
  return onGlobal([vo = cpuViews(outputs), vi = cpuViews(inputs), gop = gop, factor = factor,
                   rank = rank_, size = size_](c10d::Backend& g) mutable {
    for (size_t i = 0; i < vi.size(); ++i) {
      reduceScatterViaAllreduce(g, vo[i], vi[i], gop, rank, size);
      scaleBy(vo[i], factor);
    }
    return WorkPtr();
  });
}

OpBody HostHierarchy::alltoallBase(const at::Tensor& output, const at::Tensor& input,
                                   const std::vector<int64_t>& output_split_sizes,
                                   const std::vector<int64_t>& input_split_sizes) const {
  return onGlobal([vo = cpuView(output), vi = cpuView(input), os = output_split_sizes,
                   is = input_split_sizes](c10d::Backend& g) mutable {
    return g.alltoall_base(vo, vi, os, is);
  });
}

OpBody HostHierarchy::alltoall(const std::vector<at::Tensor>& outputs,
                               const std::vector<at::Tensor>& inputs) const {
  return onGlobal([vo = cpuViews(outputs), vi = cpuViews(inputs)](c10d::Backend& g) mutable {
    // gloo's list all_to_all needs equal sizes: one flat all_to_all_single
    // with the lists' sizes as splits.
    std::vector<at::Tensor> flat_in;
    std::vector<int64_t> in_splits, out_splits;
    int64_t out_total = 0;
    for (auto& t : vi) {
      flat_in.push_back(t.reshape(-1));
      in_splits.push_back(t.numel());
    }
    for (auto& t : vo) {
      out_splits.push_back(t.numel());
      out_total += t.numel();
    }
    at::Tensor in = at::cat(flat_in);
    at::Tensor out = at::empty({out_total}, in.options());
    g.alltoall_base(out, in, out_splits, in_splits)->wait();
    int64_t off = 0;
    for (auto& t : vo) {
      t.copy_(out.narrow(0, off, t.numel()).view(t.sizes()));
      off += t.numel();
    }
    return WorkPtr();
  });
}

OpBody HostHierarchy::send(const at::Tensor& t, int dst) const {
  // The data is copied and the send posted without waiting for the receiver
  // (which may be behind a send of its own, as in a ring of isend/irecv): the
  // buffer is free at once, as with the shared-memory ring buffer.  Sends in
  // flight are kept until they complete.
  auto global = global_;
  auto sends = sends_;
  return [global, sends, v = cpuView(t), dst](comm::ShmGroup&) mutable {
    std::vector<at::Tensor> tv = {v.clone()};
    auto w = global->send(tv, dst, 0);
    std::lock_guard<std::mutex> lock(sends->mu);
    auto& in_flight = sends->works;
    in_flight.erase(std::remove_if(in_flight.begin(), in_flight.end(),
                                   [](auto& p) { return p.first->isCompleted(); }),
                    in_flight.end());
    in_flight.emplace_back(w, tv[0]);
  };
}

OpBody HostHierarchy::recv(const at::Tensor& t, int src) const {
  auto global = global_;
  auto pending = pending_recvs_;
  return [global, pending, v = cpuViews({t}), src](comm::ShmGroup&) mutable {
    auto w = global->recv(v, src, 0);
    if (pending) pending->push_back(w); else w->wait();
  };
}

void HostHierarchy::startCoalescing() {
  pending_recvs_ = std::make_shared<std::vector<WorkPtr>>();
}

std::function<void()> HostHierarchy::endCoalescing() {
  auto pending = std::move(pending_recvs_);
  pending_recvs_.reset();
  if (!pending) return nullptr;
  return [pending] {
    for (auto& w : *pending) w->wait();
  };
}

void HostHierarchy::waitForSends() {
  std::lock_guard<std::mutex> lock(sends_->mu);
  for (auto& [work, data] : sends_->works) {
    try {
      work->wait();
    } catch (...) {
    }
  }
}

}  // namespace at::axon
