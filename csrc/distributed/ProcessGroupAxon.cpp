// ProcessGroupAxon (see ProcessGroupAxon.h).
#include "ProcessGroupAxon.h"

#include <axon/env.h>
#include "GlooAxon.h"

#include <dirent.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <cstdlib>
#include <map>
#include <optional>
#include <mutex>
#include <random>
#include <thread>

#include <ATen/MemoryOverlap.h>
#include <ATen/core/ivalue.h>
#include <c10/core/Event.h>
#include <c10/core/StreamGuard.h>
#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>
#include <pybind11/chrono.h>
#include <torch/csrc/utils/pybind.h>

#include <axon/comm.h>

#include "../core/AxonRuntime.h"
#include "../core/AxonStream.h"
#include "../core/CachingAllocator.h"

namespace at::axon {
namespace {

namespace comm = ::axon::comm;
using c10d::OpType;

constexpr const char* kBackendName = "axon";

// What a collective's stream work reports back.
struct OpState {
  std::mutex mu;
  std::string error;
  void set_error(const std::string& e) {
    std::lock_guard<std::mutex> lock(mu);
    if (error.empty()) error = e;
  }
  std::string get_error() {
    std::lock_guard<std::mutex> lock(mu);
    return error;
  }
};

[[noreturn]] void throw_dist_error(const std::string& message) {
  C10_THROW_ERROR(DistBackendError, message);
}

class WorkAxon : public c10d::Work {
 public:
  WorkAxon(int rank, OpType type, const char* profiling_title, c10::DeviceIndex device,
           std::shared_ptr<OpState> state, c10::Event end,
           c10::intrusive_ptr<c10::ivalue::Future> future, std::vector<at::Tensor> outputs,
           bool ran_inline = false)
      : c10d::Work(rank, type, profiling_title),
        ran_inline_(ran_inline),
        device_(device),
        state_(std::move(state)),
        end_(std::move(end)),
        future_(std::move(future)),
        outputs_(std::move(outputs)) {}

  bool isCompleted() override { return end_.query(); }

  bool isSuccess() const override {
    return const_cast<c10::Event&>(end_).query() && state_->get_error().empty();
  }

  std::exception_ptr exception() const override {
    std::string e = state_->get_error();
    if (e.empty()) return nullptr;
    return std::make_exception_ptr(c10::DistBackendError(
        c10::SourceLocation{__func__, __FILE__, static_cast<uint32_t>(__LINE__)}, e));
  }

  std::vector<at::Tensor> result() override { return outputs_; }

  // Orders the caller's current stream after the collective (no host wait).
  // If the collective fails, the error is raised by stream work queued behind
  // it, so it surfaces at the caller's next synchronisation.
  bool wait(std::chrono::milliseconds /*timeout*/) override {
    std::string e = state_->get_error();
    if (!e.empty()) throw_dist_error(e);
    // Finished already (or before the call returned): nothing to order, and
    // its error, if any, was raised above.
    if (ran_inline_ || end_.query()) return true;
    c10::Stream current = getCurrentAxonStream(device_);
    end_.block(current);
    auto state = state_;
    rt_call([&] {
      ::axon::rt::launch(to_rt(current), "c10d::wait (axon)", [state] {
        std::string err = state->get_error();
        if (!err.empty()) throw std::runtime_error(err);
      });
    });
    return true;
  }

  void synchronize() override { wait(kNoTimeout); }

  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }

  // Blocks the host until the collective ran; raises its error.
  void hostWait() {
    try {
      end_.synchronize();
    } catch (const std::exception&) {
      // The communication stream's pending error is the collective's.
    }
    std::string e = state_->get_error();
    if (!e.empty()) throw_dist_error(e);
  }

 private:
  bool ran_inline_;
  c10::DeviceIndex device_;
  std::shared_ptr<OpState> state_;
  c10::Event end_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
  std::vector<at::Tensor> outputs_;
};

comm::DType to_comm(at::ScalarType t, const char* op) {
  switch (t) {
    case at::kFloat: return comm::DType::kFloat32;
    case at::kDouble: return comm::DType::kFloat64;
    case at::kHalf: return comm::DType::kFloat16;
    case at::kBFloat16: return comm::DType::kBFloat16;
    case at::kChar: return comm::DType::kInt8;
    case at::kByte: return comm::DType::kUInt8;
    case at::kShort: return comm::DType::kInt16;
    case at::kInt: return comm::DType::kInt32;
    case at::kLong: return comm::DType::kInt64;
    case at::kBool: return comm::DType::kBool;
    case at::kComplexFloat: return comm::DType::kFloat32;   // as (re, im) pairs
    case at::kComplexDouble: return comm::DType::kFloat64;
    default:
      TORCH_CHECK_TYPE(false, "ProcessGroupAxon: ", op, " does not support tensors of dtype ", t);
  }
}

// Elements as the transport counts them (complex: two reals).
size_t comm_count(const at::Tensor& t) {
  return static_cast<size_t>(t.numel()) * (t.is_complex() ? 2 : 1);
}

struct Reduction {
  comm::ReduceOp op;
  double factor = 1.0;
};

Reduction to_comm(const c10d::ReduceOp& op, const at::Tensor& t, const char* name) {
  using R = c10d::ReduceOp;
  Reduction r;
  switch (op.op_) {
    case R::SUM: r.op = comm::ReduceOp::kSum; break;
    case R::AVG: r.op = comm::ReduceOp::kAvg; break;
    case R::PRODUCT: r.op = comm::ReduceOp::kProduct; break;
    case R::MIN: r.op = comm::ReduceOp::kMin; break;
    case R::MAX: r.op = comm::ReduceOp::kMax; break;
    case R::BAND: r.op = comm::ReduceOp::kBand; break;
    case R::BOR: r.op = comm::ReduceOp::kBor; break;
    case R::BXOR: r.op = comm::ReduceOp::kBxor; break;
    case R::PREMUL_SUM: {
      r.op = comm::ReduceOp::kPremulSum;
      auto* s = dynamic_cast<c10d::PreMulSumSupplement*>(op.supplement_.get());
      TORCH_CHECK(s != nullptr, "ProcessGroupAxon: PREMUL_SUM without a factor");
      r.factor = s->tensor_factor.defined() ? s->tensor_factor.to(at::kCPU).item<double>()
                                            : s->double_factor;
      break;
    }
    default:
      TORCH_CHECK(false, "ProcessGroupAxon: ", name, " does not support this ReduceOp");
  }
  if (t.is_complex()) {
    TORCH_CHECK(r.op == comm::ReduceOp::kSum || r.op == comm::ReduceOp::kAvg ||
                    r.op == comm::ReduceOp::kPremulSum,
                "ProcessGroupAxon: ", name, " of complex tensors supports only SUM and AVG");
  }
  try {
    comm::check_reduce(to_comm(t.scalar_type(), name), r.op);
  } catch (const comm::CommError& e) {
    TORCH_CHECK(false, e.what());
  }
  return r;
}

char* ptr(const at::Tensor& t) { return static_cast<char*>(t.data_ptr()); }

// The dtype a call carries in its signature, which the ranks compare (see
// axon/comm.h): a comm::DType, or -1 for types comm does not name.  Complex
// types are named by their components (the element count tells them apart).
int dtype_tag(const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kFloat: case at::kDouble: case at::kHalf: case at::kBFloat16: case at::kChar:
    case at::kByte: case at::kShort: case at::kInt: case at::kLong: case at::kBool:
    case at::kComplexFloat: case at::kComplexDouble:
      return static_cast<int>(to_comm(t.scalar_type(), "signature"));
    default:
      return -1;
  }
}
size_t nbytes(const at::Tensor& t) { return t.numel() * t.element_size(); }

