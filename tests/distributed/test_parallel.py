"""PyTorch's parallel APIs on axon: FSDP2 (fp32, bf16 mixed precision, CPU
offload, HSDP), DDP, torch.distributed.checkpoint, DTensor tensor and sequence
parallelism, the DTensor RNG, a 2-D TP x FSDP mesh, and
examples/train_fsdp_tp.py under torchrun.

Every distributed run is compared with the same training on one axon device,
computed in the test process:

* Model: the tiny random-init Llama of conftest (hidden 64, 2 layers, vocab
  128), AdamW (lr 3e-3), STEPS = 5 steps on learnable sequences (arithmetic
  progressions mod the vocabulary), so the loss really moves (4.87 -> 4.52).
* Data parallelism (FSDP, HSDP, DDP, the dp dimension of a 2-D mesh): rank r
  trains on its slice of the global batch; the curve compared is the mean of
  the ranks' local losses, which is the global batch's loss.
* Loss curves (fp32): within LOSS_ATOL_FP32 = 1e-4.  Distributed and
  single-device runs differ only by summation order (gradient averaging, TP's
  partial sums): measured <= 5e-7.  Training on rank 0's half of the batch
  without averaging gradients departs by > 0.1 within two steps
  (test_tolerances_discriminate checks that on the reference itself).
* Gradients: AdamW hardly sees a gradient scale, so a reduction that sums
  instead of averaging would keep the loss curve; the reduced gradients of
  one backward are compared with single-device ones (GRAD_TOL: rtol 1e-4,
  atol 1e-6; measured <= 2e-8).
* Mixed precision (bf16 params, fp32 reduce) is compared with its exact
  single-device emulation: bf16 copies of the fp32 master weights (buffers
  stay fp32, as in FSDP) run every rank's micro-batch, their bf16 gradients
  are averaged in fp32, AdamW steps the fp32 master weights.  Tolerance
  LOSS_ATOL_BF16 = 2e-4 (measured: equal; a one-ulp difference of an fp32
  master weight could flip a bf16 rounding); bf16 training departs from fp32
  training by ~1e-3 in five steps, and the ranks check that the layers run
  with bf16 weights and activations.
* Parameters after training (PARAM_ATOL = 1e-3: AdamW turns gradient
  rounding noise near zero into steps of ~lr).

Processes: one run of 2 ranks for FSDP/DCP/DDP, one of 2 ranks for TP/SP/RNG,
one of 4 ranks for FSDP/HSDP/TP x FSDP, and the example under torchrun on 4
and 2 ranks (~45 s in all on an idle 2-core machine).

The device under test is axon; AXON_DIST_TEST_DEVICE=cpu runs the same checks
on the CPU with gloo (a control for the tests themselves).
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from conftest import REPO_ROOT, TINY_LM_VOCAB, tiny_causal_lm
from dist_util import run_ranks, ship, unship

pytestmark = pytest.mark.skipif(not dist.is_available(), reason="torch.distributed unavailable")

DEV = os.environ.get("AXON_DIST_TEST_DEVICE", "axon")
REPO = Path(REPO_ROOT)

STEPS = 5
CKPT_STEP = 3          # DCP checkpoint after this many steps
BATCH = 8              # global batch (sequences)
SEQ = 16
LR = 3e-3
LOSS_ATOL_FP32 = 1e-4
LOSS_ATOL_BF16 = 2e-4
LOGITS_TOL = dict(rtol=1e-4, atol=1e-4)
GRAD_TOL = dict(rtol=1e-4, atol=1e-6)  # measured differences ~2e-8
PARAM_ATOL = 1e-3      # AdamW turns near-zero gradient noise into steps of ~lr


# ---------------------------------------------------------------------------
# Shared by the test process and the ranks


def batches(steps: int = STEPS, batch: int = BATCH, seq: int = SEQ) -> list[torch.Tensor]:
    """Learnable token sequences: start + stride * t (mod vocab), stride in 1..3."""
    g = torch.Generator().manual_seed(1234)
    out = []
    for _ in range(steps):
        start = torch.randint(0, TINY_LM_VOCAB, (batch, 1), generator=g)
        stride = torch.randint(1, 4, (batch, 1), generator=g)
        out.append((start + stride * torch.arange(seq)) % TINY_LM_VOCAB)
    return out


def local_batch(ids: torch.Tensor, dp_rank: int, dp_size: int) -> torch.Tensor:
    return ids.chunk(dp_size)[dp_rank]


def new_model(device) -> torch.nn.Module:
    return tiny_causal_lm("llama").train().to(device)


def loss_of(model, ids) -> torch.Tensor:
    return model(input_ids=ids, labels=ids).loss


def tp_plan(sequence_parallel: bool) -> tuple[dict, dict]:
    """(per decoder layer plan, top-level plan) for a Transformers Llama.

    Plain TP: q/k/v/gate/up column-wise, o/down row-wise, activations
    replicated between blocks.  Sequence parallel (Megatron-SP): between blocks
    the residual stream is sharded along the sequence (Shard(1)); the norms run
    on the shards, the attention and MLP inputs are all-gathered and their
    outputs reduce-scattered; the embedding is row-wise (vocab-sharded table)
    with a sequence-sharded output and the LM head gathers the sequence back.
    The residual stream stays a DTensor (Transformers takes the positions from
    its global shape; residual + block output adds two DTensors).
    """
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput,
                                                   RowwiseParallel, SequenceParallel)

    if not sequence_parallel:
        layer = {"self_attn.q_proj": ColwiseParallel(), "self_attn.k_proj": ColwiseParallel(),
                 "self_attn.v_proj": ColwiseParallel(), "self_attn.o_proj": RowwiseParallel(),
                 "mlp.gate_proj": ColwiseParallel(), "mlp.up_proj": ColwiseParallel(),
                 "mlp.down_proj": RowwiseParallel()}
        return layer, {}
    layer = {
        "input_layernorm": SequenceParallel(),
        "self_attn": PrepareModuleInput(input_kwarg_layouts={"hidden_states": Shard(1)},
                                        desired_input_kwarg_layouts={"hidden_states": Replicate()}),
        "self_attn.q_proj": ColwiseParallel(), "self_attn.k_proj": ColwiseParallel(),
        "self_attn.v_proj": ColwiseParallel(),
        "self_attn.o_proj": RowwiseParallel(output_layouts=Shard(1), use_local_output=False),
        "post_attention_layernorm": SequenceParallel(),
        "mlp": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
        "mlp.gate_proj": ColwiseParallel(), "mlp.up_proj": ColwiseParallel(),
        "mlp.down_proj": RowwiseParallel(output_layouts=Shard(1), use_local_output=False),
    }
    top = {
        "model.embed_tokens": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1),
                                              use_local_output=False),
        "model.norm": SequenceParallel(),
        "lm_head": ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate()),
    }
    return layer, top


def apply_tp(model, tp_mesh, sequence_parallel: bool = False):
    from torch.distributed.tensor.parallel import parallelize_module

    layer_plan, top_plan = tp_plan(sequence_parallel)
    for layer in model.model.layers:
        parallelize_module(layer, tp_mesh, layer_plan)
    if top_plan:
        parallelize_module(model, tp_mesh, top_plan)
    return model


def apply_fsdp(model, dp_mesh, mp_policy=None):
    from torch.distributed.fsdp import fully_shard

    kw = {} if mp_policy is None else {"mp_policy": mp_policy}
    for layer in model.model.layers:
        fully_shard(layer, mesh=dp_mesh, **kw)
    fully_shard(model, mesh=dp_mesh, **kw)
    return model


def bf16_policy():
    from torch.distributed.fsdp import MixedPrecisionPolicy

    return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)


def train(model, dp_rank: int, dp_size: int, steps=range(STEPS), opt=None):
    """Trains on this rank's slice of each global batch; returns (local losses, opt)."""
    device = next(model.parameters()).device  # a DTensor's is its local tensor's
    if opt is None:
        # foreach (the default on axon, as on CUDA) cannot mix DTensor and plain
        # parameters in one group, and plain TP leaves the norms and embeddings plain
        from torch.distributed.tensor import DTensor

        kinds = {isinstance(p, DTensor) for p in model.parameters()}
        opt = torch.optim.AdamW(model.parameters(), lr=LR,
                                foreach=False if len(kinds) > 1 else None)
    data = batches()
    losses = []
    for step in steps:
        ids = local_batch(data[step], dp_rank, dp_size).to(device)
        loss = loss_of(model, ids)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses, opt


