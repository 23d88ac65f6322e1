"""Generic stream kernels (csrc/aten/GenericKernel.cpp) lay their results out as the CPU does.

The generic kernel allocates a result with the geometry its Meta kernel computes, then runs
the CPU kernel into it. Where a Meta kernel's layout differs from the CPU kernel's (some are
Python decompositions that make dense results), the strides a program sees would differ,
and with them whether a later reshape is a view (found by the fuzzer: floor_divide of a
transposed input, then flatten, then an in-place write). This test runs every generic
kernel's default overload that takes one or two tensors (and nothing else required) on a
transposed and a contiguous input, on the CPU and on axon, and compares the results'
strides and values.
"""

from __future__ import annotations

import warnings

import pytest
import torch

from conftest import assert_same

import torch_axon  # noqa: F401
from torch_axon import _C


def _generic_ops():
    names = sorted({r[0] for r in _C._op_table()
                    if r[2] == "generic stream kernel" and r[1] == "PrivateUse1"})
    ops = []
    for name in names:
        qualified = name if "::" in name else "aten::" + name
        ns, _, rest = qualified.partition("::")
        opname, _, overload = rest.partition(".")
        if overload or opname.endswith("_"):
            continue  # out=, in-place and other overloads: their layout is the caller's
        packet = getattr(getattr(torch.ops, ns), opname, None)
        if packet is None:
            continue
        op = packet.default
        args = op._schema.arguments
        tensors = [a for a in args if str(a.type) == "Tensor"]
        required = [a for a in args if not a.has_default_value()]
        if not tensors or len(tensors) > 2 or any(str(a.type) != "Tensor" for a in required):
            continue
        ops.append(pytest.param(op, len([a for a in required if str(a.type) == "Tensor"]),
                                id=qualified))
    return ops


# Inputs of the wrong shape for the op, which the CPU kernel does not check (it returns
# uninitialised values where axon's Meta kernel sizes the result and refuses):
UNCHECKED = {"aten::_weight_norm_interface"}
OPS = [p for p in _generic_ops() if p.id not in UNCHECKED]


def test_the_class_is_covered():
    # the ops whose Meta layout was wrong are among those checked
    ids = {p.id for p in OPS}
    assert {"aten::floor_divide", "aten::hardswish_backward"} <= ids
    assert len(OPS) > 30


@pytest.mark.parametrize("op,n", OPS)
def test_result_strides_match_cpu(op, n):
    def inputs(device):
        g = torch.Generator().manual_seed(0)
        a = (torch.rand(4, 2, generator=g) + 0.5).t()  # transposed
        b = torch.rand(2, 4, generator=g) + 0.5
        x = [a.to(device), b.to(device)][:n]
        assert x[0].stride() == (1, 2)  # .to keeps a dense layout
        return x

    results = {}
    for device in ("cpu", "axon"):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                results[device] = op(*inputs(device))
        except Exception as e:  # noqa: BLE001 - compared below
            results[device] = e
    cpu, ax = results["cpu"], results["axon"]
    if isinstance(cpu, Exception) or isinstance(ax, Exception):
        # both refuse these arguments (the error parity is test_errors.py's)
        assert isinstance(cpu, Exception) and isinstance(ax, Exception), (cpu, ax)
        return
    cpu_list = list(cpu) if isinstance(cpu, (tuple, list)) else [cpu]
    ax_list = list(ax) if isinstance(ax, (tuple, list)) else [ax]
    for c, a in zip(cpu_list, ax_list):
        if not isinstance(c, torch.Tensor):
            continue
        assert a.shape == c.shape and a.dtype == c.dtype
        if c.numel() > 1:
            assert a.stride() == c.stride(), f"{op}: cpu {c.stride()}, axon {a.stride()}"
        if op._schema.name not in ("aten::rrelu_with_noise",) and not c.dtype.is_complex:
            assert_same(a, c, accum=True)


@pytest.mark.parametrize("other", ["number", "int64 tensor", "cpu scalar", "0-dim axon",
                                   "broadcast row"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64])
def test_floor_divide_layout_with_mixed_operands(dtype, other):
    """The layout correction (TensorIterator's order) with type promotion, Python numbers,
    CPU scalars and broadcasting: the CPU's strides and values."""
    g = torch.Generator().manual_seed(1)
    a = (torch.rand(5, 3, generator=g) * 10 + 1).to(dtype).t()
    b = {"number": 3.0,
         "int64 tensor": torch.randint(1, 5, (3, 5), generator=g),
         "cpu scalar": torch.tensor(2.5),
         "0-dim axon": torch.tensor(2.5),
         "broadcast row": (torch.rand(5, generator=g) + 1).to(dtype)}[other]
    expected = torch.floor_divide(a, b)
    ax_b = b.axon() if isinstance(b, torch.Tensor) and other != "cpu scalar" else b
    got = torch.floor_divide(a.axon(), ax_b)
    assert got.stride() == expected.stride() and got.dtype == expected.dtype
    assert_same(got, expected, accum=True)


# Python Meta kernels that lay results out by device (torch._meta_registrations.device_hint):
# axon's generic kernel runs them on meta tensors, which used to answer "cuda" (CUDA's
# layout in eager, while torch.compile's FakeTensors on axon took the other branch: the
# compiled code's stride assertion failed).
DEVICE_HINT_OPS = {
    "rfft": lambda x: torch.fft.rfft(x),
    "rfft2": lambda x: torch.fft.rfft2(x),
    "rfftn_3d": lambda x: torch.fft.rfftn(x.reshape(2, 2, 8)),
    "rfft2_transposed": lambda x: torch.fft.rfft2(x.t()),
    "irfft_transposed": lambda x: torch.fft.irfft(x.t().to(torch.complex64)),
    "hfft": lambda x: torch.fft.hfft(x.to(torch.complex64)),
    "hfft2": lambda x: torch.fft.hfft2(x.to(torch.complex64)),
    "ifft2": lambda x: torch.fft.ifft2(x.to(torch.complex64)),
    "svd": lambda x: torch.linalg.svd(x),
    "svd_reduced": lambda x: torch.linalg.svd(x.t(), full_matrices=False),
    "eig": lambda x: torch.linalg.eig(x[:, :4]),
    "median_dim": lambda x: x.median(1),
    "mode_dim": lambda x: x.mode(0),
    "histc": lambda x: torch.histc(x, bins=7),
    "reflection_pad2d": lambda x: torch.nn.functional.pad(x[None], (1, 1, 1, 1), mode="reflect"),
}


@pytest.mark.parametrize("name", list(DEVICE_HINT_OPS))
def test_device_dependent_meta_layouts_match_cpu_and_compile(name):
    f = DEVICE_HINT_OPS[name]
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(3))
    cpu, ax = f(x), f(x.axon())
    cpu = list(cpu) if isinstance(cpu, tuple) else [cpu]
    ax = list(ax) if isinstance(ax, tuple) else [ax]
    for c, a in zip(cpu, ax):
        assert a.shape == c.shape and a.dtype == c.dtype
        assert a.stride() == c.stride(), f"{name}: cpu {c.stride()}, axon {a.stride()}"
    if name.startswith(("rfft", "irfft", "hfft", "ifft")):
        torch._dynamo.reset()
        compiled = torch.compile(lambda t: f(t) * 2)(x.axon())  # no stride assertion fails
        torch.testing.assert_close(compiled.cpu(), cpu[0] * 2, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(ax[0].cpu(), cpu[0], atol=1e-4, rtol=1e-4)
