"""torch_axon.tile (issue 20): row-wise kernels written in Python, lowered to <axon/kernel.h>
C++ and registered as native ops. Each kernel is compared with the same math in float32 on
the CPU (the tile kernels compute in float32 and round each output once), across float32,
bfloat16 and float16, contiguous, strided, 3-D and zero-size inputs; errors at tracing and at
the call; torch.compile."""

import pytest
import torch
import torch.nn.functional as F

import torch_axon.tile as tl
from conftest import FLOAT_DTYPES, make

DEV = "axon"


@pytest.fixture(scope="module")
def ops():
    @tl.kernel("axon_tile_test::rms_norm(Tensor x, Tensor w, float eps) -> Tensor")
    def rms_norm(x, w, eps):
        return x * tl.rsqrt(tl.mean(x * x) + eps) * w

    @tl.kernel("axon_tile_test::layer_norm(Tensor x, Tensor w, Tensor b, float eps) -> Tensor")
    def layer_norm(x, w, b, eps):
        m = tl.mean(x)
        return (x - m) * tl.rsqrt(tl.mean((x - m) ** 2) + eps) * w + b

    @tl.kernel("axon_tile_test::softmax_relu(Tensor x) -> (Tensor, Tensor)")
    def softmax_relu(x):
        e = tl.exp(x - tl.max(x))
        return e / tl.sum(e), tl.maximum(x, 0.0)

    @tl.kernel("axon_tile_test::mix(Tensor x, Tensor y, int k, float a) -> Tensor")
    def mix(x, y, k, a):
        # reverse operators, unary functions, an int argument, min over the row
        gelu = 0.5 * x * (1 + tl.tanh(0.7978845608 * (x + 0.044715 * x * x * x)))
        return (1 - tl.sigmoid(y)) * gelu / (2 + tl.abs(x)) + tl.erf(-x) * k \
            + tl.minimum(x, y) * a - tl.sqrt(tl.abs(y)) + tl.min(x) - tl.exp(y) ** 1

    return dict(rms_norm=rms_norm, layer_norm=layer_norm, softmax_relu=softmax_relu, mix=mix)


def _mix_ref(x, y, k, a):
    x, y = x.float(), y.float()
    gelu = 0.5 * x * (1 + torch.tanh(0.7978845608 * (x + 0.044715 * x * x * x)))
    return ((1 - torch.sigmoid(y)) * gelu / (2 + x.abs()) + torch.erf(-x) * k
            + torch.minimum(x, y) * a - y.abs().sqrt() + x.amin(-1, keepdim=True) - y.exp())


def _layouts(shape, dtype, seed):
    """(name, cpu, axon) of one tensor's values in several layouts."""
    base = make(shape, dtype, seed=seed)
    yield "contiguous", base, base.to(DEV)
    t = make(shape[::-1], dtype, seed=seed).to(DEV).permute(*range(len(shape) - 1, -1, -1))
    yield "transposed", t.cpu(), t
    s = make(shape[:-1] + (2 * shape[-1],), dtype, seed=seed).to(DEV)[..., ::2]
    yield "column-strided", s.cpu(), s


# the outputs are rounded once from float32; bf16/fp16: one rounding of the dtype
def _tol(dtype):
    return {torch.float32: dict(rtol=1e-5, atol=1e-5), torch.bfloat16: dict(rtol=1.6e-2, atol=1e-2),
            torch.float16: dict(rtol=2e-3, atol=2e-3)}[dtype]


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("shape", [(8, 100), (3, 5, 37), (4, 1), (2, 16), (0, 7), (6, 0)])
def test_norms_and_softmax_match_float32_cpu(ops, dtype, shape):
    w = make((shape[-1],), dtype, 0.5, 1.5, seed=2)
    b = make((shape[-1],), dtype, seed=3)
    for layout, x_cpu, x in _layouts(shape, dtype, 1):
        xf = x_cpu.float()
        y = ops["rms_norm"](x, w.to(DEV), 1e-6)
        assert y.dtype == dtype and y.shape == x.shape and y.is_contiguous(), layout
        torch.testing.assert_close(
            y.cpu(), F.rms_norm(xf, (shape[-1],), w.float(), 1e-6).to(dtype), **_tol(dtype))
        torch.testing.assert_close(
            ops["layer_norm"](x, w.to(DEV), b.to(DEV), 1e-5).cpu(),
            F.layer_norm(xf, (shape[-1],), w.float(), b.float(), 1e-5).to(dtype), **_tol(dtype))
        s, r = ops["softmax_relu"](x)
        torch.testing.assert_close(s.cpu(), torch.softmax(xf, -1).to(dtype), **_tol(dtype))
        torch.testing.assert_close(r.cpu(), x_cpu.clamp_min(0), atol=0, rtol=0)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_elementwise_functions_scalars_and_row_tensors(ops, dtype):
    x_cpu = make((5, 70), dtype, seed=4)
    y_cpu = make((5, 70), dtype, seed=5)
    got = ops["mix"](x_cpu.to(DEV), y_cpu.to(DEV), 3, -0.25)
    torch.testing.assert_close(got.cpu(), _mix_ref(x_cpu, y_cpu, 3, -0.25).to(dtype),
                               **_tol(dtype))
    # y as a row: one 1-D tensor of the last dim's size, broadcast over the rows (strided)
    row = make((140,), dtype, seed=6).to(DEV)[::2]
    got = ops["mix"](x_cpu.to(DEV), row, 0, 1.0)
    torch.testing.assert_close(got.cpu(), _mix_ref(x_cpu, row.cpu().expand(5, 70), 0, 1.0).to(dtype),
                               **_tol(dtype))


