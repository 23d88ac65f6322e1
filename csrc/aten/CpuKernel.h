// Running an ATen CPU kernel as stream work, from unboxed arguments.
//
// launchCpuKernel(device, name, fn, args...) captures the arguments by value
// (device tensors by their data pointer and geometry, holding no reference to
// their memory; CPU tensors as snapshots; array refs as vectors; see capture()
// below), and on the stream worker calls fn with host views of the device
// tensors.  fn is usually an at::cpu:: function, which runs the CPU kernel
// without going through the dispatcher again.
#pragma once

#include <algorithm>
#include <memory>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include <ATen/Tensor.h>
#include <ATen/TensorIterator.h>
#include <ATen/core/IListRef.h>
#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/core/List.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/util/OptionalArrayRef.h>
#include <c10/util/bit_cast.h>

#include <omp.h>

#include <axon/runtime.h>

#include "HostView.h"
#include "KernelSelect.h"
#include "Launch.h"
#include "OpDevice.h"
#include "../core/AxonRuntime.h"
#include "../core/CachingAllocator.h"

namespace at::axon::cpu_kernel {

// ---- capture: what the kernel keeps until it runs.  A device tensor is
// captured by its memory and geometry at launch, so that later in-place
// metadata changes on the host (t_(), resize_() ...) do not affect the
// kernel, as a CUDA kernel takes pointers and strides at launch.  No
// reference is held: as with CUDA's caching allocator, memory the host frees
// meanwhile is reused only by work on the same stream, which runs after this
// kernel (other streams need record_stream).  The worker builds the host
// view, so launching allocates nothing for it.  CPU tensors are snapshots;
// Python numbers (wrapped 0-dim tensors) travel as Scalars.
struct DeviceView {
  void* data = nullptr;
  size_t nbytes = 0;
  bool on_device = false;
  at::Tensor cpu;
  std::optional<at::Scalar> number;
  c10::SmallVector<int64_t, 5> sizes, strides;
  int64_t offset = 0;
  caffe2::TypeMeta dtype;
  bool conj = false, neg = false;
  const void* impl = nullptr;  // the tensor's TensorImpl, for the launch's signature only

