"""The synchronous CPU fallback (ops with no axon kernel): its statistics
(torch.axon.fallback_stats), that structural ops never take it, its opt-in
warning (AXON_FALLBACK_WARN), and that it keeps what a kernel returns (the
conjugate bit). Which ops are left there: python -m torch_axon.ops (or
tests/ops/test_op_table.py).
"""

from __future__ import annotations

import warnings

import torch

from conftest import assert_same, make, run_python


# (take and unique_consecutive: ops left in the fallback, see docs/ARCHITECTURE.md)

def test_fallback_stats_count_ops():
    x = torch.ones(4, device="axon")
    idx = torch.tensor([0, 2], device="axon")
    torch.axon.reset_fallback_stats()
    assert torch.axon.fallback_stats() == {}
    x.take(idx)
    stats = torch.axon.fallback_stats()
    assert list(stats.values()) == [1]
    (name,) = stats
    assert name.startswith("aten::take")
    x.take(idx)
    torch.take(x, idx)
    x.unique_consecutive()
    stats = torch.axon.fallback_stats()
    assert stats[name] == 3
    assert sum(v for k, v in stats.items() if k.startswith("aten::unique_consecutive")) == 1
    assert torch_axon_exports_same_function()
    torch.axon.reset_fallback_stats()
    assert torch.axon.fallback_stats() == {}


def torch_axon_exports_same_function():
    import torch_axon
    return torch_axon.fallback_stats() == torch.axon.fallback_stats()


def test_structural_ops_do_not_fall_back():
    torch.axon.reset_fallback_stats()
    x = torch.arange(12.0)
    a = x.to("axon")  # empty + copy
    v = a.view(3, 4).t()[1:, ::2]  # views
    b = v.contiguous()  # strided copy
    c = b.to("axon:1").cpu()  # device-to-device, device-to-host
    torch.empty(5, device="axon").resize_(10)
    assert b.is_contiguous()
    assert torch.axon.fallback_stats() == {}
    torch.testing.assert_close(c, x.view(3, 4).t()[1:, ::2], rtol=0, atol=0)


def test_no_fallback_warning_by_default():
    x = torch.ones(4, device="axon")
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        x.tan()
    assert not [m for m in w if "fallback" in str(m.message)]


def test_fallback_warn_env_warns_once_per_op():
    r = run_python("""
        import warnings, torch
        x = torch.ones(4, device="axon")
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            i = torch.tensor([0, 2], device="axon")
            x.take(i); x.take(i); torch.take(x, i)
            x.unique_consecutive(); x.unique_consecutive()
        msgs = [str(m.message) for m in w if "fallback" in str(m.message)]
        print(len(msgs))
        for m in msgs: print(m.splitlines()[0])
    """, env={"AXON_FALLBACK_WARN": "1"})
    assert r.returncode == 0, r.stderr
    lines = r.stdout.strip().splitlines()
    assert lines[0] == "2", lines
    assert any("aten::take" in m and "has no axon kernel" in m and "CPU" in m
               for m in lines[1:])
    assert any("aten::unique_consecutive" in m for m in lines[1:])


def test_fallback_keeps_a_kernels_conjugate_bit():
    """linalg.lu_solve(left=False) returns X^H by flipping its out's conjugate
    bit (it stays in the fallback, which carried back sizes and strides but
    not that bit: the result was the conjugate of the right one)."""
    A = make((3, 3), torch.float32, seed=5) + 1j * make((3, 3), torch.float32, seed=6)
    B = make((4, 3), torch.float32, seed=7) + 1j * make((4, 3), torch.float32, seed=8)
    LU, piv = torch.linalg.lu_factor(A)
    for adjoint in (False, True):
        want = torch.linalg.lu_solve(LU, piv, B, left=False, adjoint=adjoint)
        got = torch.linalg.lu_solve(LU.axon(), piv.axon(), B.axon(), left=False, adjoint=adjoint)
        assert got.is_conj() == want.is_conj()
        assert_same(got, want, accum=True)
        # and it solves X A = B (X A^H = B): checked without lu_solve
        lhs = got.cpu() @ (A.mH if adjoint else A)
        torch.testing.assert_close(lhs.resolve_conj(), B, rtol=1e-4, atol=1e-4)


def test_op_without_a_cpu_kernel_raises_naming_axon():
    """CUDA-only ops (no CPU kernel for the fallback to run) raise the
    dispatcher's NotImplementedError naming axon and the op, not the CPU
    backend (the arguments are axon tensors); nothing runs, the device keeps
    working."""
    import pytest

    x = make((4, 5), torch.float32).to("axon")
    calls = {
        "aten::_fused_dropout": lambda: torch.ops.aten._fused_dropout(x, 0.5),
        "aten::cudnn_convolution": lambda: torch.ops.aten.cudnn_convolution(
            x[None, None], x[None, None, :2, :2], [0, 0], [1, 1], [1, 1], 1, False, False, False),
    }
    for name, call in calls.items():
        assert not torch._C._dispatch_has_computed_kernel_for_dispatch_key(name, "CPU")
        with pytest.raises(NotImplementedError,
                           match=f"Could not run '{name}' with arguments from the 'axon' backend"):
            call()
    assert_same(x * 2, make((4, 5), torch.float32) * 2)
