"""The Axon Kernel Interface (issue 20): <axon/kernel.h>, torch_axon.kernel and
torch.ops.axon._launch_kernel.

Kernels built by the JIT compute what the same computation gives on the CPU (float32,
bfloat16, float16; strided and zero-size inputs); the header's vector math and dtype
conversions hold on each ISA path (AVX-512, AVX2, scalar); the build cache; the host's
errors; a kernel's failure as an asynchronous error; ordering with streams and events;
and a kernel registered as a custom op (fake and autograd) under torch.compile, autograd,
graph capture and the profiler.
"""

import math
import os
import textwrap

import pytest
import torch
import torch.nn.functional as F

import torch_axon
import torch_axon.kernel as K
from conftest import FLOAT_DTYPES, layout_pair, make, run_python, tol

DEV = "axon"

SOURCE = r"""
#include <axon/kernel.h>
#include <cstdio>
using namespace axon::kernel;

// out = x + alpha * y (one float dtype, any strides, same shapes)
template <class T>
static void add_scale_t(const AxonKernelContext* ctx, const AxonTensor& xt, const AxonTensor& yt,
                        const AxonTensor& ot, float alpha) {
  View<T> x = as<T>(xt), y = as<T>(yt), o = as<T>(ot);
  const int64_t n = o.numel();
  if (x.is_contiguous() && y.is_contiguous() && o.is_contiguous()) {
    const Vec a = Vec::broadcast(alpha);
    parallel_for(ctx, 0, n, 4096, [&](int64_t b, int64_t e) {
      int64_t i = b;
      for (; i + Vec::kLanes <= e; i += Vec::kLanes)
        fma(Vec::load(y.data() + i), a, Vec::load(x.data() + i)).store(o.data() + i);
      if (i < e)
        fma(Vec::load_partial(y.data() + i, e - i), a, Vec::load_partial(x.data() + i, e - i))
            .store_partial(o.data() + i, e - i);
    });
    return;
  }
  parallel_for(ctx, 0, n, 4096, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      int64_t rem = i, ox = 0, oy = 0, oo = 0;
      for (int d = o.ndim() - 1; d >= 0; --d) {
        const int64_t k = rem % o.size(d);
        rem /= o.size(d);
        ox += k * x.stride(d);
        oy += k * y.stride(d);
        oo += k * o.stride(d);
      }
      o.data()[oo] = T(std::fma(float(y.data()[oy]), alpha, float(x.data()[ox])));
    }
  });
}

AXON_KERNEL(add_scale) {
  AXON_CHECK(ctx, args->num_tensors == 3 && args->num_floats == 1, "add_scale(x, y, out; alpha)");
  const AxonTensor &x = args->tensors[0], &y = args->tensors[1], &o = args->tensors[2];
  AXON_CHECK(ctx, x.dtype == o.dtype && y.dtype == o.dtype, "add_scale: x, y, out: one dtype");
  AXON_CHECK(ctx, x.ndim == o.ndim && y.ndim == o.ndim, "add_scale: shapes differ");
  for (int d = 0; d < o.ndim; ++d)
    AXON_CHECK(ctx, x.sizes[d] == o.sizes[d] && y.sizes[d] == o.sizes[d], "add_scale: shapes differ");
  const float alpha = float(args->floats[0]);
  const bool ok = dispatch_float(o.dtype, [&](auto tag) {
    add_scale_t<decltype(tag)>(ctx, x, y, o, alpha);
  });
  AXON_CHECK(ctx, ok, "add_scale: expected float32, bfloat16 or float16");
}

// out[r] = x[r] / sqrt(mean(x[r]^2) + eps) * w; rows may be strided, columns unit-stride.
template <class T>
static void rms_norm_t(const AxonKernelContext* ctx, View<T> x, View<T> w, View<T> o, float eps) {
  const int64_t rows = x.size(0), cols = x.size(1);
  constexpr int L = Vec::kLanes;
  parallel_for(ctx, 0, rows, 1, [&](int64_t b, int64_t e) {
    float* buf = scratch<float>(ctx, size_t(cols));  // this chunk's row, as float
    if (buf == nullptr) return ctx->fail(ctx->impl, "rms_norm: no scratch memory");
    for (int64_t r = b; r < e; ++r) {
      const T* xr = x.ptr(r);
      T* orow = o.ptr(r);
      Vec acc = Vec::zero();
      int64_t j = 0;
      for (; j + L <= cols; j += L) {
        const Vec v = Vec::load(xr + j);
        v.store(buf + j);
        acc = fma(v, v, acc);
      }
      if (j < cols) {
        const Vec v = Vec::load_partial(xr + j, cols - j);
        v.store_partial(buf + j, cols - j);
        acc = fma(v, v, acc);
      }
      const Vec inv = rsqrt(Vec::broadcast(reduce_sum(acc) / float(cols) + eps));
      for (j = 0; j + L <= cols; j += L)
        (Vec::load(buf + j) * inv * Vec::load(w.data() + j)).store(orow + j);
      if (j < cols)
        (Vec::load_partial(buf + j, cols - j) * inv * Vec::load_partial(w.data() + j, cols - j))
            .store_partial(orow + j, cols - j);
    }
  });
}

AXON_KERNEL(rms_norm) {
  AXON_CHECK(ctx, args->num_tensors == 3 && args->num_floats == 1, "rms_norm(x, w, out; eps)");
  const AxonTensor &x = args->tensors[0], &w = args->tensors[1], &o = args->tensors[2];
  AXON_CHECK(ctx, x.ndim == 2 && o.ndim == 2 && w.ndim == 1, "rms_norm: x, out 2-d, w 1-d");
  AXON_CHECK(ctx, x.dtype == o.dtype && w.dtype == o.dtype, "rms_norm: x, w, out: one dtype");
  AXON_CHECK(ctx, x.sizes[1] == w.sizes[0] && x.sizes[0] == o.sizes[0] && x.sizes[1] == o.sizes[1],
             "rms_norm: shapes differ");
  AXON_CHECK(ctx, (x.sizes[1] <= 1 || x.strides[1] == 1) && (o.sizes[1] <= 1 || o.strides[1] == 1) &&
                  (w.sizes[0] <= 1 || w.strides[0] == 1),
             "rms_norm: x, w and out need unit column stride");
  const float eps = float(args->floats[0]);
  const bool ok = dispatch_float(o.dtype, [&](auto tag) {
    using T = decltype(tag);
    rms_norm_t<T>(ctx, as<T>(x), as<T>(w), as<T>(o), eps);
  });
  AXON_CHECK(ctx, ok, "rms_norm: expected float32, bfloat16 or float16");
}

// Fails (asynchronously, once launched with this signature before) on a negative index.
AXON_KERNEL(check_indices) {
  AXON_CHECK(ctx, args->num_tensors == 1 && is<int64_t>(args->tensors[0]), "check_indices(int64)");
  View<int64_t> idx = as<int64_t>(args->tensors[0]);
  for (int64_t i = 0; i < idx.numel(); ++i) {
    if (idx(i) < 0) {
      char msg[96];
      std::snprintf(msg, sizeof msg, "index %lld at position %lld is negative",
                    (long long)idx(i), (long long)i);
      ctx->fail(ctx->impl, msg);
      return;
    }
  }
}

// out = f(x), x float32 contiguous 1-d, out float32/bf16/f16: ints[0] picks f.
template <class T>
static void unary_t(const AxonKernelContext* ctx, const float* x, T* o, int64_t n, int64_t op) {
  parallel_for(ctx, 0, n, 1 << 14, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; i += Vec::kLanes) {
      const int64_t m = e - i < Vec::kLanes ? e - i : Vec::kLanes;
      const Vec v = Vec::load_partial(x + i, m);
      Vec r = v;
      switch (op) {
        case 1: r = exp(v); break;
        case 2: r = tanh(v); break;
        case 3: r = erf(v); break;
        case 4: r = sigmoid(v); break;
        case 5: r = sqrt(v); break;
        case 6: r = rsqrt(v); break;
        default: break;
      }
      r.store_partial(o + i, m);
    }
  });
}

AXON_KERNEL(unary) {
  AXON_CHECK(ctx, args->num_tensors == 2 && args->num_ints == 1, "unary(x, out; op)");
  View<float> x = as<float>(args->tensors[0]);
  const AxonTensor& o = args->tensors[1];
  AXON_CHECK(ctx, is<float>(x.tensor()) && x.is_contiguous(), "unary: x float32 contiguous");
  const bool ok = dispatch_float(o.dtype, [&](auto tag) {
    using T = decltype(tag);
    unary_t<T>(ctx, x.data(), as<T>(o).data(), x.numel(), args->ints[0]);
  });
  AXON_CHECK(ctx, ok, "unary: bad out dtype");
}

// out = [sum, max, min] of x (float32 contiguous 1-d), in vectors with a partial tail.
AXON_KERNEL(reduce3) {
  View<float> x = as<float>(args->tensors[0]), out = as<float>(args->tensors[1]);
  const int64_t n = x.numel();
  Vec s = Vec::zero(), mx = Vec::broadcast(-INFINITY), mn = Vec::broadcast(INFINITY);
  int64_t i = 0;
  for (; i + Vec::kLanes <= n; i += Vec::kLanes) {
    const Vec v = Vec::load(x.data() + i);
    s += v;
    mx = max(mx, v);
    mn = min(mn, v);
  }
  s += Vec::load_partial(x.data() + i, n - i);
  mx = max(mx, Vec::load_partial(x.data() + i, n - i, -INFINITY));
  mn = min(mn, Vec::load_partial(x.data() + i, n - i, INFINITY));
  out(0) = reduce_sum(s);
  out(1) = reduce_max(mx);
  out(2) = reduce_min(mn);
}

// out = [lanes, threads, abi version, device]
AXON_KERNEL(info) {
  View<int64_t> out = as<int64_t>(args->tensors[0]);
  out(0) = Vec::kLanes;
  out(1) = ctx->num_threads;
  out(2) = ctx->abi_version;
  out(3) = ctx->device;
}

// Asks for scratch until it has `ints[0]` bytes in 1 MiB pieces; writes whether they
// were 64-byte aligned and distinct.
AXON_KERNEL(scratch_probe) {
  View<int64_t> out = as<int64_t>(args->tensors[0]);
  int64_t ok = 1;
  char* prev = nullptr;
  for (int64_t got = 0; got < args->ints[0]; got += 1 << 20) {
    char* p = scratch<char>(ctx, 1 << 20);
    AXON_CHECK(ctx, p != nullptr, "scratch_probe: no scratch");
    ok &= (reinterpret_cast<uintptr_t>(p) % 64 == 0) && p != prev;
    p[0] = p[(1 << 20) - 1] = 1;
    prev = p;
  }
  out(0) = ok;
}

// ---- for native ops (lib.op) ----

// add_scale's output rule: x and y of one float dtype and one shape; out like x.
AXON_SHAPE(add_scale_shape) {
  AXON_SHAPE_CHECK(num_outputs == 1 && args->num_tensors == 2, "add_scale_shape: one output");
  const AxonTensor &x = args->tensors[0], &y = args->tensors[1];
  AXON_SHAPE_CHECK(x.dtype == y.dtype, "add_scale: x and y must have one dtype");
  AXON_SHAPE_CHECK(x.dtype == AXON_FLOAT32 || x.dtype == AXON_BFLOAT16 || x.dtype == AXON_FLOAT16,
                   "add_scale: expected float32, bfloat16 or float16");
  bool same = x.ndim == y.ndim;
  for (int d = 0; same && d < x.ndim; ++d) same = x.sizes[d] == y.sizes[d];
  AXON_SHAPE_CHECK(same, "add_scale: x and y must have one shape");
  set_like(outputs[0], x);
  return 0;
}

// row_stats(x [R, C], bias? [C], int[] dims, bool negate) -> (y [R, C] like x, s [R] float32):
// y = (x + bias), negated if asked; s = the row sums of y, in float, in column order.
// ints = [len(dims), dims..., negate].  Any strides.
template <class T>
static void row_stats_t(const AxonTensor& xt, const AxonTensor& bt, const AxonTensor& yt,
                        const AxonTensor& st, bool negate) {
  View<T> x = as<T>(xt), y = as<T>(yt);
  View<float> s = as<float>(st);
  for (int64_t r = 0; r < x.size(0); ++r) {
    float acc = 0.f;
    for (int64_t c = 0; c < x.size(1); ++c) {
      float v = float(x(r, c));
      if (given(bt)) v = float(T(v + float(as<T>(bt)(c))));
      if (negate) v = -v;
      y(r, c) = T(v);
      acc += float(T(v));
    }
    s(r) = acc;
  }
}

AXON_SHAPE(row_stats_shape) {
  const AxonTensor &x = args->tensors[0], &b = args->tensors[1];
  AXON_SHAPE_CHECK(x.ndim == 2, "row_stats: x must be 2-D");
  AXON_SHAPE_CHECK(!given(b) || (b.ndim == 1 && b.sizes[0] == x.sizes[1] && b.dtype == x.dtype),
                   "row_stats: bias must be 1-D with x's columns and dtype");
  AXON_SHAPE_CHECK(args->num_ints == 2 + args->ints[0], "row_stats: ints = [n, dims..., negate]");
  set_like(outputs[0], x);
  outputs[1].dtype = AXON_FLOAT32;
  outputs[1].ndim = 1;
  outputs[1].sizes[0] = x.sizes[0];
  return 0;
}

AXON_KERNEL(row_stats) {
  AXON_CHECK(ctx, args->num_tensors == 4, "row_stats(x, bias, y, s)");
  const bool negate = args->ints[args->num_ints - 1] != 0;
  const bool ok = dispatch_float(args->tensors[0].dtype, [&](auto tag) {
    row_stats_t<decltype(tag)>(args->tensors[0], args->tensors[1], args->tensors[2],
                               args->tensors[3], negate);
  });
  AXON_CHECK(ctx, ok, "row_stats: expected a float dtype");
}

// add_(Tensor(a!) x, float v) -> (): x += v in place (float32, contiguous); v < 0 fails.
AXON_KERNEL(add_inplace) {
  View<float> x = as<float>(args->tensors[0]);
  AXON_CHECK(ctx, args->floats[0] >= 0, "add_: v must be >= 0");
  for (int64_t i = 0; i < x.numel(); ++i) x.data()[i] += float(args->floats[0]);
}

// out = x - alpha * y: add_scale's arguments, another result (re-registration tests).
AXON_KERNEL(sub_scale) {
  const AxonTensor &x = args->tensors[0], &y = args->tensors[1], &o = args->tensors[2];
  const float alpha = -float(args->floats[0]);
  const bool ok = dispatch_float(o.dtype, [&](auto tag) {
    add_scale_t<decltype(tag)>(ctx, x, y, o, alpha);
  });
  AXON_CHECK(ctx, ok, "sub_scale: expected float32, bfloat16 or float16");
}

// none_probe(Tensor? a, Tensor x) -> Tensor: out[0] = given(a), out[1] = numel(a), out[2] = ndim(a)
AXON_SHAPE(none_probe_shape) {
  outputs[0].dtype = AXON_INT64;
  outputs[0].ndim = 1;
  outputs[0].sizes[0] = 3;
  return 0;
}
AXON_KERNEL(none_probe) {
  View<int64_t> out = as<int64_t>(args->tensors[2]);
  View<float> a = as<float>(args->tensors[0]);
  out(0) = given(args->tensors[0]);
  out(1) = a.numel();
  out(2) = a.ndim();
}

// An output rule that forgets its second output.
AXON_SHAPE(forgets_an_output) {
  set_like(outputs[0], args->tensors[0]);
  return 0;
}

// Impossible scratch sizes: nullptr, not a wrapped-around small block.
AXON_KERNEL(scratch_huge) {
  View<int64_t> out = as<int64_t>(args->tensors[0]);
  out(0) = scratch<double>(ctx, static_cast<size_t>(-1) / 4) == nullptr &&
           ctx->scratch(ctx->impl, static_cast<size_t>(-1) - 10) == nullptr;
}
"""

