// Element types the kernels read and write, and their scalar conversions.
// Kernels compute in float32 whatever the storage type.
#pragma once

#include <cstddef>
#include <cstdint>

namespace axon::kernels {

enum class DType : int { kFloat32 = 0, kBFloat16 = 1, kFloat16 = 2 };

// Bytes per element: 4, 2, 2.
size_t dtype_size(DType dt);

// bfloat16: the top 16 bits of a float32; float -> bf16 rounds to nearest even,
// NaN stays a (quiet) NaN.
float bf16_to_float(uint16_t bits);
uint16_t float_to_bf16(float value);

// IEEE 754 binary16; float -> f16 rounds to nearest even, overflows to inf,
// keeps subnormals, NaN stays a (quiet) NaN.
float f16_to_float(uint16_t bits);
uint16_t float_to_f16(float value);

// Converts n elements of type dt to float32 (vectorised).
void convert_to_float(DType dt, const void* src, int64_t n, float* dst);
// Converts n float32 values to type dt (vectorised).
void convert_from_float(DType dt, const float* src, int64_t n, void* dst);

}  // namespace axon::kernels