def first_grads(model, dp_rank: int, dp_size: int) -> dict[str, torch.Tensor]:
    """Gradients (unsharded, CPU) of one backward on this rank's slice of batch 0,
    then zeroed.  AdamW hardly sees a gradient scale (an AVG reduced as SUM), so
    the reduced gradients themselves are compared with single-device ones."""
    from torch.distributed.tensor import DTensor

    device = next(model.parameters()).device
    loss_of(model, local_batch(batches()[0], dp_rank, dp_size).to(device)).backward()
    grads = {}
    for name, p in model.named_parameters():
        g = p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad
        grads[name.removeprefix("module.")] = g.detach().cpu().clone()
    model.zero_grad(set_to_none=True)
    return grads


def full_params(model) -> dict[str, torch.Tensor]:
    """Unsharded parameters on the CPU (DTensor params gathered)."""
    from torch.distributed.tensor import DTensor

    out = {}
    for name, p in model.named_parameters():
        t = p.full_tensor() if isinstance(p, DTensor) else p
        out[name] = t.detach().cpu().clone()
    return out


def rank_device() -> torch.device:
    """This rank's device (dist_util pins rank r to axon:r)."""
    if DEV == "cpu":
        return torch.device("cpu")
    return torch.device(DEV, getattr(torch, DEV).current_device())


def init_dist(rank: int, world_size: int):
    """Like torchrun's `dist.init_process_group()`: the default backend of each device."""
    if DEV == "cpu":
        dist.init_process_group("gloo")
    else:
        dist.init_process_group()
        assert dist.get_backend_config().find(f"{DEV}:") >= 0, dist.get_backend_config()
    torch.manual_seed(0)


# ---------------------------------------------------------------------------
# Single-device references (test process, axon:0)


