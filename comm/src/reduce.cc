// Element-wise reductions over the ranks' buffers (vectorised by the compiler:
// -O3 on plain loops over blocks).  bfloat16/float16 are widened to float32
// block by block, so a sum of n half-precision inputs rounds once.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "axon/comm.h"
#include "axon/kernels/dtype.h"

namespace axon::comm {

size_t dtype_size(DType dt) {
  switch (dt) {
    case DType::kFloat64: case DType::kInt64: return 8;
    case DType::kFloat32: case DType::kInt32: return 4;
    case DType::kFloat16: case DType::kBFloat16: case DType::kInt16: return 2;
    case DType::kInt8: case DType::kUInt8: case DType::kBool: return 1;
  }
  return 1;
}

const char* dtype_name(DType dt) {
  switch (dt) {
    case DType::kFloat32: return "float32";
    case DType::kFloat64: return "float64";
    case DType::kFloat16: return "float16";
    case DType::kBFloat16: return "bfloat16";
    case DType::kInt8: return "int8";
    case DType::kUInt8: return "uint8";
    case DType::kInt16: return "int16";
    case DType::kInt32: return "int32";
    case DType::kInt64: return "int64";
    case DType::kBool: return "bool";
  }
  return "?";
}

const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return "SUM";
    case ReduceOp::kAvg: return "AVG";
    case ReduceOp::kProduct: return "PRODUCT";
    case ReduceOp::kMin: return "MIN";
    case ReduceOp::kMax: return "MAX";
    case ReduceOp::kBand: return "BAND";
    case ReduceOp::kBor: return "BOR";
    case ReduceOp::kBxor: return "BXOR";
    case ReduceOp::kPremulSum: return "PREMUL_SUM";
  }
  return "?";
}

static bool is_float(DType dt) {
  return dt == DType::kFloat32 || dt == DType::kFloat64 || dt == DType::kFloat16 ||
         dt == DType::kBFloat16;
}

void check_reduce(DType dt, ReduceOp op) {
  bool bitwise = op == ReduceOp::kBand || op == ReduceOp::kBor || op == ReduceOp::kBxor;
  if ((bitwise && is_float(dt)) || ((op == ReduceOp::kAvg || op == ReduceOp::kPremulSum) && !is_float(dt))) {
    throw CommError(std::string("axon process group: ReduceOp.") + reduce_op_name(op) +
                    " is not supported for " + dtype_name(dt) + " tensors");
  }
}

// Entry points compiled for AVX-512, AVX2 and the baseline (the loader picks
// one), as kernels/src/simd.h does; what they call in their loops is inlined.
// ThreadSanitizer builds use the baseline only (it instruments the resolvers).
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && \
    !defined(__SANITIZE_THREAD__)
#define AXON_COMM_SIMD __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define AXON_COMM_SIMD
#endif
#define AXON_COMM_INLINE [[gnu::always_inline]] inline

