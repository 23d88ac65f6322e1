/* The Axon Kernel Interface: write device kernels for torch-axon.
 *
 * A kernel is a function in a shared library built by torch_axon.kernel.load() (or any
 * compiler with -I$(python -c "import torch_axon.kernel as k; print(k.include_path())")).
 * It receives the launch's tensors (views of device memory, which is host-addressable),
 * integer and float arguments, and a context with the device's parallel_for, per-launch
 * scratch memory and an error channel. It runs as stream work on the current stream of the
 * tensors' device, ordered with every other kernel.
 *
 * A kernel may also be a native op (torch_axon.kernel: lib.op(schema, kernel, shape)): an
 * AXON_SHAPE function gives its outputs' dtypes and sizes, checked on the host at each call
 * and used as the op's meta kernel; the dispatcher then calls it with no Python in between.
 *
 * Two layers, one header:
 *   - a C ABI (below; stable, versioned by AXON_KERNEL_ABI_VERSION), usable from C;
 *   - a header-only C++17 layer, namespace axon::kernel: View<T>, bf16/f16, Vec (SIMD float
 *     vector on the ISA the compiler targets: AVX-512F, AVX2+FMA or a portable fallback),
 *     parallel_for, scratch, AXON_KERNEL and AXON_CHECK.
 *
 *   #include <axon/kernel.h>
 *   using namespace axon::kernel;
 *   AXON_KERNEL(scale) {                    // scale(x, out, floats=(alpha,))
 *     AXON_CHECK(ctx, args->num_tensors == 2 && args->num_floats == 1, "scale(x, out, alpha)");
 *     View<float> x = as<float>(args->tensors[0]), out = as<float>(args->tensors[1]);
 *     AXON_CHECK(ctx, x.is_contiguous() && out.is_contiguous(), "contiguous inputs only");
 *     const Vec a = Vec::broadcast(float(args->floats[0]));
 *     parallel_for(ctx, 0, x.numel(), 4096, [&](int64_t b, int64_t e) {
 *       int64_t i = b;
 *       for (; i + Vec::kLanes <= e; i += Vec::kLanes) (Vec::load(x.data() + i) * a).store(out.data() + i);
 *       if (i < e) (Vec::load_partial(x.data() + i, e - i) * a).store_partial(out.data() + i, e - i);
 *     });
 *   }
 */
#ifndef AXON_KERNEL_H
#define AXON_KERNEL_H

#include <stddef.h>
#include <stdint.h>

/* ------------------------------------------------------------------------------------ */
/* The C ABI                                                                             */
/* ------------------------------------------------------------------------------------ */

#define AXON_KERNEL_ABI_VERSION 1
#define AXON_MAX_DIMS 8

#ifdef __cplusplus
extern "C" {
#endif

/* Element types (the numbering is part of the ABI). */
enum AxonDType {
  AXON_FLOAT32 = 0,
  AXON_BFLOAT16 = 1,
  AXON_FLOAT16 = 2,
  AXON_FLOAT64 = 3,
  AXON_INT64 = 4,
  AXON_INT32 = 5,
  AXON_INT16 = 6,
  AXON_INT8 = 7,
  AXON_UINT8 = 8,
  AXON_BOOL = 9,
  /* An optional tensor argument of a native op given None: data NULL, no elements
     (ndim 1, sizes[0] 0). */
  AXON_NONE = -1
};

/* A strided view of a device tensor. */
typedef struct AxonTensor {
  void* data;                     /* first element (storage data + offset), host-addressable */
  int32_t dtype;                  /* AxonDType */
  int32_t ndim;                   /* <= AXON_MAX_DIMS */
  int64_t sizes[AXON_MAX_DIMS];   /* entries >= ndim are unspecified */
  int64_t strides[AXON_MAX_DIMS]; /* in elements */
} AxonTensor;

typedef void (*AxonParallelBody)(void* ctx, int64_t begin, int64_t end);

typedef struct AxonKernelContext {
  int32_t abi_version; /* AXON_KERNEL_ABI_VERSION */
  int32_t device;      /* axon device index */
  int32_t num_threads; /* compute threads a parallel_for may use (>= 1) */
  int32_t reserved;
  void* impl; /* opaque, passed back to the functions below */
  /* Splits [begin, end) into chunks of >= grain iterations, runs body(ctx, b, e) on each,
     possibly concurrently on the device's compute threads; returns when all have run. */
  void (*parallel_for)(void* impl, int64_t begin, int64_t end, int64_t grain, void* ctx,
                       AxonParallelBody body);
  /* Scratch memory for this launch (64-byte aligned, freed after the kernel returns);
     NULL if it cannot be allocated (then call fail). Thread-safe. */
  void* (*scratch)(void* impl, size_t bytes);
  /* Records an error (the first one wins; thread-safe); the kernel should return soon
     after. It surfaces like any kernel's asynchronous error: RuntimeError
     "'<op name>' failed: <msg>" at the next synchronising call. */
  void (*fail)(void* impl, const char* msg);
} AxonKernelContext;

typedef struct AxonKernelArgs {
  const AxonTensor* tensors;
  int32_t num_tensors;
  const int64_t* ints;
  int32_t num_ints;
  const double* floats;
  int32_t num_floats;
} AxonKernelArgs;

/* Every kernel entry point. */
typedef void (*AxonKernelFn)(const AxonKernelContext* ctx, const AxonKernelArgs* args);

/* The output rule of a native op (torch_axon.kernel: lib.op(schema, kernel, shape=...)).
   Called on the host at every call of the op (and on meta or fake tensors, for
   torch.compile), before anything is allocated or launched, with the op's arguments as its
   kernel will get them, outputs left out; tensors have data NULL. It sets each output's
   dtype, ndim and sizes (outputs are allocated contiguous) and returns 0, or writes a
   message into err (err_len bytes, NUL-terminated: axon_shape_error) and returns non-zero:
   the call then raises RuntimeError with the message. */
typedef int (*AxonShapeFn)(const AxonKernelArgs* inputs, AxonTensor* outputs,
                           int32_t num_outputs, char* err, size_t err_len);

#ifdef __cplusplus
}
#endif