@functools.lru_cache(maxsize=None)
def reference(micro: int = 1, mixed_precision: bool = False, only_rank0: bool = False):
    """Single-device training: losses per step (mean over `micro` micro-batches,
    each micro-batch its own mean loss, gradients averaged) and a snapshot of
    the parameters after CKPT_STEP steps.

    mixed_precision: FSDP's MixedPrecisionPolicy(bf16 params, fp32 reduce)
    emulated: bf16 copy of the fp32 master weights per step, bf16 gradients
    averaged in fp32.  only_rank0: the wrong computation (micro-batch 0 alone)
    to show the tolerances discriminate.
    """
    import copy

    device = torch.device(DEV, 0)
    master = new_model(device)
    work = master
    if mixed_precision:  # bf16 parameters; buffers (rotary inv_freq) stay fp32, as in FSDP
        work = copy.deepcopy(master)
        for p in work.parameters():
            p.data = p.data.to(torch.bfloat16)
    opt = torch.optim.AdamW(master.parameters(), lr=LR)
    losses, snapshot = [], None
    for step, ids in enumerate(batches()):
        if step == CKPT_STEP:
            snapshot = {k: v.detach().cpu().clone() for k, v in master.named_parameters()}
        if mixed_precision:
            with torch.no_grad():
                for w, m in zip(work.parameters(), master.parameters()):
                    w.copy_(m)
        total, grads = 0.0, None
        parts = list(ids.to(device).chunk(micro))
        if only_rank0:
            parts = parts[:1]
        for part in parts:
            loss = loss_of(work, part)
            loss.backward()
            total += loss.item() / micro
            g = [p.grad.float() / len(parts) for p in work.parameters()]
            grads = g if grads is None else [a + b for a, b in zip(grads, g)]
            work.zero_grad()
        if only_rank0:
            with torch.no_grad():
                total = sum(loss_of(work, p).item() for p in ids.to(device).chunk(micro)) / micro
        for p, g in zip(master.parameters(), grads):
            p.grad = g
        opt.step()
        opt.zero_grad()
        losses.append(total)
    return torch.tensor(losses, dtype=torch.float64), snapshot


@functools.lru_cache(maxsize=None)
def reference_logits() -> torch.Tensor:
    model = new_model(torch.device(DEV, 0)).eval()
    with torch.no_grad():
        return model(input_ids=batches()[0].to(torch.device(DEV, 0))).logits.cpu()


@functools.lru_cache(maxsize=None)
def reference_grads() -> dict[str, torch.Tensor]:
    """Gradients of the full batch 0 on one device."""
    return first_grads(new_model(torch.device(DEV, 0)), 0, 1)


def assert_grads(actual: dict, what: str):
    expected = reference_grads()
    assert set(actual) == set(expected), (what, set(actual) ^ set(expected))
    worst = 0.0
    for name, g in actual.items():
        torch.testing.assert_close(g, expected[name], **GRAD_TOL,
                                   msg=lambda m, n=name: f"{what}: gradient of {n}: {m}")
        worst = max(worst, (g - expected[name]).abs().max().item())
    print(f"{what}: max |gradient difference| {worst:.2e}")


def curve(per_rank_losses) -> torch.Tensor:
    """Global-batch loss curve from the ranks' local curves (equal token counts)."""
    return torch.tensor(per_rank_losses, dtype=torch.float64).mean(0)


def assert_curve(actual: torch.Tensor, expected: torch.Tensor, atol: float, what: str):
    diff = (actual - expected).abs().max().item()
    print(f"{what}: max |loss difference| {diff:.2e} (tolerance {atol:.0e})")
    assert diff <= atol, (f"{what}: loss curve differs from single-device training by {diff:.3g}"
                          f" (tolerance {atol})\n  actual   {actual.tolist()}\n"
                          f"  expected {expected.tolist()}")


def test_tolerances_discriminate():
    """The reference curve moves, and a wrong data-parallel computation (rank 0's
    micro-batch only) leaves the fp32 and bf16 tolerances far behind."""
    good, _ = reference(micro=2)
    wrong, _ = reference(micro=2, only_rank0=True)
    assert good[0] - good[-1] > 0.1, good
    assert (good - wrong).abs().max() > 10 * LOSS_ATOL_BF16, (good, wrong)
    # micro-batching is exact up to rounding (what the fp32 tolerance allows)
    full, _ = reference(micro=1)
    assert_curve(good, full, LOSS_ATOL_FP32 / 10, "2 micro-batches vs full batch")
    bf16, _ = reference(micro=2, mixed_precision=True)
    assert (bf16 - good).abs().max() > LOSS_ATOL_BF16  # bf16 training is distinguishable


# ---------------------------------------------------------------------------
# FSDP2 (1-D), DDP and DCP: one spawned run of 2 ranks


def test_fsdp2_custom_ops_have_device_kernels():
    """fully_shard's copy-in/out ops dispatch to a kernel for axon (torch
    registers PrivateUse1 ones), not to a missing-kernel error or the CPU."""
    import torch.distributed.fsdp._fully_shard._fsdp_collectives  # noqa: F401  (defines them)

    for op in ("all_gather_copy_in", "split_with_sizes_copy", "chunk_cat"):
        assert torch._C._dispatch_has_kernel_for_dispatch_key(f"fsdp::{op}", "PrivateUse1"), op
    # and they compute on axon what they compute on the CPU
    x = [torch.arange(6.0).view(2, 3), torch.arange(4.0).view(2, 2)]
    for device in ("cpu", DEV):
        out = torch.empty(2, 5, device=device)
        torch.ops.fsdp.chunk_cat([t.to(device) for t in x], dim=0, num_chunks=2, out=out)
        if device == "cpu":
            expected = out
        else:
            torch.testing.assert_close(out.cpu(), expected, rtol=0, atol=0)


