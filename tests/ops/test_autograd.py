"""Autograd through axon ops against the CPU: an MLP's and a composite
function's gradients in every float dtype, gradients accumulating and
flowing through views and in-place ops.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

from conftest import FLOAT_DTYPES, assert_same, make, tol
from op_util import tiny_mlp


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_mlp_gradients_match_cpu(dtype):
    model_c = tiny_mlp(dtype)
    model_a = copy.deepcopy(model_c).axon()
    x = make((10, 6), dtype, seed=31)
    target = torch.tensor([0, 1, 2, 1, 0, 2, 2, 1, 0, 1])
    loss_c = F.cross_entropy(model_c(x), target)
    loss_a = F.cross_entropy(model_a(x.axon()), target.axon())
    assert_same(loss_a, loss_c, accum=True)
    loss_c.backward()
    loss_a.backward()
    for (name, pc), pa in zip(model_c.named_parameters(), model_a.parameters()):
        assert pa.grad is not None and pa.grad.device.type == "axon", name
        assert pa.grad.dtype == pc.grad.dtype
        t = tol(dtype, accum=True)
        torch.testing.assert_close(pa.grad.cpu(), pc.grad, msg=name, **t)


def composite(x, y, w):
    a = torch.sin(x) * y.exp() / (1 + w.abs())
    b = (x @ y.t()).logsumexp(-1).mean()
    c = torch.where(x > 0, x ** 2, -x).sum()
    d = torch.cat([x, y], 0).index_select(0, torch.tensor([3, 0, 5], device=x.device)).softmax(1)
    e = x.t()[::2].unfold(1, 2, 2).sum() + x.gather(1, torch.tensor([[0], [2], [1], [0]], device=x.device)).sum()
    f = F.layer_norm(y, (5,)).pow(2).mean() + torch.cumsum(w, 0).max()
    return a.sum() + b + c + d.sum() * 0.1 + e + f


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_composite_gradients_match_cpu(dtype):
    x = make((4, 5), dtype, -1, 1, seed=32)
    y = make((4, 5), dtype, -1, 1, seed=33)
    w = make((5,), dtype, -1, 1, seed=34)
    leaves_c = [t.clone().requires_grad_() for t in (x, y, w)]
    leaves_a = [t.axon().requires_grad_() for t in (x, y, w)]
    out_c = composite(*leaves_c)
    out_a = composite(*leaves_a)
    assert_same(out_a, out_c, accum=True, rtol=tol(dtype, True)["rtol"] * 3,
                atol=tol(dtype, True)["atol"] * 3)
    grads_c = torch.autograd.grad(out_c, leaves_c)
    grads_a = torch.autograd.grad(out_a, leaves_a)
    for gc, ga in zip(grads_c, grads_a):
        assert ga.device.type == "axon"
        t = tol(dtype, accum=True)
        torch.testing.assert_close(ga.cpu(), gc, rtol=t["rtol"] * 3, atol=t["atol"] * 3)


def test_gradients_accumulate_and_flow_through_views():
    x = make((4, 6), torch.float32, seed=35)
    xc, xa = x.clone().requires_grad_(), x.axon().requires_grad_()
    for leaf in (xc, xa):
        for _ in range(2):
            v = leaf.t()[1:4]
            (v * v).sum().backward()
        tmp = leaf.clone()
        tmp[:, 1].mul_(3)  # in-place on a view of a non-leaf
        tmp.sum().backward()
    assert_same(xa.grad, xc.grad)


@pytest.mark.parametrize("devices", [None, [0, 1, 2], [2, 5]])
def test_data_parallel_matches_one_module_on_the_cpu(devices):
    # nn.DataParallel over axon's devices (scatter, replicate, parallel_apply, gather, and
    # the reduction of the replicas' gradients): as the same module on the CPU
    import copy

    torch.manual_seed(0)
    ref = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.GELU(), torch.nn.Linear(16, 3))
    first = 0 if devices is None else devices[0]
    dp = torch.nn.DataParallel(copy.deepcopy(ref).to(f"axon:{first}"), device_ids=devices)
    x = make((10, 6), torch.float32, seed=3)
    got = dp(x.to(f"axon:{first}"))
    want = ref(x)
    assert got.device == torch.device("axon", first)
    assert_same(got, want, accum=True)
    got.square().sum().backward()
    want.square().sum().backward()
    for a, b in zip(dp.module.parameters(), ref.parameters()):
        assert a.grad.device == torch.device("axon", first)
        assert_same(a.grad, b.grad, accum=True)


@pytest.mark.parametrize("destination", ["cpu", -1, 1])
@pytest.mark.parametrize("out", [False, True])
def test_data_parallel_gather_to_host_and_devices(destination, out):
    # comm.gather of results on several devices into host memory (or another device):
    # the data is there when it returns (also into a pinned out=)
    import warnings

    from torch.nn.parallel import comm

    parts = [make((3, 5), torch.float32, seed=i) for i in range(4)]
    dev = [p.to(f"axon:{i}") * 2 for i, p in enumerate(parts)]
    want = torch.cat([p * 2 for p in parts])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # -1 for the CPU is deprecated
        if out:
            target = "cpu" if destination in ("cpu", -1) else f"axon:{destination}"
            o = torch.empty(12, 5, device=target, pin_memory=target == "cpu")
            got = comm.gather(dev, 0, out=o)
            assert got is o
        else:
            got = comm.gather(dev, 0, destination=destination)
    assert got.device == (torch.device("cpu") if destination in ("cpu", -1)
                          else torch.device("axon", destination))
    assert torch.equal(got.cpu(), want)