def test_errors_at_the_call(ops):
    x = torch.randn(4, 8, device=DEV)
    with pytest.raises(RuntimeError, match="axon_tile_test::rms_norm: every tensor must have the "
                                           "first tensor's shape, or be 1-D"):
        ops["rms_norm"](x, torch.ones(7, device=DEV), 1e-6)
    with pytest.raises(RuntimeError, match="every tensor must have the first tensor's dtype"):
        ops["rms_norm"](x, torch.ones(8, device=DEV, dtype=torch.bfloat16), 1e-6)
    with pytest.raises(RuntimeError, match="expected float32, bfloat16 or float16"):
        ops["rms_norm"](x.double(), torch.ones(8, device=DEV).double(), 1e-6)
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        ops["rms_norm"](x, torch.ones(8), 1e-6)


def test_errors_at_tracing():
    with pytest.raises(TypeError, match="argument 'n' has type List\\[int\\]"):
        tl.kernel("axon_tile_test::bad1(Tensor x, int[] n) -> Tensor")(lambda x, n: x)
    with pytest.raises(TypeError, match="returns 2 value"):
        tl.kernel("axon_tile_test::bad2(Tensor x) -> Tensor")(lambda x: (x, x))
    with pytest.raises(TypeError, match="no truth value"):
        tl.kernel("axon_tile_test::bad3(Tensor x) -> Tensor")(lambda x: x if x else -x)
    with pytest.raises(TypeError, match="\\*\\* 3"):
        tl.kernel("axon_tile_test::bad4(Tensor x) -> Tensor")(lambda x: x ** 3)
    with pytest.raises(TypeError, match="of a per-row value"):
        tl.kernel("axon_tile_test::bad5(Tensor x) -> Tensor")(lambda x: tl.sum(tl.sum(x)))
    with pytest.raises(TypeError, match="not str"):
        tl.kernel("axon_tile_test::bad6(Tensor x) -> Tensor")(lambda x: x + "1")


def test_compiled_equals_eager_and_the_source_is_readable(ops):
    w = make((64,), torch.float32, 0.5, 1.5, seed=7).to(DEV)

    def f(x):
        return ops["rms_norm"](x * 2, w, 1e-6) + 1

    torch._dynamo.reset()
    compiled = torch.compile(f, fullgraph=True)
    for rows in (3, 9):
        x = make((rows, 64), torch.float32, seed=rows).to(DEV)
        torch.testing.assert_close(compiled(x).cpu(), f(x).cpu(), atol=0, rtol=0)
    src = ops["rms_norm"].source
    assert "parallel_for" in src and "AXON_SHAPE" in src and "reduce_sum" in src


def test_dynamic_shapes_compile_once(ops):
    from torch._dynamo.testing import CompileCounterWithBackend
    w = make((32,), torch.float32, 0.5, 1.5, seed=8).to(DEV)
    torch._dynamo.reset()
    counter = CompileCounterWithBackend("inductor")
    f = torch.compile(lambda x: ops["rms_norm"](x, w, 1e-6) + 1, backend=counter, dynamic=True,
                      fullgraph=True)
    for rows in (2, 5, 11):
        x = make((rows, 32), torch.float32, seed=rows).to(DEV)
        torch.testing.assert_close(f(x).cpu(), (ops["rms_norm"](x, w, 1e-6) + 1).cpu(),
                                   atol=0, rtol=0)
    assert counter.frame_count == 1, counter.frame_count