def _fsdp_ddp_dcp_ranks(rank, world_size, ckpt_dir):
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor
    from torch.nn.parallel import DistributedDataParallel as DDP

    import torch.distributed.checkpoint as dcp

    init_dist(rank, world_size)
    out = {}
    t0 = time.perf_counter()
    mesh = init_device_mesh(DEV, (world_size,))
    device = rank_device()

    # fp32 FSDP, checkpointed after CKPT_STEP steps
    model = apply_fsdp(new_model(device), mesh)
    p = model.model.embed_tokens.weight
    assert isinstance(p, DTensor) and p.to_local().device == device, (type(p), device)
    assert p.to_local().shape[0] == TINY_LM_VOCAB // world_size
    grads = first_grads(model, rank, world_size)
    out["fsdp_grads"] = grads if rank == 0 else None
    losses, opt = train(model, rank, world_size, steps=range(CKPT_STEP))
    msd, osd = get_state_dict(model, opt)
    dcp.save({"model": msd, "optim": osd}, checkpoint_id=ckpt_dir)
    more, _ = train(model, rank, world_size, steps=range(CKPT_STEP, STEPS), opt=opt)
    out["fsdp"] = losses + more
    params = full_params(model)  # a collective: every rank gathers
    out["fsdp_params"] = params if rank == 0 else None
    if DEV != "cpu":
        # FSDP2's communication streams: high-priority axon streams of this device
        ctx = model._get_fsdp_state()._comm_ctx
        streams = [ctx.all_gather_copy_in_stream, ctx.all_gather_stream,
                   ctx.reduce_scatter_stream]
        default = getattr(torch, DEV).default_stream(device)
        for st in streams:
            assert isinstance(st, getattr(torch, DEV).Stream) and st.device == device, st
            assert st.priority == -1 and st.stream_id != default.stream_id, st

    # a fresh (differently initialised) FSDP model and optimizer resume from the checkpoint
    torch.manual_seed(1)
    model2 = new_model(device)
    with torch.no_grad():
        for q in model2.parameters():
            q.normal_()
    apply_fsdp(model2, mesh)
    opt2 = torch.optim.AdamW(model2.parameters(), lr=LR)
    # optimizer state exists only after a step; get_state_dict/set_state_dict create it
    msd2, osd2 = get_state_dict(model2, opt2)
    dcp.load({"model": msd2, "optim": osd2}, checkpoint_id=ckpt_dir)
    set_state_dict(model2, opt2, model_state_dict=msd2, optim_state_dict=osd2)
    out["resumed"], _ = train(model2, rank, world_size, steps=range(CKPT_STEP, STEPS), opt=opt2)
    del model, model2, opt, opt2

    # mixed precision: bf16 params, fp32 gradient reduction
    model = apply_fsdp(new_model(device), mesh, bf16_policy())
    seen = []
    model.model.layers[1].mlp.down_proj.register_forward_hook(
        lambda mod, args, res: seen.append((mod.weight.dtype, args[0].dtype, res.dtype)))
    out["fsdp_bf16"], _ = train(model, rank, world_size)
    assert seen and all(s == (torch.bfloat16,) * 3 for s in seen), seen
    assert model.model.embed_tokens.weight.dtype == torch.float32  # sharded master weights
    del model

    # CPU offload: sharded parameters in pinned host memory, optimizer step on the CPU
    if DEV != "cpu":
        from torch.distributed.fsdp import CPUOffloadPolicy, fully_shard

        model = new_model(device)
        for module in [*model.model.layers, model]:
            fully_shard(module, mesh=mesh, offload_policy=CPUOffloadPolicy())
        shard = model.model.embed_tokens.weight.to_local()
        assert shard.device.type == "cpu" and shard.is_pinned()
        out["fsdp_offload"], _ = train(model, rank, world_size)
        del model

    # DDP
    model = DDP(new_model(device), device_ids=[device.index] if DEV != "cpu" else None)
    out["ddp_grads"] = first_grads(model, rank, world_size)
    out["ddp"], _ = train(model, rank, world_size)
    out["ddp_params"] = full_params(model.module)
    out["seconds"] = time.perf_counter() - t0
    return ship(out)


_RUNS: dict = {}


def spawned(key, fn, world_size, *args):
    """run_ranks once per module; a failed run fails every test using it at once
    (module fixtures would re-run it per test)."""
    if key not in _RUNS:
        t0 = time.perf_counter()
        try:
            _RUNS[key] = (unship(run_ranks(fn, world_size, *args)), time.perf_counter() - t0)
        except BaseException as e:  # noqa: BLE001
            _RUNS[key] = e
    if isinstance(_RUNS[key], BaseException):
        raise _RUNS[key]
    return _RUNS[key]


@pytest.fixture(scope="module")
def fsdp_run(tmp_path_factory):
    ckpt = tmp_path_factory.mktemp("dcp")
    results, seconds = spawned("fsdp", _fsdp_ddp_dcp_ranks, 2, str(ckpt))
    return results, ckpt, seconds


def test_fsdp2_matches_single_device(fsdp_run):
    results, _, _ = fsdp_run
    expected, _ = reference(micro=1)
    assert_grads(results[0]["fsdp_grads"], "FSDP2 fp32, 2 ranks")
    assert_curve(curve([r["fsdp"] for r in results]), expected, LOSS_ATOL_FP32,
                 "FSDP2 fp32, 2 ranks")
    # the trained (gathered) parameters too
    ref_model = _reference_final_params()
    for name, value in results[0]["fsdp_params"].items():
        torch.testing.assert_close(value, ref_model[name], rtol=0, atol=PARAM_ATOL, msg=name)


@functools.lru_cache(maxsize=None)
def _reference_final_params():
    device = torch.device(DEV, 0)
    model = new_model(device)
    train(model, 0, 1)
    return full_params(model)


def test_fsdp2_mixed_precision(fsdp_run):
    results, _, _ = fsdp_run
    expected, _ = reference(micro=2, mixed_precision=True)
    assert_curve(curve([r["fsdp_bf16"] for r in results]), expected, LOSS_ATOL_BF16,
                 "FSDP2 bf16 params / fp32 reduce, 2 ranks")


