// The axon device an op runs on, found from its arguments, with PyTorch's
// "Expected all tensors to be on the same device" error for arguments on
// another device.  One spelling for every kernel path:
//   opDevice(op, main, {&others...}): unboxed kernels with a main tensor;
//   opDevice(schema, stack):          boxed kernels (the generic stream kernel,
//                                     the fallback);
//   checkSameDevice(op, device, args...): the variant for arguments checked
//                                     against a device found before;
//   firstAxonDevice(args...):         the first axon tensor's device (-1 if
//                                     none), for kernels with no main tensor;
//                                     then checkSameDevice.
#pragma once

#include <initializer_list>
#include <optional>
#include <type_traits>
#include <vector>

#include <ATen/Tensor.h>
#include <ATen/core/IListRef.h>
#include <ATen/core/List.h>
#include <ATen/core/function_schema.h>
#include <ATen/core/stack.h>
#include <c10/core/Device.h>

#include "../core/AxonRuntime.h"

namespace at::axon {

// The device of `main`, which must be an axon tensor (PyTorch's error, naming
// `op`, if it is not); each of `others` (undefined ones skipped) must be on it
// too, CPU 0-dim tensors excepted (checkSameDevice).
c10::DeviceIndex opDevice(const char* op, const at::Tensor& main,
                          std::initializer_list<const at::Tensor*> others = {});

// The axon device an op's arguments (the top of the stack) live on: the first
// axon tensor's (tensors, tensor lists, optional-tensor lists) or axon Device
// argument's.  Raises PyTorch's mixed-device error for tensors on other
// devices, except CPU scalars (0-dim) and, for indexing ops, CPU index
// tensors, among the inputs: arguments the op writes (out=, in-place) must be
// on the op's device.
c10::DeviceIndex opDevice(const c10::FunctionSchema& schema, const torch::jit::Stack& stack);

namespace op_device_detail {
// Tensor-holding argument types the walkers below have no branch for (every
// list convertible to ITensorListRef or ArrayRef<optional<Tensor>> has one):
// refused at compile time rather than skipped.  IOptTensorListRef is an index
// list in the ops that take it; a kernel passing one must decide how.
template <typename T>
inline constexpr bool holdsTensors =
    std::is_same_v<T, at::TensorBase> || std::is_same_v<T, at::IOptTensorListRef>;
}  // namespace op_device_detail

// Raises PyTorch's error unless t is on axon:`device` (CPU 0-dim tensors
// excepted, as everywhere in PyTorch), or "expected an axon tensor among the
// arguments" when no device was found (device < 0).  Undefined tensors pass;
// non-tensor arguments are ignored, so that a kernel can pass all of its
// arguments.
void checkSameDevice(const char* op, c10::DeviceIndex device, const at::Tensor& t);
inline void checkSameDevice(const char* op, c10::DeviceIndex device,
                            const std::optional<at::Tensor>& t) {
  if (t.has_value()) checkSameDevice(op, device, *t);
}
inline void checkSameDevice(const char* op, c10::DeviceIndex device,
                            const at::ITensorListRef& list) {
  for (const at::Tensor& t : list) checkSameDevice(op, device, t);
}
// Index lists (aten::index, index_put_): CPU index tensors are allowed on an
// axon tensor, and an axon index on a CPU tensor gets PyTorch's "indices
// should be either on cpu or on the same device" from the op's meta function;
// neither walker takes them.
inline void checkSameDevice(const char*, c10::DeviceIndex,
                            const c10::List<std::optional<at::Tensor>>&) {}
// Everything else: tensor lists in any spelling (TensorList, std::vector,
// c10::List) are checked element by element; non-tensor arguments are
// ignored; the types of holdsTensors do not compile.
template <typename T>
void checkSameDevice(const char* op, c10::DeviceIndex device, const T& v) {
  if constexpr (std::is_convertible_v<const T&, at::ITensorListRef>) {
    checkSameDevice(op, device, at::ITensorListRef(v));
  } else if constexpr (std::is_convertible_v<const T&, at::ArrayRef<std::optional<at::Tensor>>>) {
    for (const std::optional<at::Tensor>& t : at::ArrayRef<std::optional<at::Tensor>>(v)) {
      checkSameDevice(op, device, t);
    }
  } else {
    static_assert(!op_device_detail::holdsTensors<T>,
                  "checkSameDevice: unhandled tensor-holding argument type");
  }
}

// The device of the first axon tensor among the arguments (-1 if none), for
// kernels whose arguments have no main tensor; check them with
// checkSameDevice.
namespace op_device_detail {
inline void first(c10::DeviceIndex& d, const at::Tensor& t) {
  if (d < 0 && t.defined() && t.device().type() == kAxon) {
    d = t.device().index();
  }
}
inline void first(c10::DeviceIndex& d, const std::optional<at::Tensor>& t) {
  if (t.has_value()) first(d, *t);
}
inline void first(c10::DeviceIndex& d, const at::ITensorListRef& list) {
  for (const at::Tensor& t : list) first(d, t);
}
inline void first(c10::DeviceIndex&, const c10::List<std::optional<at::Tensor>>&) {}
template <typename T>
void first(c10::DeviceIndex& d, const T& v) {
  if constexpr (std::is_convertible_v<const T&, at::ITensorListRef>) {
    first(d, at::ITensorListRef(v));
  } else if constexpr (std::is_convertible_v<const T&, at::ArrayRef<std::optional<at::Tensor>>>) {
    for (const std::optional<at::Tensor>& t : at::ArrayRef<std::optional<at::Tensor>>(v)) first(d, t);
  } else {
    static_assert(!holdsTensors<T>, "firstAxonDevice: unhandled tensor-holding argument type");
  }
}
}  // namespace op_device_detail

template <typename... A>
c10::DeviceIndex firstAxonDevice(const A&... args) {
  c10::DeviceIndex d = -1;
  (op_device_detail::first(d, args), ...);
  return d;
}

}  // namespace at::axon
