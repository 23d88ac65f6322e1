// What ProcessGroupAxon hands to axon::comm: dtypes and reductions in comm's
// terms, element and byte counts, raw pointers, shareable buffers, and CPU
// views of device tensors (device memory is host-addressable).
#pragma once

#include <cstddef>
#include <optional>
#include <vector>

#include <ATen/core/Tensor.h>
#include <torch/csrc/distributed/c10d/Types.hpp>

#include <axon/comm.h>

namespace at::axon {

// Raises c10::DistBackendError (torch.distributed.DistBackendError).
[[noreturn]] void throwDistError(const std::string& message);

// The transport's element type of a tensor dtype (complex: its component
// type); raises a TypeError naming `op` for dtypes comm cannot move.
::axon::comm::DType toCommDType(at::ScalarType type, const char* op);

// A c10d reduction in comm's terms: the op and PREMUL_SUM's factor.
struct Reduction {
  ::axon::comm::ReduceOp op;
  double factor = 1.0;
};

// Raises an error naming `op` for reductions not defined for the tensor's
// dtype (AVG of integers, bitwise ops of floats; complex tensors take SUM,
// AVG and PREMUL_SUM only).
Reduction toCommReduction(const c10d::ReduceOp& reduce_op, const at::Tensor& t, const char* op);

// Elements as the transport counts them (complex: two reals).
size_t commCount(const at::Tensor& t);
size_t byteCount(const at::Tensor& t);
char* dataPtr(const at::Tensor& t);

// The dtype a call carries in its signature, which the ranks compare (see
// axon/comm.h): a comm::DType, or -1 for types comm does not name.  Complex
// types are named by their components (the element count tells them apart).
int dtypeTag(const at::Tensor& t);
// t's memory layout for the signature ranks compare (ShmGroup::set_layout_tag;
// -1 for an undefined tensor).
int layoutTag(const at::Tensor& t);

// The tensor's memory as the peers can map it (its allocation's export), or
// none (empty tensors, memory that is not shareable).
std::optional<::axon::comm::SharedBuffer> sharedBuffer(const at::Tensor& t);

// A CPU tensor over the same bytes as `t` (for gloo between hosts).
at::Tensor cpuView(const at::Tensor& t);
std::vector<at::Tensor> cpuViews(const std::vector<at::Tensor>& ts);

}  // namespace at::axon