def test_fsdp2_cpu_offload(fsdp_run):
    if DEV == "cpu":
        pytest.skip("offload is to the CPU")
    results, _, _ = fsdp_run
    expected, _ = reference(micro=1)
    assert_curve(curve([r["fsdp_offload"] for r in results]), expected, LOSS_ATOL_FP32,
                 "FSDP2 + CPUOffloadPolicy, 2 ranks")


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")
def test_fsdp2_dcp_save_load(fsdp_run):
    results, ckpt, _ = fsdp_run
    expected, snapshot = reference(micro=1)
    # resuming a fresh FSDP model + optimizer from the checkpoint continues the curve
    assert_curve(curve([r["resumed"] for r in results]), expected[CKPT_STEP:], LOSS_ATOL_FP32,
                 "FSDP2 resumed from DCP")
    resumed = curve([r["resumed"] for r in results])
    original = curve([r["fsdp"] for r in results])[CKPT_STEP:]
    torch.testing.assert_close(resumed, original, rtol=0, atol=1e-6)
    # the sharded checkpoint loads into a plain single-process model (no process group)
    import torch.distributed.checkpoint as dcp

    model = new_model("cpu")
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
    sd = {"model": model.state_dict()}
    dcp.load(sd, checkpoint_id=str(ckpt), no_dist=True)
    model.load_state_dict(sd["model"])
    for name, value in model.named_parameters():
        torch.testing.assert_close(value.detach(), snapshot[name], rtol=0, atol=PARAM_ATOL,
                                   msg=name)
    with torch.no_grad():
        loss = loss_of(model, batches()[CKPT_STEP]).item()
    assert abs(loss - expected[CKPT_STEP].item()) <= LOSS_ATOL_FP32


def test_ddp_matches_single_device(fsdp_run):
    results, _, seconds = fsdp_run
    expected, _ = reference(micro=1)
    for r in results:
        assert_grads(r["ddp_grads"], "DDP, 2 ranks")
    assert_curve(curve([r["ddp"] for r in results]), expected, LOSS_ATOL_FP32, "DDP, 2 ranks")
    ref = _reference_final_params()
    for name, value in results[0]["ddp_params"].items():
        # replicas stay identical; they match single-device training
        torch.testing.assert_close(results[1]["ddp_params"][name], value, rtol=0, atol=0)
        torch.testing.assert_close(value, ref[name], rtol=0, atol=PARAM_ATOL, msg=name)
    ranks = ", ".join(f"{r['seconds']:.1f}" for r in results)
    print(f"FSDP/DCP/DDP run: {seconds:.1f} s (in the ranks: {ranks} s)")


# ---------------------------------------------------------------------------
# Tensor / sequence parallelism and the DTensor RNG: one spawned run of 2 ranks


def _dropout_checks(mesh, device):
    import torch.nn.functional as F
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    axon_mod = getattr(torch, DEV)
    out = {}
    torch.manual_seed(7)
    ones = torch.ones(16, 16, device=device)
    rep = distribute_tensor(ones, mesh, [Replicate()])
    shard = distribute_tensor(ones, mesh, [Shard(0)])
    state0 = axon_mod.get_rng_state().clone()
    y_rep = F.dropout(rep, p=0.5, training=True)
    state1 = axon_mod.get_rng_state().clone()
    y_shard = F.dropout(shard, p=0.5, training=True)
    state2 = axon_mod.get_rng_state().clone()
    out["rep"] = y_rep.to_local().cpu()
    out["shard_local"] = y_shard.to_local().cpu()
    out["shard_full"] = y_shard.full_tensor().cpu()
    out["states"] = [state0, state1, state2]
    # the local shard is what the generator at (seed, offset + shard_index * shard_numel)
    # produces for a plain tensor of the shard's shape
    state = state1.clone()
    offset = state[8:].view(torch.int64)
    offset += mesh.get_local_rank() * out["shard_local"].numel()
    saved = axon_mod.get_rng_state()
    axon_mod.set_rng_state(state)
    out["shard_replay"] = F.dropout(torch.ones(8, 16, device=device), p=0.5).cpu()
    axon_mod.set_rng_state(saved)
    # same seed, same sharded result
    torch.manual_seed(7)
    F.dropout(rep, p=0.5, training=True)
    out["shard_again"] = F.dropout(shard, p=0.5, training=True).to_local().cpu()
    return out


# F.scaled_dot_product_attention on DTensors: (placement of q/k/v, mask, SDPA kwargs).
SDPA_DTENSOR_CASES = {
    "heads": ("Shard(dim=1)", None, {}),
    "heads_causal_gqa": ("Shard(dim=1)", None, {"is_causal": True, "enable_gqa": True}),
    "batch_causal": ("Shard(dim=0)", None, {"is_causal": True}),
    "replicated": ("Replicate()", None, {}),
    "heads_mask_b1ls": ("Shard(dim=1)", "b1ls", {}),
    "heads_mask_bhls": ("Shard(dim=1)", "bhls", {}),
    "batch_bool_mask_ls": ("Shard(dim=0)", "bool_ls", {}),
    # 6 query heads over 3 key/value heads: 2 shards cannot split on group
    # boundaries, so the heads are gathered (the output is not head-sharded)
    "heads_gqa_uneven_groups": ("Shard(dim=1)", None, {"enable_gqa": True, "heads": (6, 3)}),
}