// The largest synchronous collective that may run on the calling thread (see
// enqueue_on).  With a core or more to spare per local rank, a large one is
// left to the communication stream, where it overlaps the caller's host work
// (FSDP1 issues its all-gathers and reduce-scatters synchronously on side
// streams); 4 MiB moves in about the 150-200 us a stream task's wake-ups cost
// here.  With no core to spare (as many local ranks as cores or more), the
// stream worker and the host thread share one core per rank, nothing
// overlaps, and the wake-ups are pure cost: any size runs inline.
// AXON_COMM_INLINE_BYTES overrides.
size_t inline_bytes_limit(size_t local_ranks) {
  size_t cores = 0;
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0) cores = static_cast<size_t>(CPU_COUNT(&set));
  if (cores == 0) cores = std::max(1u, std::thread::hardware_concurrency());
  const size_t fallback =
      local_ranks >= cores ? std::numeric_limits<size_t>::max() : size_t{4} << 20;
  return ::axon::rt::env_bytes("AXON_COMM_INLINE_BYTES", fallback);
}

comm::Config config_from_env(std::chrono::milliseconds timeout) {
  comm::Config c;
  // The runtime's byte-size parser (axon/env.h): "4MiB" or "4194304"; a bad
  // value warns "axon: ignoring ..." and keeps the default.
  c.slot_bytes = ::axon::rt::env_bytes("AXON_COMM_SLOT_BYTES", c.slot_bytes, 1);
  c.p2p_bytes = ::axon::rt::env_bytes("AXON_COMM_P2P_BYTES", c.p2p_bytes, 1);
  c.small_bytes = ::axon::rt::env_bytes("AXON_COMM_SMALL_BYTES", c.small_bytes);
  c.timeout = timeout;
  return c;
}

// A collective as queued while coalescing, or run at once.
struct Op {
  const char* name;
  bool p2p = false;
  comm::P2POp p2p_op{};
  std::function<void(comm::ShmGroup&)> fn;
  // A collective the caller does not run asynchronously, up to
  // inline_bytes_limit(): when both streams are idle it runs on the calling
  // thread (see enqueue_on).
  bool may_run_inline = false;
};

class ProcessGroupAxon : public c10d::Backend {
 public:
  // host_of[r]: the host index of global rank r (equal for all: one host).
  // With several hosts, `leaders` is a gloo group of the lowest rank of each
  // host (null on other ranks) and `global` a gloo group of all ranks.
  ProcessGroupAxon(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                   std::chrono::milliseconds timeout, std::vector<int> host_of,
                   c10::intrusive_ptr<c10d::Backend> leaders,
                   c10::intrusive_ptr<c10d::Backend> global)
      : c10d::Backend(rank, size), timeout_(timeout) {
    TORCH_CHECK(store, "ProcessGroupAxon needs a store");
    if (host_of.empty()) host_of.assign(size, 0);
    TORCH_CHECK(static_cast<int>(host_of.size()) == size,
                "ProcessGroupAxon: host_of must have one entry per rank");
    int my_host = host_of[rank];
    host_of_ = host_of;
    {
      std::vector<int> firsts;  // hosts in the order of their lowest rank
      for (int r = 0; r < size; ++r) {
        if (std::find(firsts.begin(), firsts.end(), host_of[r]) == firsts.end()) firsts.push_back(host_of[r]);
      }
      for (size_t i = 0; i < firsts.size(); ++i) host_order_[firsts[i]] = static_cast<int>(i);
    }
    for (int r = 0; r < size; ++r) {
      if (host_of[r] == my_host) local_ranks_.push_back(r);
      if (host_of[r] != my_host) multi_host_ = true;
    }
    local_rank_ = static_cast<int>(std::find(local_ranks_.begin(), local_ranks_.end(), rank) -
                                   local_ranks_.begin());
    if (multi_host_) {
      TORCH_CHECK(global, "ProcessGroupAxon: ranks on several hosts need a gloo group");
      TORCH_CHECK(local_rank_ != 0 || leaders, "ProcessGroupAxon: host leaders need a gloo group");
      leaders_ = std::move(leaders);
      global_ = std::move(global);
    }
    if (local_rank_ == 0) remove_stale_segments();
    std::string key = "axon_shm_name/" + std::to_string(my_host);
    std::string name;
    static std::atomic<int> counter{0};
    comm::Config config = config_from_env(timeout);
    inline_bytes_ = inline_bytes_limit(local_ranks_.size());
    try {
      if (local_rank_ == 0) {
        std::random_device rd;
        name = "axon-pg-" + std::to_string(getpid()) + "-" + std::to_string(counter++) + "-" +
               std::to_string(rd());
        shm_ = std::make_shared<comm::ShmGroup>(name, 0, local_ranks_.size(), config);
        store->set(key, std::vector<uint8_t>(name.begin(), name.end()));
      } else {
        auto bytes = store->get(key);
        name.assign(bytes.begin(), bytes.end());
        shm_ = std::make_shared<comm::ShmGroup>(name, local_rank_, local_ranks_.size(), config);
      }
      shm_->attach_all();
    } catch (const comm::CommError& e) {
      throw_dist_error(e.what());
    }
  }

  ~ProcessGroupAxon() override {
    // Stream work holds the transport; let it finish before the group goes.
    // Wait without consuming errors: a failure of that work (a recv that
    // timed out) stays pending on the communication stream, and the next
    // synchronising call that covers it raises it (torch.axon.synchronize(),
    // or any stream that waited on the work).
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
    std::lock_guard<std::mutex> lock(gloo_sends_->mu);
    for (auto& [work, data] : gloo_sends_->works) {
      try {
        work->wait();
      } catch (...) {
      }
    }
  }

  const std::string getBackendName() const override { return kBackendName; }

  bool supportsCoalescing() const override { return true; }

  void setTimeout(std::chrono::milliseconds timeout) override { timeout_ = timeout; }

