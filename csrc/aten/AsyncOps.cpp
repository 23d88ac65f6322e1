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

void launchChecked(c10::DeviceIndex device, const char* name, uint64_t dtypes, int threads,
                   std::function<void()> fn) {
  // A per-thread cache in front of the shared set: no lock on the hot path.
  static std::mutex mutex;
  static std::unordered_set<uint64_t> verified;
  thread_local std::unordered_set<uint64_t> verified_here;
  const uint64_t key = c10::hash_combine(reinterpret_cast<uintptr_t>(name), dtypes);
  if (verified_here.count(key) != 0) return launch(device, name, std::move(fn), threads);
  {
    std::lock_guard<std::mutex> lock(mutex);
    if (verified.count(key) != 0) {
      verified_here.insert(key);
      return launch(device, name, std::move(fn), threads);
    }
  }
  syncCurrentStream(device);
  fn();
  verified_here.insert(key);
  std::lock_guard<std::mutex> lock(mutex);
  verified.insert(key);
}

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
  return at::detail::empty_strided_meta(t.sizes(), t.strides(), t.scalar_type(),
                                        std::nullopt, c10::Device(c10::kMeta),
                                        std::nullopt);
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

  at::Tensor capture(const at::Tensor& t) {
    if (!t.defined()) return t;
    if (t.is_cpu()) return snapshotCpuTensor(t);
    return hostView(t);
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

bool all_empty(const c10::IValue& v) {
  if (v.isTensor()) return !v.toTensor().defined() || v.toTensor().numel() == 0;
  if (v.isTensorList()) {
    for (const at::Tensor& t : v.toTensorList()) {
      if (t.defined() && t.numel() > 0) return false;
    }
  }
  return true;
}

void hash_dtypes(uint64_t& h, const c10::IValue& v) {
  if (v.isTensor()) {
    const at::Tensor& t = v.toTensor();
    h = h * 131 + (t.defined() ? static_cast<uint64_t>(t.scalar_type()) + 1 : 0);
  } else if (v.isList()) {
    for (const c10::IValue& e : v.toListRef()) hash_dtypes(h, e);
  }
}

uint64_t dtype_hash(const CpuWork& work) {
  uint64_t h = 0;
  for (const c10::IValue& v : work.args) hash_dtypes(h, v);
  for (const c10::IValue& v : work.outputs) hash_dtypes(h, v);
  return h;
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

void async_kernel(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const c10::FunctionSchema& schema = op.schema();
  OpPlan& plan = plan_for(schema);
  if (plan.kind == OpPlan::Kind::kUnsupported) return axonFallback(op, stack);

  const size_t num_args = schema.arguments().size();
  const size_t begin = stack->size() - num_args;
  const c10::DeviceIndex device = OpDevice(schema).scan(*stack);

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
    }
  }

  if (plan.kind == OpPlan::Kind::kMutating) {  // out= tensors take their new shapes
    size_t w = 0;
    for (size_t i = 0; i < num_args; ++i) {
      if (plan.written[i]) apply_geometry(written_meta[w++], (*stack)[begin + i]);
    }
  }

  CpuWork work{op, {}, {}};
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
  if (plan.kind == OpPlan::Kind::kMutating) {
    std::vector<c10::IValue> returns;
    for (size_t r : plan.return_arg) returns.push_back((*stack)[begin + r]);
    const uint64_t dtypes = dtype_hash(work);
    launchChecked(device, name, dtypes, 0, std::move(work));
    torch::jit::drop(*stack, num_args);
    for (auto& r : returns) stack->push_back(std::move(r));
    return;
  }

  bool empty = true;
  std::vector<c10::IValue> results;
  for (const c10::IValue& m : meta) {
    results.push_back(map_tensors(m, [&](const at::Tensor& t) { return device_like(t, device); }));
    empty = empty && all_empty(results.back());
    work.outputs.push_back(map_tensors(results.back(), [&](const at::Tensor& t) {
      return work.capture(t);
    }));
  }
  if (!empty) {
    const uint64_t dtypes = dtype_hash(work);
    launchChecked(device, name, dtypes, 0, std::move(work));
  }
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
           "logical_not.out", "logical_and.out", "logical_or.out", "logical_xor.out",
           "abs.out", "sign.out", "floor.out", "ceil.out", "round.out", "trunc.out",
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