def _sdpa_inputs(case):
    """CPU q, k, v (k, v with half the heads for GQA) and the case's mask."""
    _, mask_kind, kw = SDPA_DTENSOR_CASES[case]
    g = torch.Generator().manual_seed(5)
    q_heads, kv_heads = kw.get("heads", (4, 2 if kw.get("enable_gqa") else 4))
    q = torch.randn(2, q_heads, 8, 16, generator=g)
    k, v = (torch.randn(2, kv_heads, 8, 16, generator=g) for _ in range(2))
    mask = {None: None, "b1ls": torch.randn(2, 1, 8, 8, generator=g),
            "bhls": torch.randn(2, 4, 8, 8, generator=g),
            "bool_ls": torch.rand(8, 8, generator=g) > 0.3}[mask_kind]
    if mask is not None and mask.dtype == torch.bool:
        mask[:, 0] = True
    return q, k, v, mask


def _sdpa_dtensor_checks(mesh, device):
    import torch.nn.functional as F
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    placements = {"Shard(dim=1)": Shard(1), "Shard(dim=0)": Shard(0), "Replicate()": Replicate()}
    out = {}
    for case, (placement, _, kw) in SDPA_DTENSOR_CASES.items():
        q, k, v, mask = _sdpa_inputs(case)
        dq, dk, dv = (distribute_tensor(t.to(device), mesh, [placements[placement]]).requires_grad_()
                      for t in (q, k, v))
        dmask = None if mask is None else distribute_tensor(mask.to(device), mesh, [Replicate()])
        kw = {n: a for n, a in kw.items() if n != "heads"}
        y = F.scaled_dot_product_attention(dq, dk, dv, attn_mask=dmask, **kw)
        y.backward(torch.ones_like(y))
        out[case] = dict(placements=str(y.placements), grad_fn=y.grad_fn.name(),
                         y=y.full_tensor().cpu(),
                         grads=[t.grad.full_tensor().cpu() for t in (dq, dk, dv)])
    return out


def _cp_inputs():
    g = torch.Generator().manual_seed(11)
    return [torch.randn(2, 4, 16, 8, generator=g) for _ in range(3)]


def _context_parallel_checks(mesh, device):
    """torch.distributed.tensor.experimental.context_parallel: q, k, v sharded
    on the sequence (load-balanced), SDPA as ring attention; gradients reach
    q, k, v through scalar weights (the buffers themselves are resharded in
    place and cannot require grad)."""
    import torch.nn.functional as F
    from torch.distributed.tensor.experimental import context_parallel
    from torch.distributed.tensor.experimental._attention import (_cp_options,
                                                                  context_parallel_unshard)

    out = {}
    for causal in (False, True):
        q, k, v = (t.to(device) for t in _cp_inputs())
        w = [torch.ones((), device=device, requires_grad=True) for _ in range(3)]
        # upstream load-balances causal attention only ("Load balancing requires
        # `is_causal=True`")
        _cp_options.enable_load_balance = causal
        with context_parallel(mesh, buffers=[q, k, v], buffer_seq_dims=[2, 2, 2]):
            y = F.scaled_dot_product_attention(q * w[0], k * w[1], v * w[2], is_causal=causal)
            (y * y).sum().backward()
        (full,) = context_parallel_unshard(mesh, [y.detach()], [2])
        grads = torch.stack([t.grad for t in w])
        torch.distributed.all_reduce(grads)  # each rank saw its part of the sequence
        out[causal] = (full.cpu(), grads.cpu())
    _cp_options.enable_load_balance = True
    try:  # a mask: not supported by ring attention (as for CUDA's flash attention)
        q, k, v = (t.to(device) for t in _cp_inputs())
        with context_parallel(mesh, buffers=[q, k, v], buffer_seq_dims=[2, 2, 2]):
            F.scaled_dot_product_attention(q, k, v, attn_mask=torch.zeros(
                16, 16, device=device)[None, None].expand(2, 4, 16, 16).contiguous())
    except NotImplementedError as e:
        out["mask_error"] = str(e)
    try:  # dropout: each ring step draws its own numbers, which the backward cannot replay
        q, k, v = (t.to(device) for t in _cp_inputs())
        with context_parallel(mesh, buffers=[q, k, v], buffer_seq_dims=[2, 2, 2]):
            F.scaled_dot_product_attention(q, k, v, dropout_p=0.5, is_causal=True)
    except NotImplementedError as e:
        out["dropout_error"] = str(e)
    return out


def _tp_ranks(rank, world_size):
    from torch.distributed.device_mesh import init_device_mesh

    init_dist(rank, world_size)
    t0 = time.perf_counter()
    mesh = init_device_mesh(DEV, (world_size,), mesh_dim_names=("tp",))
    device = rank_device()
    out = {}
    ids = batches()[0].to(device)
    for name, sp in (("tp", False), ("sp", True)):
        model = apply_tp(new_model(device), mesh, sequence_parallel=sp)
        q = model.model.layers[0].self_attn.q_proj.weight
        assert q.to_local().shape[0] == q.shape[0] // world_size and q.to_local().device == device
        model.eval()
        with torch.no_grad():
            logits = model(input_ids=ids).logits
        out[f"{name}_logits"] = (logits.full_tensor() if hasattr(logits, "full_tensor")
                                 else logits).cpu()
        model.train()
        out[f"{name}_grads"] = first_grads(model, 0, 1)
        out[name], _ = train(model, 0, 1)  # every TP rank sees the whole batch
        del model
    if DEV != "cpu":
        out["dropout"] = _dropout_checks(mesh, device)
        out["sdpa"] = _sdpa_dtensor_checks(mesh, device)
        out["context_parallel"] = _context_parallel_checks(mesh, device)
    out["seconds"] = time.perf_counter() - t0
    return ship(out)


