// Tier 2 for ops whose work is an ATen CPU kernel: one boxed kernel that runs
// any such op asynchronously.
//
// On the host, the op's Meta kernel runs on meta stand-ins of the arguments:
// it raises PyTorch's own errors for bad input (synchronously, like CUDA's
// launch-time checks) and gives the shapes, strides and dtypes of the results.
// The results are allocated on the device, and the CPU kernel is enqueued on
// the current stream with host views of the arguments: the functional kernel,
// whose results are copied into the device results (converting dtype where
// the Meta kernel follows CUDA's conventions rather than the CPU's, as for
// layer_norm's statistics).  Mutating ops (in-place and out=) run the same kernel on
// host views of the mutated tensors, after the host has resized out=
// arguments the way the Meta kernel did.
//
// An op is eligible when it returns tensors only and its returns are either
// new tensors or the tensors it mutates (views stay with tier 1); an op with
// new results may also write arguments it does not return (batch norm's
// running statistics), in place through their host views.  Ops are
// registered one by one (the list at the end), so each is a deliberate
// choice; an op whose Meta kernel is missing falls back to tier 3.
#include <algorithm>
#include <atomic>
#include <cstring>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <unordered_set>

#include <ATen/EmptyTensor.h>
#include <ATen/ExpandUtils.h>
#include <ATen/core/LegacyTypeDispatch.h>
#include <c10/util/strides.h>
#include <c10/util/bit_cast.h>
#include <c10/util/overflows.h>
#include <cmath>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/library.h>

#include "../core/AxonGenerator.h"
#include "../core/CachingAllocator.h"
#include "Fallback.h"
#include "HostView.h"
#include "Launch.h"