ISA_FLAGS = {"native": (), "avx2": ("-mno-avx512f",), "scalar": ("-mno-avx2",)}
WARN_FLAGS = ("-Wall", "-Wextra", "-Werror")


def _cpu_flags():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def expected_lanes(isa):
    flags = _cpu_flags()
    if isa == "native" and "avx512f" in flags:
        return 16
    if isa in ("native", "avx2") and {"avx2", "fma"} <= flags:
        return 8
    return 4


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    d = tmp_path_factory.mktemp("kernel_cache")
    old = os.environ.get("AXON_KERNEL_CACHE")
    os.environ["AXON_KERNEL_CACHE"] = str(d)
    yield d
    if old is None:
        os.environ.pop("AXON_KERNEL_CACHE", None)
    else:
        os.environ["AXON_KERNEL_CACHE"] = old


@pytest.fixture(scope="module")
def libs(cache):
    """The test kernels on each ISA path, built warning-free (-Wall -Wextra -Werror)."""
    return {isa: K.load("test_kernels_" + isa, source=SOURCE, extra_cflags=flags + WARN_FLAGS)
            for isa, flags in ISA_FLAGS.items()}


@pytest.fixture(scope="module")
def lib(libs):
    return libs["native"]


# ------------------------------------------------------------------ kernels vs the CPU