  // ------------------------------------------------------------ collectives

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override {
    const char* op = "broadcast";
    at::Tensor t = single(tensors, op);
    check_root(opts.rootRank, op);
    char* p = ptr(t);
    size_t n = nbytes(t);
    int root = static_cast<int>(opts.rootRank);
    if (multi_host_) {
      // The root's host: a host broadcast from the root (its leader gets it);
      // leaders: gloo broadcast from the root host's leader; other hosts: a
      // host broadcast from their leader.
      auto it = std::find(local_ranks_.begin(), local_ranks_.end(), root);
      bool root_host = it != local_ranks_.end();
      int local_root = root_host ? static_cast<int>(it - local_ranks_.begin()) : 0;
      int root_leader_index = leader_index_of(root);
      auto leaders = leaders_;
      at::Tensor view = cpu_view(t);
      std::optional<comm::SharedBuffer> shared = shared_buffer(t);
      return enqueue(OpType::BROADCAST, op, {t}, {t}, [=](comm::ShmGroup& g) mutable {
        const comm::SharedBuffer* sp = shared ? &*shared : nullptr;
        if (root_host) g.broadcast(p, n, local_root, sp);
        if (g.rank() == 0) {
          std::vector<at::Tensor> v = {view};
          c10d::BroadcastOptions b;
          b.rootRank = root_leader_index;
          leaders->broadcast(v, b)->wait();
        }
        if (!root_host) g.broadcast(p, n, 0, sp);
      });
    }
    std::optional<comm::SharedBuffer> shared = shared_buffer(t);
    return enqueue(OpType::BROADCAST, op, {t}, {t},
                   Op{op, false, {}, [=](comm::ShmGroup& g) {
                        g.broadcast(p, n, root, shared ? &*shared : nullptr);
                      }, sync_inline(opts.asyncOp, n)});
  }

  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override {
    const char* op = "all_reduce";
    at::Tensor t = single(tensors, op);
    TORCH_CHECK(!opts.sparseIndices.has_value() && t.layout() == at::kStrided,
                "ProcessGroupAxon: all_reduce does not support sparse tensors");
    Reduction r = to_comm(opts.reduceOp, t, op);
    comm::DType dt = to_comm(t.scalar_type(), op);
    char* p = ptr(t);
    size_t n = comm_count(t);
    if (multi_host_) {
      // Host sum at the leader, leaders' all_reduce over gloo, host broadcast.
      bool scaled = r.op == comm::ReduceOp::kAvg || r.op == comm::ReduceOp::kPremulSum;
      comm::ReduceOp local = scaled ? comm::ReduceOp::kSum : r.op;
      double factor = r.op == comm::ReduceOp::kAvg ? 1.0 / getSize() : r.factor;
      c10d::AllreduceOptions gopts;
      gopts.reduceOp = scaled ? c10d::ReduceOp(c10d::ReduceOp::SUM) : opts.reduceOp;
      auto leaders = leaders_;
      at::Tensor view = cpu_view(t);
      size_t bytes = nbytes(t);
      std::optional<comm::SharedBuffer> shared = shared_buffer(t);
      return enqueue(OpType::ALLREDUCE, op, {t}, {t}, [=](comm::ShmGroup& g) mutable {
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
      });
    }
    // Device memory is mappable by the peers: large all_reduces work on the
    // ranks' tensors directly.
    std::optional<comm::SharedBuffer> shared = shared_buffer(t);
    return enqueue(OpType::ALLREDUCE, op, {t}, {t},
                   Op{op, false, {}, [=](comm::ShmGroup& g) {
                        g.all_reduce(p, n, dt, r.op, r.factor, shared ? &*shared : nullptr);
                      }, sync_inline(opts.asyncOp, nbytes(t))});
  }

  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
      std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) override {
    const char* op = "all_reduce_coalesced";
    TORCH_CHECK(!tensors.empty(), "ProcessGroupAxon: ", op, " needs at least one tensor");
    std::vector<std::tuple<char*, size_t, comm::DType, Reduction,
                           std::optional<comm::SharedBuffer>>> parts;
    for (auto& t : tensors) {
      check_tensor(t, op);
      parts.emplace_back(ptr(t), comm_count(t), to_comm(t.scalar_type(), op),
                         to_comm(opts.reduceOp, t, op), shared_buffer(t));
    }
    if (multi_host_) {
      auto [gop, factor] = gloo_reduce(opts.reduceOp, tensors[0]);
      c10d::AllreduceCoalescedOptions o;
      o.reduceOp = gop;
      return on_global(OpType::ALLREDUCE_COALESCED, op, tensors, tensors,
                       [v = cpu_views(tensors), o, factor](c10d::Backend& g) mutable {
                         auto w = g.allreduce_coalesced(v, o);
                         w->wait();
                         for (auto& t : v) scale(t, factor);
                         return c10::intrusive_ptr<c10d::Work>();
                       });
    }
    return enqueue(OpType::ALLREDUCE_COALESCED, op, tensors, tensors,
                   [parts](comm::ShmGroup& g) {
                     for (auto& [p, n, dt, r, sh] : parts) {
                       g.all_reduce(p, n, dt, r.op, r.factor, sh ? &*sh : nullptr);
                     }
                   });
  }

  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors,
                                        const c10d::ReduceOptions& opts) override {
    const char* op = "reduce";
    at::Tensor t = single(tensors, op);
    check_root(opts.rootRank, op);
    Reduction r = to_comm(opts.reduceOp, t, op);
    comm::DType dt = to_comm(t.scalar_type(), op);
    char* p = ptr(t);
    size_t n = comm_count(t);
    int root = static_cast<int>(opts.rootRank);
    if (multi_host_) {
      auto [gop, factor] = gloo_reduce(opts.reduceOp, t);
      c10d::ReduceOptions o = opts;
      o.reduceOp = gop;
      bool is_root = getRank() == root;
      return on_global(OpType::REDUCE, op, {t}, {t},
                       [v = cpu_views({t}), o, factor, is_root](c10d::Backend& g) mutable {
                         // On a copy: gloo uses non-root buffers as scratch,
                         // NCCL (and the shared-memory path) leave them alone.
                         std::vector<at::Tensor> buf = {v[0].clone()};
                         g.reduce(buf, o)->wait();
                         if (is_root) {
                           v[0].copy_(buf[0]);
                           scale(v[0], factor);
                         }
                         return c10::intrusive_ptr<c10d::Work>();
                       });
    }
    return enqueue(OpType::REDUCE, op, {t}, {t},
                   Op{op, false, {}, [=](comm::ShmGroup& g) {
                        g.reduce(p, n, dt, r.op, root, r.factor);
                      }, sync_inline(opts.asyncOp, nbytes(t))});
  }

  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts) override {
    const char* op = "all_gather";
    at::Tensor in = single(inputs, op);
    TORCH_CHECK(outputs.size() == 1, "ProcessGroupAxon: ", op, " takes one output list");
    auto& outs = outputs[0];
    check_list(outs, in, op, "output");
    std::vector<void*> dst;
    for (auto& o : outs) dst.push_back(ptr(o));
    const char* src = ptr(in);
    size_t n = nbytes(in);
    std::vector<at::Tensor> all = outs;
    all.push_back(in);
    if (multi_host_) {
      std::vector<std::vector<at::Tensor>> vo = {cpu_views(outs)};
      return on_global(OpType::ALLGATHER, op, all, outs,
                       [vo, vi = cpu_views({in})](c10d::Backend& g) mutable {
                         return g.allgather(vo, vi);
                       });
    }
    std::optional<comm::SharedBuffer> shared = shared_buffer(in);
    return enqueue(OpType::ALLGATHER, op, all, outs,
                   Op{op, false, {}, [=](comm::ShmGroup& g) {
                        g.all_gather(src, n, dst.data(), shared ? &*shared : nullptr);
                      }, sync_inline(opts.asyncOp, n * getSize())});
  }

  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts) override {
    const char* op = "all_gather_into_tensor";
    check_tensor(input, op);
    check_tensor(output, op);
    check_same_dtype(input, output, op);
    TORCH_CHECK(output.numel() == input.numel() * getSize(), "ProcessGroupAxon: ", op,
                ": output tensor size must be equal to world_size times input tensor size (",
                output.numel(), " vs ", getSize(), " x ", input.numel(), ")");
    size_t n = nbytes(input);
    std::vector<void*> dst;
    for (int r = 0; r < getSize(); ++r) dst.push_back(ptr(output) + r * n);
    const char* src = ptr(input);
    if (multi_host_) {
      return on_global(OpType::_ALLGATHER_BASE, op, {input, output}, {output},
                       [vo = cpu_view(output), vi = cpu_view(input)](c10d::Backend& g) mutable {
                         return g._allgather_base(vo, vi);
                       });
    }
    std::optional<comm::SharedBuffer> shared = shared_buffer(input);
    return enqueue(OpType::_ALLGATHER_BASE, op, {input, output}, {output},
                   Op{op, false, {}, [=](comm::ShmGroup& g) {
                        g.all_gather(src, n, dst.data(), shared ? &*shared : nullptr);
                      }, sync_inline(opts.asyncOp, nbytes(output))});
  }

  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions&) override {
    const char* op = "all_gather_into_tensor_coalesced";
    TORCH_CHECK(outputs.size() == inputs.size(), "ProcessGroupAxon: ", op,
                ": as many outputs as inputs are needed");
    std::vector<std::pair<const char*, std::vector<void*>>> parts;
    std::vector<size_t> sizes;
    std::vector<at::Tensor> all;
    for (size_t i = 0; i < inputs.size(); ++i) {
      check_tensor(inputs[i], op);
      check_tensor(outputs[i], op);
      check_same_dtype(inputs[i], outputs[i], op);
      TORCH_CHECK(outputs[i].numel() == inputs[i].numel() * getSize(), "ProcessGroupAxon: ", op,
                  ": output tensor size must be equal to world_size times input tensor size");
      size_t n = nbytes(inputs[i]);
      std::vector<void*> dst;
      for (int r = 0; r < getSize(); ++r) dst.push_back(ptr(outputs[i]) + r * n);
      parts.emplace_back(ptr(inputs[i]), std::move(dst));
      sizes.push_back(n);
      all.push_back(inputs[i]);
      all.push_back(outputs[i]);
    }
    if (multi_host_) {
      return on_global(OpType::COALESCED, op, all, outputs,
                       [vo = cpu_views(outputs), vi = cpu_views(inputs)](c10d::Backend& g) mutable {
                         c10::intrusive_ptr<c10d::Work> w;
                         for (size_t i = 0; i < vi.size(); ++i) {
                           w = g._allgather_base(vo[i], vi[i]);
                           w->wait();
                         }
                         return c10::intrusive_ptr<c10d::Work>();
                       });
    }
    return enqueue(OpType::COALESCED, op, all, outputs, [=](comm::ShmGroup& g) {
      for (size_t i = 0; i < parts.size(); ++i) {
        g.all_gather(parts[i].first, sizes[i], parts[i].second.data());
      }
    });
  }

  c10::intrusive_ptr<c10d::Work> allgather_coalesced(
      std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions&) override {
    const char* op = "all_gather_coalesced";
    TORCH_CHECK(outputs.size() == inputs.size(), "ProcessGroupAxon: ", op,
                ": as many output lists as inputs are needed");
    std::vector<std::pair<const char*, std::vector<void*>>> parts;
    std::vector<size_t> sizes;
    std::vector<at::Tensor> all, outs;
    for (size_t i = 0; i < inputs.size(); ++i) {
      check_tensor(inputs[i], op);
      check_list(outputs[i], inputs[i], op, "output");
      std::vector<void*> dst;
      for (auto& o : outputs[i]) {
        dst.push_back(ptr(o));
        all.push_back(o);
        outs.push_back(o);
      }
      parts.emplace_back(ptr(inputs[i]), std::move(dst));
      sizes.push_back(nbytes(inputs[i]));
      all.push_back(inputs[i]);
    }
    if (multi_host_) {
      std::vector<std::vector<at::Tensor>> vo;
      for (auto& l : outputs) vo.push_back(cpu_views(l));
      return on_global(OpType::ALLGATHER_COALESCED, op, all, outs,
                       [vo, vi = cpu_views(inputs)](c10d::Backend& g) mutable {
                         return g.allgather_coalesced(vo, vi);
                       });
    }
    return enqueue(OpType::ALLGATHER_COALESCED, op, all, outs, [=](comm::ShmGroup& g) {
      for (size_t i = 0; i < parts.size(); ++i) {
        g.all_gather(parts[i].first, sizes[i], parts[i].second.data());
      }
    });
  }

  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs,
                                        std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& opts) override {
    const char* op = "gather";
    at::Tensor in = single(inputs, op);
    check_root(opts.rootRank, op);
    int root = static_cast<int>(opts.rootRank);
    std::vector<void*> dst(getSize(), nullptr);
    std::vector<at::Tensor> all = {in}, outs;
    if (getRank() == root) {
      TORCH_CHECK(outputs.size() == 1, "ProcessGroupAxon: gather: requires a single-element "
                  "output list on the root");
      check_list(outputs[0], in, op, "output");
      for (int r = 0; r < getSize(); ++r) dst[r] = ptr(outputs[0][r]);
      all.insert(all.end(), outputs[0].begin(), outputs[0].end());
      outs = outputs[0];
    } else {
      TORCH_CHECK(outputs.empty() || (outputs.size() == 1 && outputs[0].empty()),
                  "ProcessGroupAxon: gather: requires empty output on non-root");
    }
    const char* src = ptr(in);
    size_t n = nbytes(in);
    if (multi_host_) {
      std::vector<std::vector<at::Tensor>> vo;
      for (auto& l : outputs) vo.push_back(cpu_views(l));
      return on_global(OpType::GATHER, op, all, outs,
                       [vo, vi = cpu_views({in}), opts](c10d::Backend& g) mutable {
                         return g.gather(vo, vi, opts);
                       });
    }
    return enqueue(OpType::GATHER, op, all, outs,
                   Op{op, false, {}, [=](comm::ShmGroup& g) {
                        g.gather(src, n, dst.data(), root);
                      }, sync_inline(opts.asyncOp, n * getSize())});
  }

  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs,
                                         std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts) override {
    const char* op = "scatter";
    at::Tensor out = single(outputs, op);
    check_root(opts.rootRank, op);
    int root = static_cast<int>(opts.rootRank);
    std::vector<const void*> src(getSize(), nullptr);
    std::vector<at::Tensor> all = {out};
    if (getRank() == root) {
      TORCH_CHECK(inputs.size() == 1, "ProcessGroupAxon: scatter: requires a single-element "
                  "input list on the root");
      check_list(inputs[0], out, op, "input");
      for (int r = 0; r < getSize(); ++r) src[r] = ptr(inputs[0][r]);
      all.insert(all.end(), inputs[0].begin(), inputs[0].end());
    } else {
      TORCH_CHECK(inputs.empty() || (inputs.size() == 1 && inputs[0].empty()),
                  "ProcessGroupAxon: scatter: requires empty input on non-root");
    }
    char* dst = ptr(out);
    size_t n = nbytes(out);
    if (multi_host_) {
      std::vector<std::vector<at::Tensor>> vi;
      for (auto& l : inputs) vi.push_back(cpu_views(l));
      return on_global(OpType::SCATTER, op, all, {out},
                       [vo = cpu_views({out}), vi, opts](c10d::Backend& g) mutable {
                         return g.scatter(vo, vi, opts);
                       });
    }
    return enqueue(OpType::SCATTER, op, all, {out},
                   Op{op, false, {}, [=](comm::ShmGroup& g) {
                        g.scatter(src.data(), n, dst, root);
                      }, sync_inline(opts.asyncOp, n * getSize())});
  }

  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override {
    const char* op = "reduce_scatter";
    at::Tensor out = single(outputs, op);
    TORCH_CHECK(inputs.size() == 1, "ProcessGroupAxon: ", op, " takes one input list");
    check_list(inputs[0], out, op, "input");
    Reduction r = to_comm(opts.reduceOp, out, op);
    comm::DType dt = to_comm(out.scalar_type(), op);
    std::vector<const void*> src;
    for (auto& t : inputs[0]) src.push_back(ptr(t));
    std::vector<at::Tensor> all = inputs[0];
    all.push_back(out);
    char* dst = ptr(out);
    size_t n = comm_count(out);
    if (multi_host_) {
      auto [gop, factor] = gloo_reduce(opts.reduceOp, out);
      c10d::ReduceScatterOptions o;
      o.reduceOp = gop;
      std::vector<std::vector<at::Tensor>> vi = {cpu_views(inputs[0])};
      return on_global(OpType::REDUCE_SCATTER, op, all, {out},
                       [vo = cpu_views({out}), vi, o, factor](c10d::Backend& g) mutable {
                         auto w = g.reduce_scatter(vo, vi, o);
                         w->wait();
                         scale(vo[0], factor);
                         return c10::intrusive_ptr<c10d::Work>();
                       });
    }
    return enqueue(OpType::REDUCE_SCATTER, op, all, {out},
                   Op{op, false, {}, [=](comm::ShmGroup& g) {
                        g.reduce_scatter(src.data(), dst, n, dt, r.op, r.factor);
                      }, sync_inline(opts.asyncOp, nbytes(out) * getSize())});
  }

  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(
      at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) override {
    const char* op = "reduce_scatter_tensor";
    check_tensor(input, op);
    check_tensor(output, op);
    check_same_dtype(input, output, op);
    TORCH_CHECK(input.numel() == output.numel() * getSize(), "ProcessGroupAxon: ", op,
                ": input tensor must be the same size as output size times world size (",
                input.numel(), " vs ", output.numel(), " x ", getSize(), ")");
    Reduction r = to_comm(opts.reduceOp, output, op);
    comm::DType dt = to_comm(output.scalar_type(), op);
    size_t n = comm_count(output);
    size_t step = nbytes(output);
    std::vector<const void*> src;
    for (int q = 0; q < getSize(); ++q) src.push_back(ptr(input) + q * step);
    char* dst = ptr(output);
    if (multi_host_) {
      auto [gop, factor] = gloo_reduce(opts.reduceOp, output);
      c10d::ReduceScatterOptions o;
      o.reduceOp = gop;
      return on_global(OpType::_REDUCE_SCATTER_BASE, op, {input, output}, {output},
                       [vo = cpu_view(output), vi = cpu_view(input), o, factor,
                        rank = getRank(), size = getSize()](c10d::Backend& g) mutable {
                         reduce_scatter_via_allreduce(g, vo, vi, o.reduceOp, rank, size);
                         scale(vo, factor);
                         return c10::intrusive_ptr<c10d::Work>();
                       });
    }
    std::optional<comm::SharedBuffer> shared = shared_buffer(input);
    return enqueue(OpType::_REDUCE_SCATTER_BASE, op, {input, output}, {output},
                   Op{op, false, {}, [=](comm::ShmGroup& g) {
                        g.reduce_scatter(src.data(), dst, n, dt, r.op, r.factor,
                                         shared ? &*shared : nullptr);
                      }, sync_inline(opts.asyncOp, nbytes(input))});
  }

  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::ReduceScatterOptions& opts) override {
    const char* op = "reduce_scatter_tensor_coalesced";
    TORCH_CHECK(outputs.size() == inputs.size(), "ProcessGroupAxon: ", op,
                ": as many outputs as inputs are needed");
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
      check_tensor(inputs[i], op);
      check_tensor(outputs[i], op);
      check_same_dtype(inputs[i], outputs[i], op);
      TORCH_CHECK(inputs[i].numel() == outputs[i].numel() * getSize(), "ProcessGroupAxon: ", op,
                  ": input tensor must be the same size as output size times world size");
      Part p;
      size_t step = nbytes(outputs[i]);
      for (int q = 0; q < getSize(); ++q) p.src.push_back(ptr(inputs[i]) + q * step);
      p.dst = ptr(outputs[i]);
      p.n = comm_count(outputs[i]);
      p.dt = to_comm(outputs[i].scalar_type(), op);
      p.r = to_comm(opts.reduceOp, outputs[i], op);
      parts.push_back(std::move(p));
      all.push_back(inputs[i]);
      all.push_back(outputs[i]);
    }
    if (multi_host_) {
      auto [gop, factor] = gloo_reduce(opts.reduceOp, outputs[0]);
      c10d::ReduceScatterOptions o;
      o.reduceOp = gop;
      return on_global(OpType::COALESCED, op, all, outputs,
                       [vo = cpu_views(outputs), vi = cpu_views(inputs), o, factor,
                        rank = getRank(), size = getSize()](c10d::Backend& g) mutable {
                         for (size_t i = 0; i < vi.size(); ++i) {
                           reduce_scatter_via_allreduce(g, vo[i], vi[i], o.reduceOp, rank, size);
                           scale(vo[i], factor);
                         }
                         return c10::intrusive_ptr<c10d::Work>();
                       });
    }
    return enqueue(OpType::COALESCED, op, all, outputs, [parts](comm::ShmGroup& g) {
      for (auto& p : parts) g.reduce_scatter(p.src.data(), p.dst, p.n, p.dt, p.r.op, p.r.factor);
    });
  }

  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& output_split_sizes,
                                               std::vector<int64_t>& input_split_sizes,
                                               const c10d::AllToAllOptions& opts) override {
    const char* op = "all_to_all_single";
    check_tensor(input, op);
    check_tensor(output, op);
    check_same_dtype(input, output, op);
    int n = getSize();
    auto splits = [&](const at::Tensor& t, const std::vector<int64_t>& sizes, const char* what) {
      std::vector<size_t> bytes(n);
      int64_t rows = t.dim() > 0 ? t.size(0) : 1;
      int64_t row_bytes = rows > 0 ? nbytes(t) / rows : 0;
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
      src[r] = ptr(source) + so;
      dst[r] = ptr(output) + ro;
      so += sb[r];
      ro += rb[r];
    }
    if (multi_host_) {
      return on_global(OpType::ALLTOALL_BASE, op, {source, output}, {output},
                       [vo = cpu_view(output), vi = cpu_view(source), os = output_split_sizes,
                        is = input_split_sizes](c10d::Backend& g) mutable {
                         return g.alltoall_base(vo, vi, os, is);
                       });
    }
    // Peers read this rank's input (or its copy) directly.
    std::optional<comm::SharedBuffer> shared = shared_buffer(source);
    return enqueue(OpType::ALLTOALL_BASE, op, {source, output}, {output},
                   Op{op, false, {}, [=](comm::ShmGroup& g) {
                        g.all_to_all(src.data(), sb.data(), dst.data(), rb.data(),
                                     shared ? &*shared : nullptr);
                      }, sync_inline(opts.asyncOp, std::max(nbytes(input), nbytes(output)))});
  }

  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs,
                                          std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions& opts) override {
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
      check_tensor(inputs[r], op);
      check_tensor(outputs[r], op);
      check_same_dtype(inputs[r], inputs[0], op);
      check_same_dtype(outputs[r], inputs[0], op);
      src[r] = ptr(inputs[r]);
      dst[r] = ptr(outputs[r]);
      sb[r] = nbytes(inputs[r]);
      rb[r] = nbytes(outputs[r]);
      all.push_back(inputs[r]);
      all.push_back(outputs[r]);
    }
    if (multi_host_) {
      return on_global(OpType::ALLTOALL, op, all, outputs,
                       [vo = cpu_views(outputs), vi = cpu_views(inputs)](c10d::Backend& g) mutable {
                         // gloo's list all_to_all needs equal sizes: one flat
                         // all_to_all_single with the lists' sizes as splits.
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
                         return c10::intrusive_ptr<c10d::Work>();
                       });
    }
    size_t sent = 0;
    for (size_t x : sb) sent += x;
    return enqueue(OpType::ALLTOALL, op, all, outputs,
                   Op{op, false, {}, [=](comm::ShmGroup& g) {
                        g.all_to_all(src.data(), sb.data(), dst.data(), rb.data());
                      }, sync_inline(opts.asyncOp, sent)});
  }

  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst,
                                      int /*tag*/) override {
    const char* op = "send";
    at::Tensor t = single(tensors, op);
    check_peer(dst, op);
    if (multi_host_) {
      // The data is copied and the send posted without waiting for the
      // receiver (which may be behind a send of its own, as in a ring of
      // isend/irecv): the buffer is free at once, as with the shared-memory
      // ring buffer.  Sends in flight are kept until they complete.
      auto global = global_;
      auto sends = gloo_sends_;
      return enqueue(OpType::SEND, op, {t}, {},
                     [global, sends, v = cpu_view(t), dst](comm::ShmGroup&) mutable {
                       std::vector<at::Tensor> tv = {v.clone()};
                       auto w = global->send(tv, dst, 0);
                       std::lock_guard<std::mutex> lock(sends->mu);
                       auto& in_flight = sends->works;
                       in_flight.erase(std::remove_if(in_flight.begin(), in_flight.end(),
                                                      [](auto& p) { return p.first->isCompleted(); }),
                                       in_flight.end());
                       in_flight.emplace_back(w, tv[0]);
                     });
    }
    Op o{op, true, comm::P2POp{true, dst, ptr(t), nbytes(t), dtype_tag(t)}, nullptr};
    return enqueue(OpType::SEND, op, {t}, {}, std::move(o));
  }

  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src,
                                      int /*tag*/) override {
    const char* op = "recv";
    at::Tensor t = single(tensors, op);
    check_peer(src, op);
    if (multi_host_) {
      auto global = global_;
      auto pending = gloo_pending_;
      return enqueue(OpType::RECV, op, {t}, {t},
                     [global, pending, v = cpu_views({t}), src](comm::ShmGroup&) mutable {
                       auto w = global->recv(v, src, 0);
                       if (pending) pending->push_back(w); else w->wait();
                     });
    }
    Op o{op, true, comm::P2POp{false, src, ptr(t), nbytes(t), dtype_tag(t)}, nullptr};
    return enqueue(OpType::RECV, op, {t}, {t}, std::move(o));
  }

  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>&, int) override {
    TORCH_CHECK(false, "ProcessGroupAxon does not support recv from any source; pass src");
  }

  // Blocks the host until every rank arrived (like NCCL's barrier, which
  // synchronises the device).
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override {
    const char* op = "barrier";
    // Once bound, the group's device: its communication stream is the only
    // thread that may drive the transport.
    c10::DeviceIndex device = device_ >= 0 ? device_
                              : opts.device.has_value() && opts.device->type() == kAxon
                                  ? resolve_index(*opts.device)
                                  : current_device();
    auto leaders = leaders_;
    bool mh = multi_host_;
    auto work = enqueue_on(device, OpType::BARRIER, op, {}, {},
                           Op{op, false, {}, [leaders, mh](comm::ShmGroup& g) {
                                g.barrier();
                                if (mh && g.rank() == 0) leaders->barrier()->wait();
                                if (mh) g.barrier();
                              }, true});
    if (!coalescing_) static_cast<WorkAxon*>(work.get())->hostWait();
    return work;
  }

  void startCoalescing() override {
    TORCH_CHECK(!coalescing_, "ProcessGroupAxon: coalescing already started");
    coalescing_ = true;
    coalesced_.clear();
    if (multi_host_) gloo_pending_ = std::make_shared<std::vector<c10::intrusive_ptr<c10d::Work>>>();
    coalesced_tensors_.clear();
    coalesced_outputs_.clear();
  }

  c10::intrusive_ptr<c10d::Work> endCoalescing() override {
    TORCH_CHECK(coalescing_, "ProcessGroupAxon: endCoalescing without startCoalescing");
    coalescing_ = false;
    std::vector<Op> ops = std::move(coalesced_);
    coalesced_.clear();
    c10::DeviceIndex device = device_ >= 0 ? device_ : current_device();
    auto pending = std::move(gloo_pending_);
    gloo_pending_.reset();
    Op all{"coalesced", false, {}, [ops, pending](comm::ShmGroup& g) {
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
        o.fn(g);
      }
      if (!batch.empty()) g.send_recv_batch(batch);
      if (pending) {
        for (auto& w : *pending) w->wait();
      }
    }};
    return enqueue_on(device, OpType::COALESCED, "coalesced", std::move(coalesced_tensors_),
                      std::move(coalesced_outputs_), std::move(all));
  }


  // A segment is unlinked as soon as every rank has attached, so only a
  // process killed while a group was forming can leave one behind; its name
  // carries the creator's pid: those of processes that are gone are removed
  // when the next group is created.
  static void remove_stale_segments() {
    DIR* dir = opendir("/dev/shm");
    if (dir == nullptr) return;
    while (dirent* e = readdir(dir)) {
      std::string n = e->d_name;
      if (n.rfind("axon-pg-", 0) != 0) continue;
      long pid = std::strtol(n.c_str() + 8, nullptr, 10);
      if (pid > 0 && kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) {
        shm_unlink(("/" + n).c_str());
      }
    }
    closedir(dir);
  }

  // Test hook: whether the group spans several hosts, and this rank's host-local rank.
  bool multiHost() const { return multi_host_; }
  int localRank() const { return local_rank_; }

 private:
  // ------------------------------------------------------------ several hosts
  //
  // all_reduce, broadcast and barrier are hierarchical: shared memory within
  // the host, gloo between the hosts' leaders (lowest rank of each host) on
  // CPU views of the device buffers (device memory is host-addressable).
  // The other collectives run on gloo over all ranks.

  // The rank in the leaders' group of the leader of `rank`'s host (hosts are
  // ordered by their lowest rank, as the Python side creates that group).
  int leader_index_of(int rank) const { return host_order_.at(host_of_.at(rank)); }

  static at::Tensor cpu_view(const at::Tensor& t) {
    return at::from_blob(t.data_ptr(), t.sizes(), t.strides(),
                         at::TensorOptions().dtype(t.dtype()).device(at::kCPU));
  }
  static std::vector<at::Tensor> cpu_views(const std::vector<at::Tensor>& ts) {
    std::vector<at::Tensor> out;
    for (const auto& t : ts) out.push_back(cpu_view(t));
    return out;
  }

  // gloo has no AVG or PREMUL_SUM: SUM, then scale by the returned factor (NaN: none).
  std::pair<c10d::ReduceOp, double> gloo_reduce(const c10d::ReduceOp& op, const at::Tensor& t) {
    Reduction r = to_comm(op, t, "reduction");
    if (r.op == comm::ReduceOp::kAvg) return {c10d::ReduceOp(c10d::ReduceOp::SUM), 1.0 / getSize()};
    if (r.op == comm::ReduceOp::kPremulSum) return {c10d::ReduceOp(c10d::ReduceOp::SUM), r.factor};
    return {op, std::numeric_limits<double>::quiet_NaN()};
  }
  // gloo's reduce_scatter_tensor(_coalesced) in torch 2.13 always sums (it
  // drops the op); this is what it does, with the op.
  static void reduce_scatter_via_allreduce(c10d::Backend& g, at::Tensor& out, const at::Tensor& in,
                                           const c10d::ReduceOp& op, int rank, int size) {
    std::vector<at::Tensor> buf = {in.clone()};
    c10d::AllreduceOptions ao;
    ao.reduceOp = op;
    g.allreduce(buf, ao)->wait();
    out.copy_(buf[0].chunk(size)[rank]);
  }

  static void scale(const at::Tensor& t, double factor) {
    if (std::isnan(factor) || t.numel() == 0) return;
    comm::DType dt = to_comm(t.scalar_type(), "scale");
    const void* src = t.data_ptr();
    comm::reduce(dt, comm::ReduceOp::kPremulSum, t.data_ptr(), &src, 1, comm_count(t), factor);
  }

  // Runs a gloo collective (over all ranks) as stream work.
  c10::intrusive_ptr<c10d::Work> on_global(OpType type, const char* name,
                                           std::vector<at::Tensor> tensors,
                                           std::vector<at::Tensor> outputs,
                                           std::function<c10::intrusive_ptr<c10d::Work>(c10d::Backend&)> fn) {
    auto global = global_;
    return enqueue(type, name, std::move(tensors), std::move(outputs),
                   [global, fn](comm::ShmGroup&) {
                     // fn waits itself when it post-processes (returns null).
                     if (auto w = fn(*global)) w->wait();
                   });
  }

  // ------------------------------------------------------------ checks

  void check_tensor(const at::Tensor& t, const char* op) {
    TORCH_CHECK(t.defined(), "ProcessGroupAxon: ", op, ": undefined tensor");
    TORCH_CHECK(t.device().type() == kAxon, "ProcessGroupAxon: ", op,
                ": all tensors must be on an axon device, but one is on ", t.device(),
                " (use a \"cpu:gloo,axon:axon\" group for CPU tensors)");
    TORCH_CHECK(t.layout() == at::kStrided, "ProcessGroupAxon: ", op,
                " does not support sparse tensors");
    TORCH_CHECK(t.is_contiguous() || t.is_contiguous(at::MemoryFormat::ChannelsLast) ||
                    t.is_contiguous(at::MemoryFormat::ChannelsLast3d),
                "ProcessGroupAxon: ", op, ": tensors must be contiguous");
    (void)to_comm(t.scalar_type(), op);
    c10::DeviceIndex d = t.device().index();
    if (device_ < 0) device_ = d;
    TORCH_CHECK(d == device_, "ProcessGroupAxon: ", op, ": this process group runs on axon:",
                static_cast<int>(device_), " but a tensor is on axon:", static_cast<int>(d),
                " (one device per rank and group; call torch.axon.set_device(local_rank) "
                "before the first collective)");
  }

  void check_same_dtype(const at::Tensor& a, const at::Tensor& b, const char* op) {
    TORCH_CHECK_TYPE(a.scalar_type() == b.scalar_type(), "ProcessGroupAxon: ", op,
                     ": tensors must have the same dtype, got ", a.scalar_type(), " and ",
                     b.scalar_type());
  }

  at::Tensor single(std::vector<at::Tensor>& ts, const char* op) {
    TORCH_CHECK(ts.size() == 1, "ProcessGroupAxon: ", op,
                " takes exactly one tensor per rank (one device per process), got ", ts.size());
    check_tensor(ts[0], op);
    return ts[0];
  }

  void check_list(const std::vector<at::Tensor>& list, const at::Tensor& like, const char* op,
                  const char* what) {
    TORCH_CHECK(static_cast<int>(list.size()) == getSize(), "ProcessGroupAxon: ", op, ": the ",
                what, " list must have world size (", getSize(), ") tensors, got ",
                list.size());
    for (const auto& t : list) {
      check_tensor(t, op);
      check_same_dtype(t, like, op);
      TORCH_CHECK(t.numel() == like.numel(), "ProcessGroupAxon: ", op, ": every ", what,
                  " tensor must have ", like.numel(), " elements, got ", t.numel());
    }
  }

  bool sync_inline(bool async_op, size_t bytes) const {
    return !async_op && bytes <= inline_bytes_;
  }

  static std::optional<comm::SharedBuffer> shared_buffer(const at::Tensor& t) {
    ::axon::rt::MemoryExport ex;
    if (t.numel() == 0 || !::axon::rt::memory_export(t.data_ptr(), &ex)) return std::nullopt;
    return comm::SharedBuffer{ex.fd, ex.id, ex.size, ex.offset};
  }

  void check_root(int64_t root, const char* op) {
    TORCH_CHECK(root >= 0 && root < getSize(), "ProcessGroupAxon: ", op, ": invalid root rank ",
                root, " for a group of size ", getSize());
  }

  void check_peer(int peer, const char* op) {
    TORCH_CHECK(peer >= 0 && peer < getSize() && peer != getRank(), "ProcessGroupAxon: ", op,
                ": invalid peer rank ", peer, " (rank ", getRank(), " of ", getSize(), ")");
  }

  // ------------------------------------------------------------ streams

  c10::Stream commStream(c10::DeviceIndex device) {
    auto it = streams_.find(device);
    if (it != streams_.end()) return it->second;
    // A stream of the group's own: a collective never queues behind another
    // group's (a 2-D mesh's groups can be entered in different orders by
    // different ranks) or behind a user's pool stream.
    c10::Stream s = to_c10(rt_call([&] { return ::axon::rt::stream_dedicated(device); }));
    streams_.emplace(device, s);
    return s;
  }

  c10::intrusive_ptr<c10d::Work> enqueue(OpType type, const char* name,
                                         std::vector<at::Tensor> tensors,
                                         std::vector<at::Tensor> outputs,
                                         std::function<void(comm::ShmGroup&)> fn) {
    return enqueue(type, name, std::move(tensors), std::move(outputs),
                   Op{name, false, {}, std::move(fn)});
  }

  c10::intrusive_ptr<c10d::Work> enqueue(OpType type, const char* name,
                                         std::vector<at::Tensor> tensors,
                                         std::vector<at::Tensor> outputs, Op op) {
    c10::DeviceIndex device = device_ >= 0 ? device_ : current_device();
    return enqueue_on(device, type, name, std::move(tensors), std::move(outputs), std::move(op));
  }

  c10::intrusive_ptr<c10d::Work> enqueue_on(c10::DeviceIndex device, OpType type,
                                            const char* name, std::vector<at::Tensor> tensors,
                                            std::vector<at::Tensor> outputs, Op op) {
    if (std::string broken = shm_->broken(); !broken.empty()) {
      throw_dist_error(std::string("ProcessGroupAxon: cannot run ") + name +
                       ": the process group failed earlier: " + broken);
    }
    if (!op.p2p && op.fn && !tensors.empty()) {
      // Byte-moving calls (broadcast, all_gather, ...) carry the dtype of
      // their tensors in the signature the ranks compare.
      op.fn = [tag = dtype_tag(tensors[0]), fn = std::move(op.fn)](comm::ShmGroup& g) {
        g.set_dtype_tag(tag);
        fn(g);
      };
    }
    if (coalescing_) {
      coalesced_.push_back(std::move(op));
      coalesced_tensors_.insert(coalesced_tensors_.end(), tensors.begin(), tensors.end());
      coalesced_outputs_.insert(coalesced_outputs_.end(), outputs.begin(), outputs.end());
      // The operation runs at endCoalescing(); its Work is that call's.
      auto state = std::make_shared<OpState>();
      c10::Event done(kAxon);
      auto future = c10::make_intrusive<c10::ivalue::Future>(
          c10::ListType::create(c10::TensorType::get()));
      future->markCompleted(c10::IValue(std::vector<at::Tensor>{}));
      return c10::make_intrusive<WorkAxon>(getRank(), type, name, device, state, std::move(done),
                                           future, std::vector<at::Tensor>{});
    }
    c10::Stream current = getCurrentAxonStream(device);
    c10::Stream comm_stream = commStream(device);
    if (op.may_run_inline && !op.p2p && ::axon::rt::stream_query(to_rt(current)) &&
        ::axon::rt::stream_query(to_rt(comm_stream))) {
      // Latency: a synchronous collective with nothing queued before it runs
      // here, on the calling thread, instead of waking the stream workers (3
      // thread switches per rank on few cores, ~150-200 us here).  Stream
      // order is kept: both streams are idle, so its inputs are final, and
      // it is done before anything queued after it.
      auto state = std::make_shared<OpState>();
      try {
        run_op(*shm_, *state, timeout_, name, [&] { op.fn(*shm_); });
      } catch (const std::exception& e) {
        throw_dist_error(e.what());
      }
      auto future = c10::make_intrusive<c10::ivalue::Future>(
          c10::ListType::create(c10::TensorType::get()));
      future->markCompleted(c10::IValue(outputs));
      return c10::make_intrusive<WorkAxon>(getRank(), type, name, device, state,
                                           c10::Event(kAxon), future, std::move(outputs), true);
    }
    // The collective runs after the work that produced its inputs.
    c10::Event ready(kAxon);
    ready.record(current);
    ready.block(comm_stream);
    // Memory freed by the caller meanwhile is not reused before the collective ran.
    for (const auto& t : tensors) {
      if (t.numel() > 0) getCachingAllocator()->recordStream(t.storage().data_ptr(), comm_stream);
    }
    auto state = std::make_shared<OpState>();
    auto shm = shm_;
    auto timeout = timeout_;
    std::function<void()> task;
    if (op.p2p) {
      comm::P2POp p = op.p2p_op;
      task = [shm, state, p, timeout, name] {
        run_op(*shm, *state, timeout, name, [&] { shm->send_recv_batch({p}); });
      };
    } else {
      auto fn = std::move(op.fn);
      task = [shm, state, fn, timeout, name] {
        run_op(*shm, *state, timeout, name, [&] { fn(*shm); });
      };
    }
    rt_call([&] { ::axon::rt::launch(to_rt(comm_stream), name, std::move(task)); });
    c10::Event end(kAxon);
    end.record(comm_stream);
    // A future completed "on the communication stream": its users' streams
    // wait for the collective (DDP's communication hooks use it).
    std::vector<c10::Device> devices = {c10::Device(kAxon, device)};
    auto future = c10::make_intrusive<c10::ivalue::Future>(
        c10::ListType::create(c10::TensorType::get()), devices);
    {
      c10::StreamGuard guard(comm_stream);
      future->markCompleted(c10::IValue(outputs));
    }
    return c10::make_intrusive<WorkAxon>(getRank(), type, name, device, state, std::move(end),
                                         future, std::move(outputs));
  }

  template <typename F>
  static void run_op(comm::ShmGroup& shm, OpState& state, std::chrono::milliseconds timeout,
                     const char* name, F&& body) {
    try {
      shm.set_timeout(timeout);
      body();
    } catch (const std::exception& e) {
      std::string message = e.what();
      if (message.rfind("axon process group", 0) != 0) {
        message = std::string("axon process group: ") + name + " failed: " + message;
      }
      state.set_error(message);
      // Whatever failed (the transport, or gloo between hosts), the ranks may
      // now be at different steps: the group is done for, here and for peers.
      shm.abort(message);
      throw std::runtime_error(message);
    }
  }

  std::chrono::milliseconds timeout_;
  bool multi_host_ = false;
  std::vector<int> local_ranks_;  // the global ranks on this host
  std::vector<int> host_of_;
  std::map<int, int> host_order_;
  int local_rank_ = 0;
  c10::intrusive_ptr<c10d::Backend> leaders_, global_;
  // gloo receives posted inside a coalesced batch, waited for at its end.
  std::shared_ptr<std::vector<c10::intrusive_ptr<c10d::Work>>> gloo_pending_;
  // gloo sends in flight and their data (several hosts).
  struct GlooSends {
    std::mutex mu;
    std::vector<std::pair<c10::intrusive_ptr<c10d::Work>, at::Tensor>> works;
  };
  std::shared_ptr<GlooSends> gloo_sends_ = std::make_shared<GlooSends>();
  std::shared_ptr<comm::ShmGroup> shm_;
  size_t inline_bytes_ = 0;  // see inline_bytes_limit
  std::map<c10::DeviceIndex, c10::Stream> streams_;
  c10::DeviceIndex device_ = -1;
  bool coalescing_ = false;
  std::vector<Op> coalesced_;
  std::vector<at::Tensor> coalesced_tensors_, coalesced_outputs_;
};

}  // namespace