namespace at::axon {

// ------------------------------------------------------------ launching

namespace {

// Signatures whose kernel ran once, synchronously, without error or warning
// (see launchChecked).  Bounded: past kMaxSignatures the set starts afresh
// (some launches then run synchronously once more).
constexpr size_t kMaxSignatures = size_t{1} << 16;
std::mutex signatures_mutex;
std::unordered_set<uint64_t> signatures;
std::atomic<uint64_t> signatures_generation{0};

class CollectWarnings final : public c10::WarningHandler {
 public:
  std::vector<c10::Warning> warnings;
  void process(const c10::Warning& warning) override { warnings.push_back(warning); }
};

// Stream workers: a kernel launched asynchronously had its warnings raised
// at the call already (see launchChecked); nothing goes to stderr.
class DropWarnings final : public c10::WarningHandler {
 public:
  void process(const c10::Warning&) override {}
};

thread_local HostWarningScope* current_host_warnings = nullptr;

// Launches that ran synchronously to be checked (a new signature, or a
// kernel that warns): torch.ops.axon._checked_launches(), for tests and for
// finding workloads that keep meeting new signatures.
std::atomic<int64_t> checked_launches{0};

}  // namespace

void launchChecked(c10::DeviceIndex device, const char* name, uint64_t signature, int threads,
                   std::function<void()> fn) {
  // A per-thread cache in front of the shared set: no lock on the hot path.
  thread_local std::unordered_set<uint64_t> verified_here;
  thread_local uint64_t generation_here = 0;
  const uint64_t key = c10::hash_combine(reinterpret_cast<uintptr_t>(name), signature);
  const uint64_t generation = signatures_generation.load(std::memory_order_relaxed);
  if (generation_here != generation || verified_here.size() > kMaxSignatures) {
    verified_here.clear();
    generation_here = generation;
  }
  bool verified = verified_here.count(key) != 0;
  if (!verified) {
    std::lock_guard<std::mutex> lock(signatures_mutex);
    verified = signatures.count(key) != 0;
    if (verified) verified_here.insert(key);
  }
  if (verified) {
    return launch(device, name, [fn = std::move(fn)] {
      static DropWarnings drop;
      c10::WarningUtils::WarningHandlerGuard quiet(&drop);
      fn();
    }, threads);
  }
  // A new signature: the CPU kernel checks it here, at the call.
  checked_launches.fetch_add(1, std::memory_order_relaxed);
  syncCurrentStream(device);
  CollectWarnings collect;
  {
    c10::WarningUtils::WarningHandlerGuard guard(&collect);
    fn();
  }
  bool warned = false;
  const HostWarningScope* host = HostWarningScope::current();
  for (const c10::Warning& w : collect.warnings) {
    if (host != nullptr && host->raised(w.msg())) continue;  // the host's checks raised it
    warned = true;
    c10::warn(w);
  }
  if (warned) return;  // runs at the call every time: its warnings once per call
  verified_here.insert(key);
  std::lock_guard<std::mutex> lock(signatures_mutex);
  if (signatures.size() >= kMaxSignatures) {
    signatures.clear();
    signatures_generation.fetch_add(1, std::memory_order_relaxed);
  }
  signatures.insert(key);
}

// ------------------------------------------------------------ signatures

namespace {

// Which conversions of s would overflow (c10::checked_convert, what
// Scalar::to<T>() raises): two Scalars with the same mask pass or fail the
// same conversions.
template <typename... To>
uint64_t overflow_mask(const at::Scalar& s) {
  uint64_t mask = 0;
  int bit = 0;
  if (s.isComplex()) {
    const auto v = s.toComplexDouble();
    ((mask |= uint64_t{c10::overflows<To>(v)} << bit++), ...);
  } else if (s.isFloatingPoint()) {
    const double v = s.toDouble();
    ((mask |= uint64_t{c10::overflows<To>(v)} << bit++), ...);
  } else if (s.type() == at::kUInt64) {
    const uint64_t v = s.toUInt64();
    ((mask |= uint64_t{c10::overflows<To>(v)} << bit++), ...);
  } else if (!s.isBoolean()) {
    const int64_t v = s.toLong();
    ((mask |= uint64_t{c10::overflows<To>(v)} << bit++), ...);
  }
  return mask;
}

}  // namespace

void Signature::scalar(const at::Scalar& s) {
  mix(0x51 + static_cast<uint64_t>(s.type()));
  if (s.isSymbolic()) return;
  if (full) {
    if (s.isComplex()) {
      const auto v = s.toComplexDouble();
      mix(c10::bit_cast<uint64_t>(v.real()));
      mix(c10::bit_cast<uint64_t>(v.imag()));
    } else if (s.isFloatingPoint()) {
      mix(c10::bit_cast<uint64_t>(s.toDouble()));
    } else if (s.type() == at::kUInt64) {
      mix(s.toUInt64());
    } else if (s.isBoolean()) {
      mix(s.toBool());
    } else {
      mix(static_cast<uint64_t>(s.toLong()));
    }
    return;
  }
  // Range class only (a learning rate that changes every step must not make
  // every step synchronous).
  mix(overflow_mask<uint8_t, int8_t, int16_t, int32_t, int64_t, uint16_t, uint32_t, uint64_t,
                    c10::Half, c10::BFloat16, float, double, c10::Float8_e4m3fn,
                    c10::Float8_e5m2, c10::complex<c10::Half>, c10::complex<float>>(s));
  if (s.isFloatingPoint()) {
    const double v = s.toDouble();
    mix((std::isnan(v) ? 1 : 0) | (std::isinf(v) ? 2 : 0) | (v < 0 ? 4 : 0) | (v == 0 ? 8 : 0) |
        (std::isfinite(v) && v == std::trunc(v) ? 16 : 0));
  } else if (!s.isComplex() && !s.isBoolean() && s.type() != at::kUInt64) {
    const int64_t v = s.toLong();
    mix((v < 0 ? 4 : 0) | (v == 0 ? 8 : 0));
  }
}

void Signature::device_tensor(const void* storage_data, int64_t offset, c10::IntArrayRef sizes,
                              c10::IntArrayRef strides, caffe2::TypeMeta dtype, bool conj,
                              bool neg) {
  mix(0x61 + static_cast<uint64_t>(dtype.toScalarType()) * 4 + (conj ? 1 : 0) + (neg ? 2 : 0));
  if (!full) return;
  mix(sizes.size());
  for (int64_t v : sizes) mix(static_cast<uint64_t>(v));
  for (int64_t v : strides) mix(static_cast<uint64_t>(v));
  // Aliasing: which storage (in order of appearance), and where in it,
  // relative to the storage's first tensor here.
  const int64_t byte_offset = offset * static_cast<int64_t>(dtype.itemsize());
  size_t index = 0;
  for (; index < storages.size(); ++index) {
    if (storages[index].first == storage_data) break;
  }
  if (index == storages.size()) storages.emplace_back(storage_data, byte_offset);
  mix(index);
  mix(static_cast<uint64_t>(byte_offset - storages[index].second));
}

void Signature::cpu_tensor(const at::Tensor& t) {
  mix(0x71 + static_cast<uint64_t>(t.scalar_type()));
  if (!full) return;
  mix(t.dim());
  for (int64_t v : t.sizes()) mix(static_cast<uint64_t>(v));
  for (int64_t v : t.strides()) mix(static_cast<uint64_t>(v));
  // The values of a small CPU tensor are host-visible (an index list).
  constexpr size_t kMaxContents = 4096;
  if (t.nbytes() <= kMaxContents && !t.is_conj() && !t.is_neg()) {
    const at::Tensor c = t.contiguous();
    const auto* p = static_cast<const unsigned char*>(c.const_data_ptr());
    const size_t n = c.numel() * c.element_size();
    uint64_t word = 0;
    for (size_t i = 0; i < n; ++i) {
      word = (word << 8) | p[i];
      if (i % 8 == 7) mix(word), word = 0;
    }
    mix(word);
  }
}

void Signature::tensor(const at::Tensor& t) {
  if (!t.defined()) return undefined();
  if (t.is_cpu()) {
    if (t.unsafeGetTensorImpl()->is_wrapped_number()) {
      mix(0x21);
      mix(static_cast<uint64_t>(t.scalar_type()));
      return scalar(wrappedNumberValue(t));
    }
    return cpu_tensor(t);
  }
  device_tensor(t.storage().data(), t.storage_offset(), t.sizes(), t.strides(), t.dtype(),
                t.is_conj(), t.is_neg());
}

void Signature::string(std::string_view s) { mix(std::hash<std::string_view>{}(s)); }

// ------------------------------------------------------------ host warnings

HostWarningScope::HostWarningScope()
    : prev_(c10::WarningUtils::get_warning_handler()), outer_(current_host_warnings) {
  c10::WarningUtils::set_warning_handler(this);
  current_host_warnings = this;
}

HostWarningScope::~HostWarningScope() {
  c10::WarningUtils::set_warning_handler(prev_);
  current_host_warnings = outer_;
}

void HostWarningScope::process(const c10::Warning& warning) {
  messages_.push_back(warning.msg());
  prev_->process(warning);
}

bool HostWarningScope::raised(const std::string& message) const {
  for (const std::string& m : messages_) {
    if (m == message) return true;
  }
  return outer_ != nullptr && outer_->raised(message);
}

HostWarningScope* HostWarningScope::current() { return current_host_warnings; }

at::Tensor emptyDevice(c10::IntArrayRef sizes, c10::IntArrayRef strides,
                       c10::ScalarType dtype, c10::DeviceIndex device) {
  c10::OptionalDeviceGuard guard;
  if (device != current_device()) guard.reset_device(c10::Device(kAxon, device));
  return at::detail::empty_strided_generic(
      sizes, strides, getCachingAllocator(),
      c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), dtype);
}

at::Tensor emptyDevice(c10::IntArrayRef sizes, c10::ScalarType dtype,
                       c10::DeviceIndex device) {
  return emptyDevice(sizes, c10::contiguous_strides(sizes), dtype, device);
}

at::Tensor emptyDeviceLike(const at::Tensor& t, c10::ScalarType dtype) {
  // As at::empty_like(t) (preserve_format): t's strides when t is dense, else
  // dense strides in t's dimension order (what Meta kernels, and so
  // torch.compile's stride checks, expect).
  return t.is_non_overlapping_and_dense()
             ? emptyDevice(t.sizes(), t.strides(), dtype, t.device().index())
             : emptyDevice(t.sizes(), at::infer_dense_strides(t.sizes(), t.strides()), dtype,
                           t.device().index());
}