@pytest.fixture(scope="module")
def tp_run():
    return spawned("tp", _tp_ranks, 2)[0]


@pytest.mark.parametrize("plan", ["tp", "sp"])
def test_tensor_parallel_matches_single_device(tp_run, plan):
    expected_logits = reference_logits()
    for r in tp_run:
        torch.testing.assert_close(r[f"{plan}_logits"], expected_logits, **LOGITS_TOL)
    expected, _ = reference(micro=1)
    for r in tp_run:
        assert_grads(r[f"{plan}_grads"], f"{plan.upper()} (2 ranks)")
        assert_curve(torch.tensor(r[plan], dtype=torch.float64), expected, LOSS_ATOL_FP32,
                     f"{plan.upper()} (2 ranks)")


@pytest.mark.skipif(DEV == "cpu", reason="DTensor's RNG tracker needs an accelerator")
def test_dtensor_dropout_rng(tp_run):
    d0, d1 = tp_run[0]["dropout"], tp_run[1]["dropout"]
    numel = 16 * 16
    # replicated: the same mask everywhere; values are 0 or 1/(1-p)
    torch.testing.assert_close(d0["rep"], d1["rep"], rtol=0, atol=0)
    assert set(d0["rep"].unique().tolist()) <= {0.0, 2.0}
    assert 0.3 < (d0["rep"] != 0).float().mean() < 0.7
    # sharded: different shards draw different numbers, the whole tensor agrees
    assert not torch.equal(d0["shard_local"], d1["shard_local"])
    torch.testing.assert_close(d0["shard_full"], d1["shard_full"], rtol=0, atol=0)
    torch.testing.assert_close(d0["shard_full"][:8], d0["shard_local"], rtol=0, atol=0)
    torch.testing.assert_close(d0["shard_full"][8:], d1["shard_local"], rtol=0, atol=0)
    # Philox-style (seed, offset) bookkeeping: shard i starts at offset + i * shard numel,
    # every rank advances the offset by the whole tensor's numel
    for d in (d0, d1):
        torch.testing.assert_close(d["shard_replay"], d["shard_local"], rtol=0, atol=0)
        s0, s1, s2 = (s.view(torch.int64) for s in d["states"])
        assert s1[0] == s0[0] == 7 and s1[1] - s0[1] == numel and s2[1] - s1[1] == numel, \
            (s0, s1, s2)
        torch.testing.assert_close(d["shard_again"], d["shard_local"], rtol=0, atol=0)
    for i in range(3):
        torch.testing.assert_close(d0["states"][i], d1["states"][i], rtol=0, atol=0)


# ---------------------------------------------------------------------------
# 4 ranks: FSDP2 on 4, HSDP (2 x 2), TP x FSDP (2 x 2)