  at::Tensor view() const {
    if (number.has_value()) return wrappedNumber(*number, dtype.toScalarType());
    if (!on_device) return cpu;
    return hostView(data, nbytes, sizes, strides, offset, dtype, conj, neg);
  }
  c10::ScalarType scalar_type() const {
    return on_device || number.has_value()
               ? dtype.toScalarType()
               : (cpu.defined() ? cpu.scalar_type() : c10::ScalarType::Undefined);
  }
  bool defined() const { return on_device || number.has_value() || cpu.defined(); }
};
inline DeviceView capture(const at::Tensor& t) {
  DeviceView v;
  if (!t.defined()) return v;
  if (t.is_cpu()) {
    if (t.unsafeGetTensorImpl()->is_wrapped_number()) {
      v.number = wrappedNumberValue(t);
      v.dtype = t.dtype();
    } else {
      v.cpu = snapshotCpuTensor(t);
    }
    return v;
  }
  v.on_device = true;
  v.data = t.storage().mutable_data();
  v.nbytes = t.storage().nbytes();
  v.sizes.assign(t.sizes().begin(), t.sizes().end());
  v.strides.assign(t.strides().begin(), t.strides().end());
  v.offset = t.storage_offset();
  v.dtype = t.dtype();
  v.conj = t.is_conj();
  v.neg = t.is_neg();
  v.impl = t.unsafeGetTensorImpl();
  return v;
}
inline std::optional<DeviceView> capture(const std::optional<at::Tensor>& t) {
  if (!t.has_value()) return std::nullopt;
  return capture(*t);
}
inline std::vector<int64_t> capture(c10::IntArrayRef a) { return a.vec(); }
inline std::optional<std::vector<int64_t>> capture(at::OptionalIntArrayRef a) {
  if (!a.has_value()) return std::nullopt;
  return a->vec();
}
inline std::vector<DeviceView> capture(const at::ITensorListRef& list) {
  std::vector<DeviceView> out;
  for (const at::Tensor& t : list) out.push_back(capture(t));
  return out;
}
inline std::vector<DeviceView> capture(at::TensorList list) {
  std::vector<DeviceView> out;
  for (const at::Tensor& t : list) out.push_back(capture(t));
  return out;
}
inline std::vector<std::optional<DeviceView>> capture(
    const c10::List<std::optional<at::Tensor>>& list) {
  std::vector<std::optional<DeviceView>> out;
  for (const std::optional<at::Tensor>& t : list) out.push_back(capture(t));
  return out;
}
inline std::string capture(std::string_view s) { return std::string(s); }
inline std::optional<std::string> capture(const std::optional<c10::string_view>& s) {
  if (!s.has_value()) return std::nullopt;
  return std::string(*s);
}
template <typename T>
T capture(const T& v) {
  return v;
}

// ---- host: what the CPU kernel receives
inline at::Tensor host(const DeviceView& v) { return v.view(); }
inline std::optional<at::Tensor> host(const std::optional<DeviceView>& v) {
  if (!v.has_value()) return std::nullopt;
  return v->view();
}
inline c10::IntArrayRef host(const std::vector<int64_t>& v) { return v; }
inline at::OptionalIntArrayRef host(const std::optional<std::vector<int64_t>>& v) {
  if (!v.has_value()) return std::nullopt;
  return c10::IntArrayRef(*v);
}
// A list of host views that passes as either kind of tensor list.
struct HostTensorList {
  std::vector<at::Tensor> views;
  operator at::ITensorListRef() const { return at::ITensorListRef(views); }
  operator at::TensorList() const { return views; }
};
inline HostTensorList host(const std::vector<DeviceView>& v) {
  HostTensorList out;
  for (const DeviceView& t : v) out.views.push_back(t.view());
  return out;
}
inline c10::List<std::optional<at::Tensor>> host(
    const std::vector<std::optional<DeviceView>>& list) {
  c10::List<std::optional<at::Tensor>> out;
  for (const std::optional<DeviceView>& t : list) out.push_back(host(t));
  return out;
}
inline std::string_view host(const std::string& s) { return s; }
inline std::optional<c10::string_view> host(const std::optional<std::string>& s) {
  if (!s.has_value()) return std::nullopt;
  return c10::string_view(*s);
}
template <typename T>
const T& host(const T& v) {
  return v;
}

// ---- the launch's signature (see HostChecks in Launch.h)
inline void add_signature(Signature& s, const DeviceView& v);
inline void add_signature(Signature& s, const at::Scalar& v);
inline void add_signature(Signature& s, const std::string& v);
template <typename V>
void add_signature(Signature& s, const std::optional<V>& v);
template <typename V>
void add_signature(Signature& s, const std::vector<V>& list);
template <typename T>
void add_signature(Signature& s, const T& v);

inline void add_signature(Signature& s, const DeviceView& v) {
  if (!v.defined()) return s.undefined();
  if (v.number.has_value()) {
    s.mix(0x21);
    s.mix(static_cast<uint64_t>(v.dtype.toScalarType()));
    return s.scalar(*v.number);
  }
  if (!v.on_device) return s.cpu_tensor(v.cpu);
  s.device_tensor(v.data, v.offset, v.sizes, v.strides, v.dtype, v.conj, v.neg, v.impl);
}
inline void add_signature(Signature& s, const at::Scalar& v) { s.scalar(v); }
inline void add_signature(Signature& s, const std::string& v) { s.string(v); }
template <typename V>
void add_signature(Signature& s, const std::optional<V>& v) {
  if (!v.has_value()) return s.mix(0x31);
  s.mix(0x32);
  add_signature(s, *v);
}
template <typename V>
void add_signature(Signature& s, const std::vector<V>& list) {
  s.mix(0x41 + list.size());
  for (const V& v : list) add_signature(s, v);
}
// Plain values (dims, flags, sizes, enums): exact.  Generators and kernel
// state: nothing the host checks.
template <typename T>
void add_signature(Signature& s, const T& v) {
  if constexpr (std::is_enum_v<T> || std::is_integral_v<T>) {
    s.mix(static_cast<uint64_t>(v));
  } else if constexpr (std::is_floating_point_v<T>) {
    s.mix(c10::bit_cast<uint64_t>(static_cast<double>(v)));
  }
}

// ---- the thread policy's size of the arguments (kselect::KernelSize)
using Elements = kselect::KernelSize;
inline void add_elements(Elements& n, const DeviceView& v) {
  if (!v.on_device) return;
  int64_t e = 1;
  for (int64_t s : v.sizes) e *= s;
  n.add(e, static_cast<int64_t>(v.dtype.itemsize()));
}
inline void add_elements(Elements& n, const std::optional<DeviceView>& v) {
  if (v.has_value()) add_elements(n, *v);
}
template <typename T>
void add_elements(Elements&, const T&) {}
template <typename V>
void add_elements(Elements& n, const std::vector<V>& list) {
  for (const V& v : list) add_elements(n, v);
}

// Arguments that are the same device tensor (an in-place op's self and its
// out=) get one host view, as they are one tensor on the CPU: kernels test
// `out.is_same(self)` and otherwise first copy all of self into out
// (index_copy_, index_add_, scatter_ ...: a static KV cache's update would copy
// the whole cache).  Arguments in the same device memory with another
// geometry get host views of one CPU storage, so that the CPU kernel's
// overlap checks (assert_no_partial_overlap ...) see what the CPU would.
struct SameViews {
  c10::SmallVector<std::pair<const DeviceView*, at::Tensor>, 6> seen;
  at::Tensor operator()(const DeviceView& v) {
    // (Empty storages are not merged: unrelated empty outputs share no memory.)
    if (!v.on_device || v.data == nullptr || v.nbytes == 0) return v.view();
    const at::Tensor* same_storage = nullptr;
    for (const auto& [p, t] : seen) {
      if (p->data != v.data || p->nbytes != v.nbytes) continue;
      if (p->offset == v.offset && p->sizes == v.sizes && p->strides == v.strides &&
          p->dtype == v.dtype && p->conj == v.conj && p->neg == v.neg) {
        return t;
      }
      same_storage = &t;
    }
    at::Tensor t = same_storage != nullptr ? viewOfStorage(same_storage->storage(), v) : v.view();
    seen.emplace_back(&v, t);
    return t;
  }
  static at::Tensor viewOfStorage(const c10::Storage& storage, const DeviceView& v) {
    auto impl = c10::make_intrusive<c10::TensorImpl>(
        c10::Storage(storage), c10::DispatchKeySet(c10::DispatchKey::CPU), v.dtype);
    impl->set_sizes_and_strides(v.sizes, v.strides, v.offset);
    impl->_set_conj(v.conj);
    impl->_set_neg(v.neg);
    return at::Tensor(std::move(impl));
  }
};
inline at::Tensor host(const DeviceView& v, SameViews& same) { return same(v); }
inline std::optional<at::Tensor> host(const std::optional<DeviceView>& v, SameViews& same) {
  if (!v.has_value()) return std::nullopt;
  return same(*v);
}
inline HostTensorList host(const std::vector<DeviceView>& v, SameViews& same) {
  HostTensorList out;
  for (const DeviceView& t : v) out.views.push_back(same(t));
  return out;
}
inline c10::List<std::optional<at::Tensor>> host(
    const std::vector<std::optional<DeviceView>>& list, SameViews& same) {
  c10::List<std::optional<at::Tensor>> out;
  for (const std::optional<DeviceView>& t : list) out.push_back(host(t, same));
  return out;
}
template <typename T>
decltype(auto) host(const T& v, SameViews&) {
  return host(v);
}

template <typename Fn, typename Tuple, size_t... I>
void call_on_host(const Fn& fn, const Tuple& captured, std::index_sequence<I...>) {
  // Materialised first so that out= parameters (Tensor&) bind to lvalues.
  SameViews same;
  auto views = std::make_tuple(host(std::get<I>(captured), same)...);
  fn(std::get<I>(views)...);
}

// What capture(a) makes, made where it is stored: a tuple element
// initialised from a Capturing converts it in place (no copy or move of
// the captured geometry).
template <typename A>
struct Capturing {
  using Type = decltype(capture(std::declval<const A&>()));
  const A& a;
  operator Type() const { return capture(a); }
};

// A CPU kernel launch's work: fn and the captured arguments, one allocation.
template <typename Fn, typename... A>
class CpuKernelWork final : public Work {
 public:
  using Captured = std::tuple<typename Capturing<A>::Type...>;
  CpuKernelWork(Fn fn, const A&... a) : fn_(fn), captured_(Capturing<A>{a}...) {}
  void run() override {
    // The kernel's nested ops work on plain CPU buffers: no autograd.
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    call_on_host(fn_, captured_, std::index_sequence_for<A...>{});
  }
  const Captured& captured() const { return captured_; }

