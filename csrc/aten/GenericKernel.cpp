#include "GenericKernel.h"

#include <algorithm>
#include <memory>
#include <mutex>
#include <unordered_map>

#include <ATen/EmptyTensor.h>
#include <ATen/TensorIterator.h>
#include <ATen/core/LegacyTypeDispatch.h>
#include <c10/util/strides.h>

#include "../core/AxonGenerator.h"
#include "Fallback.h"
#include "HostView.h"
#include "KernelSelect.h"
#include "Launch.h"
#include "OpDevice.h"

namespace at::axon {

namespace {
thread_local int meta_for_axon = 0;
}  // namespace

MetaForAxon::MetaForAxon() { ++meta_for_axon; }
MetaForAxon::~MetaForAxon() { --meta_for_axon; }
bool metaForAxon() { return meta_for_axon > 0; }

namespace {

// ------------------------------------------------------------ op plans

// The Meta kernel's results (after the layout rules) for one argument
// signature: reused for later calls with that signature, so an op whose Meta
// kernel is a Python decomposition (addmv, ...) pays for it once per signature.
struct CachedMeta {
  torch::jit::Stack meta;                  // functional ops: the results' stand-ins
  std::vector<c10::IValue> written_meta;   // mutating ops: the written arguments'
};
struct MetaCache {
  static constexpr size_t kMaxEntries = 256;  // per op; cleared when full
  std::mutex mutex;
  std::unordered_map<uint64_t, std::shared_ptr<const CachedMeta>> entries;

