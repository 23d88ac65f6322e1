#include "Fallback.h"

#include <axon/env.h>

#include <cstdlib>
#include <mutex>
#include <unordered_map>
#include <unordered_set>

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <ATen/ops/_nested_tensor_size_native.h>
#include <ATen/ops/_nested_tensor_storage_offsets_native.h>
#include <ATen/ops/_nested_tensor_strides_native.h>
#include <c10/core/DeviceGuard.h>
#include <torch/library.h>

#include "../core/AxonGenerator.h"
#include "../core/AxonRuntime.h"
#include "../core/SyncDebug.h"
#include "HostView.h"
#include "OpDevice.h"
#include "Registry.h"

namespace at::axon {
namespace {

// ------------------------------------------------------------ statistics

struct OpCount {
  std::string name;
  int64_t count = 0;
  bool warned = false;
};

std::mutex stats_mutex;
// Keyed by the op's schema, whose address is stable for the process.
std::unordered_map<const c10::FunctionSchema*, OpCount> stats;

bool warn_enabled() {
  static const bool enabled = [] {
    return ::axon::rt::env_bool("AXON_FALLBACK_WARN", false);
  }();
  return enabled;
}

}  // namespace

std::string op_name(const c10::FunctionSchema& schema) {
  const auto& name = schema.operator_name();
  return name.overload_name.empty() ? name.name
                                    : name.name + "." + name.overload_name;
}

namespace {

void count(const c10::FunctionSchema& schema) {
  bool warn = false;
  {
    std::lock_guard<std::mutex> lock(stats_mutex);
    OpCount& c = stats[&schema];
    if (c.name.empty()) c.name = op_name(schema);
    c.count++;
    if (!c.warned && warn_enabled()) c.warned = warn = true;
  }
  if (warn) {
    TORCH_WARN("axon: ", op_name(schema),
               " has no axon kernel; it runs on the CPU (fallback)");
  }
}

// ------------------------------------------------------------ quantized

// Axon has no quantized tensors (no QuantizedPrivateUse1 kernels, no
// quantizer on device memory).  Factories dispatched on a quantized dtype
// stop at quantizedFallback below; ops that take dense axon tensors and return quantized ones
// (quantize_per_tensor, quantize_per_channel, _make_per_*_quantized_tensor)
// reach the fallback, whose CPU kernel would return a QuantizedCPU tensor that
// cannot be moved: they raise here instead of returning a half-built tensor.
[[noreturn]] void quantized_unsupported(const c10::FunctionSchema& schema,
                                        c10::ScalarType dtype) {
  TORCH_CHECK_NOT_IMPLEMENTED(
      false, "Could not run '", op_name(schema), "' on axon: it makes a quantized tensor (torch.",
      c10::getDtypeNames(dtype).first,
      "), and axon has no quantized tensors (no QuantizedPrivateUse1 kernels). "
      "Quantize on the CPU (tensor.cpu()); the fake_quantize_* ops work on axon.");
}

// Nor sparse tensors (no SparsePrivateUse1 / SparseCsrPrivateUse1 kernels):
// ops on them stop at the fallback registered for those keys below, and ops
// that would make one from dense axon tensors (to_sparse, ...) raise here
// rather than return a CPU sparse tensor that cannot be moved.
[[noreturn]] void sparse_unsupported(const std::string& op, c10::Layout layout) {
  TORCH_CHECK_NOT_IMPLEMENTED(
      false, "Could not run '", op, "' on axon: it needs a tensor of layout ", layout,
      ", and axon has only strided tensors (no sparse tensors: no SparsePrivateUse1 kernels). "
      "Keep such tensors on the CPU, or use dense ones (to_dense(); nn.Embedding(..., "
      "sparse=False), the default).");
}

bool is_scalar_type(const c10::TypePtr& type) {
  if (type->kind() == c10::TypeKind::ScalarTypeType) return true;
  if (auto opt = type->cast<c10::OptionalType>()) {
    return opt->getElementType()->kind() == c10::TypeKind::ScalarTypeType;
  }
  return false;
}

// Before the kernel runs: a quantized dtype argument.
void check_no_quantized_dtype(const c10::FunctionSchema& schema,
                              const torch::jit::Stack& stack) {
  const size_t num_args = schema.arguments().size();
  const size_t begin = stack.size() - num_args;
  for (size_t i = 0; i < num_args; ++i) {
    const c10::IValue& v = stack[begin + i];
    if (!v.isInt() || !is_scalar_type(schema.arguments()[i].real_type())) continue;
    const auto dtype = static_cast<c10::ScalarType>(v.toInt());
    if (c10::isQIntType(dtype)) quantized_unsupported(schema, dtype);
  }
}

// After it ran (on host views; nothing on the device changed yet): a quantized
// result.
void check_no_quantized_result(const c10::FunctionSchema& schema, const c10::IValue& v) {
  auto check = [&](const at::Tensor& t) {
    if (t.defined() && t.is_quantized()) quantized_unsupported(schema, t.scalar_type());
    if (t.defined() && t.layout() != c10::kStrided) sparse_unsupported(op_name(schema), t.layout());
  };
  if (v.isTensor()) {
    check(v.toTensor());
  } else if (v.isTensorList()) {
    for (const at::Tensor& t : v.toTensorList().vec()) check(t);
  } else if (v.isList()) {
    for (const c10::IValue& e : v.toListRef()) {
      if (e.isTensor()) check(e.toTensor());
    }
  }
}

// ------------------------------------------------------------ the fallback

class Fallback {
 public:
  Fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack)
      : schema_(op.schema()), stack_(stack) {}