void initDistributedBindings(pybind11::module_& m) {
  namespace py = pybind11;
  auto d = m.def_submodule("_distributed", "the axon c10d backend");
  py::class_<ProcessGroupAxon, c10d::Backend, c10::intrusive_ptr<ProcessGroupAxon>>(
      d, "ProcessGroupAxon")
      .def(py::init([](const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                       std::chrono::milliseconds timeout, std::vector<int> host_of,
                       std::optional<c10::intrusive_ptr<c10d::Backend>> leaders,
                       std::optional<c10::intrusive_ptr<c10d::Backend>> global) {
             return c10::make_intrusive<ProcessGroupAxon>(
                 store, rank, size, timeout, std::move(host_of),
                 leaders.value_or(c10::intrusive_ptr<c10d::Backend>()),
                 global.value_or(c10::intrusive_ptr<c10d::Backend>()));
           }),
           py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("timeout"),
           py::arg("host_of") = std::vector<int>(), py::arg("leaders") = py::none(),
           py::arg("global_group") = py::none(), py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("multi_host", &ProcessGroupAxon::multiHost)
      .def_property_readonly("local_rank", &ProcessGroupAxon::localRank);
  initGlooAxonBindings(d);
  d.def("memcpy_bandwidth", [](size_t bytes, int reps) {
    return ::axon::comm::memcpy_bandwidth(bytes, reps);
  }, py::call_guard<py::gil_scoped_release>());
}

}  // namespace at::axon
