// ProcessGroupAxon: the collectives and their argument checks (see
// ProcessGroupAxon.h).  Each collective checks its arguments, then builds its
// body: over the host's shared memory (axon::comm::ShmGroup), or, when the
// group spans several hosts, over gloo (HostHierarchy); OpRunner runs it.
#include "ProcessGroupAxon.h"

#include <algorithm>

#include <ATen/MemoryOverlap.h>
#include <c10/util/Exception.h>

#include <axon/comm_config.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include "../aten/KernelSelect.h"
#include "../core/AxonRuntime.h"
#include "CommTypes.h"
#include "WorkAxon.h"

namespace at::axon {

namespace {
// A multi-host call's signature (HostHierarchy::checked): op type, dtype,
// elements, reduction, root (-1 where not compared), memory format.
std::vector<int64_t> sig(c10d::OpType type, const at::Tensor& t, int64_t elements,
                         int64_t reduce = -1, int64_t root = -1) {
  return {static_cast<int64_t>(type), t.defined() ? dtypeTag(t) : -1, elements, reduce, root,
          layoutTag(t)};
}

int64_t total(const std::vector<at::Tensor>& ts) {
  int64_t n = 0;
  for (const at::Tensor& t : ts) n += t.numel();
  return n;
}
// The job's store for the kernel selection's agreement between ranks
// (KernelSelect.h): the store under every group's prefixes, so that all the
// job's groups share one choice per key, through a connection of its own
// (stream workers call it; a TCPStore client serialises its calls, and the
// host may be blocked in a get() on the group's connection).
class StoreAgreement final : public kselect::Agreement {
 public:
  explicit StoreAgreement(c10::intrusive_ptr<c10d::Store> store) : store_(std::move(store)) {
    while (auto* prefixed = dynamic_cast<c10d::PrefixStore*>(store_.get())) {
      store_ = prefixed->getUnderlyingStore();
    }
    try {
      store_ = store_->clone();
    } catch (const std::exception&) {  // a store that cannot clone: shared
    }
  }
  std::string get(const std::string& key) override {
    if (!store_->check({key})) return "";
    const std::vector<uint8_t> v = store_->get(key);
    return std::string(v.begin(), v.end());
  }
  std::string propose(const std::string& key, const std::string& value) override {
    const std::vector<uint8_t> v =
        store_->compareSet(key, {}, std::vector<uint8_t>(value.begin(), value.end()));
    return std::string(v.begin(), v.end());
  }

 private:
  c10::intrusive_ptr<c10d::Store> store_;
};

}  // namespace
namespace {

namespace comm = ::axon::comm;
using c10d::OpType;

constexpr const char* kBackendName = "axon";

HostTopology topologyOf(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                        std::vector<int> host_of) {
  TORCH_CHECK(store, "ProcessGroupAxon needs a store");
  return HostTopology(rank, size, std::move(host_of));
}

}  // namespace

ProcessGroupAxon::ProcessGroupAxon(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                   int size, std::chrono::milliseconds timeout,
                                   std::vector<int> host_of,
                                   c10::intrusive_ptr<c10d::Backend> leaders,
                                   c10::intrusive_ptr<c10d::Backend> global)
    : c10d::Backend(rank, size), topology_(topologyOf(store, rank, size, std::move(host_of))) {
  if (topology_.multi_host) {
    hosts_ = std::make_unique<HostHierarchy>(topology_, rank, size, std::move(leaders),
                                             std::move(global));
  }
  const int local_rank = topology_.local_rank;
  const int local_size = static_cast<int>(topology_.local_ranks.size());
  if (local_rank == 0) comm::remove_stale_segments();
  // The host's local rank 0 names the segment; the others read the name.
  std::string key = "axon_shm_name/" + std::to_string(topology_.host_of[rank]);
  comm::Config config = comm::config_from_env(timeout);
  const size_t inline_bytes = comm::inline_bytes(topology_.local_ranks.size());
  try {
    std::string name;
    if (local_rank == 0) {
      name = comm::new_segment_name();
      shm_ = std::make_shared<comm::ShmGroup>(name, 0, local_size, config);
      store->set(key, std::vector<uint8_t>(name.begin(), name.end()));
    } else {
      auto bytes = store->get(key);
      name.assign(bytes.begin(), bytes.end());
      shm_ = std::make_shared<comm::ShmGroup>(name, local_rank, local_size, config);
    }
    shm_->attach_all();
  } catch (const comm::CommError& e) {
    throwDistError(e.what());
  }
  runner_ = std::make_unique<OpRunner>(rank, shm_, timeout, inline_bytes);
  if (size > 1) kselect::addAgreement(this, std::make_shared<StoreAgreement>(store));
}

ProcessGroupAxon::~ProcessGroupAxon() {
  kselect::removeAgreement(this);
  // Stream work holds the transport; let it finish before the group goes.
  // Wait without consuming errors: a failure of that work (a recv that timed
  // out) stays pending on the communication stream, and the next
  // synchronising call that covers it raises it (torch.axon.synchronize(),
  // or any stream that waited on the work).
  runner_->drain();
  if (hosts_) hosts_->waitForSends();
}

const std::string ProcessGroupAxon::getBackendName() const { return kBackendName; }

void ProcessGroupAxon::setTimeout(std::chrono::milliseconds timeout) {
  runner_->setTimeout(timeout);
}

// ---------------------------------------------------------------- collectives

c10::intrusive_ptr<c10d::Work> ProcessGroupAxon::broadcast(std::vector<at::Tensor>& tensors,
                                                           const c10d::BroadcastOptions& opts) {
  const char* op = "broadcast";
  at::Tensor t = singleTensor(tensors, op);
  checkRoot(opts.rootRank, op);
  char* p = dataPtr(t);
  size_t n = byteCount(t);
  int root = static_cast<int>(opts.rootRank);
  if (hosts_) return enqueue(OpType::BROADCAST, op, {t}, {t}, hosts_->checked(sig(OpType::BROADCAST, t, t.numel(), -1, root), hosts_->broadcast(t, root)));
  std::optional<comm::SharedBuffer> shared = sharedBuffer(t);
  return enqueue(OpType::BROADCAST, op, {t}, {t},
                 Op{op, false, {}, [=](comm::ShmGroup& g) {
                      g.broadcast(p, n, root, shared ? &*shared : nullptr);
                    }, runner_->syncInline(opts.asyncOp, n)});
}

namespace {
// PREMUL_SUM (NCCL's): each rank's input times its own factor, then summed.
// The factor may differ between ranks, so it scales this rank's contribution
// (floating-point tensors; on the current stream, before the collective) and
// the collective is a SUM.
struct Premul {
  bool active = false;
  at::Tensor tensor;  // the factor as a tensor, or
  double value = 1.0;