c10::DeviceIndex axonDevice(const char* op, const at::Tensor& t) {
  TORCH_CHECK(t.device().type() == kAxon,
              "Expected all tensors to be on the same device, but found at least two devices, ",
              t.device(), " and axon! (when checking arguments for ", op, ")");
  return t.device().index();
}

at::Tensor snapshotCpuTensor(const at::Tensor& t) {
  at::Tensor c;
  if (t.dim() == 0 && !t.is_conj() && !t.is_neg()) {  // the common case: a scalar
    c = at::detail::empty_cpu({}, t.scalar_type());
    std::memcpy(c.data_ptr(), t.const_data_ptr(), t.element_size());
  } else {
    c = t.clone();
  }
  if (t.unsafeGetTensorImpl()->is_wrapped_number()) {
    c.unsafeGetTensorImpl()->set_wrapped_number(true);
  }
  return c;
}

namespace {

// ------------------------------------------------------------ op plans

struct OpPlan {
  enum class Kind { kFunctional, kMutating, kUnsupported };
  Kind kind = Kind::kUnsupported;
  std::string name;                    // "aten::add.Tensor", for error messages
  // Mutating ops: for each return, the argument it is (alias set match).
  std::vector<size_t> return_arg;
  std::vector<bool> written;           // per argument
};

bool is_tensor_type(const c10::TypePtr& t) {
  if (t->kind() == c10::TypeKind::TensorType) return true;
  if (auto l = t->cast<c10::ListType>()) {
    return l->getElementType()->kind() == c10::TypeKind::TensorType;
  }
  return false;
}

OpPlan make_plan(const c10::FunctionSchema& schema) {
  OpPlan plan;
  plan.name = op_name(schema);
  const auto& args = schema.arguments();
  const auto& rets = schema.returns();
  bool mutating = false;
  for (const auto& a : args) {
    bool w = a.alias_info() != nullptr && a.alias_info()->isWrite();
    plan.written.push_back(w);
    mutating |= w;
  }
  for (const auto& r : rets) {
    if (!is_tensor_type(r.type())) return plan;  // scalars etc. need the host
  }
  bool fresh_returns = !rets.empty();  // new results only (none: a mutating op)
  for (const auto& r : rets) fresh_returns = fresh_returns && r.alias_info() == nullptr;
  if (fresh_returns) {
    // Functional results; arguments an op also writes without returning them
    // (batch norm's running statistics) are written through their host views.
    plan.kind = OpPlan::Kind::kFunctional;
    return plan;
  }
  if (!mutating) return plan;  // a view
  for (const auto& r : rets) {
    if (r.alias_info() == nullptr || !r.alias_info()->isWrite()) return plan;
    std::optional<size_t> arg;
    for (size_t i = 0; i < args.size(); ++i) {
      if (args[i].alias_info() != nullptr &&
          args[i].alias_info()->beforeSets() == r.alias_info()->beforeSets()) {
        arg = i;
      }
    }
    if (!arg.has_value()) return plan;
    plan.return_arg.push_back(*arg);
  }
  plan.kind = OpPlan::Kind::kMutating;
  return plan;
}

OpPlan& plan_for(const c10::FunctionSchema& schema) {
  static std::mutex mutex;
  static std::unordered_map<const c10::FunctionSchema*, OpPlan*> plans;
  std::lock_guard<std::mutex> lock(mutex);
  OpPlan*& p = plans[&schema];
  if (p == nullptr) p = new OpPlan(make_plan(schema));  // lives for the process
  return *p;
}

// ------------------------------------------------------------ value mapping

// A copy of v with every tensor (also inside lists) replaced by f(tensor).
template <typename F>
c10::IValue map_tensors(const c10::IValue& v, const F& f) {
  if (v.isTensor()) return f(v.toTensor());
  if (v.isTensorList()) {
    c10::List<at::Tensor> out;
    out.reserve(v.toTensorList().size());
    for (const at::Tensor& t : v.toTensorList()) out.push_back(f(t));
    return out;
  }
  if (v.isList()) {
    c10::impl::GenericList in = v.toList();
    c10::impl::GenericList out(in.elementType());
    out.reserve(in.size());
    for (const c10::IValue& e : in) out.push_back(map_tensors(e, f));
    return out;
  }
  return v;
}

bool is_generator_arg(const c10::Argument& arg) {
  const c10::TypePtr& t = arg.type();
  if (t->kind() == c10::TypeKind::GeneratorType) return true;
  auto opt = t->cast<c10::OptionalType>();
  return opt && opt->getElementType()->kind() == c10::TypeKind::GeneratorType;
}

at::Tensor meta_like(const at::Tensor& t) {
  if (!t.defined()) return t;
  // A Python number stays one (a CPU scalar, which Meta kernels take among
  // meta tensors): type promotion treats it as a scalar (int64 tensor // 0.5
  // is float32, not float64).
  if (t.unsafeGetTensorImpl()->is_wrapped_number()) return t;
  return at::detail::empty_strided_meta(t.sizes(), t.strides(), t.scalar_type(),
                                        std::nullopt, c10::Device(c10::kMeta), std::nullopt);
}

at::Tensor device_like(const at::Tensor& meta, c10::DeviceIndex device) {
  if (!meta.defined()) return meta;
  return emptyDevice(meta.sizes(), meta.strides(), meta.scalar_type(), device);
}


// Carries a Meta kernel's resize of an out= argument over to the axon tensor.
void apply_geometry(const at::Tensor& meta, const at::Tensor& dev) {
  if (!meta.defined() || !dev.defined()) return;
  if (meta.sizes() == dev.sizes() && meta.strides() == dev.strides()) return;
  at::Tensor d = dev;
  d.resize_(meta.sizes());
  if (d.strides() != meta.strides()) {
    d.as_strided_(meta.sizes(), meta.strides(), d.storage_offset());
  }
}

void apply_geometry(const c10::IValue& meta, const c10::IValue& dev) {
  if (meta.isTensor() && dev.isTensor()) {
    apply_geometry(meta.toTensor(), dev.toTensor());
  } else if (meta.isTensorList() && dev.isTensorList()) {
    auto m = meta.toTensorList();
    auto d = dev.toTensorList();
    for (size_t i = 0; i < m.size() && i < d.size(); ++i) apply_geometry(m[i], d[i]);
  }
}

// ------------------------------------------------------------ the kernel

// Runs the CPU kernel on the stream worker.  Arguments and outputs are host
// views made at launch (no references to device memory are held; see
// cpu_kernel::capture), CPU snapshots and CPU generators.
struct CpuWork {
  c10::OperatorHandle op;
  std::vector<c10::IValue> args;
  std::vector<c10::IValue> outputs;  // functional ops: where results go