  void run(const c10::OperatorHandle& op) {
    const size_t num_args = schema_.arguments().size();
    const size_t begin = stack_->size() - num_args;
    device_ = opDevice(schema_, *stack_);
    check_no_quantized_dtype(schema_, *stack_);
    c10::DeviceGuard guard(c10::Device(kAxon, device_));
    syncCurrentStream(device_);
    warnOrErrorOnFallbackSync(schema_.operator_name());
    for (size_t i = 0; i < num_args; ++i) {
      note_written((*stack_)[begin + i], schema_.arguments()[i]);
    }
    for (size_t i = 0; i < num_args; ++i) {
      to_host((*stack_)[begin + i], schema_.arguments()[i]);
    }
    op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), stack_);
    const size_t num_rets = schema_.returns().size();
    const size_t rbegin = stack_->size() - num_rets;
    for (size_t i = 0; i < num_rets; ++i) {
      check_no_quantized_result(schema_, (*stack_)[rbegin + i]);
    }
    sync_mutated();
    for (size_t i = 0; i < num_rets; ++i) to_device((*stack_)[rbegin + i]);
  }

 private:
  // Device storages that the op writes through some argument.
  void note_written(const c10::IValue& v, const c10::Argument& arg) {
    if (arg.alias_info() == nullptr || !arg.alias_info()->isWrite()) return;
    auto note = [&](const at::Tensor& t) {
      if (t.defined() && t.device().type() == kAxon && t.storage().data() != nullptr) {
        written_.insert(t.storage().data());
      }
    };
    if (v.isTensor()) {
      note(v.toTensor());
    } else if (v.isTensorList()) {
      for (const at::Tensor& t : v.toTensorList()) note(t);
    }
  }

  // Host views of one device storage share one CPU storage (and one tensor
  // is one host view), so that the CPU kernel's overlap checks (out= sharing
  // memory with an input: assert_no_overlap ...) see what the CPU would.
  at::Tensor host(const at::Tensor& t, bool mutated) {
    if (!t.defined() || t.device().type() != kAxon) return t;
    if (auto same = host_of_.find(t.unsafeGetTensorImpl()); same != host_of_.end()) {
      if (mutated) mutated_.emplace_back(same->second, t);
      return same->second;
    }
    const void* data = t.storage().data();
    at::Tensor h;
    if (auto shared = data != nullptr ? cpu_storages_.find(data) : cpu_storages_.end();
        shared != cpu_storages_.end() && shared->second.nbytes() == t.storage().nbytes()) {
      auto impl = c10::make_intrusive<c10::TensorImpl>(
          c10::Storage(shared->second), c10::DispatchKeySet(c10::DispatchKey::CPU), t.dtype());
      impl->set_sizes_and_strides(t.sizes(), t.strides(), t.storage_offset());
      impl->_set_conj(t.is_conj());
      impl->_set_neg(t.is_neg());
      h = at::Tensor(std::move(impl));
    } else {
      h = hostView(t, /*resizable=*/mutated || (data != nullptr && written_.count(data) != 0));
      if (data != nullptr) cpu_storages_.emplace(data, h.storage());
    }
    host_of_.emplace(t.unsafeGetTensorImpl(), h);
    originals_.emplace(h.unsafeGetTensorImpl(), t);
    if (t.storage().data() != nullptr) bases_.emplace(t.storage().data(), t);
    if (mutated) mutated_.emplace_back(h, t);
    return h;
  }

  void to_host(c10::IValue& v, const c10::Argument& arg) {
    const bool mutated = arg.alias_info() != nullptr && arg.alias_info()->isWrite();
    if (v.isTensor()) {
      v = host(v.toTensor(), mutated);
    } else if (v.isTensorList()) {
      auto list = v.toTensorList();
      for (size_t i = 0; i < list.size(); ++i) list[i] = host(list[i], mutated);
    } else if (v.isList()) {
      auto list = v.toList();
      for (size_t i = 0; i < list.size(); ++i) {
        c10::IValue e = list.get(i);
        if (e.isTensor()) list.set(i, host(e.toTensor(), mutated));
      }
    } else if (v.isDevice() && v.toDevice().type() == kAxon) {
      v = c10::Device(c10::kCPU);
    } else if (arg.type()->kind() == c10::TypeKind::OptionalType &&
               arg.type()->cast<c10::OptionalType>()->getElementType()->kind() ==
                   c10::TypeKind::GeneratorType) {
      std::optional<at::Generator> gen;
      if (v.isGenerator()) gen = v.toGenerator();
      if (!gen.has_value() || gen->device().type() == kAxon) {
        v = cpuGeneratorFor(gen, device_);
      }
    } else if (v.isGenerator() && v.toGenerator().device().type() == kAxon) {
      v = cpuGeneratorFor(v.toGenerator(), device_);
    }
  }

  // A kernel may resize an out= tensor, or restride an in-place one, or flip
  // its conjugate bit (linalg_lu_solve with left=False returns X^H by setting
  // out's conj bit): carry that back to the axon tensor.
  void sync_mutated() {
    for (auto& [h, t] : mutated_) {
      c10::TensorImpl* timpl = t.unsafeGetTensorImpl();
      if (h.is_conj() != t.is_conj()) timpl->_set_conj(h.is_conj());
      if (h.is_neg() != t.is_neg()) timpl->_set_neg(h.is_neg());
      if (h.storage().data() == t.storage().data() &&
          h.storage().nbytes() == t.storage().nbytes()) {
        if (h.sizes() != t.sizes() || h.strides() != t.strides() ||
            h.storage_offset() != t.storage_offset()) {
          timpl->set_sizes_and_strides(h.sizes(), h.strides(), h.storage_offset());
        }
        continue;
      }
      // Reallocated on the CPU: give t a storage of that size and copy.
      at::Tensor fresh = copyToDevice(h, device_);
      timpl->set_storage_keep_dtype(fresh.storage());
      timpl->set_sizes_and_strides(fresh.sizes(), fresh.strides(),
                                   fresh.storage_offset());
    }
  }

  at::Tensor device_tensor(const at::Tensor& r) {
    if (!r.defined() || !r.is_cpu()) return r;
    auto it = originals_.find(r.unsafeGetTensorImpl());
    if (it != originals_.end()) return it->second;  // in-place / out= result
    auto base = r.storage().data() != nullptr ? bases_.find(r.storage().data())
                                              : bases_.end();
    if (base != bases_.end()) {  // a view of an input
      auto impl = c10::make_intrusive<c10::TensorImpl>(
          c10::TensorImpl::VIEW, c10::Storage(base->second.storage()),
          base->second.key_set(), r.dtype());
      impl->set_sizes_and_strides(r.sizes(), r.strides(), r.storage_offset());
      return at::Tensor(std::move(impl));
    }
    return copyToDevice(r, device_);
  }

  void to_device(c10::IValue& v) {
    if (v.isTensor()) {
      v = device_tensor(v.toTensor());
    } else if (v.isTensorList()) {
      auto list = v.toTensorList();
      for (size_t i = 0; i < list.size(); ++i) list[i] = device_tensor(list[i]);
    } else if (v.isList()) {
      auto list = v.toList();
      for (size_t i = 0; i < list.size(); ++i) {
        c10::IValue e = list.get(i);
        if (e.isTensor()) list.set(i, device_tensor(e.toTensor()));
      }
    }
  }

  const c10::FunctionSchema& schema_;
  torch::jit::Stack* stack_;
  c10::DeviceIndex device_ = -1;
  std::unordered_map<const c10::TensorImpl*, at::Tensor> originals_;
  std::unordered_map<const void*, at::Tensor> bases_;
  std::vector<std::pair<at::Tensor, at::Tensor>> mutated_;
  std::unordered_map<const c10::TensorImpl*, at::Tensor> host_of_;
  std::unordered_map<const void*, c10::Storage> cpu_storages_;
  std::unordered_set<const void*> written_;
};

}  // namespace

void axonFallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  // An op with no CPU kernel either (CUDA-only ones: _cudnn_rnn,
  // _flash_attention_forward, ...): the dispatcher's error would name the
  // CPU backend, although the arguments are axon tensors.  Before counting:
  // nothing falls back.
  TORCH_CHECK_NOT_IMPLEMENTED(
      op.hasComputedKernelForDispatchKey(c10::DispatchKey::CPU), "Could not run '",
      op_name(op.schema()), "' with arguments from the 'axon' backend. axon has no kernel for "
      "it, and neither has the CPU, whose kernel axon runs for ops without one of their own "
      "(it is an operator of another backend, e.g. CUDA-only).");
  count(op.schema());
  Fallback(op, stack).run(op);
}

namespace {

TORCH_LIBRARY_IMPL(_, PrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&axonFallback>());
}

// Sparse axon tensors (sparse_coo_tensor(..., device="axon"), a CPU sparse
// tensor's .to("axon"), nn.Embedding(sparse=True)'s gradient): PyTorch's
// error for a missing kernel names the dispatch key; this one says what to do.
void sparseFallback(const c10::OperatorHandle& op, torch::jit::Stack* /*stack*/) {
  sparse_unsupported(op_name(op.schema()), c10::kSparse);
}
void sparseCsrFallback(const c10::OperatorHandle& op, torch::jit::Stack* /*stack*/) {
  sparse_unsupported(op_name(op.schema()), c10::kSparseCsr);
}
// Sparse compressed tensors (CSR, CSC, BSR, BSC) are made by composite ops
// straight from their index and value tensors, so no kernel of the keys
// above runs until one is used, and then an op with a composite kernel
// (values(), crow_indices(), .cpu()) fails with a misleading layout error.
// Their constructors raise instead, for axon tensors, an axon device, or a
// CPU tensor's .to("axon") (which builds the axon tensor with
// _sparse_compressed_tensor_unsafe on SparseCsrPrivateUse1).
void sparseCompressedConstructor(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const std::string name = op.schema().name();
  c10::Layout layout = name.find("csc") != std::string::npos   ? c10::kSparseCsc
                       : name.find("bsr") != std::string::npos ? c10::kSparseBsr
                       : name.find("bsc") != std::string::npos ? c10::kSparseBsc
                                                               : c10::kSparseCsr;
  const auto& args = op.schema().arguments();
  const size_t first = stack->size() - args.size();
  for (size_t i = 0; i < args.size(); ++i) {
    const c10::IValue& v = (*stack)[first + i];
    if (args[i].name() == "layout" && v.isInt()) layout = static_cast<c10::Layout>(v.toInt());
  }
  sparse_unsupported(op_name(op.schema()), layout);
}
constexpr const char* kSparseCompressedConstructors[] = {
    "sparse_compressed_tensor.comp_plain_value_size",
    "sparse_compressed_tensor.comp_plain_value",
    "sparse_csr_tensor.crow_col_value_size",
    "sparse_csr_tensor.crow_col_value",
    "sparse_csc_tensor.ccol_row_value_size",
    "sparse_csc_tensor.ccol_row_value",
    "sparse_bsr_tensor.crow_col_value_size",
    "sparse_bsr_tensor.crow_col_value",
    "sparse_bsc_tensor.ccol_row_value_size",
    "sparse_bsc_tensor.ccol_row_value",
    "_sparse_compressed_tensor_unsafe",
    "_sparse_csr_tensor_unsafe",
    "_sparse_csc_tensor_unsafe",
    "_sparse_bsr_tensor_unsafe",
    "_sparse_bsc_tensor_unsafe",
    "_sparse_compressed_tensor_with_dims",
};
void registerSparseCompressedConstructors(torch::Library& m, c10::DispatchKey key) {
  OpRegistrar reg(m, "unsupported layouts", key);
  for (const char* op : kSparseCompressedConstructors) {
    reg.impl(Path::kStructural, op,
             torch::CppFunction::makeFromBoxedFunction<&sparseCompressedConstructor>());
  }
}
TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  registerSparseCompressedConstructors(m, c10::DispatchKey::PrivateUse1);
}
TORCH_LIBRARY_IMPL(aten, AutogradPrivateUse1, m) {
  registerSparseCompressedConstructors(m, c10::DispatchKey::AutogradPrivateUse1);
}
// Not recorded in the op table (which lists the PrivateUse1 and autograd keys):
// a CPU tensor's .to("axon") reaches _sparse_compressed_tensor_unsafe here.
TORCH_LIBRARY_IMPL(aten, SparseCsrPrivateUse1, m) {
  for (const char* op : kSparseCompressedConstructors)
    m.impl(op, torch::CppFunction::makeFromBoxedFunction<&sparseCompressedConstructor>());
}
// Nested tensors of the strided layout (NestedTensorImpl) have no
// NestedTensorPrivateUse1 kernels: every op on one stops here, with the way
// that works (the jagged layout is a Python subclass over ordinary axon
// tensors).
void nestedFallback(const c10::OperatorHandle& op, torch::jit::Stack* /*stack*/) {
  TORCH_CHECK_NOT_IMPLEMENTED(
      false, "Could not run '", op_name(op.schema()),
      "' on axon: it takes a nested tensor of the strided layout, which axon does not "
      "support (no NestedTensorPrivateUse1 kernels). Use the jagged layout "
      "(torch.nested.nested_tensor(..., layout=torch.jagged) or nested.as_nested_tensor(..., "
      "layout=torch.jagged)), which works on axon, or keep strided nested tensors on the CPU.");
}
TORCH_LIBRARY_IMPL(_, NestedTensorPrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&nestedFallback>());
}
// Made from a list of axon tensors (torch.nested.nested_tensor / as_nested_tensor
// of the strided layout), one would only fail at its first use: refuse it here.
TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  OpRegistrar(m, "unsupported layouts")
      .impl(Path::kStructural, "_nested_tensor_from_tensor_list",
            torch::CppFunction::makeFromBoxedFunction<&nestedFallback>());
}
TORCH_LIBRARY_IMPL(aten, AutogradPrivateUse1, m) {
  OpRegistrar(m, "unsupported layouts", c10::DispatchKey::AutogradPrivateUse1)
      .impl(Path::kStructural, "_nested_tensor_from_tensor_list",
            torch::CppFunction::makeFromBoxedFunction<&nestedFallback>());
}
// Their metadata (host tensors) is readable: autograd reads it when one is made
// from axon tensors that require grad (InputMetadata), inside code that cannot
// propagate an exception, so without these the process aborted there.
TORCH_LIBRARY_IMPL(aten, NestedTensorPrivateUse1, m) {
  m.impl("_nested_tensor_size", &at::native::_nested_tensor_size);
  m.impl("_nested_tensor_strides", &at::native::_nested_tensor_strides);
  m.impl("_nested_tensor_storage_offsets", &at::native::_nested_tensor_storage_offsets);
}
// Ops dispatched on a quantized axon tensor or dtype
// (_empty_affine_quantized, ...): PyTorch's error for a missing kernel names
// the dispatch key ("Quantizedaxon backend"); this one says what to do.
void quantizedFallback(const c10::OperatorHandle& op, torch::jit::Stack* /*stack*/) {
  TORCH_CHECK_NOT_IMPLEMENTED(
      false, "Could not run '", op_name(op.schema()),
      "' on axon: it takes or makes a quantized tensor, and axon has no quantized tensors "
      "(no QuantizedPrivateUse1 kernels). Quantize on the CPU (tensor.cpu()); the "
      "fake_quantize_* ops work on axon.");
}
TORCH_LIBRARY_IMPL(_, QuantizedPrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&quantizedFallback>());
}
TORCH_LIBRARY_IMPL(_, SparsePrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&sparseFallback>());
}
TORCH_LIBRARY_IMPL(_, SparseCsrPrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&sparseCsrFallback>());
}

}  // namespace

std::map<std::string, int64_t> fallbackStats() {
  std::lock_guard<std::mutex> lock(stats_mutex);
  std::map<std::string, int64_t> out;
  for (const auto& [schema, c] : stats) {
    if (c.count > 0) out[c.name] += c.count;
  }
  return out;
}

void resetFallbackStats() {
  std::lock_guard<std::mutex> lock(stats_mutex);
  for (auto& [schema, c] : stats) c.count = 0;
}

}  // namespace at::axon