@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("layout", ["contiguous", "transposed", "sliced", "expanded", "zero_size"])
def test_add_scale_matches_cpu(lib, dtype, layout):
    x_cpu, x = layout_pair(layout, dtype, rows=37, cols=45, seed=1)
    y_cpu, y = layout_pair(layout if layout != "expanded" else "sliced", dtype, rows=37, cols=45,
                           seed=2)
    out = torch.empty(x.shape, dtype=dtype, device=DEV)
    lib.add_scale(x, y, out, floats=(0.75,), written=(2,))
    expected = (x_cpu.float() + 0.75 * y_cpu.float()).to(dtype)
    torch.testing.assert_close(out.cpu(), expected, **tol(dtype))
    # a non-contiguous output too
    out_t = torch.empty(x.shape[::-1], dtype=dtype, device=DEV).t()
    lib.add_scale(x, y, out_t, floats=(0.75,), written=(2,))
    torch.testing.assert_close(out_t.cpu(), expected, **tol(dtype))


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("rows, cols, strided", [(33, 100, False), (5, 1000, True), (0, 64, False),
                                                 (7, 3, True)])
def test_rms_norm_matches_cpu(lib, dtype, rows, cols, strided):
    base = make((rows, cols + (9 if strided else 0)), dtype, seed=3)
    x_cpu = base[:, :cols]
    x = base.to(DEV)[:, :cols]
    assert x.is_contiguous() == (not strided or rows <= 1)
    w_cpu = make((cols,), dtype, 0.5, 1.5, seed=4)
    out = torch.empty(rows, cols, dtype=dtype, device=DEV)
    lib.rms_norm(x, w_cpu.to(DEV), out, floats=(1e-6,), written=(2,))
    expected = F.rms_norm(x_cpu.float(), (cols,), w_cpu.float(), eps=1e-6).to(dtype)
    torch.testing.assert_close(out.cpu(), expected, **tol(dtype, accum=True))


def test_kernel_check_raises_at_first_launch(lib):
    x = torch.randn(4, 8, device=DEV)
    w = torch.ones(8, device=DEV)
    out = torch.empty(4, 8, device=DEV)
    # A host-visible problem: the first launch of this signature runs at the call.
    with pytest.raises(RuntimeError, match=r"'test_kernels_native::rms_norm' failed: rms_norm: x, "
                                           r"w and out need unit column stride"):
        lib.rms_norm(x.t().contiguous().t(), w, out.t().contiguous().t(), floats=(1e-6,))
    with pytest.raises(RuntimeError, match=r"'my::norm' failed: rms_norm\(x, w, out; eps\)"):
        lib.rms_norm(x, w, out, name="my::norm")  # no eps


# ------------------------------------------------------------------ the header on each ISA