 private:
  Fn fn_;
  Captured captured_;
};

// ---- adaptive eager (Fusion.h): a launch the stream may fuse with its
// neighbours.  The fusion engine sees the kernel's device tensors and runs it
// on tiles of them (views it builds) instead of the whole tensors.
enum class FusionKind : uint8_t {
  kNone,
  kPointwise,  // a TensorIterator op: every output element from the inputs' same element
  kRowSum,     // sum over the last dimension only
  kRowMean,    // mean over the last dimension only
};

class Fusible : public ::axon::rt::FusibleTask {
 public:
  FusionKind kind = FusionKind::kNone;
  const char* name = nullptr;
  Work* work = nullptr;  // the launch's work (this object), retired by the engine
  // The device tensors among the arguments, in order; the output is the last.
  c10::SmallVector<const DeviceView*, 6> views;
  // Every tensor argument in order (device tensors, Python numbers, CPU
  // tensors), and the Scalar arguments: what the engine's own loops read.
  c10::SmallVector<const DeviceView*, 6> args;
  c10::SmallVector<at::Scalar, 2> scalars;
  // Reductions: the dtype argument.
  std::optional<c10::ScalarType> reduce_dtype;
  // The thread policy gave the launch the team, whose parts may move an
  // element between ATen's vector loop and its scalar tail: it joins a run
  // only as one of the engine's own exactly rounded ops (Fusion.cpp), whose
  // values are the same wherever a loop splits.
  bool team = false;
  // Where it was launched, and the device's free-log mark then
  // (CachingAllocator.h: was its result freed before later work could read it?).
  c10::DeviceIndex device = 0;
  int64_t stream = 0;
  uint64_t free_mark = 0;
  // Runs the kernel with views[i] replaced by mapped[i] (pointwise ops).
  virtual void runMapped(c10::ArrayRef<at::Tensor> mapped) = 0;