  at::Tensor scaled(const at::Tensor& t) const {
    return (tensor.defined() ? t * tensor : t * value).to(t.scalar_type());
  }
  void scale_(const at::Tensor& t) const {
    if (tensor.defined()) {
      t.mul_(tensor);
    } else {
      t.mul_(value);
    }
  }
};

Premul premul(const c10d::ReduceOp& reduce_op, const std::vector<at::Tensor>& tensors) {
  Premul p;
  if (reduce_op.op_ != c10d::ReduceOp::PREMUL_SUM) return p;
  for (const at::Tensor& t : tensors) {
    // (anything else goes the usual way, to its checks' errors)
    if (!t.defined() || t.device().type() != kAxon || !(t.is_floating_point() || t.is_complex())) {
      return p;
    }
  }
  auto* s = dynamic_cast<c10d::PreMulSumSupplement*>(reduce_op.supplement_.get());
  if (s == nullptr) return p;  // toCommReduction raises
  p.active = true;
  p.tensor = s->tensor_factor;
  p.value = s->double_factor;
  return p;
}

const c10d::ReduceOp kSum(c10d::ReduceOp::SUM);
}  // namespace

c10::intrusive_ptr<c10d::Work> ProcessGroupAxon::allreduce(std::vector<at::Tensor>& tensors,
                                                           const c10d::AllreduceOptions& opts) {
  const char* op = "all_reduce";
  if (Premul pm = premul(opts.reduceOp, tensors); pm.active) {
    singleTensor(tensors, op);  // the checks before the tensor changes
    for (const at::Tensor& t : tensors) pm.scale_(t);  // in place: the result overwrites it
    c10d::AllreduceOptions sum = opts;
    sum.reduceOp = kSum;
    return allreduce(tensors, sum);
  }
  at::Tensor t = singleTensor(tensors, op);
  TORCH_CHECK(!opts.sparseIndices.has_value() && t.layout() == at::kStrided,
              "ProcessGroupAxon: all_reduce does not support sparse tensors");
  Reduction r = toCommReduction(opts.reduceOp, t, op);
  comm::DType dt = toCommDType(t.scalar_type(), op);
  char* p = dataPtr(t);
  size_t n = commCount(t);
  if (hosts_) {
    return enqueue(OpType::ALLREDUCE, op, {t}, {t}, hosts_->checked(sig(OpType::ALLREDUCE, t, t.numel(), opts.reduceOp.op_),
                                              hosts_->allreduce(t, r, opts.reduceOp)));
  }
  // Device memory is mappable by the peers: large all_reduces work on the
  // ranks' tensors directly.
  std::optional<comm::SharedBuffer> shared = sharedBuffer(t);
  return enqueue(OpType::ALLREDUCE, op, {t}, {t},
                 Op{op, false, {}, [=](comm::ShmGroup& g) {
                      g.all_reduce(p, n, dt, r.op, r.factor, shared ? &*shared : nullptr);
                    }, runner_->syncInline(opts.asyncOp, byteCount(t))});
}

c10::intrusive_ptr<c10d::Work> ProcessGroupAxon::allreduce_coalesced(
    std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) {
  const char* op = "all_reduce_coalesced";
  TORCH_CHECK(!tensors.empty(), "ProcessGroupAxon: ", op, " needs at least one tensor");
  if (Premul pm = premul(opts.reduceOp, tensors); pm.active) {
    for (const at::Tensor& t : tensors) checkTensor(t, op);  // before the tensors change
    for (const at::Tensor& t : tensors) pm.scale_(t);
    c10d::AllreduceCoalescedOptions sum = opts;
    sum.reduceOp = kSum;
    return allreduce_coalesced(tensors, sum);
  }
  std::vector<std::tuple<char*, size_t, comm::DType, Reduction,
                         std::optional<comm::SharedBuffer>>> parts;
  for (auto& t : tensors) {
    checkTensor(t, op);
    parts.emplace_back(dataPtr(t), commCount(t), toCommDType(t.scalar_type(), op),
                       toCommReduction(opts.reduceOp, t, op), sharedBuffer(t));
  }
  if (hosts_) {
    return enqueue(OpType::ALLREDUCE_COALESCED, op, tensors, tensors,
                   hosts_->checked(sig(OpType::ALLREDUCE_COALESCED, tensors[0], total(tensors),
                                       opts.reduceOp.op_),
                                   hosts_->allreduceCoalesced(tensors, opts.reduceOp)));
  }
  return enqueue(OpType::ALLREDUCE_COALESCED, op, tensors, tensors,
                 [parts](comm::ShmGroup& g) {
                   for (auto& [p, n, dt, r, sh] : parts) {
                     g.all_reduce(p, n, dt, r.op, r.factor, sh ? &*sh : nullptr);
                   }
                 });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupAxon::reduce(std::vector<at::Tensor>& tensors,
                                                        const c10d::ReduceOptions& opts) {
  const char* op = "reduce";
  at::Tensor t = singleTensor(tensors, op);
  checkRoot(opts.rootRank, op);
  if (Premul pm = premul(opts.reduceOp, tensors); pm.active) {
    // The root's tensor receives the result; the others' stay as they were.
    std::vector<at::Tensor> scaled = {t};
    if (opts.rootRank == getRank()) {
      pm.scale_(t);
    } else {
      scaled[0] = pm.scaled(t);
    }
    c10d::ReduceOptions sum = opts;
    sum.reduceOp = kSum;
    return reduce(scaled, sum);
  }
  Reduction r = toCommReduction(opts.reduceOp, t, op);
  comm::DType dt = toCommDType(t.scalar_type(), op);
  char* p = dataPtr(t);
  size_t n = commCount(t);
  int root = static_cast<int>(opts.rootRank);
  if (hosts_) return enqueue(OpType::REDUCE, op, {t}, {t}, hosts_->checked(sig(OpType::REDUCE, t, t.numel(), opts.reduceOp.op_, opts.rootRank),
                                   hosts_->reduce(t, opts)));
  return enqueue(OpType::REDUCE, op, {t}, {t},
                 Op{op, false, {}, [=](comm::ShmGroup& g) {
                      g.reduce(p, n, dt, r.op, root, r.factor);
                    }, runner_->syncInline(opts.asyncOp, byteCount(t))});
}

c10::intrusive_ptr<c10d::Work> ProcessGroupAxon::allgather(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  const char* op = "all_gather";
  at::Tensor in = singleTensor(inputs, op);
  TORCH_CHECK(outputs.size() == 1, "ProcessGroupAxon: ", op, " takes one output list");
  auto& outs = outputs[0];
  checkList(outs, in, op, "output");
  std::vector<void*> dst;
  for (auto& o : outs) dst.push_back(dataPtr(o));
  const char* src = dataPtr(in);
  size_t n = byteCount(in);
  std::vector<at::Tensor> all = outs;
  all.push_back(in);
  if (hosts_) return enqueue(OpType::ALLGATHER, op, all, outs, hosts_->checked(sig(OpType::ALLGATHER, in, in.numel()),
                                   hosts_->allgather(outs, in)));
  std::optional<comm::SharedBuffer> shared = sharedBuffer(in);
  return enqueue(OpType::ALLGATHER, op, all, outs,
                 Op{op, false, {}, [=](comm::ShmGroup& g) {
                      g.all_gather(src, n, dst.data(), shared ? &*shared : nullptr);
                    }, runner_->syncInline(opts.asyncOp, n * getSize())});
}

c10::intrusive_ptr<c10d::Work> ProcessGroupAxon::_allgather_base(
    at::Tensor& output, at::Tensor& input, const c10d::AllgatherOptions& opts) {
  const char* op = "all_gather_into_tensor";
  checkTensor(input, op);
  checkTensor(output, op);
  checkSameDtypeAndFormat(input, output, op);
  TORCH_CHECK(output.numel() == input.numel() * getSize(), "ProcessGroupAxon: ", op,
              ": output tensor size must be equal to world_size times input tensor size (",
              output.numel(), " vs ", getSize(), " x ", input.numel(), ")");
  size_t n = byteCount(input);
  std::vector<void*> dst;
  for (int r = 0; r < getSize(); ++r) dst.push_back(dataPtr(output) + r * n);
  const char* src = dataPtr(input);
  if (hosts_) {
    return enqueue(OpType::_ALLGATHER_BASE, op, {input, output}, {output},
                   hosts_->checked(sig(OpType::_ALLGATHER_BASE, input, input.numel()),
                                   hosts_->allgatherBase(output, input)));
  }
  std::optional<comm::SharedBuffer> shared = sharedBuffer(input);
  return enqueue(OpType::_ALLGATHER_BASE, op, {input, output}, {output},
                 Op{op, false, {}, [=](comm::ShmGroup& g) {
                      g.all_gather(src, n, dst.data(), shared ? &*shared : nullptr);
                    }, runner_->syncInline(opts.asyncOp, byteCount(output))});
}

c10::intrusive_ptr<c10d::Work> ProcessGroupAxon::allgather_into_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions&) {
  const char* op = "all_gather_into_tensor_coalesced";
  TORCH_CHECK(outputs.size() == inputs.size(), "ProcessGroupAxon: ", op,
              ": as many outputs as inputs are needed");
  std::vector<std::pair<const char*, std::vector<void*>>> parts;
  std::vector<size_t> sizes;
  std::vector<at::Tensor> all;
  for (size_t i = 0; i < inputs.size(); ++i) {
    checkTensor(inputs[i], op);
    checkTensor(outputs[i], op);
    checkSameDtypeAndFormat(inputs[i], outputs[i], op);
    TORCH_CHECK(outputs[i].numel() == inputs[i].numel() * getSize(), "ProcessGroupAxon: ", op,
                ": output tensor size must be equal to world_size times input tensor size");
    size_t n = byteCount(inputs[i]);
    std::vector<void*> dst;
    for (int r = 0; r < getSize(); ++r) dst.push_back(dataPtr(outputs[i]) + r * n);
    parts.emplace_back(dataPtr(inputs[i]), std::move(dst));
    sizes.push_back(n);
    all.push_back(inputs[i]);
    all.push_back(outputs[i]);
  }
  if (hosts_) {
    return enqueue(OpType::COALESCED, op, all, outputs,
                   hosts_->checked(sig(OpType::COALESCED, inputs[0], total(inputs)),
                                   hosts_->allgatherIntoTensorCoalesced(outputs, inputs)));
  }
  return enqueue(OpType::COALESCED, op, all, outputs, [=](comm::ShmGroup& g) {
    for (size_t i = 0; i < parts.size(); ++i) {
      g.all_gather(parts[i].first, sizes[i], parts[i].second.data());
    }
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupAxon::allgather_coalesced(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions&) {
  const char* op = "all_gather_coalesced";
  TORCH_CHECK(outputs.size() == inputs.size(), "ProcessGroupAxon: ", op,
              ": as many output lists as inputs are needed");
  std::vector<std::pair<const char*, std::vector<void*>>> parts;
  std::vector<size_t> sizes;
  std::vector<at::Tensor> all, outs;
  for (size_t i = 0; i < inputs.size(); ++i) {
    checkTensor(inputs[i], op);
    checkList(outputs[i], inputs[i], op, "output");
    std::vector<void*> dst;
    for (auto& o : outputs[i]) {
      dst.push_back(dataPtr(o));
      all.push_back(o);
      outs.push_back(o);
    }
    parts.emplace_back(dataPtr(inputs[i]), std::move(dst));
    sizes.push_back(byteCount(inputs[i]));
    all.push_back(inputs[i]);
  }
  if (hosts_) {
    return enqueue(OpType::ALLGATHER_COALESCED, op, all, outs,
                   hosts_->checked(sig(OpType::ALLGATHER_COALESCED, inputs[0], total(inputs)),
                                   hosts_->allgatherCoalesced(outputs, inputs)));
  }
  return enqueue(OpType::ALLGATHER_COALESCED, op, all, outs, [=](comm::ShmGroup& g) {
    for (size_t i = 0; i < parts.size(); ++i) {
      g.all_gather(parts[i].first, sizes[i], parts[i].second.data());
    }
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupAxon::gather(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::GatherOptions& opts) {
  const char* op = "gather";
  at::Tensor in = singleTensor(inputs, op);
  checkRoot(opts.rootRank, op);
  int root = static_cast<int>(opts.rootRank);
  std::vector<void*> dst(getSize(), nullptr);
  std::vector<at::Tensor> all = {in}, outs;
  if (getRank() == root) {
    TORCH_CHECK(outputs.size() == 1, "ProcessGroupAxon: gather: requires a single-element "
                "output list on the root");
    checkList(outputs[0], in, op, "output");
    for (int r = 0; r < getSize(); ++r) dst[r] = dataPtr(outputs[0][r]);
    all.insert(all.end(), outputs[0].begin(), outputs[0].end());
    outs = outputs[0];
  } else {
    TORCH_CHECK(outputs.empty() || (outputs.size() == 1 && outputs[0].empty()),
                "ProcessGroupAxon: gather: requires empty output on non-root");
  }
  const char* src = dataPtr(in);
  size_t n = byteCount(in);
  if (hosts_) return enqueue(OpType::GATHER, op, all, outs, hosts_->checked(sig(OpType::GATHER, in, in.numel(), -1, opts.rootRank),
                                   hosts_->gather(outputs, in, opts)));
  return enqueue(OpType::GATHER, op, all, outs,
                 Op{op, false, {}, [=](comm::ShmGroup& g) {
                      g.gather(src, n, dst.data(), root);
                    }, runner_->syncInline(opts.asyncOp, n * getSize())});
}

c10::intrusive_ptr<c10d::Work> ProcessGroupAxon::scatter(
    std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
    const c10d::ScatterOptions& opts) {
  const char* op = "scatter";
  at::Tensor out = singleTensor(outputs, op);
  checkRoot(opts.rootRank, op);
  int root = static_cast<int>(opts.rootRank);
  std::vector<const void*> src(getSize(), nullptr);
  std::vector<at::Tensor> all = {out};
  if (getRank() == root) {
    TORCH_CHECK(inputs.size() == 1, "ProcessGroupAxon: scatter: requires a single-element "
                "input list on the root");
    checkList(inputs[0], out, op, "input");
    for (int r = 0; r < getSize(); ++r) src[r] = dataPtr(inputs[0][r]);
    all.insert(all.end(), inputs[0].begin(), inputs[0].end());
  } else {
    TORCH_CHECK(inputs.empty() || (inputs.size() == 1 && inputs[0].empty()),
                "ProcessGroupAxon: scatter: requires empty input on non-root");
  }
  char* dst = dataPtr(out);
  size_t n = byteCount(out);
  if (hosts_) return enqueue(OpType::SCATTER, op, all, {out}, hosts_->checked(sig(OpType::SCATTER, out, out.numel(), -1, opts.rootRank),
                                   hosts_->scatter(out, inputs, opts)));
  return enqueue(OpType::SCATTER, op, all, {out},
                 Op{op, false, {}, [=](comm::ShmGroup& g) {
                      g.scatter(src.data(), n, dst, root);
                    }, runner_->syncInline(opts.asyncOp, n * getSize())});
}

c10::intrusive_ptr<c10d::Work> ProcessGroupAxon::reduce_scatter(
    std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
    const c10d::ReduceScatterOptions& opts) {
  const char* op = "reduce_scatter";
  at::Tensor out = singleTensor(outputs, op);
  TORCH_CHECK(inputs.size() == 1, "ProcessGroupAxon: ", op, " takes one input list");
  if (Premul pm = premul(opts.reduceOp, inputs[0]); pm.active) {
    std::vector<std::vector<at::Tensor>> scaled(1);
    for (const at::Tensor& t : inputs[0]) scaled[0].push_back(pm.scaled(t));
    c10d::ReduceScatterOptions sum = opts;
    sum.reduceOp = kSum;
    return reduce_scatter(outputs, scaled, sum);
  }
  checkList(inputs[0], out, op, "input");
  Reduction r = toCommReduction(opts.reduceOp, out, op);
  comm::DType dt = toCommDType(out.scalar_type(), op);
  std::vector<const void*> src;
  for (auto& t : inputs[0]) src.push_back(dataPtr(t));
  std::vector<at::Tensor> all = inputs[0];
  all.push_back(out);
  char* dst = dataPtr(out);
  size_t n = commCount(out);
  if (hosts_) {
    return enqueue(OpType::REDUCE_SCATTER, op, all, {out},
                   hosts_->checked(sig(OpType::REDUCE_SCATTER, out, out.numel(), opts.reduceOp.op_),
                                   hosts_->reduceScatter(out, inputs[0], opts.reduceOp)));
  }
  return enqueue(OpType::REDUCE_SCATTER, op, all, {out},
                 Op{op, false, {}, [=](comm::ShmGroup& g) {
                      g.reduce_scatter(src.data(), dst, n, dt, r.op, r.factor);
                    }, runner_->syncInline(opts.asyncOp, byteCount(out) * getSize())});
}

c10::intrusive_ptr<c10d::Work> ProcessGroupAxon::_reduce_scatter_base(
    at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) {
  const char* op = "reduce_scatter_tensor";
  if (Premul pm = premul(opts.reduceOp, {input}); pm.active) {
    at::Tensor scaled = pm.scaled(input);
    c10d::ReduceScatterOptions sum = opts;
    sum.reduceOp = kSum;
    return _reduce_scatter_base(output, scaled, sum);
  }
  checkTensor(input, op);
  checkTensor(output, op);
  checkSameDtypeAndFormat(input, output, op);
  TORCH_CHECK(input.numel() == output.numel() * getSize(), "ProcessGroupAxon: ", op,
              ": input tensor must be the same size as output size times world size (",
              input.numel(), " vs ", output.numel(), " x ", getSize(), ")");
  Reduction r = toCommReduction(opts.reduceOp, output, op);
  comm::DType dt = toCommDType(output.scalar_type(), op);
  size_t n = commCount(output);
  size_t step = byteCount(output);
  std::vector<const void*> src;
  for (int q = 0; q < getSize(); ++q) src.push_back(dataPtr(input) + q * step);
  char* dst = dataPtr(output);
  if (hosts_) {
    return enqueue(OpType::_REDUCE_SCATTER_BASE, op, {input, output}, {output},
                   hosts_->checked(sig(OpType::_REDUCE_SCATTER_BASE, output, output.numel(),
                                       opts.reduceOp.op_),
                                   hosts_->reduceScatterBase(output, input, opts.reduceOp)));
  }
  std::optional<comm::SharedBuffer> shared = sharedBuffer(input);
  return enqueue(OpType::_REDUCE_SCATTER_BASE, op, {input, output}, {output},
                 Op{op, false, {}, [=](comm::ShmGroup& g) {
                      g.reduce_scatter(src.data(), dst, n, dt, r.op, r.factor,
                                       shared ? &*shared : nullptr);
                    }, runner_->syncInline(opts.asyncOp, byteCount(input))});
}

c10::intrusive_ptr<c10d::Work> ProcessGroupAxon::reduce_scatter_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::ReduceScatterOptions& opts) {
  const char* op = "reduce_scatter_tensor_coalesced";
  TORCH_CHECK(outputs.size() == inputs.size(), "ProcessGroupAxon: ", op,
              ": as many outputs as inputs are needed");
  if (Premul pm = premul(opts.reduceOp, inputs); pm.active) {
    std::vector<at::Tensor> scaled;
    for (const at::Tensor& t : inputs) scaled.push_back(pm.scaled(t));
    c10d::ReduceScatterOptions sum = opts;
    sum.reduceOp = kSum;
    return reduce_scatter_tensor_coalesced(outputs, scaled, sum);
  }
  struct Part {
    std::vector<const void*> src;
    char* dst;
    size_t n;
    comm::DType dt;
    Reduction r;
  };
  std::vector<Part> parts;
  std::vector<at::Tensor> all;
  for (size_t i = 0; i < inputs.size(); ++i) {
    checkTensor(inputs[i], op);
    checkTensor(outputs[i], op);
    checkSameDtypeAndFormat(inputs[i], outputs[i], op);
    TORCH_CHECK(inputs[i].numel() == outputs[i].numel() * getSize(), "ProcessGroupAxon: ", op,
                ": input tensor must be the same size as output size times world size");
    Part p;
    size_t step = byteCount(outputs[i]);
    for (int q = 0; q < getSize(); ++q) p.src.push_back(dataPtr(inputs[i]) + q * step);
    p.dst = dataPtr(outputs[i]);
    p.n = commCount(outputs[i]);
    p.dt = toCommDType(outputs[i].scalar_type(), op);
    p.r = toCommReduction(opts.reduceOp, outputs[i], op);
    parts.push_back(std::move(p));
    all.push_back(inputs[i]);
    all.push_back(outputs[i]);
  }
  if (hosts_) {
    return enqueue(OpType::COALESCED, op, all, outputs,
                   hosts_->checked(
                       sig(OpType::COALESCED, outputs[0], total(outputs), opts.reduceOp.op_),
                       hosts_->reduceScatterTensorCoalesced(outputs, inputs, opts.reduceOp)));
  }
  return enqueue(OpType::COALESCED, op, all, outputs, [parts](comm::ShmGroup& g) {
    for (auto& p : parts) g.reduce_scatter(p.src.data(), p.dst, p.n, p.dt, p.r.op, p.r.factor);
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupAxon::alltoall_base(
    at::Tensor& output, at::Tensor& input, std::vector<int64_t>& output_split_sizes,
    std::vector<int64_t>& input_split_sizes, const c10d::AllToAllOptions& opts) {
  const char* op = "all_to_all_single";
  checkTensor(input, op);
  checkTensor(output, op);
  checkSameDtypeAndFormat(input, output, op);
  int n = getSize();
  auto splits = [&](const at::Tensor& t, const std::vector<int64_t>& sizes, const char* what) {
    std::vector<size_t> bytes(n);
    int64_t rows = t.dim() > 0 ? t.size(0) : 1;
    int64_t row_bytes = rows > 0 ? byteCount(t) / rows : 0;
    if (sizes.empty()) {
      TORCH_CHECK(rows % n == 0, "ProcessGroupAxon: ", op, ": the ", what,
                  " tensor's first dimension (", rows, ") must divide by world size ", n);
      for (auto& b : bytes) b = static_cast<size_t>(rows / n * row_bytes);
    } else {
      TORCH_CHECK(static_cast<int>(sizes.size()) == n, "ProcessGroupAxon: ", op, ": ", what,
                  " split sizes must have world size (", n, ") entries, got ", sizes.size());
      int64_t total = 0;
      for (int r = 0; r < n; ++r) {
        TORCH_CHECK(sizes[r] >= 0, "ProcessGroupAxon: ", op, ": negative split size");
        bytes[r] = static_cast<size_t>(sizes[r] * row_bytes);
        total += sizes[r];
      }
      TORCH_CHECK(total == rows, "ProcessGroupAxon: ", op, ": ", what, " split sizes sum to ",
                  total, " but the tensor's first dimension is ", rows);
    }
    return bytes;
  };
  std::vector<size_t> sb = splits(input, input_split_sizes, "input");
  std::vector<size_t> rb = splits(output, output_split_sizes, "output");
  // An output overlapping the input (in place): the exchange reads a copy,
  // queued before it on the current stream.  (Writing parts of the output
  // while other parts of the input are still to be read would lose data.)
  const bool overlap = input.numel() > 0 && output.numel() > 0 &&
                       at::get_overlap_status(input, output) != at::MemOverlapStatus::No;
  at::Tensor source = overlap ? input.clone() : input;
  std::vector<const void*> src(n);
  std::vector<void*> dst(n);
  size_t so = 0, ro = 0;
  for (int r = 0; r < n; ++r) {
    src[r] = dataPtr(source) + so;
    dst[r] = dataPtr(output) + ro;
    so += sb[r];
    ro += rb[r];
  }
  if (hosts_) {
    return enqueue(OpType::ALLTOALL_BASE, op, {source, output}, {output},
                   hosts_->checked(sig(OpType::ALLTOALL_BASE, source, -1),
                                   hosts_->alltoallBase(output, source, output_split_sizes,
                                                        input_split_sizes)));
  }
  // Peers read this rank's input (or its copy) directly.
  std::optional<comm::SharedBuffer> shared = sharedBuffer(source);
  return enqueue(OpType::ALLTOALL_BASE, op, {source, output}, {output},
                 Op{op, false, {}, [=](comm::ShmGroup& g) {
                      g.all_to_all(src.data(), sb.data(), dst.data(), rb.data(),
                                   shared ? &*shared : nullptr);
                    },
                    runner_->syncInline(opts.asyncOp,
                                        std::max(byteCount(input), byteCount(output)))});
}

c10::intrusive_ptr<c10d::Work> ProcessGroupAxon::alltoall(std::vector<at::Tensor>& outputs,
                                                          std::vector<at::Tensor>& inputs,
                                                          const c10d::AllToAllOptions& opts) {
  const char* op = "all_to_all";
  int n = getSize();
  TORCH_CHECK(static_cast<int>(inputs.size()) == n && static_cast<int>(outputs.size()) == n,
              "ProcessGroupAxon: ", op, ": input and output lists must have world size (", n,
              ") tensors");
  std::vector<const void*> src(n);
  std::vector<void*> dst(n);
  std::vector<size_t> sb(n), rb(n);
  std::vector<at::Tensor> all;
  for (int r = 0; r < n; ++r) {
    checkTensor(inputs[r], op);
    checkTensor(outputs[r], op);
    checkSameDtypeAndFormat(inputs[r], inputs[0], op);
    checkSameDtypeAndFormat(outputs[r], inputs[0], op);
    src[r] = dataPtr(inputs[r]);
    dst[r] = dataPtr(outputs[r]);
    sb[r] = byteCount(inputs[r]);
    rb[r] = byteCount(outputs[r]);
    all.push_back(inputs[r]);
    all.push_back(outputs[r]);
  }
  if (hosts_) return enqueue(OpType::ALLTOALL, op, all, outputs, hosts_->checked(sig(OpType::ALLTOALL, inputs[0], -1),
                                   hosts_->alltoall(outputs, inputs)));
  size_t sent = 0;
  for (size_t x : sb) sent += x;
  return enqueue(OpType::ALLTOALL, op, all, outputs,
                 Op{op, false, {}, [=](comm::ShmGroup& g) {
                      g.all_to_all(src.data(), sb.data(), dst.data(), rb.data());
                    }, runner_->syncInline(opts.asyncOp, sent)});
}

c10::intrusive_ptr<c10d::Work> ProcessGroupAxon::send(std::vector<at::Tensor>& tensors, int dst,
                                                      int /*tag*/) {
  const char* op = "send";
  at::Tensor t = singleTensor(tensors, op);
  checkPeer(dst, op);
  if (hosts_) return enqueue(OpType::SEND, op, {t}, {}, hosts_->send(t, dst));
  Op o{op, true, comm::P2POp{true, dst, dataPtr(t), byteCount(t), dtypeTag(t)}, nullptr};
  return enqueue(OpType::SEND, op, {t}, {}, std::move(o));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupAxon::recv(std::vector<at::Tensor>& tensors, int src,
                                                      int /*tag*/) {
  const char* op = "recv";
  at::Tensor t = singleTensor(tensors, op);
  checkPeer(src, op);
  if (hosts_) return enqueue(OpType::RECV, op, {t}, {t}, hosts_->recv(t, src));
  Op o{op, true, comm::P2POp{false, src, dataPtr(t), byteCount(t), dtypeTag(t)}, nullptr};
  return enqueue(OpType::RECV, op, {t}, {t}, std::move(o));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupAxon::recvAnysource(std::vector<at::Tensor>&, int) {
  TORCH_CHECK(false, "ProcessGroupAxon does not support recv from any source; pass src");
}

c10::intrusive_ptr<c10d::Work> ProcessGroupAxon::barrier(const c10d::BarrierOptions& opts) {
  const char* op = "barrier";
  // Once bound, the group's device: its communication stream is the only
  // thread that may drive the transport.
  c10::DeviceIndex device = device_ >= 0 ? device_
                            : opts.device.has_value() && opts.device->type() == kAxon
                                ? resolve_index(*opts.device)
                                : current_device();
  OpBody body = hosts_ ? hosts_->checked(sig(OpType::BARRIER, at::Tensor(), -1), hosts_->barrier()) : OpBody([](comm::ShmGroup& g) { g.barrier(); });
  auto work = runner_->run(device, OpType::BARRIER, op, {}, {},
                           Op{op, false, {}, std::move(body), true});
  if (!runner_->coalescing()) static_cast<WorkAxon*>(work.get())->hostWait();
  return work;
}

void ProcessGroupAxon::startCoalescing() {
  TORCH_CHECK(!runner_->coalescing(), "ProcessGroupAxon: coalescing already started");
  runner_->startCoalescing();
  if (hosts_) hosts_->startCoalescing();
}

c10::intrusive_ptr<c10d::Work> ProcessGroupAxon::endCoalescing() {
  TORCH_CHECK(runner_->coalescing(), "ProcessGroupAxon: endCoalescing without startCoalescing");
  std::function<void()> finish = hosts_ ? hosts_->endCoalescing() : nullptr;
  return runner_->endCoalescing(groupDevice(), std::move(finish));
}

// ---------------------------------------------------------------- running

c10::DeviceIndex ProcessGroupAxon::groupDevice() const {
  return device_ >= 0 ? device_ : current_device();
}

c10::intrusive_ptr<c10d::Work> ProcessGroupAxon::enqueue(OpType type, const char* name,
                                                         std::vector<at::Tensor> tensors,
                                                         std::vector<at::Tensor> outputs,
                                                         OpBody body) {
  return enqueue(type, name, std::move(tensors), std::move(outputs),
                 Op{name, false, {}, std::move(body)});
}

c10::intrusive_ptr<c10d::Work> ProcessGroupAxon::enqueue(OpType type, const char* name,
                                                         std::vector<at::Tensor> tensors,
                                                         std::vector<at::Tensor> outputs, Op op) {
  return runner_->run(groupDevice(), type, name, std::move(tensors), std::move(outputs),
                      std::move(op));
}

// ---------------------------------------------------------------- checks

void ProcessGroupAxon::checkTensor(const at::Tensor& t, const char* op) {
  TORCH_CHECK(t.defined(), "ProcessGroupAxon: ", op, ": undefined tensor");
  TORCH_CHECK(t.device().type() == kAxon, "ProcessGroupAxon: ", op,
              ": all tensors must be on an axon device, but one is on ", t.device(),
              " (use a \"cpu:gloo,axon:axon\" group for CPU tensors)");
  TORCH_CHECK(t.layout() == at::kStrided, "ProcessGroupAxon: ", op,
              " does not support sparse tensors");
  TORCH_CHECK(t.is_contiguous() || t.is_contiguous(at::MemoryFormat::ChannelsLast) ||
                  t.is_contiguous(at::MemoryFormat::ChannelsLast3d),
              "ProcessGroupAxon: ", op, ": tensors must be contiguous");
  (void)toCommDType(t.scalar_type(), op);
  c10::DeviceIndex d = t.device().index();
  if (device_ < 0) device_ = d;
  TORCH_CHECK(d == device_, "ProcessGroupAxon: ", op, ": this process group runs on axon:",
              static_cast<int>(device_), " but a tensor is on axon:", static_cast<int>(d),
              " (one device per rank and group; call torch.axon.set_device(local_rank) "
              "before the first collective)");
}

// The collectives move bytes: a call's tensors must lay their elements out
// in the same order (all in logical order, or all channels_last), or the
// bytes of one land as other elements of the other.
void ProcessGroupAxon::checkSameDtypeAndFormat(const at::Tensor& a, const at::Tensor& b,
                                               const char* op) {
  TORCH_CHECK_TYPE(a.scalar_type() == b.scalar_type(), "ProcessGroupAxon: ", op,
                   ": tensors must have the same dtype, got ", a.scalar_type(), " and ",
                   b.scalar_type());
  auto format = [](const at::Tensor& t) {
    return t.is_contiguous() ? at::MemoryFormat::Contiguous : t.suggest_memory_format();
  };
  TORCH_CHECK(format(a) == format(b), "ProcessGroupAxon: ", op,
              ": tensors must have the same memory format, got ", format(a), " and ", format(b),
              " (make them contiguous in one format, e.g. .contiguous())");
}

at::Tensor ProcessGroupAxon::singleTensor(std::vector<at::Tensor>& ts, const char* op) {
  TORCH_CHECK(ts.size() == 1, "ProcessGroupAxon: ", op,
              " takes exactly one tensor per rank (one device per process), got ", ts.size());
  checkTensor(ts[0], op);
  return ts[0];
}

void ProcessGroupAxon::checkList(const std::vector<at::Tensor>& list, const at::Tensor& like,
                                 const char* op, const char* what) {
  TORCH_CHECK(static_cast<int>(list.size()) == getSize(), "ProcessGroupAxon: ", op, ": the ",
              what, " list must have world size (", getSize(), ") tensors, got ", list.size());
  for (const auto& t : list) {
    checkTensor(t, op);
    checkSameDtypeAndFormat(t, like, op);
    TORCH_CHECK(t.numel() == like.numel(), "ProcessGroupAxon: ", op, ": every ", what,
                " tensor must have ", like.numel(), " elements, got ", t.numel());
  }
}

void ProcessGroupAxon::checkRoot(int64_t root, const char* op) {
  TORCH_CHECK(root >= 0 && root < getSize(), "ProcessGroupAxon: ", op, ": invalid root rank ",
              root, " for a group of size ", getSize());
}

void ProcessGroupAxon::checkPeer(int peer, const char* op) {
  TORCH_CHECK(peer >= 0 && peer < getSize() && peer != getRank(), "ProcessGroupAxon: ", op,
              ": invalid peer rank ", peer, " (rank ", getRank(), " of ", getSize(), ")");
}

}  // namespace at::axon