@pytest.mark.parametrize("isa", list(ISA_FLAGS))
def test_isa_paths(libs, isa):
    lib = libs[isa]
    info = torch.zeros(4, dtype=torch.int64, device=DEV)
    lib.info(info, written=(0,))
    lanes, threads, abi, device = info.tolist()
    assert lanes == expected_lanes(isa)
    assert threads >= 1 and abi == 1 and device == 0

    # exp / tanh / erf / sigmoid / sqrt / rsqrt against float64, in ulps of the result
    n = 100_003  # not a multiple of any lane count: a partial tail
    x64 = torch.linspace(-30, 30, n, dtype=torch.float64)
    x = x64.float()
    for op, (fn, max_ulp) in {1: (torch.exp, 2), 2: (torch.tanh, 2), 3: (torch.erf, 4),
                              4: (torch.sigmoid, 3), 5: (torch.sqrt, 0.5),
                              6: (torch.rsqrt, 1)}.items():
        src = x.abs() + 1e-3 if op in (5, 6) else x
        out = torch.empty(n, device=DEV)
        lib.unary(src.to(DEV), out, ints=(op,), written=(1,))
        ref = fn(src.double())
        ulp = torch.finfo(torch.float32).eps * ref.abs().clamp_min(2.0 ** -126)
        err = ((out.cpu().double() - ref).abs() / ulp).max().item()
        # ulp here is 2^-23 |ref|: up to twice the ulp of ref's binade
        assert err <= 2 * max_ulp, (isa, op, err)
    special = torch.tensor([float("nan"), float("inf"), -float("inf"), 0.0, 100.0, -200.0])
    out = torch.empty(6, device=DEV)
    lib.unary(special.to(DEV), out, ints=(1,), written=(1,))
    torch.testing.assert_close(out.cpu(), torch.exp(special), equal_nan=True, atol=0, rtol=0)
    lib.unary(special.to(DEV), out, ints=(2,), written=(1,))
    torch.testing.assert_close(out.cpu(), torch.tanh(special), equal_nan=True, atol=0, rtol=0)

    # float -> bf16 / f16 bit for bit as PyTorch rounds: halfway cases, subnormals,
    # overflow, NaN, +-0
    g = torch.Generator().manual_seed(5)
    bits = torch.randint(-2**31, 2**31, (50_000,), generator=g, dtype=torch.int64).to(torch.int32)
    vals = torch.cat([bits.view(torch.float32),
                      torch.tensor([0.0, -0.0, 65504.0, 65520.0, 65519.99, 1e-8, -6e-8, 3e-5,
                                    1.0 + 2.0**-8, 1.0 + 3 * 2.0**-8, 1.0 + 2.0**-11,
                                    1.0 + 3 * 2.0**-11, 3.4e38, float("inf")]),
                      torch.randn(1000, generator=g) * 1e-5])
    for dt in (torch.bfloat16, torch.float16):
        out = torch.empty(vals.numel(), dtype=dt, device=DEV)
        lib.unary(vals.to(DEV), out, ints=(0,), written=(1,))
        got, want = out.cpu(), vals.to(dt)
        nan = want.isnan()
        assert torch.equal(got.isnan(), nan), (isa, dt)
        assert torch.equal(got[~nan].view(torch.int16), want[~nan].view(torch.int16)), (isa, dt)
        # and back: every 16-bit pattern converts to float exactly as PyTorch's
        all16 = torch.arange(-2**15, 2**15, dtype=torch.int32).to(torch.int16).view(dt)
        back = torch.empty(all16.numel(), device=DEV)
        lib.add_scale(all16.to(DEV).float(), torch.zeros(all16.numel(), device=DEV), back,
                      floats=(1.0,), written=(2,))
        torch.testing.assert_close(back.cpu(), all16.float(), equal_nan=True, atol=0, rtol=0)

    # reductions over every length up to 3 vectors, with partial tails
    for m in range(0, 3 * 16 + 2):
        v = make((m,), torch.float32, seed=m)
        out = torch.empty(3, device=DEV)
        lib.reduce3(v.to(DEV), out, written=(1,))
        s, mx, mn = out.tolist()
        assert math.isclose(s, v.double().sum().item(), rel_tol=1e-5, abs_tol=1e-5)
        assert mx == (v.max().item() if m else -math.inf)
        assert mn == (v.min().item() if m else math.inf)


def test_bf16_f16_loads_from_axon_tensors(libs):
    # loads with conversion (bf16/f16 -> float), through the rms_norm kernel on every ISA
    x_cpu = make((3, 37), torch.float32, seed=8)
    w_cpu = make((37,), torch.float32, 0.5, 1.5, seed=9)
    for isa, lib in libs.items():
        for dt in (torch.bfloat16, torch.float16):
            out = torch.empty(3, 37, dtype=dt, device=DEV)
            lib.rms_norm(x_cpu.to(dt).to(DEV), w_cpu.to(dt).to(DEV), out, floats=(1e-5,),
                         written=(2,))
            expected = F.rms_norm(x_cpu.to(dt).float(), (37,), w_cpu.to(dt).float(),
                                  eps=1e-5).to(dt)
            torch.testing.assert_close(out.cpu(), expected, **tol(dt, accum=True), msg=isa)


def test_header_compiles_as_c(cache, tmp_path):
    src = tmp_path / "c_kernel.c"
    src.write_text(textwrap.dedent("""
        #include <axon/kernel.h>
        /* out[i] = 2 * x[i], float32 contiguous */
        static void body(void* c, int64_t b, int64_t e) {
          const AxonKernelArgs* args = (const AxonKernelArgs*)c;
          const float* x = (const float*)args->tensors[0].data;
          float* out = (float*)args->tensors[1].data;
          for (int64_t i = b; i < e; ++i) out[i] = 2.0f * x[i];
        }
        AXON_KERNEL(twice) {
          AXON_CHECK(ctx, args->num_tensors == 2, "twice(x, out)");
          ctx->parallel_for(ctx->impl, 0, args->tensors[0].sizes[0], 1024, (void*)args, body);
        }
        /* a native op's output rule, in C */
        AXON_SHAPE(twice_shape) {
          AXON_SHAPE_CHECK(args->tensors[0].dtype == AXON_FLOAT32, "twice: float32 only");
          outputs[0] = args->tensors[0];
          return 0;
        }
    """))
    clib = K.load("c_kernels", sources=[src], extra_cflags=("-Wall", "-Wextra", "-Werror"))
    assert any(c[0] == "gcc" and "-std=c11" in c for c in K.build_info(clib).commands)
    x = make((5000,), torch.float32, seed=1)
    out = torch.empty(5000, device=DEV)
    clib.twice(x.to(DEV), out, written=(1,))
    torch.testing.assert_close(out.cpu(), 2 * x, atol=0, rtol=0)
    twice = clib.op("axon_c_test::twice(Tensor x) -> Tensor", shape="twice_shape")
    torch.testing.assert_close(twice(x.to(DEV)).cpu(), 2 * x, atol=0, rtol=0)
    with pytest.raises(RuntimeError, match="twice: float32 only"):
        twice(x.double().to(DEV))


def test_scratch_is_aligned_and_large(lib):
    out = torch.zeros(1, dtype=torch.int64, device=DEV)
    lib.scratch_probe(out, ints=(8 << 20,), written=(0,))
    assert out.item() == 1
    lib.scratch_probe(out, ints=(8 << 20,), written=(0,))  # the arena is reused
    assert out.item() == 1
    out.zero_()
    lib.scratch_huge(out, written=(0,))
    assert out.item() == 1


# ------------------------------------------------------------------ the build

def test_build_cache_hit(cache, lib):
    info = K.build_info(lib)
    assert not info.cached and info.compile_seconds > 0, info
    assert os.path.dirname(info.path) == str(cache / info.key)
    mtime = os.path.getmtime(info.path)
    # Another process: found in the cache, not compiled again.
    r = run_python(f"""
        import torch, torch_axon.kernel as K
        lib = K.load("test_kernels_native", source={SOURCE!r},
                     extra_cflags={ISA_FLAGS['native'] + WARN_FLAGS!r})
        i = K.build_info(lib)
        print(i.cached, i.path, i.total_seconds)
    """, env={"AXON_KERNEL_CACHE": str(cache)})
    assert r.returncode == 0, r.stderr
    cached, path, seconds = r.stdout.split()
    assert cached == "True" and path == info.path
    assert float(seconds) < info.compile_seconds
    assert os.path.getmtime(info.path) == mtime
    # In this process: the same library object.
    assert K.load("test_kernels_native", source=SOURCE,
                  extra_cflags=ISA_FLAGS["native"] + WARN_FLAGS) is lib
    # A different flag is a different build.
    assert K.build_info(lib).key != K.build_info(
        K.load("test_kernels_native", source=SOURCE, extra_cflags=("-DUNUSED_FLAG=1",))).key
    assert not [p for p in os.listdir(cache) if p.startswith(".build-")]  # no leftovers