  // Host views of arguments in one device storage share one CPU storage (the
  // same tensor when the geometry is the same too), so that the CPU kernel's
  // overlap checks see what they would on the CPU.
  std::vector<std::pair<at::Tensor, at::Tensor>> views;  // (device, host)

  at::Tensor capture(const at::Tensor& t) {
    if (!t.defined()) return t;
    if (t.is_cpu()) return snapshotCpuTensor(t);
    const void* data = t.storage().data();
    for (const auto& [d, h] : views) {
      if (data == nullptr || d.storage().data() != data ||
          d.storage().nbytes() != t.storage().nbytes()) {
        continue;
      }
      if (d.sizes() == t.sizes() && d.strides() == t.strides() &&
          d.storage_offset() == t.storage_offset() && d.dtype() == t.dtype() &&
          d.is_conj() == t.is_conj() && d.is_neg() == t.is_neg()) {
        return h;
      }
      auto impl = c10::make_intrusive<c10::TensorImpl>(
          c10::Storage(h.storage()), c10::DispatchKeySet(c10::DispatchKey::CPU), t.dtype());
      impl->set_sizes_and_strides(t.sizes(), t.strides(), t.storage_offset());
      impl->_set_conj(t.is_conj());
      impl->_set_neg(t.is_neg());
      at::Tensor v(std::move(impl));
      views.emplace_back(t, v);
      return v;
    }
    at::Tensor v = hostView(t);
    if (data != nullptr) views.emplace_back(t, v);
    return v;
  }

  void operator()() const {
    // Nested ops of the CPU kernel skip autograd: they work on plain buffers.
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    torch::jit::Stack stack(args.begin(), args.end());
    const auto cpu = c10::DispatchKeySet(c10::DispatchKey::CPU);
    // A mutating CPU kernel may restride an out= tensor of the right size to
    // the layout it prefers (replication_pad2d's out follows a channels-last
    // input): its values then sit in the device memory in that layout while
    // the axon tensor keeps the Meta kernel's strides.  Such a view is put
    // back: its values are copied out and into the original strides.
    struct Geometry {
      size_t arg;
      std::vector<int64_t> strides;
      int64_t offset;
      const void* data;
    };
    std::vector<Geometry> before;
    if (outputs.empty()) {
      for (size_t i = 0; i < args.size(); ++i) {
        if (!args[i].isTensor()) continue;
        const at::Tensor& t = args[i].toTensor();
        if (t.defined() && t.numel() > 0) {
          before.push_back({i, t.strides().vec(), t.storage_offset(), t.const_data_ptr()});
        }
      }
    }
    op.redispatchBoxed(cpu, &stack);
    for (const Geometry& g : before) {
      at::Tensor t = args[g.arg].toTensor();
      if (t.strides() == c10::IntArrayRef(g.strides) || t.const_data_ptr() != g.data) continue;
      const at::Tensor values = t.clone();
      t.as_strided_(t.sizes(), g.strides, g.offset);
      t.copy_(values);
    }
    if (outputs.empty()) return;  // mutating
    TORCH_INTERNAL_ASSERT(stack.size() == outputs.size());
    for (size_t i = 0; i < outputs.size(); ++i) copy_result(stack[i], outputs[i]);
  }