#if defined(__GNUC__)
#define AXON_KERNEL_EXPORT __attribute__((visibility("default"), used))
#define AXON_KERNEL_UNUSED __attribute__((unused))
#else
#define AXON_KERNEL_EXPORT
#define AXON_KERNEL_UNUSED
#endif

/* AXON_CHECK(ctx, cond, "message"): if cond is false, reports message through ctx->fail and
   returns from the enclosing (void) function (inside a lambda: from the lambda only). */
#define AXON_CHECK(ctx, cond, msg)        \
  do {                                    \
    if (!(cond)) {                        \
      (ctx)->fail((ctx)->impl, (msg));    \
      return;                             \
    }                                     \
  } while (0)

/* Copies msg into a shape function's err buffer (truncated, NUL-terminated). */
static inline void axon_shape_error(char* err, size_t err_len, const char* msg) {
  size_t i = 0;
  if (err == NULL || err_len == 0) return;
  for (; msg != NULL && msg[i] != 0 && i + 1 < err_len; ++i) err[i] = msg[i];
  err[i] = 0;
}

/* Inside AXON_SHAPE: if cond is false, the op raises RuntimeError(msg) at the call. */
#define AXON_SHAPE_CHECK(cond, msg)            \
  do {                                         \
    if (!(cond)) {                             \
      axon_shape_error(err, err_len, (msg));   \
      return 1;                                \
    }                                          \
  } while (0)

#if !defined(__cplusplus) || defined(AXON_KERNEL_C_ABI_ONLY)
/* C: AXON_SHAPE(name) { body using args, outputs, num_outputs; return 0; }: a native op's
   output rule (AxonShapeFn). */
#ifdef __cplusplus
#define AXON_SHAPE_LINKAGE extern "C"
#else
#define AXON_SHAPE_LINKAGE
#endif
#define AXON_SHAPE(name)                                                                   \
  AXON_SHAPE_LINKAGE AXON_KERNEL_EXPORT int name(                                         \
      const AxonKernelArgs* args AXON_KERNEL_UNUSED, AxonTensor* outputs AXON_KERNEL_UNUSED, \
      int32_t num_outputs AXON_KERNEL_UNUSED, char* err AXON_KERNEL_UNUSED,               \
      size_t err_len AXON_KERNEL_UNUSED)
/* C: AXON_KERNEL(name) { body using ctx and args } */
#define AXON_KERNEL(name)                                                         \
  AXON_KERNEL_EXPORT void name(const AxonKernelContext* ctx AXON_KERNEL_UNUSED, \
                               const AxonKernelArgs* args AXON_KERNEL_UNUSED)
#endif

/* ------------------------------------------------------------------------------------ */
/* The C++ layer (AXON_KERNEL_C_ABI_ONLY: left out)                                       */
/* ------------------------------------------------------------------------------------ */
#if defined(__cplusplus) && !defined(AXON_KERNEL_C_ABI_ONLY)

#include <cmath>
#include <cstring>
#include <exception>
#include <limits>

#if defined(__x86_64__) || defined(__i386__)
/* GCC 12's AVX-512 intrinsics (_mm512_undefined_ps) trip -W(maybe-)uninitialized when inlined
   (GCC PR105593); the warning is attributed to these lines. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
#endif

/* AXON_KERNEL(name) { body using ctx and args }: an extern "C" entry point. A C++ exception
   escaping the body becomes ctx->fail(what()). */
#if defined(__cpp_exceptions) || defined(__EXCEPTIONS)
#define AXON_KERNEL(name)                                                                    \
  static void axon_kernel_body_##name(const AxonKernelContext*, const AxonKernelArgs*);      \
  extern "C" AXON_KERNEL_EXPORT void name(const AxonKernelContext* ctx,                      \
                                          const AxonKernelArgs* args) {                      \
    try {                                                                                    \
      axon_kernel_body_##name(ctx, args);                                                    \
    } catch (const std::exception& e) {                                                      \
      ctx->fail(ctx->impl, e.what());                                                        \
    } catch (...) {                                                                          \
      ctx->fail(ctx->impl, "unknown C++ exception");                                         \
    }                                                                                        \
  }                                                                                          \
  static void axon_kernel_body_##name(const AxonKernelContext* ctx AXON_KERNEL_UNUSED,      \
                                      const AxonKernelArgs* args AXON_KERNEL_UNUSED)
#else
#define AXON_KERNEL(name)                                                                    \
  extern "C" AXON_KERNEL_EXPORT void name(const AxonKernelContext* ctx AXON_KERNEL_UNUSED,  \
                                          const AxonKernelArgs* args AXON_KERNEL_UNUSED)
#endif

/* AXON_SHAPE(name) { body using args, outputs, num_outputs; return 0; }: an extern "C"
   output rule of a native op (AxonShapeFn). A C++ exception escaping the body becomes the
   call's error. */
#if defined(__cpp_exceptions) || defined(__EXCEPTIONS)
#define AXON_SHAPE(name)                                                                     \
  static int axon_shape_body_##name(const AxonKernelArgs*, AxonTensor*, int32_t, char*,      \
                                    size_t);                                                 \
  extern "C" AXON_KERNEL_EXPORT int name(const AxonKernelArgs* args, AxonTensor* outputs,    \
                                         int32_t num_outputs, char* err, size_t err_len) {   \
    try {                                                                                    \
      return axon_shape_body_##name(args, outputs, num_outputs, err, err_len);               \
    } catch (const std::exception& e) {                                                      \
      axon_shape_error(err, err_len, e.what());                                              \
    } catch (...) {                                                                          \
      axon_shape_error(err, err_len, "unknown C++ exception");                               \
    }                                                                                        \
    return 1;                                                                                \
  }                                                                                          \
  static int axon_shape_body_##name(                                                         \
      const AxonKernelArgs* args AXON_KERNEL_UNUSED, AxonTensor* outputs AXON_KERNEL_UNUSED, \
      int32_t num_outputs AXON_KERNEL_UNUSED, char* err AXON_KERNEL_UNUSED,                 \
      size_t err_len AXON_KERNEL_UNUSED)