 protected:
  ~Fusible() = default;
};

template <typename T>
void collect_view(const T&, Fusible&, bool&) {}
inline void collect_view(const DeviceView& v, Fusible& f, bool&) {
  if (!v.defined()) return;
  f.args.push_back(&v);
  if (v.on_device) f.views.push_back(&v);
}
inline void collect_view(const std::optional<DeviceView>& v, Fusible& f, bool& ok) {
  if (v.has_value()) collect_view(*v, f, ok);
}
inline void collect_view(const at::Scalar& v, Fusible& f, bool&) { f.scalars.push_back(v); }
template <typename V>
void collect_view(const std::vector<V>& list, Fusible&, bool& ok) {
  if (!list.empty()) ok = false;  // tensor lists: not fusible
}

// host() with the device views replaced by the engine's tile views, in order.
struct MappedViews {
  c10::ArrayRef<at::Tensor> views;
  size_t next = 0;
};
inline at::Tensor host(const DeviceView& v, MappedViews& m) {
  return v.on_device ? m.views[m.next++] : v.view();
}
inline std::optional<at::Tensor> host(const std::optional<DeviceView>& v, MappedViews& m) {
  if (!v.has_value()) return std::nullopt;
  return host(*v, m);
}
template <typename T>
decltype(auto) host(const T& v, MappedViews&) {
  return host(v);
}

// runSplit's parts: rows [b, e) of dimension `dim` of the output (of
// out_dim dimensions) of a tensor argument, aligned to the output's trailing
// dimensions as broadcasting aligns it; a tensor broadcast along it (size 1
// there, or without it) whole; other arguments as they are.
inline at::Tensor rows(const at::Tensor& t, int64_t out_dim, int64_t dim, int64_t b, int64_t e) {
  const int64_t d = dim - (out_dim - t.dim());
  if (d < 0 || t.size(d) == 1) return t;
  return t.narrow(d, b, e - b);
}
inline std::optional<at::Tensor> rows(const std::optional<at::Tensor>& t, int64_t out_dim,
                                      int64_t dim, int64_t b, int64_t e) {
  if (!t.has_value() || !t->defined()) return t;
  return rows(*t, out_dim, dim, b, e);
}
template <typename T>
const T& rows(const T& v, int64_t, int64_t, int64_t, int64_t) {
  return v;
}

// Whether an argument of runSplit's kernel is cut with the output: a tensor
// that broadcasts to it (trailing dimensions equal or 1); other arguments.
inline bool alignsWith(const at::Tensor& t, const at::Tensor& out) {
  const int64_t off = out.dim() - t.dim();
  if (off < 0) return false;
  for (int64_t i = 0; i < t.dim(); ++i) {
    if (t.size(i) != 1 && t.size(i) != out.size(i + off)) return false;
  }
  return true;
}
inline bool alignsWith(const std::optional<at::Tensor>& t, const at::Tensor& out) {
  return !t.has_value() || !t->defined() || alignsWith(*t, out);
}
template <typename T>
bool alignsWith(const T&, const at::Tensor&) {
  return true;
}

// On a stream worker (which drops warnings: kernels raised theirs at the call).
inline bool onStreamWorker() { return c10::WarningUtils::get_warning_handler() == dropWarnings(); }

template <typename Fn, typename... A>
class FusibleCpuKernelWork final : public Work, public Fusible {
 public:
  using Captured = std::tuple<typename Capturing<A>::Type...>;
  FusibleCpuKernelWork(FusionKind k, const char* op, Fn fn, const A&... a)
      : fn_(fn), captured_(Capturing<A>{a}...) {
    bool ok = true;
    std::apply([&](const auto&... c) { (collect_view(c, *this, ok), ...); }, captured_);
    // Not with tensor lists (index.Tensor is a TensorIterator op, not pointwise).
    splits_ = k == FusionKind::kPointwise && ok;
    if (ok && !views.empty()) {
      kind = k;
      name = op;
      work = this;
      fusible = this;
    }
  }
  void run() override {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    if (splits_ && omp_get_max_threads() > 1 && runSplit(std::index_sequence_for<A...>{})) return;
    call_on_host(fn_, captured_, std::index_sequence_for<A...>{});
  }
  // Whether the team's runs split over the compute team (runSplit).
  bool splits() const { return splits_; }
  void runMapped(c10::ArrayRef<at::Tensor> mapped) override {
    MappedViews m{mapped};
    // Braced initialisation: evaluated left to right, so views map in order.
    std::apply([&](const auto&... c) {
      std::tuple<decltype(host(c, m))...> args{host(c, m)...};
      std::apply(fn_, args);
    }, captured_);
  }
  const Captured& captured() const { return captured_; }