  static void copy_result(const c10::IValue& result, const c10::IValue& out) {
    if (out.isTensor()) {
      const at::Tensor& o = out.toTensor();
      if (!o.defined() || o.numel() == 0) return;
      const at::Tensor& r = result.toTensor();
      // Batch norm in eval mode: the CPU kernel returns empty saved statistics
      // where the Meta kernel, like CUDA's, sizes them per channel (and
      // batch_norm_kernel then returns empty ones).
      if (!r.defined() || r.numel() == 0) {
        const_cast<at::Tensor&>(o).zero_();
      } else {
        const_cast<at::Tensor&>(o).copy_(r);
      }
    } else if (out.isTensorList()) {
      auto r = result.toTensorList();
      auto o = out.toTensorList();
      for (size_t i = 0; i < o.size(); ++i) copy_result(r.get(i), o.get(i));
    }
  }
};

// The launch's signature (HostChecks::kFull: Meta kernels run on meta
// stand-ins, which know nothing of aliasing, and may check less than the CPU
// kernel) over the op's arguments as the kernel will see them.
void sign(Signature& sig, const c10::IValue& v) {
  if (v.isTensor()) {
    sig.tensor(v.toTensor());
  } else if (v.isTensorList()) {
    const auto list = v.toTensorList();
    sig.mix(0x81 + list.size());
    for (const at::Tensor& t : list) sig.tensor(t);
  } else if (v.isList()) {
    const auto list = v.toListRef();
    sig.mix(0x91 + list.size());
    for (const c10::IValue& e : list) sign(sig, e);
  } else if (v.isNone()) {
    sig.mix(0x31);
  } else if (v.isInt() || v.isDouble() || v.isBool() || v.isComplexDouble()) {
    sig.scalar(v.toScalar());
  } else if (v.isString()) {
    sig.string(v.toStringRef());
  } else if (v.isDevice()) {
    sig.mix(0xa1 + static_cast<uint64_t>(v.toDevice().type()));
  } else if (v.isGenerator()) {
    sig.mix(0xb1);
  } else {
    sig.mix(0xc1);
  }
}

// Listed ops without Meta kernels, whose result has the shape and dtype of
// one argument (its index), or which return nothing (-1; their outputs are
// arguments their callers sized): CTC's and the margin losses' backwards (a
// gradient of an input), _logcumsumexp, cummax/cummin's helpers.  Their
// inputs come from autograd or from composites that checked them
// (_logcumsumexp's dimension: logcumsumexp_kernel).
std::optional<int> without_meta(const c10::FunctionSchema& schema) {
  static const std::unordered_map<std::string, int> ops = {
      {"aten::_ctc_loss_backward", 1}, {"aten::multi_margin_loss_backward", 1},
      {"aten::multilabel_margin_loss_backward", 1}, {"aten::_logcumsumexp", 0},
      {"aten::_cummax_helper", -1}, {"aten::_cummin_helper", -1}};
  if (!schema.overload_name().empty()) return std::nullopt;
  const auto it = ops.find(schema.name());
  if (it == ops.end()) return std::nullopt;
  return it->second;
}

// The storages of v's device tensors (by identity: empty ones have no data).
void add_storages(const c10::IValue& v, std::vector<const void*>& out) {
  if (v.isTensor()) {
    const at::Tensor& t = v.toTensor();
    if (t.defined() && !t.is_cpu() && t.has_storage()) {
      out.push_back(t.storage().unsafeGetStorageImpl());
    }
  } else if (v.isTensorList()) {
    for (const at::Tensor& t : v.toTensorList()) add_storages(t, out);
  } else if (v.isList()) {
    for (const c10::IValue& e : v.toListRef()) add_storages(e, out);
  }
}

bool changes_geometry(const c10::IValue& meta, const c10::IValue& dev) {
  if (meta.isTensor() && dev.isTensor()) {
    const at::Tensor& m = meta.toTensor();
    const at::Tensor& d = dev.toTensor();
    return m.defined() && d.defined() && (m.sizes() != d.sizes() || m.strides() != d.strides());
  }
  if (meta.isTensorList() && dev.isTensorList()) {
    auto m = meta.toTensorList();
    auto d = dev.toTensorList();
    for (size_t i = 0; i < m.size() && i < d.size(); ++i) {
      if (changes_geometry(c10::IValue(m.get(i)), c10::IValue(d.get(i)))) return true;
    }
  }
  return false;
}

// Whether a written argument whose geometry the Meta kernel changes shares
// memory with another argument.
bool resizes_an_alias(const torch::jit::Stack& stack, size_t begin, size_t num_args,
                      const std::vector<bool>& written,
                      const std::vector<c10::IValue>& written_meta) {
  size_t w = 0;
  for (size_t i = 0; i < num_args; ++i) {
    if (!written[i]) continue;
    const c10::IValue& dev = stack[begin + i];
    if (!changes_geometry(written_meta[w++], dev)) continue;
    std::vector<const void*> mine, others;
    add_storages(dev, mine);
    for (size_t j = 0; j < num_args; ++j) {
      if (j != i) add_storages(stack[begin + j], others);
    }
    for (const void* p : mine) {
      if (std::find(others.begin(), others.end(), p) != others.end()) return true;
    }
  }
  return false;
}

void async_kernel(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const c10::FunctionSchema& schema = op.schema();
  OpPlan& plan = plan_for(schema);
  if (plan.kind == OpPlan::Kind::kUnsupported) return axonFallback(op, stack);

  const size_t num_args = schema.arguments().size();
  const size_t begin = stack->size() - num_args;
  const c10::DeviceIndex device = OpDevice(schema).scan(*stack);
  HostWarningScope host_warnings;  // the Meta kernel's warnings, not raised twice

  // Meta stand-ins: errors and result geometry.
  torch::jit::Stack meta;
  meta.reserve(num_args);
  for (size_t i = 0; i < num_args; ++i) {
    const c10::IValue& v = (*stack)[begin + i];
    if (is_generator_arg(schema.arguments()[i]) && v.isGenerator()) {
      meta.emplace_back();  // Meta kernels draw no numbers
    } else if (v.isDevice()) {
      meta.emplace_back(v.toDevice().type() == kAxon ? c10::Device(c10::kMeta) : v.toDevice());
    } else {
      meta.push_back(map_tensors(v, meta_like));
    }
  }
  std::vector<c10::IValue> written_meta;  // meta stand-ins of mutated args
  if (plan.kind == OpPlan::Kind::kMutating) {
    for (size_t i = 0; i < num_args; ++i) {
      if (plan.written[i]) written_meta.push_back(meta[i]);
    }
  }
  if (const auto like = without_meta(schema); like.has_value()) {
    // No Meta kernel: the result is shaped like an argument (or there is none).
    if (*like >= 0) {
      const at::Tensor arg = (*stack)[begin + *like].toTensor();
      meta = {at::detail::empty_strided_meta(arg.sizes(), c10::contiguous_strides(arg.sizes()),
                                             arg.scalar_type(), std::nullopt,
                                             c10::Device(c10::kMeta), std::nullopt)};
    } else {
      meta.clear();
    }
  } else {
    try {
      op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::Meta), &meta);
    } catch (const c10::NotImplementedError&) {
      plan.kind = OpPlan::Kind::kUnsupported;  // no Meta kernel: tier 3 from now on
      return axonFallback(op, stack);
    } catch (const std::exception&) {
      // The Meta kernel refuses the arguments, often with another message
      // (or exception type) than the CPU kernel's: let the CPU kernel, run
      // synchronously on host views, raise its own error (or, where the CPU
      // accepts what the Meta kernel refuses, compute the result).
      return axonFallback(op, stack);
    }
  }

  if (plan.kind == OpPlan::Kind::kMutating &&
      resizes_an_alias(*stack, begin, num_args, plan.written, written_meta)) {
    // An out= argument the Meta kernel resizes shares memory with another
    // argument: the CPU kernel checks the overlap before resizing, so it
    // runs as it would on the CPU (tier 3), raising its own error.
    return axonFallback(op, stack);
  }
  if (plan.kind == OpPlan::Kind::kMutating) {  // out= tensors take their new shapes
    size_t w = 0;
    for (size_t i = 0; i < num_args; ++i) {
      if (plan.written[i]) apply_geometry(written_meta[w++], (*stack)[begin + i]);
    }
  }

  Signature signature(HostChecks::kFull);
  for (size_t i = 0; i < num_args; ++i) sign(signature, (*stack)[begin + i]);

  CpuWork work{op, {}, {}, {}};
  work.args.reserve(num_args);
  for (size_t i = 0; i < num_args; ++i) {
    c10::IValue& v = (*stack)[begin + i];
    if (is_generator_arg(schema.arguments()[i])) {
      std::optional<at::Generator> gen;
      if (v.isGenerator()) gen = v.toGenerator();
      // cpuGeneratorFor raises PyTorch's error for a generator of another device.
      work.args.emplace_back(cpuGeneratorFor(gen, device));
      continue;
    }
    if (v.isDevice() && v.toDevice().type() == kAxon) {
      work.args.emplace_back(c10::Device(c10::kCPU));
      continue;
    }
    work.args.push_back(map_tensors(v, [&](const at::Tensor& t) { return work.capture(t); }));
  }

  const char* name = plan.name.c_str();
  work.views.clear();  // the kernel holds no references to device memory
  if (plan.kind == OpPlan::Kind::kMutating) {
    std::vector<c10::IValue> returns;
    for (size_t r : plan.return_arg) returns.push_back((*stack)[begin + r]);
    launchChecked(device, name, signature.hash, 0, std::move(work));
    torch::jit::drop(*stack, num_args);
    for (auto& r : returns) stack->push_back(std::move(r));
    return;
  }

  std::vector<c10::IValue> results;
  for (const c10::IValue& m : meta) {
    results.push_back(map_tensors(m, [&](const at::Tensor& t) { return device_like(t, device); }));
    work.outputs.push_back(map_tensors(results.back(), [&](const at::Tensor& t) {
      return work.capture(t);
    }));
  }
  work.views.clear();
  // Empty results too: the CPU kernel still checks the arguments (a dtype it
  // does not take raises on the CPU whatever the size).
  launchChecked(device, name, signature.hash, 0, std::move(work));
  torch::jit::drop(*stack, num_args);
  for (auto& r : results) stack->push_back(std::move(r));
}