#else
#define AXON_SHAPE(name)                                                                     \
  extern "C" AXON_KERNEL_EXPORT int name(                                                    \
      const AxonKernelArgs* args AXON_KERNEL_UNUSED, AxonTensor* outputs AXON_KERNEL_UNUSED, \
      int32_t num_outputs AXON_KERNEL_UNUSED, char* err AXON_KERNEL_UNUSED,                 \
      size_t err_len AXON_KERNEL_UNUSED)
#endif

/* Which Vec implementation this translation unit gets (chosen by the compiler flags). */
#if defined(__AVX512F__)
#define AXON_KERNEL_ISA_AVX512 1
#define AXON_KERNEL_ISA_NAME "avx512"
#elif defined(__AVX2__) && defined(__FMA__)
#define AXON_KERNEL_ISA_AVX2 1
#define AXON_KERNEL_ISA_NAME "avx2"
#else
#define AXON_KERNEL_ISA_SCALAR 1
#define AXON_KERNEL_ISA_NAME "scalar"
#endif

namespace axon {
namespace kernel {

// ---- 16-bit float storage types -------------------------------------------------------

namespace detail {
inline float bits_to_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
inline uint32_t float_to_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}
// float -> bfloat16 bits, round to nearest even; NaN -> quiet NaN (as c10::BFloat16).
inline uint16_t float_to_bf16_bits(float f) {
  const uint32_t u = float_to_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;
  return uint16_t((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
inline float bf16_bits_to_float(uint16_t h) { return bits_to_float(uint32_t(h) << 16); }
// IEEE binary16 <-> float, round to nearest even, overflow to inf, subnormals kept.
inline float f16_bits_to_float(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
  uint32_t u;
  if (exp == 0x1fu) {
    u = sign | 0x7f800000u | (mant << 13);
  } else if (exp == 0) {
    // subnormal (or zero): mant * 2^-24, exact in float
    const float f = float(mant) * 5.9604644775390625e-08f;
    u = sign | float_to_bits(f);
  } else {
    u = sign | ((exp + 112u) << 23) | (mant << 13);
  }
  return bits_to_float(u);
}
inline uint16_t float_to_f16_bits(float f) {
  uint32_t u = float_to_bits(f);
  const uint32_t sign = u & 0x80000000u;
  u ^= sign;
  uint32_t o;
  if (u >= 0x47800000u) {  // >= 65536, inf or NaN
    o = u > 0x7f800000u ? 0x7e00u : 0x7c00u;
  } else if (u < 0x38800000u) {  // result subnormal or zero: align by a float addition
    const float magic = 0.5f;
    o = float_to_bits(bits_to_float(u) + magic) - float_to_bits(magic);
  } else {  // normal: rebias, round to nearest even (a carry may reach inf: correct)
    o = (u + 0xc8000fffu + ((u >> 13) & 1u)) >> 13;
  }
  return uint16_t(o | (sign >> 16));
}
}  // namespace detail

// bfloat16 storage: float conversions round to nearest even.
struct bf16 {
  uint16_t bits;
  bf16() = default;
  bf16(float f) : bits(detail::float_to_bf16_bits(f)) {}
  operator float() const { return detail::bf16_bits_to_float(bits); }
  static bf16 from_bits(uint16_t b) {
    bf16 r;
    r.bits = b;
    return r;
  }
};

// IEEE binary16 storage.
struct f16 {
  uint16_t bits;
  f16() = default;
  f16(float f) : bits(detail::float_to_f16_bits(f)) {}
  operator float() const { return detail::f16_bits_to_float(bits); }
  static f16 from_bits(uint16_t b) {
    f16 r;
    r.bits = b;
    return r;
  }
};

// ---- dtypes and views -----------------------------------------------------------------

// The AxonDType of a C++ element type: dtype_of<float>() == AXON_FLOAT32, ...
template <class T>
struct DTypeOf;
template <> struct DTypeOf<float> { static constexpr int32_t value = AXON_FLOAT32; };
template <> struct DTypeOf<bf16> { static constexpr int32_t value = AXON_BFLOAT16; };
template <> struct DTypeOf<f16> { static constexpr int32_t value = AXON_FLOAT16; };
template <> struct DTypeOf<double> { static constexpr int32_t value = AXON_FLOAT64; };
template <> struct DTypeOf<int64_t> { static constexpr int32_t value = AXON_INT64; };
template <> struct DTypeOf<int32_t> { static constexpr int32_t value = AXON_INT32; };
template <> struct DTypeOf<int16_t> { static constexpr int32_t value = AXON_INT16; };
template <> struct DTypeOf<int8_t> { static constexpr int32_t value = AXON_INT8; };
template <> struct DTypeOf<uint8_t> { static constexpr int32_t value = AXON_UINT8; };
template <> struct DTypeOf<bool> { static constexpr int32_t value = AXON_BOOL; };
template <class T>
constexpr int32_t dtype_of() {
  return DTypeOf<T>::value;
}
// Whether t holds elements of type T.
template <class T>
inline bool is(const AxonTensor& t) {
  return t.dtype == dtype_of<T>();
}
// Whether an optional tensor argument of a native op was given (not None).
inline bool given(const AxonTensor& t) { return t.dtype != AXON_NONE; }
// In a native op's output rule: out gets in's sizes and dtype (or `dtype`).
inline void set_like(AxonTensor& out, const AxonTensor& in, int32_t dtype = AXON_NONE) {
  out.dtype = dtype == AXON_NONE ? in.dtype : dtype;
  out.ndim = in.ndim;
  for (int d = 0; d < AXON_MAX_DIMS; ++d) out.sizes[d] = in.sizes[d];
}

// A typed view of an AxonTensor (valid while the kernel runs). Indices are not
// bounds-checked; negative dims count from the end.
template <class T>
class View {
 public:
  View() = default;
  explicit View(const AxonTensor& t) : t_(&t) {}

  T* data() const { return static_cast<T*>(t_->data); }
  int ndim() const { return t_->ndim; }
  int64_t size(int d) const { return t_->sizes[d < 0 ? d + t_->ndim : d]; }
  int64_t stride(int d) const { return t_->strides[d < 0 ? d + t_->ndim : d]; }
  int64_t numel() const {
    int64_t n = 1;
    for (int d = 0; d < t_->ndim; ++d) n *= t_->sizes[d];
    return n;
  }
  // Row-major contiguous (dims of size 1 may have any stride).
  bool is_contiguous() const {
    int64_t expected = 1;
    for (int d = t_->ndim - 1; d >= 0; --d) {
      if (t_->sizes[d] == 1) continue;
      if (t_->strides[d] != expected) return false;
      expected *= t_->sizes[d];
    }
    return true;
  }
  // Element (i0, i1, ...): one index per dim.
  template <class... I>
  T& operator()(I... idx) const {
    return *ptr(idx...);
  }
  // Pointer to element (i0, ..., ik): fewer indices than dims address the start of a
  // sub-tensor, e.g. ptr(r) is row r of a matrix.
  template <class... I>
  T* ptr(I... idx) const {
    int64_t off = 0;
    int d = 0;
    (void)d;
    ((off += int64_t(idx) * t_->strides[d++]), ...);
    return data() + off;
  }
  const AxonTensor& tensor() const { return *t_; }

 private:
  const AxonTensor* t_ = nullptr;
};

// View<T> of t. Does not check the dtype: check with AXON_CHECK(ctx, is<T>(t), ...).
template <class T>
inline View<T> as(const AxonTensor& t) {
  return View<T>(t);
}

// Calls f(T()) with T the float type of dtype (float, bf16 or f16) and returns true;
// returns false for other dtypes. Use with a generic lambda:
//   if (!dispatch_float(t.dtype, [&](auto tag) { using T = decltype(tag); ... }))
//     ctx->fail(ctx->impl, "unsupported dtype");
template <class F>
inline bool dispatch_float(int32_t dtype, F&& f) {
  switch (dtype) {
    case AXON_FLOAT32: f(float()); return true;
    case AXON_BFLOAT16: f(bf16()); return true;
    case AXON_FLOAT16: f(f16()); return true;
    default: return false;
  }
}

// ---- parallel_for and scratch ---------------------------------------------------------

namespace detail {
template <class F>
struct ParallelCall {
  const F* f;
  const AxonKernelContext* ctx;
  static void run(void* p, int64_t b, int64_t e) {
    const ParallelCall* c = static_cast<const ParallelCall*>(p);
#if defined(__cpp_exceptions) || defined(__EXCEPTIONS)
    try {
      (*c->f)(b, e);
    } catch (const std::exception& ex) {
      c->ctx->fail(c->ctx->impl, ex.what());
    } catch (...) {
      c->ctx->fail(c->ctx->impl, "unknown C++ exception");
    }
#else
    (*c->f)(b, e);
#endif
  }
};
}  // namespace detail

// f(chunk_begin, chunk_end) over [begin, end) in chunks of >= grain iterations, on the
// device's compute threads; returns when all chunks have run. Nothing if begin >= end.
template <class F>
inline void parallel_for(const AxonKernelContext* ctx, int64_t begin, int64_t end, int64_t grain,
                         const F& f) {
  if (begin >= end) return;
  detail::ParallelCall<F> call{&f, ctx};
  ctx->parallel_for(ctx->impl, begin, end, grain < 1 ? 1 : grain, &call,
                    &detail::ParallelCall<F>::run);
}

// n elements of T of scratch memory for this launch (64-byte aligned, freed after the
// kernel returns); nullptr if it cannot be allocated.
template <class T>
inline T* scratch(const AxonKernelContext* ctx, size_t n) {
  if (n > static_cast<size_t>(-1) / sizeof(T)) return nullptr;  // n * sizeof(T) overflows
  return static_cast<T*>(ctx->scratch(ctx->impl, n * sizeof(T)));
}

// ---- Vec: a SIMD vector of floats -----------------------------------------------------
//
// Vec::kLanes floats (16 with AVX-512F, 8 with AVX2+FMA, 4 otherwise). Loads and stores
// convert from/to float, bf16 (round to nearest even) and f16 (IEEE, round to nearest even).
// load_partial(p, n[, fill]) and store_partial(p, n) touch only the first n elements
// (0 <= n <= kLanes): for the tail of a row; load_partial sets the other lanes to fill
// (default 0; -INFINITY before a max). Precision: exp, tanh, erf, sigmoid a few ulp;
// sqrt, rsqrt, / correctly rounded (rsqrt = 1 / sqrt). Comparisons (max, min, select_lt)
// follow the x86 instructions: max(a, b) and min(a, b) return b when either is NaN.
// reduce_sum adds the lanes in a fixed tree order.

#if defined(AXON_KERNEL_ISA_AVX512)

struct Vec {
  static constexpr int kLanes = 16;
  __m512 v;
  Vec() = default;
  Vec(__m512 x) : v(x) {}
  static Vec broadcast(float x) { return _mm512_set1_ps(x); }
  static Vec zero() { return _mm512_setzero_ps(); }

  static Vec load(const float* p) { return _mm512_loadu_ps(p); }
  static Vec load(const bf16* p) { return from_bf16(load16(p)); }
  static Vec load(const f16* p) { return _mm512_cvtph_ps(load16(p)); }
  void store(float* p) const { _mm512_storeu_ps(p, v); }
  void store(bf16* p) const { store16(p, to_bf16()); }
  void store(f16* p) const { store16(p, to_f16()); }

  // The first n lanes (n clamped to [0, kLanes]).
  static __mmask16 mask(int64_t n) {
    return n >= 16 ? __mmask16(0xffff) : n <= 0 ? __mmask16(0) : __mmask16((1u << n) - 1u);
  }
  static Vec load_partial(const float* p, int64_t n, float fill = 0.0f) {
    if (n >= kLanes) return _mm512_loadu_ps(p);
    return _mm512_mask_loadu_ps(_mm512_set1_ps(fill), mask(n), p);
  }
  static Vec load_partial(const bf16* p, int64_t n, float fill = 0.0f) {
    return _mm512_mask_blend_ps(mask(n), _mm512_set1_ps(fill), from_bf16(load16_partial(p, n)).v);
  }
  static Vec load_partial(const f16* p, int64_t n, float fill = 0.0f) {
    return _mm512_mask_blend_ps(mask(n), _mm512_set1_ps(fill), _mm512_cvtph_ps(load16_partial(p, n)));
  }
  void store_partial(float* p, int64_t n) const {
    if (n >= kLanes) return _mm512_storeu_ps(p, v);  // see load16_partial
    _mm512_mask_storeu_ps(p, mask(n), v);
  }
  void store_partial(bf16* p, int64_t n) const { store16_partial(p, n, to_bf16()); }
  void store_partial(f16* p, int64_t n) const { store16_partial(p, n, to_f16()); }

  // 16-bit lanes <-> float.
  static Vec from_bf16(__m256i h) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
  __m256i to_bf16() const {  // round to nearest even, NaN -> quiet NaN
    const __m512i u = _mm512_castps_si512(v);
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    __m512i r = _mm512_srli_epi32(
        _mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), lsb), 16);
    const __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    r = _mm512_mask_blend_epi32(nan, r, _mm512_set1_epi32(0x7fc0));
    return _mm512_cvtepi32_epi16(r);
  }
  __m256i to_f16() const { return _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
  static __m256i load16(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }
  static void store16(void* p, __m256i h) { _mm256_storeu_si256(static_cast<__m256i*>(p), h); }
  // Masked loads and stores are slow on some CPUs (AMD Zen 4): full vectors go plain.
  static __m256i load16_partial(const void* p, int64_t n) {
    if (n >= kLanes) return load16(p);
#if defined(__AVX512BW__) && defined(__AVX512VL__)
    return _mm256_maskz_loadu_epi16(mask(n), p);
#else
    alignas(32) uint16_t tmp[kLanes] = {};
    std::memcpy(tmp, p, size_t(n < 0 ? 0 : n > kLanes ? kLanes : n) * 2);
    return _mm256_load_si256(reinterpret_cast<const __m256i*>(tmp));
#endif
  }
  static void store16_partial(void* p, int64_t n, __m256i h) {
    if (n >= kLanes) return store16(p, h);
#if defined(__AVX512BW__) && defined(__AVX512VL__)
    _mm256_mask_storeu_epi16(p, mask(n), h);
#else
    alignas(32) uint16_t tmp[kLanes];
    _mm256_store_si256(reinterpret_cast<__m256i*>(tmp), h);
    std::memcpy(p, tmp, size_t(n < 0 ? 0 : n > kLanes ? kLanes : n) * 2);
#endif
  }
};

inline Vec operator+(Vec a, Vec b) { return _mm512_add_ps(a.v, b.v); }
inline Vec operator-(Vec a, Vec b) { return _mm512_sub_ps(a.v, b.v); }
inline Vec operator*(Vec a, Vec b) { return _mm512_mul_ps(a.v, b.v); }
inline Vec operator/(Vec a, Vec b) { return _mm512_div_ps(a.v, b.v); }
inline Vec operator-(Vec a) {
  return _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(a.v), _mm512_set1_epi32(int(0x80000000u))));
}
inline Vec fma(Vec a, Vec b, Vec c) { return _mm512_fmadd_ps(a.v, b.v, c.v); }
inline Vec max(Vec a, Vec b) { return _mm512_max_ps(a.v, b.v); }
inline Vec min(Vec a, Vec b) { return _mm512_min_ps(a.v, b.v); }
inline Vec sqrt(Vec a) { return _mm512_sqrt_ps(a.v); }
inline Vec abs(Vec a) {
  return _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(a.v), _mm512_set1_epi32(0x7fffffff)));
}
inline Vec floor(Vec a) { return _mm512_roundscale_ps(a.v, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC); }
// a < b ? x : y per lane (false for NaN).
inline Vec select_lt(Vec a, Vec b, Vec x, Vec y) {
  return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(a.v, b.v, _CMP_LT_OQ), y.v, x.v);
}
// x with the sign of s.
inline Vec copysign(Vec x, Vec s) {
  const __m512i m = _mm512_set1_epi32(int(0x80000000u));
  return _mm512_castsi512_ps(_mm512_or_si512(_mm512_andnot_si512(m, _mm512_castps_si512(x.v)),
                                             _mm512_and_si512(m, _mm512_castps_si512(s.v))));
}
namespace detail {
inline Vec select_nan(Vec a, Vec x, Vec y) {  // isnan(a) ? x : y
  return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(a.v, a.v, _CMP_UNORD_Q), y.v, x.v);
}
inline Vec exp2i(Vec n) {  // 2^n, n integer-valued in [-126, 127]
  const __m512i k = _mm512_add_epi32(_mm512_cvtps_epi32(n.v), _mm512_set1_epi32(127));
  return _mm512_castsi512_ps(_mm512_slli_epi32(k, 23));
}
inline void lanes(Vec a, float* out) { _mm512_storeu_ps(out, a.v); }
}  // namespace detail
inline float reduce_sum(Vec a) {
  const __m256 h = _mm256_add_ps(_mm512_castps512_ps256(a.v),
                                 _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a.v), 1)));
  const __m128 q = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
  const __m128 e = _mm_add_ps(q, _mm_movehl_ps(q, q));
  return _mm_cvtss_f32(_mm_add_ss(e, _mm_shuffle_ps(e, e, 1)));
}
inline float reduce_max(Vec a) {
  const __m256 h = _mm256_max_ps(_mm512_castps512_ps256(a.v),
                                 _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a.v), 1)));
  const __m128 q = _mm_max_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
  const __m128 e = _mm_max_ps(q, _mm_movehl_ps(q, q));
  return _mm_cvtss_f32(_mm_max_ss(e, _mm_shuffle_ps(e, e, 1)));
}
inline float reduce_min(Vec a) {
  const __m256 h = _mm256_min_ps(_mm512_castps512_ps256(a.v),
                                 _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a.v), 1)));
  const __m128 q = _mm_min_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
  const __m128 e = _mm_min_ps(q, _mm_movehl_ps(q, q));
  return _mm_cvtss_f32(_mm_min_ss(e, _mm_shuffle_ps(e, e, 1)));
}