namespace {

template <typename T, typename Acc>
AXON_COMM_INLINE void combine(ReduceOp op, Acc* acc, const T* src, size_t n) {
  switch (op) {
    case ReduceOp::kSum: case ReduceOp::kAvg: case ReduceOp::kPremulSum:
      for (size_t i = 0; i < n; ++i) acc[i] += static_cast<Acc>(src[i]);
      break;
    case ReduceOp::kProduct:
      for (size_t i = 0; i < n; ++i) acc[i] *= static_cast<Acc>(src[i]);
      break;
    case ReduceOp::kMin:
      for (size_t i = 0; i < n; ++i) {
        Acc v = static_cast<Acc>(src[i]);
        // NaN propagates, as in torch.minimum.
        acc[i] = (v < acc[i] || v != v) ? v : acc[i];
      }
      break;
    case ReduceOp::kMax:
      for (size_t i = 0; i < n; ++i) {
        Acc v = static_cast<Acc>(src[i]);
        acc[i] = (v > acc[i] || v != v) ? v : acc[i];
      }
      break;
    default:
      if constexpr (std::is_integral_v<Acc>) {
        if (op == ReduceOp::kBand) for (size_t i = 0; i < n; ++i) acc[i] &= static_cast<Acc>(src[i]);
        if (op == ReduceOp::kBor) for (size_t i = 0; i < n; ++i) acc[i] |= static_cast<Acc>(src[i]);
        if (op == ReduceOp::kBxor) for (size_t i = 0; i < n; ++i) acc[i] ^= static_cast<Acc>(src[i]);
      }
      break;
  }
}

// Same-type reduction (float32/float64/integers): in blocks, so the
// accumulator stays in L1 and out may alias an input.
template <typename T>
AXON_COMM_INLINE void reduce_typed(ReduceOp op, T* out, const void* const* srcs, int nsrc,
                                   size_t count, double factor) {
  constexpr size_t kBlock = 2048;
  alignas(64) T acc[kBlock];
  for (size_t off = 0; off < count; off += kBlock) {
    size_t n = std::min(kBlock, count - off);
    std::memcpy(acc, static_cast<const T*>(srcs[0]) + off, n * sizeof(T));
    for (int s = 1; s < nsrc; ++s) combine<T, T>(op, acc, static_cast<const T*>(srcs[s]) + off, n);
    if constexpr (std::is_floating_point_v<T>) {
      if (op == ReduceOp::kAvg) {
        for (size_t i = 0; i < n; ++i) acc[i] /= static_cast<T>(nsrc);
      } else if (op == ReduceOp::kPremulSum) {
        for (size_t i = 0; i < n; ++i) acc[i] *= static_cast<T>(factor);
      }
    }
    std::memcpy(out + off, acc, n * sizeof(T));
  }
}

void reduce_bool(ReduceOp op, uint8_t* out, const void* const* srcs, int nsrc, size_t count) {
  // Sum/max/bor of bools is "any", product/min/band is "all", bxor is parity.
  for (size_t i = 0; i < count; ++i) {
    unsigned v = static_cast<const uint8_t*>(srcs[0])[i] != 0;
    for (int s = 1; s < nsrc; ++s) {
      unsigned w = static_cast<const uint8_t*>(srcs[s])[i] != 0;
      switch (op) {
        case ReduceOp::kProduct: case ReduceOp::kMin: case ReduceOp::kBand: v &= w; break;
        case ReduceOp::kBxor: v ^= w; break;
        default: v |= w; break;
      }
    }
    out[i] = static_cast<uint8_t>(v);
  }
}

AXON_COMM_INLINE float bf16_bits_to_float(uint16_t b) {
  uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

AXON_COMM_INLINE uint16_t float_to_bf16_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  // Round to nearest even; NaN stays a (quiet) NaN.
  uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  return static_cast<uint16_t>((u & 0x7fffffffu) > 0x7f800000u ? ((u >> 16) | 0x40u) : rounded);
}

// bfloat16 sums (SUM/AVG/PREMUL_SUM, the gradient reductions): one pass per
// source over a block, the widening being a shift.
AXON_COMM_SIMD void reduce_bf16_sum(ReduceOp op, uint16_t* out, const void* const* srcs,
                                    int nsrc, size_t count, double factor) {
  constexpr size_t kBlock = 2048;
  alignas(64) float acc[kBlock];
  const float scale = op == ReduceOp::kAvg ? 1.0f / static_cast<float>(nsrc)
                      : op == ReduceOp::kPremulSum ? static_cast<float>(factor) : 1.0f;
  for (size_t off = 0; off < count; off += kBlock) {
    const size_t n = std::min(kBlock, count - off);
    const uint16_t* s0 = static_cast<const uint16_t*>(srcs[0]) + off;
    for (size_t i = 0; i < n; ++i) acc[i] = bf16_bits_to_float(s0[i]);
    for (int s = 1; s < nsrc; ++s) {
      const uint16_t* sp = static_cast<const uint16_t*>(srcs[s]) + off;
      for (size_t i = 0; i < n; ++i) acc[i] += bf16_bits_to_float(sp[i]);
    }
    if (op == ReduceOp::kAvg) {
      for (size_t i = 0; i < n; ++i) acc[i] /= static_cast<float>(nsrc);
    } else if (op == ReduceOp::kPremulSum) {
      for (size_t i = 0; i < n; ++i) acc[i] *= scale;
    }
    uint16_t* o = out + off;
    for (size_t i = 0; i < n; ++i) o[i] = float_to_bf16_bits(acc[i]);
  }
}

AXON_COMM_SIMD void reduce_f32(ReduceOp op, float* out, const void* const* srcs, int nsrc,
                               size_t count, double factor) {
  reduce_typed(op, out, srcs, nsrc, count, factor);
}

void reduce_half(DType dt, ReduceOp op, void* out, const void* const* srcs, int nsrc,
                 size_t count, double factor) {
  // Measured on the 2-core machine (axoncomm_bench, 256 MiB, shared buffers):
  // the fused loop wins for 2 sources (12 vs 9.3 GB/s bus bandwidth), the
  // kernels' block conversions for 4 (7.4 vs 6 GB/s).
  if (dt == DType::kBFloat16 && nsrc <= 2 &&
      (op == ReduceOp::kSum || op == ReduceOp::kAvg || op == ReduceOp::kPremulSum)) {
    return reduce_bf16_sum(op, static_cast<uint16_t*>(out), srcs, nsrc, count, factor);
  }
  namespace k = axon::kernels;
  k::DType kdt = dt == DType::kBFloat16 ? k::DType::kBFloat16 : k::DType::kFloat16;
  constexpr size_t kBlock = 2048;
  alignas(64) float acc[kBlock];
  alignas(64) float tmp[kBlock];
  for (size_t off = 0; off < count; off += kBlock) {
    size_t n = std::min(kBlock, count - off);
    k::convert_to_float(kdt, static_cast<const uint16_t*>(srcs[0]) + off, n, acc);
    for (int s = 1; s < nsrc; ++s) {
      k::convert_to_float(kdt, static_cast<const uint16_t*>(srcs[s]) + off, n, tmp);
      combine<float, float>(op, acc, tmp, n);
    }
    if (op == ReduceOp::kAvg) {
      for (size_t i = 0; i < n; ++i) acc[i] /= static_cast<float>(nsrc);
    } else if (op == ReduceOp::kPremulSum) {
      for (size_t i = 0; i < n; ++i) acc[i] *= static_cast<float>(factor);
    }
    k::convert_from_float(kdt, acc, n, static_cast<uint16_t*>(out) + off);
  }
}

}  // namespace