 private:
  // A pointwise kernel given the team (the thread policy measured it so): its
  // output's rows along one dimension in parts, each ATen's kernel alone on
  // its thread, the parts spread over the runtime's compute team from a
  // stream worker (not OpenMP's team, which costs ~60 us to start again after
  // a kernel on the worker alone: releaseOpenMpTeam) and run one after another
  // on the host (a
  // new signature's first launch) or when the team is busy.  An output
  // element depends only on the inputs' elements at its index, and the parts
  // depend only on the output's shape and the thread count, so every run of
  // a launch computes the same values (a part boundary may move an element
  // between ATen's vectorised loop and its scalar tail, as ATen's own split
  // over OpenMP's threads does: the CPU's values to within a rounding).  Parts
  // hold at least ATen's grain of elements.  False (nothing ran) when an
  // operand does not broadcast to the output.
  template <size_t... I>
  bool runSplit(std::index_sequence<I...>) {
    SameViews same;
    auto args = std::make_tuple(host(std::get<I>(captured_), same)...);
    const auto& out = std::get<sizeof...(A) - 1>(args);
    if constexpr (!std::is_same_v<std::decay_t<decltype(out)>, at::Tensor>) {
      return false;
    } else {
      if (!out.defined() || !(alignsWith(std::get<I>(args), out) && ...)) return false;
      const int threads = omp_get_max_threads();
      int64_t dim = -1;
      for (int64_t d = 0; d < out.dim(); ++d) {
        if (out.size(d) >= threads) {
          dim = d;
          break;
        }
      }
      if (dim < 0) return false;
      const int64_t n = out.size(dim);
      const int64_t inner = std::max<int64_t>(1, out.numel() / n);
      const int64_t grain = std::max<int64_t>(1, at::internal::GRAIN_SIZE / inner);
      const int64_t per = std::max(grain, (n + 4 * threads - 1) / (4 * threads));
      struct Ctx {
        FusibleCpuKernelWork* self;
        decltype(args)* all;
        int64_t dim, out_dim, n, per;
      } ctx{this, &args, dim, out.dim(), n, per};
      auto parts = [](void* p, int64_t first, int64_t last) {
        const Ctx& c = *static_cast<const Ctx*>(p);
        const KernelThreadsScope one(1);
        at::AutoDispatchBelowADInplaceOrView below;
        for (int64_t k = first; k < last; ++k) {
          const int64_t b = k * c.per, e = std::min(c.n, b + c.per);
          auto part = std::make_tuple(rows(std::get<I>(*c.all), c.out_dim, c.dim, b, e)...);
          std::apply(c.self->fn_, part);
        }
      };
      const int64_t count = (n + per - 1) / per;
      if (onStreamWorker()) {
        ::axon::rt::team_parallel_for(threads, 0, count, 1, &ctx,
                                      [](void* p, int64_t first, int64_t last) {
          c10::WarningUtils::WarningHandlerGuard quiet(dropWarnings());
          decltype(parts){}(p, first, last);
        });
      } else {
        parts(&ctx, 0, count);
      }
      return true;
    }
  }