#elif defined(AXON_KERNEL_ISA_AVX2)

struct Vec {
  static constexpr int kLanes = 8;
  __m256 v;
  Vec() = default;
  Vec(__m256 x) : v(x) {}
  static Vec broadcast(float x) { return _mm256_set1_ps(x); }
  static Vec zero() { return _mm256_setzero_ps(); }

  static Vec load(const float* p) { return _mm256_loadu_ps(p); }
  static Vec load(const bf16* p) { return from_bf16(load16(p)); }
  static Vec load(const f16* p) { return from_f16(load16(p)); }
  void store(float* p) const { _mm256_storeu_ps(p, v); }
  void store(bf16* p) const { store16(p, to_bf16()); }
  void store(f16* p) const { store16(p, to_f16()); }

  // All ones in the first n lanes (n clamped to [0, kLanes]).
  static __m256i mask(int64_t n) {
    const int k = n < 0 ? 0 : n > kLanes ? kLanes : int(n);
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(k), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  }
  // Masked loads and stores are slow on some CPUs (AMD): full vectors go plain.
  static Vec load_partial(const float* p, int64_t n, float fill = 0.0f) {
    if (n >= kLanes) return _mm256_loadu_ps(p);
    const __m256i m = mask(n);
    return _mm256_blendv_ps(_mm256_set1_ps(fill), _mm256_maskload_ps(p, m), _mm256_castsi256_ps(m));
  }
  static Vec load_partial(const bf16* p, int64_t n, float fill = 0.0f) {
    return _mm256_blendv_ps(_mm256_set1_ps(fill), from_bf16(load16_partial(p, n)).v,
                            _mm256_castsi256_ps(mask(n)));
  }
  static Vec load_partial(const f16* p, int64_t n, float fill = 0.0f) {
    return _mm256_blendv_ps(_mm256_set1_ps(fill), from_f16(load16_partial(p, n)).v,
                            _mm256_castsi256_ps(mask(n)));
  }
  void store_partial(float* p, int64_t n) const {
    if (n >= kLanes) return _mm256_storeu_ps(p, v);
    _mm256_maskstore_ps(p, mask(n), v);
  }
  void store_partial(bf16* p, int64_t n) const { store16_partial(p, n, to_bf16()); }
  void store_partial(f16* p, int64_t n) const { store16_partial(p, n, to_f16()); }