// Group norm by the generic kernel: ATen's composite for other backends
// (math_group_norm) views its input and fails on channels-last activations
// (a Diffusers UNet after an attention block).  Parameters of another dtype
// than the input (bf16 activations, float32 weight and bias), which the CPU
// kernel takes as they are, computing in float32 with float32 mean and rstd:
// here the input is converted to the parameters' dtype instead and the result
// back (the Meta kernel would give mean/rstd the input's dtype, which the CPU
// kernel then refuses next to float32 parameters); the backward likewise.
// native_group_norm(input, weight?, bias?, N, C, HxW, group, eps)
//   -> (out, mean, rstd)
void group_norm_kernel(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const size_t base = stack->size() - 8;
  const at::Tensor input = (*stack)[base].toTensor();
  std::optional<c10::ScalarType> param_dtype;
  for (size_t i : {base + 1, base + 2}) {
    const c10::IValue& v = (*stack)[i];
    if (v.isTensor() && v.toTensor().defined() &&
        v.toTensor().scalar_type() != input.scalar_type()) {
      param_dtype = v.toTensor().scalar_type();
    }
  }
  if (param_dtype) (*stack)[base] = input.to(*param_dtype);
  async_kernel(op, stack);
  if (param_dtype) {
    c10::IValue& out = (*stack)[stack->size() - 3];
    out = out.toTensor().to(input.scalar_type());
  }
}

// native_group_norm_backward(grad_out, input, mean, rstd, weight?, N, C, HxW,
// group, output_mask) -> (grad_input, grad_weight, grad_bias)
void group_norm_backward_kernel(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const size_t base = stack->size() - 10;
  const at::Tensor input = (*stack)[base + 1].toTensor();
  const at::Tensor mean = (*stack)[base + 2].toTensor();
  std::optional<c10::ScalarType> param_dtype;
  if (mean.defined() && mean.scalar_type() != input.scalar_type()) {
    param_dtype = mean.scalar_type();  // the forward computed in it
  }
  const c10::IValue& w = (*stack)[base + 4];
  if (w.isTensor() && w.toTensor().defined() && w.toTensor().scalar_type() != input.scalar_type()) {
    param_dtype = w.toTensor().scalar_type();
  }
  if (param_dtype) {
    for (size_t i : {base, base + 1, base + 2, base + 3}) {
      c10::IValue& v = (*stack)[i];
      if (v.isTensor() && v.toTensor().defined()) v = v.toTensor().to(*param_dtype);
    }
  }
  async_kernel(op, stack);
  if (param_dtype) {
    c10::IValue& grad_input = (*stack)[stack->size() - 3];
    if (grad_input.isTensor() && grad_input.toTensor().defined()) {
      grad_input = grad_input.toTensor().to(input.scalar_type());
    }
  }
}

// Batch norm's forms by the generic kernel, with the CPU's saved statistics
// (what eager axon returned through the fallback before, and what
// torch_axon.integrations.torch_compile makes the decompositions say): per
// channel in training, empty in eval mode, in the parameters' dtype when it
// differs from the input's (float32 parameters of 16-bit activations), else
// in the input's.  The Meta kernel, like CUDA's, sizes them per channel in
// float32 whatever the mode; the results are put right after the launch.
void batch_norm_kernel(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const c10::FunctionSchema& schema = op.schema();
  const size_t num_args = schema.arguments().size();
  const size_t base = stack->size() - num_args;
  const at::Tensor input = (*stack)[base].toTensor();
  bool training = schema.name() == "aten::_batch_norm_with_update";
  c10::ScalarType stats = input.scalar_type();
  for (size_t i = 1; i < num_args; ++i) {
    const c10::Argument& arg = schema.arguments()[i];
    const c10::IValue& v = (*stack)[base + i];
    if (arg.name() == "training") training = v.toBool();
    if (v.isTensor() && v.toTensor().defined() && v.toTensor().scalar_type() != stats) {
      stats = v.toTensor().scalar_type();
    }
  }
  async_kernel(op, stack);
  const size_t first = stack->size() - schema.returns().size();
  for (size_t r : {first + 1, first + 2}) {
    at::Tensor t = (*stack)[r].toTensor();
    if (!training) {
      (*stack)[r] = emptyDevice({0}, stats, t.device().index());
    } else if (t.scalar_type() != stats) {
      (*stack)[r] = t.to(stats);
    }
  }
}

