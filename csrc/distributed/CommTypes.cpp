// Tensor <-> axon::comm conversions (see CommTypes.h).
#include "CommTypes.h"

#include <algorithm>

#include <ATen/ops/from_blob.h>
#include <c10/util/Exception.h>

#include "../core/AxonRuntime.h"

namespace at::axon {

namespace comm = ::axon::comm;

void throwDistError(const std::string& message) {
  C10_THROW_ERROR(DistBackendError, message);
}

comm::DType toCommDType(at::ScalarType type, const char* op) {
  switch (type) {
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
      TORCH_CHECK_TYPE(false, "ProcessGroupAxon: ", op, " does not support tensors of dtype ",
                       type);
  }
}

Reduction toCommReduction(const c10d::ReduceOp& reduce_op, const at::Tensor& t, const char* op) {
  using R = c10d::ReduceOp;
  Reduction r;
  switch (reduce_op.op_) {
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
      auto* s = dynamic_cast<c10d::PreMulSumSupplement*>(reduce_op.supplement_.get());
      TORCH_CHECK(s != nullptr, "ProcessGroupAxon: PREMUL_SUM without a factor");
      r.factor = s->tensor_factor.defined() ? s->tensor_factor.to(at::kCPU).item<double>()
                                            : s->double_factor;
      break;
    }
    default:
      TORCH_CHECK(false, "ProcessGroupAxon: ", op, " does not support this ReduceOp");
  }
  if (t.is_complex()) {
    TORCH_CHECK(r.op == comm::ReduceOp::kSum || r.op == comm::ReduceOp::kAvg ||
                    r.op == comm::ReduceOp::kPremulSum,
                "ProcessGroupAxon: ", op, " of complex tensors supports only SUM and AVG");
  }
  try {
    comm::check_reduce(toCommDType(t.scalar_type(), op), r.op);
  } catch (const comm::CommError& e) {
    TORCH_CHECK(false, e.what());
  }
  return r;
}

size_t commCount(const at::Tensor& t) {
  return static_cast<size_t>(t.numel()) * (t.is_complex() ? 2 : 1);
}

size_t byteCount(const at::Tensor& t) { return t.numel() * t.element_size(); }

char* dataPtr(const at::Tensor& t) { return static_cast<char*>(t.data_ptr()); }

int dtypeTag(const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kFloat: case at::kDouble: case at::kHalf: case at::kBFloat16: case at::kChar:
    case at::kByte: case at::kShort: case at::kInt: case at::kLong: case at::kBool:
    case at::kComplexFloat: case at::kComplexDouble:
      return static_cast<int>(toCommDType(t.scalar_type(), "signature"));
    default:
      return -1;
  }
}

int layoutTag(const at::Tensor& t) {
  if (!t.defined() || t.is_contiguous()) return t.defined() ? 0 : -1;
  if (t.dim() == 4 && t.is_contiguous(at::MemoryFormat::ChannelsLast)) {
    const int order[] = {0, 2, 3, 1};
    return comm::ShmGroup::layout_tag(order, 4);
  }
  if (t.dim() == 5 && t.is_contiguous(at::MemoryFormat::ChannelsLast3d)) {
    const int order[] = {0, 2, 3, 4, 1};
    return comm::ShmGroup::layout_tag(order, 5);
  }
  // Otherwise the order of the dimensions of more than one element by
  // stride, outermost first (size-1 dimensions place no element).
  std::vector<int> order;
  for (int d = 0; d < static_cast<int>(t.dim()); ++d) {
    if (t.size(d) > 1) order.push_back(d);
  }
  std::stable_sort(order.begin(), order.end(),
                   [&](int a, int b) { return t.stride(a) > t.stride(b); });
  // Renumbered among those dimensions (layout_tag takes a permutation).
  std::vector<int> rank(order.size());
  for (size_t i = 0; i < order.size(); ++i) {
    rank[i] = static_cast<int>(std::count_if(order.begin(), order.end(),
                                             [&](int d) { return d < order[i]; }));
  }
  return comm::ShmGroup::layout_tag(rank.data(), static_cast<int>(rank.size()));
}

std::optional<comm::SharedBuffer> sharedBuffer(const at::Tensor& t) {
  ::axon::rt::MemoryExport ex;
  if (t.numel() == 0 || !::axon::rt::memory_export(t.data_ptr(), &ex)) return std::nullopt;
  return comm::SharedBuffer{ex.fd, ex.id, ex.size, ex.offset};
}

at::Tensor cpuView(const at::Tensor& t) {
  return at::from_blob(t.data_ptr(), t.sizes(), t.strides(),
                       at::TensorOptions().dtype(t.dtype()).device(at::kCPU));
}

std::vector<at::Tensor> cpuViews(const std::vector<at::Tensor>& ts) {
  std::vector<at::Tensor> out;
  for (const auto& t : ts) out.push_back(cpuView(t));
  return out;
}

}  // namespace at::axon