  // 16-bit lanes <-> float.
  static Vec from_bf16(__m128i h) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
  __m128i to_bf16() const {  // round to nearest even, NaN -> quiet NaN
    const __m256i u = _mm256_castps_si256(v);
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    __m256i r = _mm256_srli_epi32(
        _mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)), lsb), 16);
    const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    r = _mm256_blendv_epi8(r, _mm256_set1_epi32(0x7fc0), nan);
    return _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
  }
  static Vec from_f16(__m128i h) {
#if defined(__F16C__)
    return _mm256_cvtph_ps(h);
#else
    alignas(16) uint16_t b[kLanes];
    alignas(32) float f[kLanes];
    _mm_store_si128(reinterpret_cast<__m128i*>(b), h);
    for (int l = 0; l < kLanes; ++l) f[l] = detail::f16_bits_to_float(b[l]);
    return _mm256_load_ps(f);
#endif
  }
  __m128i to_f16() const {
#if defined(__F16C__)
    return _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
#else
    alignas(32) float f[kLanes];
    alignas(16) uint16_t b[kLanes];
    _mm256_store_ps(f, v);
    for (int l = 0; l < kLanes; ++l) b[l] = detail::float_to_f16_bits(f[l]);
    return _mm_load_si128(reinterpret_cast<const __m128i*>(b));
#endif
  }
  static __m128i load16(const void* p) { return _mm_loadu_si128(static_cast<const __m128i*>(p)); }
  static void store16(void* p, __m128i h) { _mm_storeu_si128(static_cast<__m128i*>(p), h); }
  static __m128i load16_partial(const void* p, int64_t n) {
    if (n >= kLanes) return load16(p);
    alignas(16) uint16_t tmp[kLanes] = {};
    std::memcpy(tmp, p, size_t(n < 0 ? 0 : n > kLanes ? kLanes : n) * 2);
    return _mm_load_si128(reinterpret_cast<const __m128i*>(tmp));
  }
  static void store16_partial(void* p, int64_t n, __m128i h) {
    if (n >= kLanes) return store16(p, h);
    alignas(16) uint16_t tmp[kLanes];
    _mm_store_si128(reinterpret_cast<__m128i*>(tmp), h);
    std::memcpy(p, tmp, size_t(n < 0 ? 0 : n > kLanes ? kLanes : n) * 2);
  }
};

