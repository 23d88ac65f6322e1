"""nn.SyncBatchNorm on axon ranks (its ops: tests/ops/test_sync_batch_norm_ops.py):
two ranks, each with half of a batch, against BatchNorm of the whole batch on the CPU
(float64): outputs, input gradients, the weight/bias gradients summed over the ranks
(DDP's all_reduce), and the running statistics on every rank.  Also a model converted
with convert_sync_batchnorm under DDP.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn

from conftest import make, tol
from dist_util import run_ranks, ship, unship

SHAPE = (6, 3, 4, 5)
SPLIT = [2, 4]  # uneven halves: counts differ between the ranks


def _sync_bn(rank, world_size, dtype):
    import torch.distributed as dist

    dist.init_process_group("axon")
    torch.manual_seed(0)
    x = make(SHAPE, dtype, seed=1).split(SPLIT)[rank].to("axon")
    grad = make(SHAPE, dtype, seed=2).split(SPLIT)[rank].to("axon")
    bn = nn.SyncBatchNorm(SHAPE[1], momentum=0.1).to("axon")
    with torch.no_grad():
        bn.weight.copy_(make((SHAPE[1],), torch.float32, 0.5, 1.5, seed=3))
        bn.bias.copy_(make((SHAPE[1],), torch.float32, seed=4))
    x.requires_grad_()
    out = bn(x)
    out.backward(grad)
    for p in (bn.weight, bn.bias):
        dist.all_reduce(p.grad)
    result = ship(dict(out=out.detach().cpu(), grad=x.grad.cpu(), gw=bn.weight.grad.cpu(),
                       gb=bn.bias.grad.cpu(), rm=bn.running_mean.cpu(), rv=bn.running_var.cpu()))
    dist.destroy_process_group()
    return result


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_sync_batch_norm_two_ranks_matches_batch_norm_of_the_whole_batch(dtype):
    results = unship(run_ranks(_sync_bn, 2, dtype, timeout=240))
    x = make(SHAPE, dtype, seed=1).double().requires_grad_()
    bn = nn.BatchNorm2d(SHAPE[1], momentum=0.1).double()
    with torch.no_grad():
        bn.weight.copy_(make((SHAPE[1],), torch.float32, 0.5, 1.5, seed=3))
        bn.bias.copy_(make((SHAPE[1],), torch.float32, seed=4))
    out = bn(x)
    out.backward(make(SHAPE, dtype, seed=2).double())
    t = tol(dtype, accum=True)
    summed = dict(rtol=1e-4, atol=1e-4) if dtype == torch.float32 else dict(rtol=2e-2, atol=1e-1)
    torch.testing.assert_close(torch.cat([r["out"] for r in results]).double(), out.detach(), **t)
    torch.testing.assert_close(torch.cat([r["grad"] for r in results]).double(), x.grad, **t)
    for r in results:
        torch.testing.assert_close(r["gw"].double(), bn.weight.grad, **summed)
        torch.testing.assert_close(r["gb"].double(), bn.bias.grad, **summed)
        torch.testing.assert_close(r["rm"].double(), bn.running_mean, **tol(torch.float32, True))
        torch.testing.assert_close(r["rv"].double(), bn.running_var, **tol(torch.float32, True))


def _ddp_convert(rank, world_size):
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    dist.init_process_group("axon")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(),
                          nn.Conv2d(4, 2, 1))
    ref = copy.deepcopy(model).double()
    model = nn.SyncBatchNorm.convert_sync_batchnorm(model).to("axon")
    ddp = DDP(model, device_ids=[rank])
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    x = make((8, 3, 6, 6), torch.float32, seed=5)
    for _ in range(2):
        opt.zero_grad()
        ddp(x.chunk(world_size)[rank].to("axon")).square().sum().backward()
        opt.step()
    state = {k: v.cpu() for k, v in model.state_dict().items()}
    dist.destroy_process_group()
    return ship(dict(state=state, ref=ref.state_dict(), x=x))


def test_convert_sync_batchnorm_under_ddp_matches_one_process_training():
    results = unship(run_ranks(_ddp_convert, 2, timeout=240))
    # The same two steps on the CPU in float64 on the whole batch; DDP averages
    # the ranks' gradients, so the loss there is the mean of the ranks' sums.
    model = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(),
                          nn.Conv2d(4, 2, 1)).double()
    model.load_state_dict(results[0]["ref"])
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = results[0]["x"].double()
    for _ in range(2):
        opt.zero_grad()
        (model(x).square().sum() / 2).backward()
        opt.step()
    expected = model.state_dict()
    for r in results:
        for k, v in expected.items():
            if v.dtype.is_floating_point:
                torch.testing.assert_close(r["state"][k].double(), v, rtol=1e-4, atol=1e-4, msg=k)
            else:
                assert torch.equal(r["state"][k], v), k
