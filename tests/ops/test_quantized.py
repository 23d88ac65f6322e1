"""Quantized tensors on axon: ops that would make one raise NotImplementedError
at the call; fake_quantize_* (float results) match the CPU.
"""

from __future__ import annotations

import re

import pytest
import torch

from conftest import AXON, assert_same, make


def _quantizing_calls():
    t = make((2, 3), torch.float32).to(AXON)
    i8 = make((2, 3), torch.int8).to(AXON)
    scales = torch.tensor([0.1, 0.2], device=AXON)
    zps = torch.tensor([0, 1], device=AXON)
    return {
        "quantize_per_tensor": (lambda: torch.quantize_per_tensor(t, 0.1, 0, torch.quint8),
                                "quint8"),
        "quantize_per_tensor.tensor_qparams": (
            lambda: torch.quantize_per_tensor(t, torch.tensor(0.1, device=AXON),
                                              torch.tensor(0, device=AXON), torch.qint8), "qint8"),
        "quantize_per_tensor.tensors": (
            lambda: torch.quantize_per_tensor([t, t], torch.tensor([0.1, 0.2], device=AXON),
                                              torch.tensor([0, 0], device=AXON), torch.qint32),
            "qint32"),
        "quantize_per_tensor_dynamic": (
            lambda: torch.quantize_per_tensor_dynamic(t, torch.quint8, False), "quint8"),
        "quantize_per_channel": (
            lambda: torch.quantize_per_channel(t, scales, zps, 0, torch.quint8), "quint8"),
        "_make_per_tensor_quantized_tensor": (
            lambda: torch._make_per_tensor_quantized_tensor(i8, 0.1, 0), "qint8"),
        "_make_per_channel_quantized_tensor": (
            lambda: torch._make_per_channel_quantized_tensor(i8, scales.double(), zps, 0),
            "qint8"),
    }


@pytest.mark.filterwarnings("ignore:.*quantized tensor creation functions.*deprecated")
def test_quantizing_ops_raise_at_the_call():
    """Ops that take dense axon tensors and return quantized ones used to return
    a half-built tensor (dtype quint8, is_quantized False, unprintable)."""
    for name, (call, dtype) in _quantizing_calls().items():
        with pytest.raises(NotImplementedError,
                           match=re.escape(f"Could not run 'aten::{name}' on axon: it makes a "
                                           f"quantized tensor (torch.{dtype}), and axon has no "
                                           "quantized tensors")):
            call()
    torch.axon.synchronize()


@pytest.mark.filterwarnings("ignore:.*quantized tensor creation functions.*deprecated")
def test_quantized_factories_and_copies_raise():
    """Factories dispatched on a quantized dtype, and moving a CPU quantized
    tensor to axon, raise NotImplementedError (as for CUDA's missing quantized
    kernels), saying what to do rather than listing dispatch keys."""
    q = torch.quantize_per_tensor(torch.randn(4), 0.1, 0, torch.quint8)
    calls = {
        "_empty_affine_quantized": lambda: torch._empty_affine_quantized(
            (3,), scale=0.1, zero_point=0, dtype=torch.quint8, device=AXON),
        "_empty_per_channel_affine_quantized": lambda: torch._empty_per_channel_affine_quantized(
            (3,), scales=torch.ones(3, device=AXON),
            zero_points=torch.zeros(3, dtype=torch.long, device=AXON), axis=0,
            dtype=torch.quint8, device=AXON),
        "empty.memory_format": lambda: torch.zeros(3, dtype=torch.qint8, device=AXON),
        "empty_strided": lambda: make((3,), torch.float32).to(AXON).to(torch.quint8),
        "empty_quantized": lambda: q.to(AXON),
        "_copy_from": lambda: torch.empty(4, device=AXON).copy_(q),
    }
    for name, call in calls.items():
        with pytest.raises(NotImplementedError,
                           match=re.escape(f"Could not run 'aten::{name}' on axon: it takes or "
                                           "makes a quantized tensor, and axon has no quantized "
                                           "tensors")):
            call()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("layout", ["contiguous", "transposed"])