inline Vec operator+(Vec a, Vec b) { return _mm256_add_ps(a.v, b.v); }
inline Vec operator-(Vec a, Vec b) { return _mm256_sub_ps(a.v, b.v); }
inline Vec operator*(Vec a, Vec b) { return _mm256_mul_ps(a.v, b.v); }
inline Vec operator/(Vec a, Vec b) { return _mm256_div_ps(a.v, b.v); }
inline Vec operator-(Vec a) { return _mm256_xor_ps(a.v, _mm256_set1_ps(-0.0f)); }
inline Vec fma(Vec a, Vec b, Vec c) { return _mm256_fmadd_ps(a.v, b.v, c.v); }
inline Vec max(Vec a, Vec b) { return _mm256_max_ps(a.v, b.v); }
inline Vec min(Vec a, Vec b) { return _mm256_min_ps(a.v, b.v); }
inline Vec sqrt(Vec a) { return _mm256_sqrt_ps(a.v); }
inline Vec abs(Vec a) { return _mm256_andnot_ps(_mm256_set1_ps(-0.0f), a.v); }
inline Vec floor(Vec a) { return _mm256_floor_ps(a.v); }
inline Vec select_lt(Vec a, Vec b, Vec x, Vec y) {
  return _mm256_blendv_ps(y.v, x.v, _mm256_cmp_ps(a.v, b.v, _CMP_LT_OQ));
}
inline Vec copysign(Vec x, Vec s) {
  const __m256 m = _mm256_set1_ps(-0.0f);
  return _mm256_or_ps(_mm256_andnot_ps(m, x.v), _mm256_and_ps(m, s.v));
}
namespace detail {
inline Vec select_nan(Vec a, Vec x, Vec y) {
  return _mm256_blendv_ps(y.v, x.v, _mm256_cmp_ps(a.v, a.v, _CMP_UNORD_Q));
}
inline Vec exp2i(Vec n) {
  const __m256i k = _mm256_add_epi32(_mm256_cvtps_epi32(n.v), _mm256_set1_epi32(127));
  return _mm256_castsi256_ps(_mm256_slli_epi32(k, 23));
}
inline void lanes(Vec a, float* out) { _mm256_storeu_ps(out, a.v); }
}  // namespace detail
inline float reduce_sum(Vec a) {
  const __m128 q = _mm_add_ps(_mm256_castps256_ps128(a.v), _mm256_extractf128_ps(a.v, 1));
  const __m128 e = _mm_add_ps(q, _mm_movehl_ps(q, q));
  return _mm_cvtss_f32(_mm_add_ss(e, _mm_shuffle_ps(e, e, 1)));
}
inline float reduce_max(Vec a) {
  const __m128 q = _mm_max_ps(_mm256_castps256_ps128(a.v), _mm256_extractf128_ps(a.v, 1));
  const __m128 e = _mm_max_ps(q, _mm_movehl_ps(q, q));
  return _mm_cvtss_f32(_mm_max_ss(e, _mm_shuffle_ps(e, e, 1)));
}
inline float reduce_min(Vec a) {
  const __m128 q = _mm_min_ps(_mm256_castps256_ps128(a.v), _mm256_extractf128_ps(a.v, 1));
  const __m128 e = _mm_min_ps(q, _mm_movehl_ps(q, q));
  return _mm_cvtss_f32(_mm_min_ss(e, _mm_shuffle_ps(e, e, 1)));
}