  Fn fn_;
  Captured captured_;
  bool splits_ = false;
};

}  // namespace at::axon::cpu_kernel

namespace at::axon {

namespace cpu_kernel {
// Signs a captured kernel's launch (Launch.h), sizes it for the thread
// policy (KernelSelect.h) and launches it.
template <typename W>
void launchCaptured(c10::DeviceIndex device, const char* name, HostChecks checks,
                    std::unique_ptr<W> work, kselect::TeamKind team = kselect::TeamKind::kOpenMp) {
  Signature signature(checks);
  Elements elements;
  std::apply([&](const auto&... c) {
    (add_signature(signature, c), ...);
    (add_elements(elements, c), ...);
  }, work->captured());
  const int threads = kselect::threadsFor(name, elements.bytes, elements.largest, *work, team);
  if constexpr (std::is_base_of_v<Fusible, W>) {
    if (threads == 0 && work->fusible != nullptr) {
      // On the team: fusible as an own pointwise op only (Fusible::team).
      work->team = true;
      if (work->kind != FusionKind::kPointwise) work->fusible = nullptr;
    }
  }
  launchChecked(device, name, signature.hash, threads, std::move(work));
}
}  // namespace cpu_kernel

// `checks`: how much of the arguments identify the launch's host-visible
// checks (Launch.h): kMeta when the caller ran the op's complete checks.
template <HostChecks checks = HostChecks::kFull, typename Fn, typename... Args>
void launchCpuKernel(c10::DeviceIndex device, const char* name, Fn fn, const Args&... args) {
  cpu_kernel::launchCaptured(device, name, checks,
                             std::make_unique<cpu_kernel::CpuKernelWork<Fn, Args...>>(fn, args...));
}

// launchCpuKernel for a kernel the stream may fuse with its neighbours
// (adaptive eager, Fusion.h): `kind` says how its output follows its inputs;
// the output is its last device tensor.
template <typename Fn, typename... Args>
void launchFusibleCpuKernel(c10::DeviceIndex device, const char* name, cpu_kernel::FusionKind kind,
                            std::optional<c10::ScalarType> reduce_dtype, Fn fn,
                            const Args&... args) {
  auto work =
      std::make_unique<cpu_kernel::FusibleCpuKernelWork<Fn, Args...>>(kind, name, fn, args...);
  work->reduce_dtype = reduce_dtype;
  if (adaptiveEager()) {
    work->device = device;
    work->stream = current_rt_stream(device).id;
    work->free_mark = freeLogMark(device);
  }
  // A pointwise kernel's team is the compute team (FusibleCpuKernelWork::runSplit).
  const kselect::TeamKind team =
      work->splits() ? kselect::TeamKind::kCompute : kselect::TeamKind::kOpenMp;
  cpu_kernel::launchCaptured(device, name, HostChecks::kMeta, std::move(work), team);
}

}  // namespace at::axon
