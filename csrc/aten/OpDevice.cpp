#include "OpDevice.h"

#include "Fallback.h"

namespace at::axon {

c10::DeviceIndex opDevice(const char* op, const at::Tensor& main,
                          std::initializer_list<const at::Tensor*> others) {
  TORCH_CHECK(main.device().type() == kAxon,
              "Expected all tensors to be on the same device, but found at least two devices, ",
              main.device(), " and axon! (when checking arguments for ", op, ")");
  const c10::DeviceIndex device = main.device().index();
  for (const at::Tensor* t : others) checkSameDevice(op, device, *t);
  return device;
}

void checkSameDevice(const char* op, c10::DeviceIndex device, const at::Tensor& t) {
  if (!t.defined()) return;
  if (device < 0) {
    // The op came here for an axon tensor in a list argument (indices) while
    // its tensor arguments are elsewhere: PyTorch's errors for that.
    const std::string name = op;
    const bool indexing = name.rfind("aten::index", 0) == 0 ||
                          name.rfind("aten::_index_put", 0) == 0 ||
                          name.rfind("aten::_unsafe_index", 0) == 0;
    TORCH_CHECK(!indexing, "indices should be either on cpu or on the same device as the "
                "indexed tensor (", t.device(), ")");
    TORCH_CHECK(false, "Expected all tensors to be on the same device, but found at least two "
                "devices, ", t.device(), " and axon! (when checking arguments for ", op, ")");
  }
  const c10::Device d = t.device();
  if (d.type() == kAxon && d.index() == device) return;
  if (d.is_cpu() && t.dim() == 0) return;
  TORCH_CHECK(false,
              "Expected all tensors to be on the same device, but found at "
              "least two devices, ", c10::Device(kAxon, device), " and ", d,
              "! (when checking arguments for ", op, ")");
}

namespace {

// Ops whose CUDA kernels accept CPU index tensors beside device tensors.
bool accepts_cpu_indices(const c10::FunctionSchema& schema) {
  const std::string& n = schema.operator_name().name;
  return n == "aten::index" || n == "aten::index_put_" ||
         n == "aten::_index_put_impl_" || n == "aten::index_put" ||
         n == "aten::_unsafe_index" || n == "aten::_unsafe_index_put";
}

// The scan behind opDevice(schema, stack).
class StackScan {
 public:
  explicit StackScan(const c10::FunctionSchema& schema)
      : schema_(schema), cpu_indices_ok_(accepts_cpu_indices(schema)) {}

  c10::DeviceIndex scan(const torch::jit::Stack& stack) {
    const size_t num_args = schema_.arguments().size();
    const size_t begin = stack.size() - num_args;
    for (size_t i = 0; i < num_args; ++i) {
      const c10::AliasInfo* alias = schema_.arguments()[i].alias_info();
      find_device(stack[begin + i], alias != nullptr && alias->isWrite());
    }
    // An axon generator given to an op on another device's tensors (the
    // generator alone sent the op here): PyTorch's error for it.
    TORCH_CHECK(device_ >= 0 || !axon_generator_, "Expected a '",
                c10::DeviceTypeName(foreign_.has_value() ? foreign_->type() : c10::kCPU,
                                    /*lower_case=*/true),
                "' device type for generator but found 'axon'");
    TORCH_CHECK(device_ >= 0, "axon: ", op_name(schema_),
                " received no axon tensor or device");
    return device_;
  }

 private:
  void note_device(const at::Tensor& t, bool index_arg, bool written) {
    if (!t.defined()) return;
    if (t.device().type() == kAxon) {
      if (device_ < 0) {
        device_ = t.device().index();
      } else if (t.device().index() != device_) {
        mixed_devices(c10::Device(kAxon, device_), t.device());
      }
      return;
    }
    // CPU scalars (0-dim) mix with device tensors in PyTorch, as do CPU
    // index tensors for indexing ops, but only as inputs: a tensor the op
    // writes (out=, in-place self) must be on the op's device, 0-dim or not,
    // or the CPU kernel would write CPU memory (as on CUDA, where
    // TensorIterator exempts CPU scalars among the inputs only).
    if (t.is_cpu() && !written && (t.dim() == 0 || index_arg)) return;
    foreign_ = t.device();
  }

  [[noreturn]] void mixed_devices(c10::Device a, c10::Device b) {
    TORCH_CHECK(false,
                "Expected all tensors to be on the same device, but found at "
                "least two devices, ", a, " and ", b, "! (when checking "
                "arguments for ", op_name(schema_), ")");
  }

  void find_device(const c10::IValue& v, bool written) {
    if (v.isTensor()) {
      note_device(v.toTensor(), false, written);
    } else if (v.isTensorList()) {
      for (const at::Tensor& t : v.toTensorList().vec()) {
        note_device(t, cpu_indices_ok_, written);
      }
    } else if (v.isList()) {
      for (const c10::IValue& e : v.toListRef()) {
        if (e.isTensor()) note_device(e.toTensor(), cpu_indices_ok_, written);
      }
    } else if (v.isGenerator()) {
      const at::Generator& g = v.toGenerator();
      axon_generator_ = axon_generator_ || (g.defined() && g.device().type() == kAxon);
    } else if (v.isDevice() && v.toDevice().type() == kAxon && device_ < 0) {
      device_ = resolve_index(v.toDevice());
      check_device(device_);
    }
    if (foreign_.has_value() && device_ >= 0) {
      mixed_devices(c10::Device(kAxon, device_), *foreign_);
    }
  }

  const c10::FunctionSchema& schema_;
  const bool cpu_indices_ok_;
  c10::DeviceIndex device_ = -1;
  std::optional<c10::Device> foreign_;
  bool axon_generator_ = false;
};

}  // namespace

c10::DeviceIndex opDevice(const c10::FunctionSchema& schema, const torch::jit::Stack& stack) {
  return StackScan(schema).scan(stack);
}

}  // namespace at::axon