def test_compile_error_message(cache):
    with pytest.raises(RuntimeError) as e:
        K.load("broken", source="#include <axon/kernel.h>\nAXON_KERNEL(k) { undefined_thing(); }\n")
    msg = str(e.value)
    assert "Error building axon kernel 'broken'" in msg
    assert "undefined_thing" in msg and "error" in msg and "g++" in msg
    assert not [p for p in os.listdir(cache) if p.startswith(".build-")]
    with pytest.raises(ValueError, match="exactly one of sources= .* and source="):
        K.load("x")
    with pytest.raises(FileNotFoundError, match="cannot read source"):
        K.load("x", sources=["/nonexistent/k.cpp"])


def test_undefined_symbol_fails_the_build_not_a_later_load(cache):
    """A library that links but leaves a symbol undefined would load from the cache only to
    fail with an OSError every time: the build fails instead, with the linker's message."""
    src = ("#include <axon/kernel.h>\nextern \"C\" void helper_nobody_defines(void);\n"
           "AXON_KERNEL(k) { (void)ctx; (void)args; helper_nobody_defines(); }\n")
    before = set(os.listdir(cache))
    with pytest.raises(RuntimeError, match="helper_nobody_defines"):
        K.load("undefined_sym", source=src)
    assert set(os.listdir(cache)) == before  # nothing installed, no leftovers


def test_sources_with_the_same_file_name(cache, tmp_path):
    """a/k.cpp and b/k.cpp are two sources, not one compiled twice."""
    for sub, fn in (("a", "fa"), ("b", "fb")):
        (tmp_path / sub).mkdir()
        (tmp_path / sub / "k.cpp").write_text(
            "#include <axon/kernel.h>\nusing namespace axon::kernel;\n"
            f"AXON_KERNEL({fn}) {{ View<float> o = as<float>(args->tensors[0]);\n"
            f"  (void)ctx; o.data()[0] = {1.0 if fn == 'fa' else 2.0}f; }}\n")
    lib = K.load("same_names", sources=[tmp_path / "a" / "k.cpp", tmp_path / "b" / "k.cpp"])
    out = torch.zeros(1, device="axon")
    lib.fa(out, written=(0,))
    assert out.item() == 1.0
    lib.fb(out, written=(0,))
    assert out.item() == 2.0


def test_missing_entry_point(lib):
    with pytest.raises(AttributeError, match="has no entry point 'nope'"):
        lib.nope
    assert lib.function("add_scale") is lib.add_scale
    assert os.path.isfile(os.path.join(K.include_path(), "axon", "kernel.h"))
    assert torch_axon.kernel is K


# ------------------------------------------------------------------ host checks

def test_host_errors(lib):
    x = torch.randn(8, device=DEV)
    with pytest.raises(RuntimeError, match=r"Expected all tensors to be on the same device, but "
                                           r"found at least two devices, axon:0 and cpu! \(when "
                                           r"checking arguments for test_kernels_native::add_scale\)"):
        lib.add_scale(x, torch.randn(8), torch.empty_like(x), floats=(1.0,))
    with pytest.raises(RuntimeError, match=r"axon kernel 'test_kernels_native::add_scale': expected "
                                           r"axon tensors, but got tensors on cpu"):
        lib.add_scale(torch.randn(8), torch.randn(8), torch.randn(8), floats=(1.0,))
    with pytest.raises(RuntimeError, match=r"axon kernel 'k': unsupported dtype ComplexFloat of "
                                           r"tensor 1 \(supported: float32, bfloat16"):
        lib.add_scale(x, torch.randn(8, dtype=torch.complex64, device=DEV), x, floats=(1.0,),
                      name="k")
    with pytest.raises(RuntimeError, match=r"axon kernel 'k': tensor 0 has 9 dimensions; at most 8"):
        lib.add_scale(torch.zeros([1] * 9, device=DEV), name="k")
    with pytest.raises(RuntimeError, match=r"axon kernel 'k': written index 3 is out of range for "
                                           r"3 tensors"):
        lib.add_scale(x, x, x, floats=(1.0,), written=(3,), name="k")
    with pytest.raises(RuntimeError, match=r"axon kernel 'k': expected at least one axon tensor"):
        lib.add_scale(name="k")
    if torch.axon.device_count() > 1:
        with pytest.raises(RuntimeError, match=r"axon:0 and axon:1"):
            lib.add_scale(x, x.to("axon:1"), x, floats=(1.0,))


def test_written_bumps_version(lib):
    x = torch.randn(8, device=DEV)
    out = torch.empty_like(x)
    v = out._version
    lib.add_scale(x, x, out, floats=(1.0,), written=(2,))
    assert out._version == v + 1 and x._version == 0
    # autograd sees the write: a tensor saved for backward then written is an error
    a = torch.randn(8, device=DEV, requires_grad=True)
    b = a * 1
    y = b.sin()  # saves b
    lib.add_scale(x, x, b, floats=(1.0,), written=(2,))
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.sum().backward()


# ------------------------------------------------------------------ async errors, streams

def test_kernel_failure_is_an_async_error_naming_the_op(lib):
    good = torch.tensor([0, 1, 2], device=DEV)
    # The first launch of a signature runs at the call: its failure raises there.
    with pytest.raises(RuntimeError, match=r"'idx::check' failed: index -1 at position 1 is "
                                           r"negative"):
        lib.check_indices(torch.tensor([0, -1, 2], device=DEV), name="idx::check")
    lib.check_indices(good, name="idx::check")  # signature now known: later launches async
    base = torch.arange(6.0, device=DEV)
    base * 2  # (a new signature would drain the stream first, raising the error there)
    bad = torch.tensor([4, 5, -7], device=DEV)
    torch.axon.synchronize()
    s = torch.axon.Stream()
    s.wait_stream(torch.axon.current_stream())
    with torch.axon.stream(s):
        lib.check_indices(bad, name="idx::check")  # returns: the failure is asynchronous
        after = base * 2  # the stream keeps working
    with pytest.raises(RuntimeError) as e:
        s.synchronize()
    msg = str(e.value)
    assert "asynchronous error in 'idx::check'" in msg, msg
    assert f"axon:0 stream {s.stream_id}" in msg and "index -7 at position 2 is negative" in msg
    torch.testing.assert_close(after.cpu(), torch.arange(6.0) * 2)
    with torch.axon.stream(s):
        z = torch.empty(4, device=DEV)
        lib.add_scale(torch.ones(4, device=DEV), torch.ones(4, device=DEV), z, floats=(2.0,))
    s.synchronize()  # reported once
    torch.testing.assert_close(z.cpu(), torch.full((4,), 3.0))