// _logcumsumexp(self, dim): its dimension checked on the host (the op has no
// Meta kernel to do it), with PyTorch's error.
void logcumsumexp_kernel(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const size_t base = stack->size() - 2;
  c10::maybe_wrap_dim((*stack)[base + 1].toInt(), (*stack)[base].toTensor().dim());
  async_kernel(op, stack);
}

TORCH_LIBRARY_FRAGMENT(axon, m) {
  m.def("_checked_launches() -> int", []() -> int64_t { return checked_launches.load(); });
}

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("_logcumsumexp", torch::CppFunction::makeFromBoxedFunction<&logcumsumexp_kernel>());
  for (const char* op : {"native_batch_norm", "_native_batch_norm_legit",
                         "_native_batch_norm_legit.no_stats", "_native_batch_norm_legit_no_training",
                         "_batch_norm_with_update", "_batch_norm_no_update"}) {
    m.impl(op, torch::CppFunction::makeFromBoxedFunction<&batch_norm_kernel>());
  }
  m.impl("native_group_norm", torch::CppFunction::makeFromBoxedFunction<&group_norm_kernel>());
  m.impl("native_group_norm_backward",
         torch::CppFunction::makeFromBoxedFunction<&group_norm_backward_kernel>());
}

// Ops run by the generic kernel: off the hottest paths (their Meta kernels
// are often Python), but each must not stall the stream.
TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  for (const char* op : {
           // training-step ops outside the hottest loop
           "embedding_dense_backward", "native_dropout_backward", "convolution",
           "convolution_backward", "log_sigmoid_forward", "log_sigmoid_backward",
           "linalg_solve_triangular", "linalg_solve_triangular.out", "eye.out", "eye.m_out",
           "linspace.out", "logspace.out",
           "_index_put_impl_", "index_put_", "index_fill_.int_Scalar", "index_fill_.int_Tensor",
           "masked_scatter_", "scatter_reduce.two_out", "scatter.reduce_out",
           "scatter.value_reduce_out",
           // reductions and norms
           "var.correction", "var.correction_out", "std.correction", "std.correction_out",
           "var_mean.correction", "std_mean.correction", "linalg_vector_norm.out",
           "norm.out", "logsumexp.out", "prod.int_out", "prod",
           "cumprod.out", "nansum.out", "histc.out",
           "aminmax.out", "aminmax",
           // elementwise ops off the hot path
           // (their functional forms too: ATen's composites for other backends
           // allocate a contiguous result where the CPU's follows the input's layout)
           "logical_not.out", "logical_and.out", "logical_or.out", "logical_xor.out",
           "logical_not", "logical_and", "logical_or", "logical_xor",
           "abs.out", "abs", "sign.out", "floor.out", "ceil.out", "round.out", "trunc.out",
           "fmod.Tensor_out", "fmod.Scalar_out", "remainder.Tensor_out", "remainder.Scalar_out",
           "atan2.out", "expm1.out", "log2.out", "log10.out", "exp2.out", "erfinv.out",
           "hardtanh.out", "hardtanh_backward.grad_input", "leaky_relu.out",
           "leaky_relu_backward.grad_input", "softplus.out", "softplus_backward.grad_input",
           "elu.out", "elu_backward.grad_input", "mish.out", 
           "hardsigmoid.out", "hardswish.out", "glu.out", "glu_backward.grad_input",
           "logit.out", "xlogy.OutTensor", "nan_to_num.out", "isnan", "isinf",
           "bitwise_left_shift.Tensor_out", "bitwise_right_shift.Tensor_out",
           "floor_divide", "floor_divide.out", "floor_divide_.Tensor", "sgn.out", "frac.out", "heaviside.out", "hypot.out",
           "copysign.out", "signbit.out", "lgamma.out", "digamma.out", "sinh.out",
           "cosh.out", "asin.out", "acos.out", "atan.out", "tan.out", "asinh.out",
           "acosh.out", "atanh.out", "exponential_", "cauchy_", "log_normal_", "geometric_",
           // shapes, sorting, indexing
           "flip", "roll", "sort.stable", "topk", "kthvalue.values",
           "mode", "median.dim_values", "cumsum", "searchsorted.Tensor",
           "searchsorted.Tensor_out", "bucketize.Tensor", "bucketize.Tensor_out",
           "unfold_backward", "im2col", "col2im",
           "reflection_pad1d.out", "reflection_pad2d.out",
           "replication_pad1d.out", "replication_pad2d.out", "upsample_nearest2d.out",
           "upsample_bilinear2d.out", "upsample_nearest2d_backward.grad_input",
           "upsample_bilinear2d_backward.grad_input", "upsample_bicubic2d.out",
           "upsample_bicubic2d_backward.grad_input",
           // CNN and image ops (pooling, padding, sampling) and their backwards
           "avg_pool2d.out", "avg_pool2d_backward.grad_input", "max_pool2d_with_indices.out",
           "max_pool2d_with_indices_backward.grad_input", "reflection_pad2d",
           "reflection_pad2d_backward", "replication_pad2d_backward", "grid_sampler_2d",
           "grid_sampler_2d_backward", "_cdist_forward", "_cdist_backward", "hardswish",
           "hardswish_backward", "glu_backward",
           // Not _embedding_bag: its CPU kernel returns an empty offset2bag for
           // mode="sum" where the Meta kernel sizes it (the fallback runs it).
           "polar.out", "complex.out", "linalg_cross.out", 
           "binary_cross_entropy", "binary_cross_entropy_backward", "mse_loss.out",
           "mse_loss_backward.grad_input", "smooth_l1_loss.out", "huber_loss.out",
           // batch norm's backwards (the forwards: batch_norm_kernel)
           "native_batch_norm_backward", "batch_norm_backward",
           // their functional forms (ATen has no composite of them for other backends;
           // mse_loss is the loss of diffusion training)
           "mse_loss", "mse_loss_backward", "smooth_l1_loss", "smooth_l1_loss_backward.grad_input",
           "huber_loss", "huber_loss_backward.out",
           "nll_loss2d_forward.output", "nll_loss2d_backward.grad_input",
           // found by an OpInfo sweep of the ops still in the fallback (2026-11-30):
           // linear algebra, scans, pooling and upsampling in 1-D and 3-D, more losses
           // and elementwise ops.  (Not: ops whose CPU kernels raise on the values,
           // such as take/put_/max_unpool's index checks and the LAPACK solvers,
           // whose errors stay synchronous in the fallback.)
           "dot", "vdot", "trace", "addmv.out", "addbmm", "addbmm.out", "rsub.Tensor",
           "rsub.Scalar", "nansum", "count_nonzero.dim_IntList", "renorm.out",
           "hardtanh", "hardtanh_", "logit", "logit_backward.grad_input", "erfc.out", "sinc.out",
           "threshold.out", "round.decimals_out", "logaddexp.out", "logaddexp2.out",
           "fmax.out", "fmin.out", "hardshrink.out", "hardshrink_backward.grad_input",
           "softshrink.out", "softshrink_backward.grad_input", "frexp.Tensor_out", "i0.out",
           "nextafter.out", "igamma.out", "igammac.out", "polygamma.out",
           "_prelu_kernel", "_prelu_kernel_backward", "rrelu_with_noise",
           "_adaptive_avg_pool2d", "_adaptive_avg_pool2d_backward", "adaptive_max_pool2d.out",
           "adaptive_max_pool2d_backward.grad_input", "_adaptive_avg_pool3d",
           "_adaptive_avg_pool3d_backward", "adaptive_max_pool3d.out", "avg_pool3d.out",
           "avg_pool3d_backward.grad_input", "max_pool3d_with_indices",
           "max_pool3d_with_indices_backward", "fractional_max_pool2d.output",
           "fractional_max_pool2d_backward.grad_input", "fractional_max_pool3d.output",
           "upsample_nearest1d.out", "upsample_nearest1d_backward.grad_input",
           "upsample_linear1d.out", "upsample_linear1d_backward.grad_input",
           "upsample_nearest3d.out", "upsample_nearest3d_backward.grad_input",
           "upsample_trilinear3d.out", "upsample_trilinear3d_backward.grad_input",
           "_upsample_bilinear2d_aa.out", "_upsample_bilinear2d_aa_backward.grad_input",
           "_upsample_nearest_exact1d.out", "_upsample_nearest_exact2d.out",
           "_upsample_nearest_exact2d_backward.grad_input", "reflection_pad3d.out",
           "replication_pad3d.out", "reflection_pad3d_backward.grad_input",
           "replication_pad3d_backward", "reflection_pad1d_backward.grad_input",
           "replication_pad1d_backward.grad_input", "grid_sampler_3d", "grid_sampler_3d_backward",
           "channel_shuffle", "_pdist_forward", "_pdist_backward", "multi_margin_loss",
           "multilabel_margin_loss_forward", "nll_loss2d_forward", "nll_loss2d_backward",
           "median", "nanmedian", "nanmedian.dim_values", "angle", "nonzero_static",
           "hardtanh_backward", "hardsigmoid_backward.grad_input",
           "_upsample_nearest_exact1d_backward.grad_input",
           "adaptive_max_pool3d_backward.grad_input", "special_i1.out", "_ctc_loss",
           // no Meta kernels: see without_meta
           // (and _logcumsumexp: logcumsumexp_kernel)
           "_ctc_loss_backward", "multi_margin_loss_backward", "multilabel_margin_loss_backward",
           "_cummax_helper", "_cummin_helper",
           "special_i0e.out", "special_i1e.out", "special_entr.out", "special_erfcx.out",
           "special_log_ndtr.out", "special_ndtri.out", "special_xlog1py.out", "special_zeta.out",
           "special_airy_ai.out", "special_bessel_j0.out", "special_bessel_j1.out",
           "special_bessel_y0.out", "special_bessel_y1.out", "special_modified_bessel_i0.out",
           "special_modified_bessel_i1.out", "special_modified_bessel_k0.out",
           "special_modified_bessel_k1.out", "special_scaled_modified_bessel_k0.out",
           "special_scaled_modified_bessel_k1.out", "special_spherical_bessel_j0.out",
           "special_chebyshev_polynomial_t.out", "special_chebyshev_polynomial_u.out",
           "special_chebyshev_polynomial_v.out", "special_chebyshev_polynomial_w.out",
           "special_shifted_chebyshev_polynomial_t.out", "special_shifted_chebyshev_polynomial_u.out",
           "special_shifted_chebyshev_polynomial_v.out", "special_shifted_chebyshev_polynomial_w.out",
           "special_hermite_polynomial_h.out", "special_hermite_polynomial_he.out",
           "special_laguerre_polynomial_l.out", "special_legendre_polynomial_p.out",
           "gcd.out", "lcm.out", "conj_physical.out", "embedding_renorm_",
           // weight norm (Wav2Vec2's positional convolution)
           "_weight_norm_interface", "_weight_norm_interface_backward",
           "_fft_r2c", "_fft_c2c", "_fft_c2r",
           // GradScaler's unscale-and-check and scale update (fp16 training steps)
           "_amp_foreach_non_finite_check_and_unscale_", "_amp_update_scale_",
           // random ops: numbers reserved from the axon generator at launch
           "bernoulli_.float", "bernoulli_.Tensor", "bernoulli.out", "uniform_", "normal_",
           "normal.Tensor_float", "normal.float_Tensor", "normal.Tensor_Tensor", "random_",
           "random_.from", "random_.to", "randperm.generator_out", 
       }) {
    m.impl(op, torch::CppFunction::makeFromBoxedFunction<&async_kernel>());
  }
}

}  // namespace

}  // namespace at::axon
