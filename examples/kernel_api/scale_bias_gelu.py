"""Worked example 1 (docs/kernels.md): a fused scale + bias + GELU kernel as a PyTorch op.

    y = gelu(x * scale + bias)      (bias over the last dim; exact, erf-based GELU)

The kernel (scale_bias_gelu.cpp) reads x once and writes y once; eager PyTorch runs three
kernels (mul, add, gelu) with two intermediate tensors.  The op has a fake implementation
(shapes for torch.compile) and a backward (a second kernel), so it works under autograd,
torch.compile (one extern kernel, no graph break) and torch.axon.graph.

Run: python examples/kernel_api/scale_bias_gelu.py
"""

from __future__ import annotations

import pathlib
import time

import torch
import torch.nn.functional as F

import torch_axon.kernel as K

HERE = pathlib.Path(__file__).resolve().parent
lib = K.load("scale_bias_gelu", sources=[HERE / "scale_bias_gelu.cpp"])


@torch.library.custom_op("axon_examples::scale_bias_gelu", mutates_args=(), device_types="axon")
def scale_bias_gelu(x: torch.Tensor, bias: torch.Tensor, scale: float) -> torch.Tensor:
    x2 = x.reshape(-1, x.shape[-1]).contiguous()
    y = torch.empty_like(x2)  # from the caching allocator, on the current stream
    lib.scale_bias_gelu(x2, bias.contiguous(), y, floats=(scale,), written=(2,),
                        name="axon_examples::scale_bias_gelu")
    return y.view(x.shape)


@scale_bias_gelu.register_fake
def _(x, bias, scale):
    torch._check(bias.dim() == 1 and bias.shape[0] == x.shape[-1],
                 lambda: "scale_bias_gelu: bias must have x.shape[-1] elements")
    return torch.empty_like(x, memory_format=torch.contiguous_format)


@torch.library.custom_op("axon_examples::scale_bias_gelu_backward", mutates_args=(),
                         device_types="axon")
def scale_bias_gelu_backward(grad: torch.Tensor, x: torch.Tensor, bias: torch.Tensor,
                             scale: float) -> torch.Tensor:
    """grad * gelu'(x * scale + bias)"""
    cols = x.shape[-1]
    x2 = x.reshape(-1, cols).contiguous()
    gz = torch.empty_like(x2)
    lib.scale_bias_gelu_backward(grad.reshape(-1, cols).contiguous(), x2, bias.contiguous(), gz,
                                 floats=(scale,), written=(3,),
                                 name="axon_examples::scale_bias_gelu_backward")
    return gz.view(x.shape)


@scale_bias_gelu_backward.register_fake
def _(grad, x, bias, scale):
    return torch.empty_like(x, memory_format=torch.contiguous_format)


def _setup_context(ctx, inputs, output):
    x, bias, scale = inputs
    ctx.save_for_backward(x, bias)
    ctx.scale = scale


def _backward(ctx, grad):
    x, bias = ctx.saved_tensors
    gz = scale_bias_gelu_backward(grad, x, bias, ctx.scale)
    grad_bias = gz.reshape(-1, x.shape[-1]).float().sum(0).to(bias.dtype)
    return gz * ctx.scale, grad_bias, None


scale_bias_gelu.register_autograd(_backward, setup_context=_setup_context)


def reference(x, bias, scale):
    """The same computation in PyTorch ops (float32, then x's dtype)."""
    return F.gelu(x.float() * scale + bias.float()).to(x.dtype)


def check(device="axon", rows=37, cols=200):
    """The op vs the CPU reference (float32, bfloat16, float16), its gradients, and
    torch.compile(fullgraph=True) vs eager."""
    tols = {torch.float32: 1e-5, torch.bfloat16: 2e-2, torch.float16: 2e-3}
    for dtype, tol in tols.items():
        g = torch.Generator().manual_seed(0)
        x = (torch.randn(rows, cols, generator=g) * 2).to(dtype).requires_grad_()
        bias = torch.randn(cols, generator=g).to(dtype).requires_grad_()
        gy = torch.randn(rows, cols, generator=g).to(dtype)
        xa = x.detach().to(device).requires_grad_()
        ba = bias.detach().to(device).requires_grad_()
        y = scale_bias_gelu(xa, ba, 0.5)
        y.backward(gy.to(device))
        y_ref = reference(x, bias, 0.5)
        y_ref.float().backward(gy.float())
        torch.testing.assert_close(y.detach().cpu(), y_ref.detach(), rtol=tol, atol=tol)
        torch.testing.assert_close(xa.grad.cpu(), x.grad, rtol=tol, atol=tol)
        torch.testing.assert_close(ba.grad.cpu().float(), bias.grad.float(), rtol=4 * tol,
                                   atol=4 * tol * rows)
    x = torch.randn(8, cols, device=device)
    bias = torch.randn(cols, device=device)
    f = lambda t: scale_bias_gelu(t * 2, bias, 0.5).sum(-1)  # noqa: E731
    compiled = torch.compile(f, fullgraph=True)  # fullgraph: a graph break would raise
    torch.testing.assert_close(compiled(x).cpu(), f(x).cpu())


def bench(fn, *args, reps=50):
    for _ in range(20):  # past the first launches (checks at the call, thread-policy trials)
        fn(*args)
    torch.axon.synchronize()
    t = time.perf_counter()
    for _ in range(reps):
        fn(*args)
    torch.axon.synchronize()
    return (time.perf_counter() - t) / reps * 1e6


def main():
    info = K.build_info(lib)
    print(f"JIT build: {'warm (cached)' if info.cached else 'cold'}, "
          f"compile {info.compile_seconds * 1e3:.0f} ms, load() {info.total_seconds * 1e3:.1f} ms")
    check()
    print("matches the CPU reference (fp32/bf16/fp16, forward and backward); "
          "torch.compile(fullgraph=True) == eager")
    for dtype in (torch.float32, torch.bfloat16):
        x = torch.randn(2048, 1024, device="axon", dtype=dtype)
        bias = torch.randn(1024, device="axon", dtype=dtype)
        eager = bench(lambda: F.gelu(x * 0.5 + bias))
        fused = bench(lambda: scale_bias_gelu(x, bias, 0.5))
        print(f"{dtype}: eager {eager:.0f} us, kernel {fused:.0f} us ({eager / fused:.2f}x)")


if __name__ == "__main__":
    main()