def test_orders_with_other_kernels_on_a_side_stream_and_events(lib):
    n = 1 << 20
    x_cpu = make((n,), torch.float32, seed=11)
    x = x_cpu.to(DEV)
    out = torch.empty(n, device=DEV)
    lib.add_scale(x, x, out, floats=(1.0,), written=(2,))  # first launch: checked at the call
    torch.axon.synchronize()
    s = torch.axon.Stream()
    s.wait_stream(torch.axon.current_stream())
    with torch.axon.stream(s):
        for _ in range(3):
            y = x * 3                   # ATen kernel
            lib.add_scale(y, x, out, floats=(0.5,), written=(2,))   # reads y
            z = out.sqrt_()             # ATen kernel after ours, in place
        done = torch.axon.Event()
        done.record(s)
    torch.axon.current_stream().wait_event(done)
    w = z + 1  # default stream, after the event
    torch.testing.assert_close(w.cpu(), (x_cpu * 3 + 0.5 * x_cpu).sqrt() + 1, equal_nan=True)


# ------------------------------------------------------------------ custom ops

@pytest.fixture(scope="module")
def ops(lib):
    """axon_kernel_test::rms_norm: the rms_norm kernel as a custom op with a fake and a
    backward (PyTorch ops)."""

    @torch.library.custom_op("axon_kernel_test::rms_norm", mutates_args=(), device_types="axon")
    def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
        x2 = x.reshape(-1, x.shape[-1])
        if x2.numel() and x2.stride(-1) != 1:
            x2 = x2.contiguous()
        out = torch.empty(x2.shape, dtype=x.dtype, device=x.device)
        lib.rms_norm(x2, w.contiguous(), out, floats=(eps,), written=(2,),
                     name="axon_kernel_test::rms_norm")
        return out.view(x.shape)

    @rms_norm.register_fake
    def _(x, w, eps):
        return torch.empty_like(x, memory_format=torch.contiguous_format)

    def setup(ctx, inputs, output):
        x, w, eps = inputs
        ctx.save_for_backward(x, w)
        ctx.eps = eps

    def backward(ctx, grad):
        x, w = ctx.saved_tensors
        xf, gf = x.float(), grad.float()
        inv = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + ctx.eps)
        xhat = xf * inv
        gw = gf * w.float()
        gx = inv * (gw - xhat * (gw * xhat).mean(-1, keepdim=True))
        dw = (gf * xhat).reshape(-1, x.shape[-1]).sum(0)
        return gx.to(x.dtype), dw.to(w.dtype), None

    rms_norm.register_autograd(backward, setup_context=setup)
    return {"rms_norm": rms_norm}


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_custom_op_autograd_matches_cpu(ops, dtype):
    x_cpu = make((6, 40), dtype, seed=12).requires_grad_()
    w_cpu = make((40,), dtype, 0.5, 1.5, seed=13).requires_grad_()
    x = x_cpu.detach().to(DEV).requires_grad_()
    w = w_cpu.detach().to(DEV).requires_grad_()
    y = ops["rms_norm"](x, w, 1e-5)
    g = make((6, 40), dtype, seed=14)
    y.backward(g.to(DEV))
    y_ref = F.rms_norm(x_cpu.float(), (40,), w_cpu.float(), eps=1e-5)
    y_ref.backward(g.float())
    t = tol(dtype, accum=True)
    torch.testing.assert_close(y.detach().cpu(), y_ref.detach().to(dtype), **t)
    torch.testing.assert_close(x.grad.cpu(), x_cpu.grad, **t)
    torch.testing.assert_close(w.grad.cpu().float(), w_cpu.grad.float(),
                               **(t if dtype == torch.float32 else dict(rtol=5e-2, atol=5e-2)))


def test_custom_op_under_torch_compile_has_no_graph_break(ops):
    torch._dynamo.reset()
    w = make((64,), torch.float32, 0.5, 1.5, seed=15).to(DEV)

    def f(x):
        return ops["rms_norm"](x * 2, w, 1e-6).relu() + 1

    x = make((8, 64), torch.float32, seed=16).to(DEV)
    explain = torch._dynamo.explain(f)(x)
    assert explain.graph_break_count == 0 and explain.graph_count == 1, explain.break_reasons
    compiled = torch.compile(f, fullgraph=True)
    torch.testing.assert_close(compiled(x).cpu(), f(x).cpu(), atol=0, rtol=0)
    x2 = make((3, 64), torch.float32, seed=17).to(DEV)  # another shape
    torch.testing.assert_close(compiled(x2).cpu(), f(x2).cpu(), atol=0, rtol=0)


def test_custom_op_in_graph_capture_and_profiler(ops):
    w = make((32,), torch.float32, 0.5, 1.5, seed=18).to(DEV)
    x = make((4, 32), torch.float32, seed=19).to(DEV)
    ops["rms_norm"](x, w, 1e-6)  # first launch (checked at the call) before capturing
    torch.axon.synchronize()
    g = torch.axon.AxonGraph()
    with torch.axon.graph(g):
        y = ops["rms_norm"](x, w, 1e-6) * 2
    for seed in (20, 21):
        x_new = make((4, 32), torch.float32, seed=seed)
        x.copy_(x_new)
        g.replay()
        expected = F.rms_norm(x_new, (32,), w.cpu(), eps=1e-6) * 2
        torch.testing.assert_close(y.cpu(), expected, **tol(torch.float32, accum=True))
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]) as prof:
        ops["rms_norm"](x, w, 1e-6).cpu()
    names = [e.name for e in prof.events() if e.device_type == DeviceType.PrivateUse1]
    assert "axon_kernel_test::rms_norm (axon)" in names, names


# ------------------------------------------------------------------ the worked examples