void reduce(DType dt, ReduceOp op, void* out, const void* const* srcs, int nsrc, size_t count,
            double factor) {
  check_reduce(dt, op);
  switch (dt) {
    case DType::kFloat32: return reduce_f32(op, static_cast<float*>(out), srcs, nsrc, count, factor);
    case DType::kFloat64: return reduce_typed(op, static_cast<double*>(out), srcs, nsrc, count, factor);
    case DType::kInt8: return reduce_typed(op, static_cast<int8_t*>(out), srcs, nsrc, count, factor);
    case DType::kUInt8: return reduce_typed(op, static_cast<uint8_t*>(out), srcs, nsrc, count, factor);
    case DType::kInt16: return reduce_typed(op, static_cast<int16_t*>(out), srcs, nsrc, count, factor);
    case DType::kInt32: return reduce_typed(op, static_cast<int32_t*>(out), srcs, nsrc, count, factor);
    case DType::kInt64: return reduce_typed(op, static_cast<int64_t*>(out), srcs, nsrc, count, factor);
    case DType::kBool: return reduce_bool(op, static_cast<uint8_t*>(out), srcs, nsrc, count);
    case DType::kFloat16: case DType::kBFloat16:
      return reduce_half(dt, op, out, srcs, nsrc, count, factor);
  }
}

}  // namespace axon::comm