def test_fake_quantize_matches_cpu(dtype, layout):
    """fake_quantize_* return float tensors: forward and backward as on the CPU."""
    base = make((6, 4), torch.float32, low=-2, high=2)
    x = base.t() if layout == "transposed" else base  # channels along dim 0
    scale = torch.tensor([0.05, 0.1, 0.02, 0.2] if layout == "transposed" else
                         [0.05, 0.1, 0.02, 0.2, 0.07, 0.03])
    zp = torch.tensor([0, 3, -2, 1] if layout == "transposed" else [0, 3, -2, 1, 0, 5],
                      dtype=torch.int32)

    def run(device):
        xi = x.detach().to(device=device, dtype=dtype, copy=True).requires_grad_()
        s, z = scale.to(device), zp.to(device)
        outs = [
            torch.fake_quantize_per_tensor_affine(xi, 0.05, 3, -128, 127),
            torch.fake_quantize_per_tensor_affine(xi, s[:1].clone(), z[:1].clone(), 0, 255),
        ]
        if dtype == torch.float32:  # the per-channel kernels take float32 only
            outs.append(torch.fake_quantize_per_channel_affine(xi, s, z, 0, -128, 127))
            sl = s[:1].clone().requires_grad_()
            zl = z[:1].float().requires_grad_()
            outs.append(torch._fake_quantize_learnable_per_tensor_affine(xi, sl, zl, 0, 255, 1.0))
        sum(o.float().sum() * (i + 1) for i, o in enumerate(outs)).backward()
        return [o.detach() for o in outs] + [xi.grad]

    want = run("cpu")
    got = run(AXON)
    for g, w in zip(got, want):
        assert_same(g, w, dtype=dtype)
    # Zero-size input.
    e = torch.fake_quantize_per_tensor_affine(torch.empty(0, 3, device=AXON), 0.1, 0, 0, 255)
    assert e.shape == (0, 3) and e.device.type == "axon"


def test_fake_quantize_modules_match_cpu():
    """torch.ao.quantization's FakeQuantize (observer + fake_quantize) and
    FusedMovingAvgObsFakeQuantize (fused_moving_avg_obs_fake_quant, which
    updates its statistics in place) on axon, against the CPU."""
    from torch.ao.quantization import FakeQuantize, FusedMovingAvgObsFakeQuantize

    for cls in (FakeQuantize, FusedMovingAvgObsFakeQuantize):
        torch.manual_seed(0)
        cpu = cls()
        ax = cls().to(AXON)
        for step in range(3):
            x = make((8, 5), torch.float32, low=-1 - step, high=2 + step, seed=step)
            want = cpu(x)
            got = ax(x.to(AXON))
            assert_same(got, want)
        for name, buf in cpu.state_dict().items():
            assert_same(ax.state_dict()[name], buf)


# ---------------------------------------------------------------- sparse

SPARSE_CASES = {
    "sparse_coo_tensor": lambda: torch.sparse_coo_tensor(
        torch.tensor([[0, 1], [1, 0]]), torch.tensor([1.0, 2.0]), (2, 2), device=AXON),
    "to_sparse": lambda: torch.randn(3, 3, device=AXON).to_sparse(),
    "to_sparse_csr": lambda: torch.eye(3, device=AXON).to_sparse_csr(),
    "cpu_sparse_to_axon": lambda: torch.eye(3).to_sparse().to(AXON),
    "embedding_sparse_grad": lambda: torch.nn.Embedding(10, 4, sparse=True).to(AXON)(
        torch.tensor([1, 2], device=AXON)).sum().backward(),
}
# Sparse compressed tensors are made by composite ops from their index and value
# tensors: each constructor must refuse (these were made, and then values(), .cpu()
# or printing failed with a misleading layout error).
_CROW, _COL, _VAL = torch.tensor([0, 1, 2]), torch.tensor([1, 0]), torch.tensor([1.0, 2.0])
SPARSE_COMPRESSED_CASES = {
    "csr_device": (torch.sparse_csr, lambda: torch.sparse_csr_tensor(
        _CROW, _COL, _VAL, (2, 2), device=AXON)),
    "csr_no_size": (torch.sparse_csr, lambda: torch.sparse_csr_tensor(
        _CROW, _COL, _VAL, device=AXON)),
    "csr_from_axon_tensors": (torch.sparse_csr, lambda: torch.sparse_csr_tensor(
        _CROW.to(AXON), _COL.to(AXON), _VAL.to(AXON), (2, 2))),
    "csc_device": (torch.sparse_csc, lambda: torch.sparse_csc_tensor(
        _CROW, _COL, _VAL, (2, 2), device=AXON)),
    "bsr_device": (torch.sparse_bsr, lambda: torch.sparse_bsr_tensor(
        _CROW, _COL, _VAL.reshape(2, 1, 1), (2, 2), device=AXON)),
    "bsc_no_size": (torch.sparse_bsc, lambda: torch.sparse_bsc_tensor(
        _CROW, _COL, _VAL.reshape(2, 1, 1), device=AXON)),
    "compressed_csc": (torch.sparse_csc, lambda: torch.sparse_compressed_tensor(
        _CROW, _COL, _VAL, (2, 2), layout=torch.sparse_csc, device=AXON)),
    "cpu_csr_to_axon": (torch.sparse_csr, lambda: torch.sparse_csr_tensor(
        _CROW, _COL, _VAL, (2, 2)).to(AXON)),
    "cpu_bsc_to_axon": (torch.sparse_bsc, lambda: torch.sparse_bsc_tensor(
        _CROW, _COL, _VAL.reshape(2, 1, 1), (2, 2)).to(AXON)),
}