@pytest.mark.parametrize("example", ["scale_bias_gelu", "row_softmax"])
def test_worked_examples(cache, example):
    """examples/kernel_api (docs/kernels.md): each op vs the CPU reference in float32,
    bfloat16 and float16, forward and backward, and compiled (fullgraph) vs eager."""
    import importlib.util

    from conftest import REPO_ROOT
    path = os.path.join(REPO_ROOT, "examples", "kernel_api", example + ".py")
    spec = importlib.util.spec_from_file_location("axon_example_" + example, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    torch._dynamo.reset()
    mod.check()


def test_direct_launch_under_compile_breaks_the_graph(lib):
    """A KernelFunction called directly (not through a custom op) is not traced: Dynamo
    breaks the graph there and runs it eagerly, so the result is still right (and
    fullgraph=True refuses it instead of dropping the launch)."""
    torch._dynamo.reset()
    lib.function("add_scale")  # looked up once (ctypes) outside the compiled code

    def f(x):
        out = torch.empty_like(x)
        lib.add_scale(x * 2, x, out, floats=(1.0,), written=(2,))
        return out + 1

    x = make((100,), torch.float32, seed=22)
    xa = x.to(DEV)
    explain = torch._dynamo.explain(f)(xa)
    assert explain.graph_break_count == 1
    assert "_launch_kernel" in str(explain.break_reasons[0].reason)
    torch.testing.assert_close(torch.compile(f)(xa).cpu(), 3 * x + 1)
    torch._dynamo.reset()
    with pytest.raises(Exception, match="_launch_kernel"):
        torch.compile(f, fullgraph=True)(xa)


def test_concurrent_builds_install_once(tmp_path):
    """Processes building the same new kernel at once each get a working library; one
    directory is installed and no temporary ones are left."""
    import subprocess
    import sys
    code = textwrap.dedent("""
        import sys, torch, torch_axon.kernel as K
        lib = K.load("race", source=sys.argv[1])
        x = torch.arange(5.0, device="axon"); out = torch.empty_like(x)
        lib.scale(x, out, floats=(3.0,), written=(1,))
        print(out.tolist())
    """)
    from conftest import REPO_ROOT
    with open(os.path.join(REPO_ROOT, "examples", "kernel_api", "scale.cpp")) as f:
        src = f.read()
    env = dict(os.environ, AXON_KERNEL_CACHE=str(tmp_path))
    procs = [subprocess.Popen([sys.executable, "-c", code, src], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(3)]
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        assert out.strip() == str([0.0, 3.0, 6.0, 9.0, 12.0])
    entries = os.listdir(tmp_path)
    assert len(entries) == 1 and not entries[0].startswith("."), entries
    assert sorted(os.listdir(tmp_path / entries[0])) == ["librace.so", "race.cpp"]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_contiguous_as_fake(dtype):
    """The strides and dtype a fake's torch.empty(shape) has, from transposed, size-1-dim
    (contiguous but with other strides), zero-size and already-dense inputs; values equal
    the CPU's conversion; an input that already matches is returned itself."""
    from torch_axon.kernel import contiguous_as_fake

    cpu = torch.randn(5, 1, 7).to(dtype)
    cases = [cpu.transpose(0, 2), cpu.as_strided((5, 1, 7), (7, 1, 1)), cpu[:0], cpu]
    for c in cases:
        t = torch.empty_strided(c.shape, c.stride(), dtype=dtype, device="axon").copy_(c)
        for want in (None, torch.float32):
            got = contiguous_as_fake(t, want)
            fake = torch.empty(t.shape, dtype=want or dtype)
            assert got.dtype == fake.dtype and got.stride() == fake.stride()
            assert torch.equal(got.cpu(), c.to(fake.dtype))
    dense = torch.randn(3, 4, device="axon", dtype=dtype)
    assert contiguous_as_fake(dense) is dense



# ------------------------------------------------------------------ native ops (lib.op)

@pytest.fixture(scope="module")
def native(lib):
    """The test kernels registered as native ops: the dispatcher calls C++ directly."""
    return {
        "add_scale": lib.op("axon_native_test::add_scale(Tensor x, Tensor y, float alpha) -> Tensor",
                            shape="add_scale_shape"),
        "row_stats": lib.op("axon_native_test::row_stats(Tensor x, Tensor? bias, int[] dims, "
                            "bool negate) -> (Tensor, Tensor)", shape="row_stats_shape"),
        "add_": lib.op("axon_native_test::add_(Tensor(a!) x, float v) -> ()", kernel="add_inplace"),
    }


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("layout", ["contiguous", "transposed", "sliced", "expanded", "zero_size"])
def test_native_op_matches_cpu(native, dtype, layout):
    x_cpu, x = layout_pair(layout, dtype, rows=37, cols=45, seed=31)
    y_cpu, y = layout_pair(layout if layout != "expanded" else "sliced", dtype, rows=37, cols=45,
                           seed=32)
    out = native["add_scale"](x, y, 0.75)
    assert out.device == x.device and out.dtype == dtype and out.shape == x.shape
    assert out.is_contiguous()
    expected = (x_cpu.float() + 0.75 * y_cpu.float()).to(dtype)
    torch.testing.assert_close(out.cpu(), expected, **tol(dtype))


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("with_bias", [True, False])
@pytest.mark.parametrize("layout", ["contiguous", "transposed", "zero_size"])
def test_native_op_multiple_outputs_optional_and_list_arguments(native, dtype, with_bias, layout):
    x_cpu, x = layout_pair(layout, dtype, rows=9, cols=13, seed=33)
    b_cpu = make((x.shape[1],), dtype, seed=34)
    bias = b_cpu.to(DEV) if with_bias else None
    y, s = native["row_stats"](x, bias, [2, 5, 7], True)
    y_ref = -(x_cpu + b_cpu) if with_bias else -x_cpu
    torch.testing.assert_close(y.cpu(), y_ref, **tol(dtype))
    assert s.dtype == torch.float32 and s.shape == (x.shape[0],)
    torch.testing.assert_close(s.cpu(), y_ref.float().sum(1), **tol(torch.float32, accum=True))
    y2, _ = native["row_stats"](x, bias, [], False)  # an empty list, negate off
    torch.testing.assert_close(y2.cpu(), -y_ref, **tol(dtype))


def test_native_op_writes_in_place_and_bumps_the_version(native):
    x = torch.zeros(5, device=DEV)
    v = x._version
    assert native["add_"](x, 2.0) is None
    assert x._version == v + 1
    torch.testing.assert_close(x.cpu(), torch.full((5,), 2.0), atol=0, rtol=0)
    # torch.compile functionalizes the mutation and writes it back
    torch._dynamo.reset()
    f = torch.compile(lambda t: (native["add_"](t, 1.0), t * 2)[1], fullgraph=True)
    t = torch.zeros(3, device=DEV)
    torch.testing.assert_close(f(t).cpu(), torch.full((3,), 2.0), atol=0, rtol=0)
    torch.testing.assert_close(t.cpu(), torch.ones(3), atol=0, rtol=0)
    # a kernel's fail(): at the call the first time a signature is seen
    with pytest.raises(RuntimeError, match=r"'axon_native_test::add_' failed: add_: v must be >= 0"):
        native["add_"](x, -1.0)


def test_native_op_errors(lib, native):
    x = torch.ones(4, 3, device=DEV)
    # the output rule's checks raise at the call, before anything is launched
    with pytest.raises(RuntimeError, match="add_scale: x and y must have one shape"):
        native["add_scale"](x, torch.ones(3, 4, device=DEV), 1.0)
    with pytest.raises(RuntimeError, match="add_scale: expected float32, bfloat16 or float16"):
        native["add_scale"](x.double(), x.double(), 1.0)
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device, but "
                                           "found at least two devices, axon:0 and cpu"):
        native["add_scale"](x, torch.ones(4, 3), 1.0)
    with pytest.raises(NotImplementedError, match="Could not run 'axon_native_test::add_scale' "
                                                  "with arguments from the 'CPU' backend"):
        native["add_scale"](torch.ones(2), torch.ones(2), 1.0)
    forgot = lib.op("axon_native_test::forgets(Tensor x) -> (Tensor, Tensor)", kernel="add_scale",
                    shape="forgets_an_output")
    with pytest.raises(RuntimeError, match="the shape function gave output 1 ndim -1"):
        forgot(x)
    # unsupported schemas are refused and leave no op behind
    with pytest.raises(RuntimeError, match="argument 's' has type str; supported argument types"):
        lib.op("axon_native_test::bad(Tensor x, str s) -> Tensor", kernel="add_scale")
    with pytest.raises(RuntimeError, match="operator axon_native_test::bad does not exist"):
        torch._C._dispatch_has_kernel_for_dispatch_key("axon_native_test::bad", "PrivateUse1")
    lib.op("axon_native_test::bad(Tensor x, Tensor y, float s) -> Tensor", kernel="add_scale")
    with pytest.raises(RuntimeError, match="returns: Tensor"):
        lib.op("axon_native_test::bad2(Tensor(a!) x) -> Tensor(a!)", kernel="add_scale")
    with pytest.raises(RuntimeError, match="already defined with schema"):
        lib.op("axon_native_test::add_scale(Tensor x, Tensor y) -> Tensor", kernel="add_scale")
    with pytest.raises(AttributeError, match="has no entry point 'nope'"):
        lib.op("axon_native_test::nope(Tensor x) -> Tensor")


def test_native_op_meta_compile_and_autograd(lib, native):
    add_scale = native["add_scale"]
    m = add_scale(torch.empty(3, 4, device="meta"), torch.empty(3, 4, device="meta"), 2.0)
    assert m.device.type == "meta" and m.shape == (3, 4)
    x_cpu, y_cpu = make((8, 16), torch.float32, seed=35), make((8, 16), torch.float32, seed=36)
    x, y = x_cpu.to(DEV), y_cpu.to(DEV)

    def f(a, b):
        return add_scale(a * 2, b, 0.5).relu() + 1

    torch._dynamo.reset()
    explain = torch._dynamo.explain(f)(x, y)
    assert explain.graph_break_count == 0 and explain.graph_count == 1, explain.break_reasons
    compiled = torch.compile(f, fullgraph=True)
    torch.testing.assert_close(compiled(x, y).cpu(), f(x, y).cpu(), atol=0, rtol=0)
    dyn = torch.compile(f, fullgraph=True, dynamic=True)  # symbolic sizes are specialised
    for rows in (3, 5):
        a, b = make((rows, 16), torch.float32, seed=rows).to(DEV), torch.ones(rows, 16, device=DEV)
        torch.testing.assert_close(dyn(a, b).cpu(), f(a, b).cpu(), atol=0, rtol=0)

    # autograd through a backward registered from Python
    def setup(ctx, inputs, output):
        ctx.alpha = inputs[2]

    def backward(ctx, grad):
        return grad, grad * ctx.alpha, None

    torch.library.register_autograd("axon_native_test::add_scale", backward, setup_context=setup)
    xg, yg = x.clone().requires_grad_(), y.clone().requires_grad_()
    g = make((8, 16), torch.float32, seed=37)
    add_scale(xg, yg, 0.5).backward(g.to(DEV))
    xc, yc = x_cpu.clone().requires_grad_(), y_cpu.clone().requires_grad_()
    (xc + 0.5 * yc).backward(g)
    torch.testing.assert_close(xg.grad.cpu(), xc.grad, atol=0, rtol=0)
    torch.testing.assert_close(yg.grad.cpu(), yc.grad, atol=0, rtol=0)


def test_native_op_streams_graph_capture_and_profiler(native):
    add_scale = native["add_scale"]
    n = 1 << 18
    x_cpu = make((n,), torch.float32, seed=38)
    x = x_cpu.to(DEV)
    add_scale(x, x, 1.0)
    torch.axon.synchronize()
    s = torch.axon.Stream()
    s.wait_stream(torch.axon.current_stream())
    with torch.axon.stream(s):
        y = x * 3
        out = add_scale(y, x, 0.5)  # on s, after y
        z = out.sqrt()
        done = torch.axon.Event()
        done.record(s)
    torch.axon.current_stream().wait_event(done)
    torch.testing.assert_close((z + 1).cpu(), (x_cpu * 3 + 0.5 * x_cpu).sqrt() + 1,
                               equal_nan=True)
    a = make((64,), torch.float32, seed=39).to(DEV)
    add_scale(a, a, 2.0)
    torch.axon.synchronize()
    g = torch.axon.AxonGraph()
    with torch.axon.graph(g):
        r = add_scale(a, a, 2.0) * 2
    for seed in (40, 41):
        new = make((64,), torch.float32, seed=seed)
        a.copy_(new)
        g.replay()
        torch.testing.assert_close(r.cpu(), (new + 2.0 * new) * 2, atol=0, rtol=0)
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]) as prof:
        add_scale(a, a, 1.0).cpu()
    names = [e.name for e in prof.events() if e.device_type == DeviceType.PrivateUse1]
    assert "axon_native_test::add_scale (axon)" in names, names