def _four_rank_ranks(rank, world_size):
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
    from torch.distributed.device_mesh import init_device_mesh

    init_dist(rank, world_size)
    t0 = time.perf_counter()
    device = rank_device()
    out = {}
    mesh1 = init_device_mesh(DEV, (world_size,))
    model = apply_fsdp(new_model(device), mesh1)
    grads = first_grads(model, rank, world_size)
    out["fsdp4_grads"] = grads if rank == 0 else None
    out["fsdp4"], _ = train(model, rank, world_size)
    del model

    # HSDP: replicate x shard (2 x 2); gradients reduce-scattered, then all-reduced
    hsdp = init_device_mesh(DEV, (2, world_size // 2), mesh_dim_names=("replicate", "shard"))
    model = apply_fsdp(new_model(device), hsdp)
    assert model.model.embed_tokens.weight.placements[0].is_replicate()
    grads = first_grads(model, rank, world_size)
    out["hsdp_grads"] = grads if rank == 0 else None
    out["hsdp"], _ = train(model, rank, world_size)
    del model

    mesh = init_device_mesh(DEV, (2, world_size // 2), mesh_dim_names=("dp", "tp"))
    dp_rank = mesh["dp"].get_local_rank()
    model = apply_fsdp(apply_tp(new_model(device), mesh["tp"]), mesh["dp"])
    w = model.model.layers[0].mlp.gate_proj.weight
    assert w.device_mesh.ndim == 2 and w.to_local().shape[0] == w.shape[0] // world_size, \
        (w.placements, w.to_local().shape)
    out["dp_rank"] = dp_rank
    grads = first_grads(model, dp_rank, 2)
    out["2d_grads"] = grads if rank == 0 else None
    out["2d"], _ = train(model, dp_rank, 2)
    sd = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True,
                                                              cpu_offload=True))
    out["2d_params"] = sd if rank == 0 else None
    out["seconds"] = time.perf_counter() - t0
    return ship(out)


@pytest.fixture(scope="module")
def four_rank_run():
    return spawned("4", _four_rank_ranks, 4)[0]


def test_fsdp2_four_ranks(four_rank_run):
    expected, _ = reference(micro=1)
    assert_grads(four_rank_run[0]["fsdp4_grads"], "FSDP2 fp32, 4 ranks")
    assert_curve(curve([r["fsdp4"] for r in four_rank_run]), expected, LOSS_ATOL_FP32,
                 "FSDP2 fp32, 4 ranks")


def test_hsdp_2d(four_rank_run):
    expected, _ = reference(micro=1)
    assert_grads(four_rank_run[0]["hsdp_grads"], "HSDP (replicate 2 x shard 2)")
    assert_curve(curve([r["hsdp"] for r in four_rank_run]), expected, LOSS_ATOL_FP32,
                 "HSDP (replicate 2 x shard 2)")


def test_tp_x_fsdp_2d(four_rank_run):
    expected, _ = reference(micro=1)
    by_dp = {}
    for r in four_rank_run:
        by_dp.setdefault(r["dp_rank"], []).append(r["2d"])
    # the TP ranks of one dp group computed the same loss
    for curves in by_dp.values():
        torch.testing.assert_close(torch.tensor(curves[0]), torch.tensor(curves[1]),
                                   rtol=0, atol=1e-6)
    assert_grads(four_rank_run[0]["2d_grads"], "TP x FSDP (2 x 2)")
    got = curve([by_dp[0][0], by_dp[1][0]])
    assert_curve(got, expected, LOSS_ATOL_FP32, "TP x FSDP (2 x 2)")
    ref = _reference_final_params()
    sd = four_rank_run[0]["2d_params"]
    assert set(sd) == set(ref)
    for name, value in sd.items():
        assert value.device.type == "cpu" and value.shape == ref[name].shape
        torch.testing.assert_close(value, ref[name], rtol=0, atol=PARAM_ATOL, msg=name)


# ---------------------------------------------------------------------------
# examples/train_fsdp_tp.py under torchrun


@pytest.mark.parametrize("nproc,dp,tp", [(4, 2, 2), (2, 2, 1)])
def test_example_train_fsdp_tp(tmp_path, nproc, dp, tp):
    """4 ranks: TP x FSDP 2 x 2; 2 ranks fall back to FSDP over both (dp=2 x tp=1)."""
    out = tmp_path / "ckpt"
    metrics = tmp_path / "metrics.json"
    env = dict(os.environ)
    env.pop("AXON_DIST_TEST_DEVICE", None)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           f"--nproc_per_node={nproc}",
           str(REPO / "examples" / "train_fsdp_tp.py"), "--steps", "6", "--output-dir", str(out),
           "--metrics", str(metrics)]
    if DEV == "cpu":
        cmd.insert(-6, "--device=cpu")
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240,
                          cwd=tmp_path)
    seconds = time.perf_counter() - t0
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-8000:]
    assert f"mesh dp={dp} x tp={tp}" in proc.stdout, proc.stdout
    m = json.loads(metrics.read_text())
    assert (m["world_size"], m["dp"], m["tp"]) == (nproc, dp, tp)
    assert "measured:" in proc.stdout and "step   6/6" in proc.stdout
    assert m["losses"][-1] < m["losses"][0] - 0.1, m["losses"]
    # a standard Transformers checkpoint that loads on the CPU and is the trained model
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    assert next(model.parameters()).device.type == "cpu"
    ids = torch.tensor(m["eval_input_ids"])
    with torch.no_grad():
        loss = model(input_ids=ids, labels=ids).loss.item()
    assert abs(loss - m["eval_loss"]) <= LOSS_ATOL_FP32, (loss, m["eval_loss"])
    assert model.config.model_type == "llama" and (out / "config.json").exists()
    print(f"example under torchrun ({nproc} ranks): {seconds:.1f} s")


@pytest.mark.skipif(DEV == "cpu", reason="DTensor has no sharding strategy for the CPU's SDPA "
                                         "op (_scaled_dot_product_flash_attention_for_cpu)")
@pytest.mark.parametrize("case", list(SDPA_DTENSOR_CASES))
def test_sdpa_on_dtensors_matches_cpu(tp_run, case):
    """F.scaled_dot_product_attention on sharded/replicated DTensors (axon's fused op
    with torch_axon's DTensor strategies): output placement as the inputs', output and
    q/k/v gradients equal to the CPU's on the whole tensors (float32 accumulation
    tolerance; measured ~5e-7)."""
    import torch.nn.functional as F

    q, k, v, mask = _sdpa_inputs(case)
    placement, _, kw = SDPA_DTENSOR_CASES[case]
    kw = {n: a for n, a in kw.items() if n != "heads"}
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    y = F.scaled_dot_product_attention(*leaves, attn_mask=mask, **kw)
    y.backward(torch.ones_like(y))
    for r in tp_run:
        got = r["sdpa"][case]
        if case == "heads_gqa_uneven_groups":
            assert got["placements"] != f"({placement},)"
        else:
            assert got["placements"] == f"({placement},)"
        assert got["grad_fn"] == "ScaledDotProductFusedAttentionOverrideableBackward0"
        torch.testing.assert_close(got["y"], y.detach(), rtol=1e-5, atol=1e-5)
        for g, leaf in zip(got["grads"], leaves):
            torch.testing.assert_close(g, leaf.grad, rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(DEV == "cpu", reason="no ring attention for the CPU's SDPA op upstream")
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_context_parallel_matches_cpu(tp_run, causal):
    """PyTorch's context parallelism (ring attention over 2 ranks; causal with
    load-balanced sequence shards) gives the CPU's attention and gradients (float32
    accumulation tolerance; ring merges partial softmaxes in another order)."""
    import torch.nn.functional as F

    q, k, v = _cp_inputs()
    w = [torch.ones((), requires_grad=True) for _ in range(3)]
    y = F.scaled_dot_product_attention(q * w[0], k * w[1], v * w[2], is_causal=causal)
    (y * y).sum().backward()
    expected = torch.stack([t.grad for t in w])
    for r in tp_run:
        full, grads = r["context_parallel"][causal]
        torch.testing.assert_close(full, y.detach(), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(grads, expected, rtol=1e-4, atol=1e-4)
    assert "no attention mask" in tp_run[0]["context_parallel"]["mask_error"]
    assert "no attention dropout" in tp_run[0]["context_parallel"]["dropout_error"]