#else  // portable fallback: 4 lanes of plain C++ (the compiler may vectorise it)

struct Vec {
  static constexpr int kLanes = 4;
  float v[4];
  static Vec broadcast(float x) { return Vec{{x, x, x, x}}; }
  static Vec zero() { return broadcast(0.0f); }
  template <class H>
  static Vec load(const H* p) {
    Vec r;
    for (int l = 0; l < kLanes; ++l) r.v[l] = float(p[l]);
    return r;
  }
  template <class H>
  void store(H* p) const {
    for (int l = 0; l < kLanes; ++l) p[l] = H(v[l]);
  }
  template <class H>
  static Vec load_partial(const H* p, int64_t n, float fill = 0.0f) {
    Vec r = broadcast(fill);
    for (int l = 0; l < kLanes && l < n; ++l) r.v[l] = float(p[l]);
    return r;
  }
  template <class H>
  void store_partial(H* p, int64_t n) const {
    for (int l = 0; l < kLanes && l < n; ++l) p[l] = H(v[l]);
  }
};

namespace detail {
template <class F>
inline Vec map(Vec a, Vec b, F f) {
  Vec r;
  for (int l = 0; l < Vec::kLanes; ++l) r.v[l] = f(a.v[l], b.v[l]);
  return r;
}
}  // namespace detail
inline Vec operator+(Vec a, Vec b) { return detail::map(a, b, [](float x, float y) { return x + y; }); }
inline Vec operator-(Vec a, Vec b) { return detail::map(a, b, [](float x, float y) { return x - y; }); }
inline Vec operator*(Vec a, Vec b) { return detail::map(a, b, [](float x, float y) { return x * y; }); }
inline Vec operator/(Vec a, Vec b) { return detail::map(a, b, [](float x, float y) { return x / y; }); }
inline Vec operator-(Vec a) { return detail::map(a, a, [](float x, float) { return -x; }); }
inline Vec fma(Vec a, Vec b, Vec c) {
  Vec r;
  for (int l = 0; l < Vec::kLanes; ++l) {
#if defined(__FMA__) || defined(FP_FAST_FMAF)
    r.v[l] = std::fma(a.v[l], b.v[l], c.v[l]);
#else
    r.v[l] = a.v[l] * b.v[l] + c.v[l];
#endif
  }
  return r;
}
// As the x86 instructions: b where either is NaN.
inline Vec max(Vec a, Vec b) { return detail::map(a, b, [](float x, float y) { return x > y ? x : y; }); }
inline Vec min(Vec a, Vec b) { return detail::map(a, b, [](float x, float y) { return x < y ? x : y; }); }
inline Vec sqrt(Vec a) { return detail::map(a, a, [](float x, float) { return std::sqrt(x); }); }
inline Vec abs(Vec a) { return detail::map(a, a, [](float x, float) { return std::fabs(x); }); }
inline Vec floor(Vec a) { return detail::map(a, a, [](float x, float) { return std::floor(x); }); }
inline Vec select_lt(Vec a, Vec b, Vec x, Vec y) {
  Vec r;
  for (int l = 0; l < Vec::kLanes; ++l) r.v[l] = a.v[l] < b.v[l] ? x.v[l] : y.v[l];
  return r;
}
inline Vec copysign(Vec x, Vec s) {
  return detail::map(x, s, [](float m, float g) { return std::copysign(m, g); });
}
namespace detail {
inline Vec select_nan(Vec a, Vec x, Vec y) {
  Vec r;
  for (int l = 0; l < Vec::kLanes; ++l) r.v[l] = std::isnan(a.v[l]) ? x.v[l] : y.v[l];
  return r;
}
inline Vec exp2i(Vec n) {
  Vec r;
  for (int l = 0; l < Vec::kLanes; ++l) r.v[l] = bits_to_float(uint32_t(int32_t(n.v[l]) + 127) << 23);
  return r;
}
inline void lanes(Vec a, float* out) { std::memcpy(out, a.v, sizeof a.v); }
}  // namespace detail
inline float reduce_sum(Vec a) { return (a.v[0] + a.v[2]) + (a.v[1] + a.v[3]); }
inline float reduce_max(Vec a) {
  const float x = a.v[0] > a.v[2] ? a.v[0] : a.v[2], y = a.v[1] > a.v[3] ? a.v[1] : a.v[3];
  return x > y ? x : y;
}
inline float reduce_min(Vec a) {
  const float x = a.v[0] < a.v[2] ? a.v[0] : a.v[2], y = a.v[1] < a.v[3] ? a.v[1] : a.v[3];
  return x < y ? x : y;
}