  std::shared_ptr<const CachedMeta> find(uint64_t key) {
    std::lock_guard<std::mutex> g(mutex);
    const auto it = entries.find(key);
    return it == entries.end() ? nullptr : it->second;
  }
  void insert(uint64_t key, std::shared_ptr<const CachedMeta> value) {
    std::lock_guard<std::mutex> g(mutex);
    if (entries.size() >= kMaxEntries) entries.clear();
    entries[key] = std::move(value);
  }
};

struct OpPlan {
  enum class Kind { kFunctional, kMutating, kUnsupported };
  Kind kind = Kind::kUnsupported;
  std::shared_ptr<MetaCache> meta_cache = std::make_shared<MetaCache>();
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
  // An out= of the right shape keeps its strides, as ATen's resize_output
  // leaves it (some Meta decompositions restride it).
  if (meta.sizes() == dev.sizes()) return;
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

// Listed ops whose Meta kernel lays the result out otherwise than the CPU
// kernel (found by tests/ops/test_generic_layout.py): the result takes the
// CPU's layout, so that what the program can observe (strides, whether a
// later reshape is a view) is the CPU's.  kIterator: TensorIterator's
// (dimensions ordered as the inputs' strides say; the Meta kernels are
// Python decompositions that make dense results); kContiguous; kConvolution:
// the result (convolution_backward: grad_input and grad_weight) in the
// memory format of the CPU's backend (convMemoryFormat; the Meta kernel,
// like the fake kernel for other backends, lays the forward out contiguous).
// kFormatOfArg0/1: the memory format the first (second) argument suggests
// (channels_last for a channels_last input), as the CPU's padding kernels and
// their backwards allocate.
// kPool3dArg0/1: every result in the first (second) argument's format as the
// CPU's 3-D max pooling decides it (an unbatched [C, D, H, W] input judged as
// [1, C, D, H, W]).
enum class Layout {
  kIterator, kContiguous, kConvolution, kFormatOfArg0, kFormatOfArg1, kPool3dArg0, kPool3dArg1
};
std::optional<Layout> cpu_layout(const c10::FunctionSchema& schema) {
  static const std::unordered_map<std::string, Layout> ops = {
      {"aten::floor_divide", Layout::kIterator},
      {"aten::hardswish_backward", Layout::kIterator},
      {"aten::rrelu_with_noise", Layout::kContiguous},
      {"aten::log_sigmoid_forward", Layout::kContiguous},
      {"aten::convolution", Layout::kConvolution},
      {"aten::convolution_backward", Layout::kConvolution},
      {"aten::reflection_pad2d", Layout::kFormatOfArg0},
      {"aten::replication_pad2d", Layout::kFormatOfArg0},
      {"aten::reflection_pad3d", Layout::kFormatOfArg0},
      {"aten::replication_pad3d", Layout::kFormatOfArg0},
      {"aten::reflection_pad2d_backward", Layout::kFormatOfArg1},
      {"aten::replication_pad2d_backward", Layout::kFormatOfArg1},
      {"aten::reflection_pad3d_backward", Layout::kFormatOfArg1},
      {"aten::replication_pad3d_backward", Layout::kFormatOfArg1},
      {"aten::max_pool3d_with_indices", Layout::kPool3dArg0},
      {"aten::max_pool3d_with_indices_backward", Layout::kPool3dArg1}};
  if (!schema.overload_name().empty()) return std::nullopt;
  const auto it = ops.find(schema.name());
  if (it == ops.end()) return std::nullopt;
  return it->second;
}

int64_t int_of(const c10::IValue& v) {
  return v.isInt() ? v.toInt() : v.toSymInt().guard_int(__FILE__, __LINE__);
}
std::vector<int64_t> ints_of(const c10::IValue& v) {
  std::vector<int64_t> out;
  for (const c10::IValue& e : v.toListRef()) out.push_back(int_of(e));
  return out;
}

// Restrides convolution's (or its backward's) meta results as the CPU lays
// them out.
void apply_conv_layout(const c10::FunctionSchema& schema, const torch::jit::Stack& a,
                       torch::jit::Stack& results) {
  const bool backward = schema.name() == "aten::convolution_backward";
  const size_t in = backward ? 1 : 0;  // input, weight, then bias (sizes), stride, ...
  if (a.size() < in + 9 || !a[in].isTensor() || !a[in + 1].isTensor()) return;
  const at::Tensor& input = a[in].toTensor();
  const at::Tensor& weight = a[in + 1].toTensor();
  if (!input.defined() || !weight.defined()) return;
  std::optional<std::vector<int64_t>> bias_sizes;
  if (backward && a[in + 2].isList()) bias_sizes = ints_of(a[in + 2]);
  const auto ints = [&](size_t i) { return ints_of(a[i]); };
  const at::MemoryFormat format = convMemoryFormat(
      input.sizes(), input.strides(), weight.sizes(), weight.strides(), input.scalar_type(),
      bias_sizes.has_value() ? std::optional<IntArrayRef>(*bias_sizes) : std::nullopt,
      ints(in + 3), ints(in + 4), ints(in + 5), a[in + 6].toBool(), ints(in + 7),
      int_of(a[in + 8]));
  const size_t n = backward ? std::min<size_t>(2, results.size()) : std::min<size_t>(1, results.size());
  for (size_t r = 0; r < n; ++r) {
    if (!results[r].isTensor() || !results[r].toTensor().defined()) continue;
    const at::Tensor& m = results[r].toTensor();
    std::vector<int64_t> strides = stridesForFormat(m.sizes(), format);
    if (input.dim() > 0 && input.size(0) == 0) {
      // An empty batch (ATen's Empty backend): the forward is input *
      // weight[0] viewed to the result's sizes (the input's strides where the
      // sizes are the input's), the backward zeros_like(input / weight).
      const at::Tensor& like = backward && r == 1 ? weight : input;
      const auto c = c10::contiguous_strides(m.sizes());
      strides.assign(c.begin(), c.end());
      if (like.sizes() == m.sizes() && like.is_non_overlapping_and_dense()) {
        strides.assign(like.strides().begin(), like.strides().end());
      }
    }
    if (m.strides() == IntArrayRef(strides)) continue;
    results[r] = at::detail::empty_strided_meta(m.sizes(), strides, m.scalar_type(),
                                                std::nullopt, c10::Device(c10::kMeta),
                                                std::nullopt);
  }
}

// Restrides a meta result as cpu_layout says (same sizes and dtype).
void apply_cpu_layout(Layout layout, const torch::jit::Stack& meta_args, at::Tensor& result) {
  if (!result.defined()) return;
  std::vector<int64_t> strides;
  if (layout == Layout::kContiguous) {
    const auto c = c10::contiguous_strides(result.sizes());
    strides.assign(c.begin(), c.end());
  } else {
    // The order TensorIterator gives the dimensions depends on the operands'
    // strides only: its dtype logic is kept out (promote to a common dtype,
    // Python numbers and CPU scalars left out).
    at::TensorIteratorConfig config;
    at::Tensor out;
    config.add_output(out).promote_inputs_to_common_dtype(true).resize_outputs(true);
    int inputs = 0;
    for (const c10::IValue& v : meta_args) {
      if (v.isTensor() && v.toTensor().defined() && v.toTensor().is_meta() &&
          v.toTensor().dim() > 0) {
        config.add_const_input(v.toTensor());
        ++inputs;
      }
    }
    if (inputs == 0) return;
    try {
      const at::TensorIterator iter = config.build();
      if (iter.output(0).sizes() != result.sizes()) return;
      strides.assign(iter.output(0).strides().begin(), iter.output(0).strides().end());
    } catch (const std::exception&) {
      return;  // the Meta kernel's layout
    }
  }
  result = at::detail::empty_strided_meta(result.sizes(), strides, result.scalar_type(),
                                          std::nullopt, c10::Device(c10::kMeta), std::nullopt);
}

// v's device tensors counted into the thread policy's size (KernelSelect.h).
using Elements = kselect::KernelSize;
void count_elements(const c10::IValue& v, Elements& n) {
  if (v.isTensor()) {
    const at::Tensor& t = v.toTensor();
    if (t.defined() && !t.is_cpu()) n.add(t.numel(), static_cast<int64_t>(t.itemsize()));
  } else if (v.isTensorList()) {
    for (const at::Tensor& t : v.toTensorList()) count_elements(t, n);
  } else if (v.isList()) {
    for (const c10::IValue& e : v.toListRef()) count_elements(e, n);
  }
}

// Launches the CPU kernel on the threads the thread policy picks.
template <typename Fn>
void launchGeneric(c10::DeviceIndex device, const char* name, uint64_t signature,
                   const Elements& elements, Fn&& fn) {
  std::unique_ptr<Work> work = functionWork(std::function<void()>(std::forward<Fn>(fn)));
  const int threads = kselect::threadsFor(name, elements.bytes, elements.largest, *work);
  launchChecked(device, name, signature, threads, std::move(work));
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

}  // namespace

void genericStreamKernel(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const c10::FunctionSchema& schema = op.schema();
  OpPlan& plan = plan_for(schema);
  if (plan.kind == OpPlan::Kind::kUnsupported) return axonFallback(op, stack);

  const size_t num_args = schema.arguments().size();
  const size_t begin = stack->size() - num_args;
  const c10::DeviceIndex device = opDevice(schema, *stack);
  HostWarningScope host_warnings;  // the Meta kernel's warnings, not raised twice

  // The cache key: everything the Meta kernel sees (the arguments' signature:
  // sizes, strides, dtypes, aliasing, exact scalars) and the default dtype.
  Signature key(HostChecks::kFull);
  for (size_t i = 0; i < num_args; ++i) sign(key, (*stack)[begin + i]);
  key.mix(0x5151 + static_cast<uint64_t>(c10::typeMetaToScalarType(c10::get_default_dtype())));
  torch::jit::Stack meta;
  std::vector<c10::IValue> written_meta;  // meta stand-ins of mutated args
  if (auto hit = plan.meta_cache->find(key.hash)) {
    meta = hit->meta;
    written_meta = hit->written_meta;
  } else {
    // Meta stand-ins: errors and result geometry.
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
    if (plan.kind == OpPlan::Kind::kMutating) {
      for (size_t i = 0; i < num_args; ++i) {
        if (plan.written[i]) written_meta.push_back(meta[i]);
      }
    }
    const std::optional<Layout> layout = cpu_layout(schema);
    torch::jit::Stack meta_args;  // what the Meta kernel consumes, when the layout needs them
    if (layout.has_value()) meta_args = meta;
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
        const MetaForAxon for_axon;
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

    if (layout == Layout::kConvolution) {
      if (plan.kind == OpPlan::Kind::kFunctional) apply_conv_layout(schema, meta_args, meta);
    } else if (layout == Layout::kPool3dArg0 || layout == Layout::kPool3dArg1) {
      const size_t arg = layout == Layout::kPool3dArg0 ? 0 : 1;
      if (plan.kind == OpPlan::Kind::kFunctional && meta_args.size() > arg &&
          meta_args[arg].isTensor() && meta_args[arg].toTensor().defined()) {
        const at::Tensor& like = meta_args[arg].toTensor();
        // The CPU's rule: a batched input's suggested format; an unbatched one
        // [C, D, H, W] channels_last_3d as [1, C, D, H, W] when that is
        // channels_last_3d-contiguous (and not contiguous), else contiguous.
        const bool unbatched = like.dim() == 4;
        at::MemoryFormat format = like.suggest_memory_format();
        if (unbatched) {
          const at::Tensor u = like.unsqueeze(0);
          format = !u.is_contiguous() && u.is_contiguous(at::MemoryFormat::ChannelsLast3d)
                       ? at::MemoryFormat::ChannelsLast3d
                       : at::MemoryFormat::Contiguous;
        }
        for (c10::IValue& r : meta) {
          if (!r.isTensor() || !r.toTensor().defined()) continue;
          const at::Tensor& m = r.toTensor();
          if (m.dim() != like.dim()) continue;
          std::vector<int64_t> sizes = m.sizes().vec();
          if (unbatched) sizes.insert(sizes.begin(), 1);
          std::vector<int64_t> strides = stridesForFormat(sizes, format);
          if (unbatched) strides.erase(strides.begin());
          if (m.strides() == IntArrayRef(strides)) continue;
          r = at::detail::empty_strided_meta(m.sizes(), strides, m.scalar_type(), std::nullopt,
                                             c10::Device(c10::kMeta), std::nullopt);
        }
      }
    } else if (layout == Layout::kFormatOfArg0 || layout == Layout::kFormatOfArg1) {
      const size_t arg = layout == Layout::kFormatOfArg0 ? 0 : 1;
      if (plan.kind == OpPlan::Kind::kFunctional && meta.size() == 1 && meta[0].isTensor() &&
          meta_args.size() > arg && meta_args[arg].isTensor()) {
        const at::Tensor& like = meta_args[arg].toTensor();
        const at::Tensor& m = meta[0].toTensor();
        if (like.defined() && m.defined() && like.dim() == m.dim()) {
          const std::vector<int64_t> strides = stridesForFormat(m.sizes(), like.suggest_memory_format());
          if (m.strides() != IntArrayRef(strides)) {
            meta[0] = at::detail::empty_strided_meta(m.sizes(), strides, m.scalar_type(),
                                                     std::nullopt, c10::Device(c10::kMeta),
                                                     std::nullopt);
          }
        }
      }
    } else if (layout.has_value() && plan.kind == OpPlan::Kind::kFunctional &&
        (meta.size() == 1 || *layout == Layout::kContiguous)) {
      for (c10::IValue& r : meta) {
        if (!r.isTensor()) continue;
        at::Tensor result = r.toTensor();
        apply_cpu_layout(*layout, meta_args, result);
        r = result;
      }
    }
    // Cached unless the Meta kernel warned (a cached call would not warn again)
    // or resized an out= argument (its resize warning is per call).
    bool cacheable = !host_warnings.any();
    if (cacheable && plan.kind == OpPlan::Kind::kMutating) {
      size_t w = 0;
      for (size_t i = 0; i < num_args && cacheable; ++i) {
        if (!plan.written[i]) continue;
        const c10::IValue& m = written_meta[w++];
        const c10::IValue& d = (*stack)[begin + i];
        if (m.isTensor() && d.isTensor()) {
          cacheable = !m.toTensor().defined() || !d.toTensor().defined() ||
                      m.toTensor().sizes() == d.toTensor().sizes();
        } else if (!m.isNone()) {
          cacheable = false;  // (tensor lists: not worth the bookkeeping)
        }
      }
    }
    if (cacheable) {
      auto entry = std::make_shared<CachedMeta>();
      entry->meta = meta;
      entry->written_meta = written_meta;
      plan.meta_cache->insert(key.hash, std::move(entry));
    }
  }
  if (plan.kind == OpPlan::Kind::kMutating && !schema.name().empty() &&
      schema.name().back() == '_') {
    // An in-place op cannot resize self: the CPU kernel's error (some Meta
    // decompositions resize it with a warning instead).
    size_t w = 0;
    for (size_t i = 0; i < num_args; ++i) {
      if (!plan.written[i]) continue;
      const c10::IValue& m = written_meta[w++];
      const c10::IValue& d = (*stack)[begin + i];
      if (m.isTensor() && d.isTensor() && m.toTensor().defined() && d.toTensor().defined()) {
        TORCH_CHECK(m.toTensor().sizes() == d.toTensor().sizes(), "output with shape ",
                    d.toTensor().sizes(), " doesn't match the broadcast shape ",
                    m.toTensor().sizes());
      }
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
    Elements elements;
    for (size_t i = 0; i < num_args; ++i) count_elements((*stack)[begin + i], elements);
    launchGeneric(device, name, signature.hash, elements, std::move(work));
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
  Elements elements;
  for (size_t i = 0; i < num_args; ++i) count_elements((*stack)[begin + i], elements);
  for (const c10::IValue& r : results) count_elements(r, elements);
  launchGeneric(device, name, signature.hash, elements, std::move(work));
  torch::jit::drop(*stack, num_args);
  for (auto& r : results) stack->push_back(std::move(r));
}

}  // namespace at::axon
