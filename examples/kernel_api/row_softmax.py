"""Worked example 2 (docs/kernels.md): row softmax with reductions, as a PyTorch op.

    y = softmax(x, dim=-1)

The kernel (row_softmax.cpp) shows what a row-wise kernel needs: strided rows, a max and a
sum reduction with partial tails (load_partial with a fill value), exp, and per-chunk
scratch memory.  Registered with a fake implementation and a backward (a second kernel),
so it works under autograd and torch.compile (one extern kernel, no graph break).

Run: python examples/kernel_api/row_softmax.py
"""

from __future__ import annotations

import pathlib
import time

import torch

import torch_axon.kernel as K

HERE = pathlib.Path(__file__).resolve().parent
lib = K.load("row_softmax", sources=[HERE / "row_softmax.cpp"])


def _rows(t: torch.Tensor) -> torch.Tensor:
    """t as (rows, cols) with a contiguous last dim (a view when possible)."""
    t2 = t.reshape(-1, t.shape[-1]) if t.dim() != 2 else t
    return t2 if t2.shape[-1] <= 1 or t2.stride(-1) == 1 else t2.contiguous()


@torch.library.custom_op("axon_examples::row_softmax", mutates_args=(), device_types="axon")
def row_softmax(x: torch.Tensor) -> torch.Tensor:
    x2 = _rows(x)
    y = torch.empty(x2.shape, dtype=x.dtype, device=x.device)
    lib.row_softmax(x2, y, written=(1,), name="axon_examples::row_softmax")
    return y.view(x.shape)


@row_softmax.register_fake
def _(x):
    return torch.empty_like(x, memory_format=torch.contiguous_format)


@torch.library.custom_op("axon_examples::row_softmax_backward", mutates_args=(),
                         device_types="axon")
def row_softmax_backward(grad: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    g2, y2 = _rows(grad), _rows(y)
    gx = torch.empty(y2.shape, dtype=y.dtype, device=y.device)
    lib.row_softmax_backward(g2, y2, gx, written=(2,), name="axon_examples::row_softmax_backward")
    return gx.view(y.shape)


@row_softmax_backward.register_fake
def _(grad, y):
    return torch.empty_like(y, memory_format=torch.contiguous_format)


def _setup_context(ctx, inputs, output):
    ctx.save_for_backward(output)


def _backward(ctx, grad):
    (y,) = ctx.saved_tensors
    return row_softmax_backward(grad, y)


row_softmax.register_autograd(_backward, setup_context=_setup_context)


def check(device="axon"):
    """The op vs the CPU reference (float32, bfloat16, float16; strided rows, a zero-size
    input), its gradient, and torch.compile(fullgraph=True) vs eager."""
    tols = {torch.float32: 1e-5, torch.bfloat16: 2e-2, torch.float16: 2e-3}
    for dtype, tol in tols.items():
        for rows, cols in ((13, 77), (0, 16), (3, 1)):
            g = torch.Generator().manual_seed(rows * cols)
            base = (torch.randn(rows, cols + 5, generator=g) * 4).to(dtype)
            x = base[:, :cols].requires_grad_()  # strided rows
            xa = base.to(device)[:, :cols].requires_grad_()
            gy = torch.randn(rows, cols, generator=g).to(dtype)
            y = row_softmax(xa)
            y.backward(gy.to(device))
            y_ref = torch.softmax(x.float(), -1)
            y_ref.backward(gy.float())
            torch.testing.assert_close(y.detach().cpu(), y_ref.detach().to(dtype), rtol=tol, atol=tol)
            torch.testing.assert_close(xa.grad.cpu(), x.grad, rtol=tol, atol=tol)
    x = torch.randn(8, 50, device=device)
    f = lambda t: row_softmax(t * 3).sum(0)  # noqa: E731
    compiled = torch.compile(f, fullgraph=True)
    torch.testing.assert_close(compiled(x).cpu(), f(x).cpu())


def bench(fn, reps=50):
    for _ in range(20):  # past the first launches (checks at the call, thread-policy trials)
        fn()
    torch.axon.synchronize()
    t = time.perf_counter()
    for _ in range(reps):
        fn()
    torch.axon.synchronize()
    return (time.perf_counter() - t) / reps * 1e6


def main():
    info = K.build_info(lib)
    print(f"JIT build: {'warm (cached)' if info.cached else 'cold'}, "
          f"compile {info.compile_seconds * 1e3:.0f} ms, load() {info.total_seconds * 1e3:.1f} ms")
    check()
    print("matches the CPU reference (fp32/bf16/fp16, strided, zero-size, forward and backward); "
          "torch.compile(fullgraph=True) == eager")
    for dtype in (torch.float32, torch.bfloat16):
        x = torch.randn(4096, 1000, device="axon", dtype=dtype)
        eager = bench(lambda: torch.softmax(x, -1))
        kernel = bench(lambda: row_softmax(x))
        print(f"{dtype}: torch.softmax {eager:.0f} us, kernel {kernel:.0f} us ({eager / kernel:.2f}x)")


if __name__ == "__main__":
    main()