#endif  // ISA

// ---- ISA-independent Vec operations -----------------------------------------------------

inline Vec broadcast(float x) { return Vec::broadcast(x); }
inline Vec operator+(Vec a, float b) { return a + Vec::broadcast(b); }
inline Vec operator-(Vec a, float b) { return a - Vec::broadcast(b); }
inline Vec operator*(Vec a, float b) { return a * Vec::broadcast(b); }
inline Vec operator/(Vec a, float b) { return a / Vec::broadcast(b); }
inline Vec operator+(float a, Vec b) { return Vec::broadcast(a) + b; }
inline Vec operator-(float a, Vec b) { return Vec::broadcast(a) - b; }
inline Vec operator*(float a, Vec b) { return Vec::broadcast(a) * b; }
inline Vec operator/(float a, Vec b) { return Vec::broadcast(a) / b; }
inline Vec& operator+=(Vec& a, Vec b) { return a = a + b; }
inline Vec& operator-=(Vec& a, Vec b) { return a = a - b; }
inline Vec& operator*=(Vec& a, Vec b) { return a = a * b; }
inline Vec& operator/=(Vec& a, Vec b) { return a = a / b; }

// 1 / sqrt(a), correctly rounded sqrt and division (not the approximate instruction).
inline Vec rsqrt(Vec a) { return Vec::broadcast(1.0f) / sqrt(a); }

// exp(a): ~1 ulp over the whole float range (subnormal results included; inf above
// 88.72, 0 below -103.97, NaN stays NaN). Cephes' polynomial on r = a - n ln2, |r| <= ln2/2,
// scaled by 2^n in two steps so that gradual underflow and n = 128 come out right.
inline Vec exp(Vec a) {
  const float kRound = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  const Vec x = min(max(a, Vec::broadcast(-104.0f)), Vec::broadcast(88.8f));
  const Vec shifted = fma(x, Vec::broadcast(1.44269504088896341f), Vec::broadcast(kRound));
  const Vec n = shifted - Vec::broadcast(kRound);
  Vec r = fma(n, Vec::broadcast(-0.693359375f), x);  // Cody-Waite: ln2 in two parts
  r = fma(n, Vec::broadcast(2.12194440e-4f), r);
  Vec p = Vec::broadcast(1.9875691500e-4f);
  p = fma(p, r, Vec::broadcast(1.3981999507e-3f));
  p = fma(p, r, Vec::broadcast(8.3334519073e-3f));
  p = fma(p, r, Vec::broadcast(4.1665795894e-2f));
  p = fma(p, r, Vec::broadcast(1.6666665459e-1f));
  p = fma(p, r, Vec::broadcast(5.0000001201e-1f));
  p = fma(p, r * r, r) + Vec::broadcast(1.0f);
  const Vec n1 = floor(n * Vec::broadcast(0.5f));
  const Vec n2 = n - n1;
  return detail::select_nan(a, a, p * detail::exp2i(n1) * detail::exp2i(n2));
}

// tanh(a): a few ulp. An odd polynomial below |a| = 0.625, 1 - 2 / (exp(2|a|) + 1) above.
inline Vec tanh(Vec a) {
  const Vec ax = abs(a);
  const Vec z = a * a;
  Vec p = Vec::broadcast(-5.70498872745e-3f);
  p = fma(p, z, Vec::broadcast(2.06390887954e-2f));
  p = fma(p, z, Vec::broadcast(-5.37397155531e-2f));
  p = fma(p, z, Vec::broadcast(1.33314422036e-1f));
  p = fma(p, z, Vec::broadcast(-3.33332819422e-1f));
  const Vec small = fma(p * z, a, a);
  const Vec e = exp(ax + ax);
  const Vec large = copysign(Vec::broadcast(1.0f) - Vec::broadcast(2.0f) / (e + Vec::broadcast(1.0f)), a);
  return select_lt(ax, Vec::broadcast(0.625f), small, large);
}

// erf(a): a few ulp. Taylor series below |a| = 1; above, 1 - t P(t) exp(-a^2) with
// t = 1 / (1 + 0.3275911 |a|) (Abramowitz & Stegun 7.1.26, abs. error <= 1.5e-7).
inline Vec erf(Vec a) {
  const Vec ax = abs(a);
  const Vec z = a * a;
  // 2/sqrt(pi) * (-1)^k / (k! (2k+1)), k = 11 .. 0
  const float c[12] = {-1.22905553e-09f, 1.48071928e-08f, -1.63658447e-07f, 1.64621144e-06f,
                       -1.49256504e-05f, 1.20553330e-04f, -8.54832702e-04f, 5.22397763e-03f,
                       -2.68661706e-02f, 1.12837917e-01f,  -3.76126389e-01f, 1.12837917e+00f};
  Vec p = Vec::broadcast(c[0]);
  for (int k = 1; k < 12; ++k) p = fma(p, z, Vec::broadcast(c[k]));
  const Vec small = p * a;
  const Vec t = Vec::broadcast(1.0f) / fma(ax, Vec::broadcast(0.3275911f), Vec::broadcast(1.0f));
  Vec q = Vec::broadcast(1.061405429f);
  q = fma(q, t, Vec::broadcast(-1.453152027f));
  q = fma(q, t, Vec::broadcast(1.421413741f));
  q = fma(q, t, Vec::broadcast(-0.284496736f));
  q = fma(q, t, Vec::broadcast(0.254829592f));
  const Vec large = copysign(Vec::broadcast(1.0f) - q * t * exp(-z), a);
  return select_lt(ax, Vec::broadcast(1.0f), small, large);
}

// 1 / (1 + exp(-a)).
inline Vec sigmoid(Vec a) { return Vec::broadcast(1.0f) / (Vec::broadcast(1.0f) + exp(-a)); }

// The lanes as an array (for debugging or scalar code).
struct Lanes {
  float v[Vec::kLanes];
  float operator[](int l) const { return v[l]; }
};
inline Lanes lanes(Vec a) {
  Lanes r;
  detail::lanes(a, r.v);
  return r;
}

}  // namespace kernel
}  // namespace axon

#endif  /* C++ layer */
#endif  /* AXON_KERNEL_H */