def test_native_op_outputs_are_new_tensors_and_none_has_no_elements(lib, native):
    x = torch.ones(4, device=DEV)
    out = native["add_scale"](x, x, 1.0)
    assert out._version == 0 and x._version == 0  # only Tensor(a!) arguments are bumped
    probe = lib.op("axon_native_test::none_probe(Tensor? a, Tensor x) -> Tensor",
                   shape="none_probe_shape")
    assert probe(None, x).cpu().tolist() == [0, 0, 1]
    assert probe(torch.ones(2, 3, device=DEV), x).cpu().tolist() == [1, 6, 2]
    with pytest.raises(AttributeError, match=r"no entry point 'nope_shape' \(define it with "
                                             r"AXON_SHAPE\(nope_shape\)"):
        lib.op("axon_native_test::nope2(Tensor x) -> Tensor", kernel="add_scale",
               shape="nope_shape")
    # the same schema spelled differently is the same op
    again = lib.op("axon_native_test::add_scale( Tensor x,Tensor y, float alpha)->Tensor",
                   shape="add_scale_shape")
    torch.testing.assert_close(again(x, x, 2.0).cpu(), torch.full((4,), 3.0), atol=0, rtol=0)


def test_native_op_reregistration_while_another_thread_calls_it(lib):
    """A re-registration replaces the kernel for later calls; calls in flight on another
    thread finish with the one they started with (no freed state, no window without one)."""
    import threading
    schema = "axon_native_test::swap(Tensor x, Tensor y, float alpha) -> Tensor"
    op = lib.op(schema, kernel="add_scale", shape="add_scale_shape")
    x = torch.full((64,), 2.0, device=DEV)
    y = torch.ones(64, device=DEV)
    seen, errors, stop = set(), [], threading.Event()

    def caller():
        try:
            while not stop.is_set():
                seen.add(float(op(x, y, 1.0)[0]))
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    t = threading.Thread(target=caller)
    t.start()
    try:
        for i in range(400):
            lib.op(schema, kernel="sub_scale" if i % 2 == 0 else "add_scale",
                   shape="add_scale_shape")
    finally:
        stop.set()
        t.join()
    assert not errors, errors
    assert seen <= {3.0, 1.0} and seen, seen  # add_scale's 2 + 1, sub_scale's 2 - 1
    lib.op(schema, kernel="sub_scale", shape="add_scale_shape")
    assert float(op(x, y, 1.0)[0]) == 1.0


def test_native_op_without_output_rule_keeps_sizes_symbolic(lib):
    from torch._dynamo.testing import CompileCounterWithBackend
    like = lib.op("axon_native_test::like_x(Tensor x, Tensor y, float alpha) -> Tensor",
                  kernel="add_scale")
    torch._dynamo.reset()
    counter = CompileCounterWithBackend("inductor")
    f = torch.compile(lambda a: like(a, a, 0.5) * 2, backend=counter, dynamic=True,
                      fullgraph=True)
    for n in (5, 9, 17):
        a = make((n, 3), torch.float32, seed=n).to(DEV)
        torch.testing.assert_close(f(a).cpu(), a.cpu() * 1.5 * 2, atol=0, rtol=0)
    assert counter.frame_count == 1, counter.frame_count