@pytest.mark.parametrize("case", sorted(SPARSE_COMPRESSED_CASES))
def test_sparse_compressed_tensors_are_refused_where_they_are_made(case):
    layout, make_it = SPARSE_COMPRESSED_CASES[case]
    name = {torch.sparse_csr: "SparseCsr", torch.sparse_csc: "SparseCsc",
            torch.sparse_bsr: "SparseBsr", torch.sparse_bsc: "SparseBsc"}[layout]
    with pytest.raises(NotImplementedError,
                       match=f"needs a tensor of layout {name}, and axon has only strided"):
        make_it()
    # the same on the CPU works, and the device keeps working
    dense = torch.sparse_csr_tensor(_CROW, _COL, _VAL, (2, 2)).to_dense()
    assert_same(dense.to(AXON) * 2, dense * 2)


@pytest.mark.parametrize("case", sorted(SPARSE_CASES))
def test_sparse_tensors_are_refused_with_a_clear_error(case):
    # axon has no sparse tensors: every way of making one says so (not the dispatcher's
    # "Could not run ... 'Sparseaxon' backend" or "Cannot access storage"), and the
    # device keeps working
    with pytest.raises(NotImplementedError, match="axon has only strided tensors"):
        SPARSE_CASES[case]()
    x = make((4, 3), torch.float32, seed=1)
    assert_same(x.to(AXON) * 2, x * 2)


NESTED_CASES = {
    # autograd records a nested tensor made from axon tensors that require grad (this
    # aborted the process); its first op raises
    "axon_nested_requiring_grad": lambda: torch.nested.as_nested_tensor(
        [torch.ones(2, 3, device=AXON, requires_grad=True),
         torch.ones(4, 3, device=AXON, requires_grad=True)]).relu(),
    "cpu_nested_to_axon": lambda: torch.nested.nested_tensor(
        [torch.ones(2, 3), torch.ones(4, 3)]).to(AXON),
    "op_on_axon_nested": lambda: torch.nested.nested_tensor(
        [torch.ones(2, 3), torch.ones(4, 3)], device=AXON).relu(),
    "axon_nested_to_cpu": lambda: torch.nested.nested_tensor(
        [torch.ones(2, 3), torch.ones(4, 3)], device=AXON).cpu(),
    # made, with nothing done to it: refused at once, not at its first use
    "made_with_device": lambda: torch.nested.nested_tensor(
        [torch.ones(2, 3), torch.ones(4, 3)], device=AXON),
    "made_from_axon_tensors": lambda: torch.nested.nested_tensor(
        [torch.ones(2, 3, device=AXON), torch.ones(4, 3, device=AXON)]),
    "as_nested_from_axon_tensors": lambda: torch.nested.as_nested_tensor(
        [torch.ones(2, 3, device=AXON), torch.ones(4, 3, device=AXON)]),
    "as_nested_with_device": lambda: torch.nested.as_nested_tensor(
        [torch.ones(2, 3), torch.ones(4, 3)], None, AXON),
}


@pytest.mark.parametrize("case", sorted(NESTED_CASES))
def test_strided_nested_tensors_are_refused_and_jagged_ones_work(case):
    # strided-layout nested tensors (NestedTensorImpl) have no axon kernels: each op says
    # so and names the jagged layout, which works (compared with the CPU)
    with pytest.raises(NotImplementedError, match="nested tensor of the strided layout"):
        NESTED_CASES[case]()
    parts = [make((2, 3), torch.float32, seed=1), make((4, 3), torch.float32, seed=2)]
    jagged = torch.nested.nested_tensor(parts, layout=torch.jagged)
    got = (jagged.to(AXON).relu() * 2).to_padded_tensor(0.0)
    assert_same(got, (jagged.relu() * 2).to_padded_tensor(0.0))
