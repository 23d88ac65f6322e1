"""Diffusers' tensor and context parallelism on 2 axon ranks.

Diffusers shards a transformer's ``_tp_plan`` with ``parallelize_module``
(DTensor, ``ColwiseParallel``/``RowwiseParallel`` and its packed variants), from
both public entry points: ``model.enable_parallelism(config=TensorParallelConfig(
mesh=... or tp_degree=...))`` and ``from_pretrained(..., parallel_config=
TensorParallelConfig(tp_degree=...))``, which streams each rank's slice of the
checkpoint.  Its device allow-list ``_SUPPORTED_TP_DEVICES`` is patched by
``torch_axon/integrations/hf_diffusers.py``.

The ranks are spawned once (a module-scoped fixture; spawning and importing
Diffusers costs ~15 s) and run, like the reference recipe (TP degree N, the
repeated transformer blocks compiled with ``fullgraph=True, dynamic=False``,
inputs drawn from a CPU generator seeded alike on every rank):

- a tiny random ``FluxTransformer2DModel`` (double- and single-stream blocks,
  the single block's ``PackedRowwiseParallel`` projection), seeded identically,
  sharded over an explicit axon DeviceMesh with ``enable_parallelism``, eager and
  then with ``compile_repeated_blocks(fullgraph=True, dynamic=False)``;
- the same model saved and loaded with ``from_pretrained(parallel_config=
  TensorParallelConfig(tp_degree=2))`` (Diffusers builds the mesh from the
  current accelerator, axon), in float32 and bfloat16;
- a tiny ``QwenImageTransformer2DModel`` with ``TensorParallelConfig(tp_degree=2)``;
- a mesh of an unsupported device type (cpu), which still raises upstream's error;
- context parallelism (``ContextParallelConfig``, ring and Ulysses) with the
  ``"_native_flash"`` attention backend, which calls
  ``aten::_scaled_dot_product_flash_attention`` for the logsumexp.

Tolerances: TP computes each block's float32 sums in two halves added by an
all-reduce, so outputs agree with the unsharded model on the CPU within the
float32 accumulation tolerance (rtol=atol=1e-4; observed ~1e-7).  In bfloat16
the two partial sums are rounded to bfloat16 before the all-reduce, one extra
rounding per row-parallel layer, so the output agrees with the CPU's bfloat16
forward within the bfloat16 tolerance (rtol=1.6e-2, atol=1e-2, a few ulps at
the output's scale of ~0.3-1; observed 2e-3, one ulp).  The all-reduced outputs are bit-identical across ranks.
"""

from __future__ import annotations

import types

import pytest
import torch

pytest.importorskip("diffusers")

from conftest import tol  # noqa: E402
from dist_util import run_ranks, ship, unship  # noqa: E402

WORLD = 2
F32 = tol(torch.float32, accum=True)
BF16 = tol(torch.bfloat16)


# ---------------------------------------------------------------- tiny models, CPU-seeded inputs


def flux_model():
    from diffusers import FluxTransformer2DModel

    torch.manual_seed(0)  # the same random init on every rank and in the CPU reference
    # 2 heads of 16 (inner 32, MLP 128): every sharded dimension divides by 2.
    return FluxTransformer2DModel(patch_size=1, in_channels=4, num_layers=1, num_single_layers=1,
                                  attention_head_dim=16, num_attention_heads=2, joint_attention_dim=32,
                                  pooled_projection_dim=32, axes_dims_rope=(4, 6, 6)).eval()


def flux_inputs(device="cpu", dtype=torch.float32):
    g = torch.Generator().manual_seed(1)  # a CPU generator: every rank draws the same values
    seq, txt = 16, 8
    ids = torch.stack(torch.meshgrid(torch.zeros(1), torch.arange(4.0), torch.arange(4.0), indexing="ij"),
                      -1).reshape(seq, 3)
    x = dict(hidden_states=torch.randn(1, seq, 4, generator=g),
             encoder_hidden_states=torch.randn(1, txt, 32, generator=g),
             pooled_projections=torch.randn(1, 32, generator=g), timestep=torch.tensor([0.7]),
             img_ids=ids, txt_ids=torch.zeros(txt, 3))
    return {k: v.to(device, dtype if k not in ("img_ids", "txt_ids") else torch.float32)
            for k, v in x.items()}


def qwen_model():
    from diffusers import QwenImageTransformer2DModel

    torch.manual_seed(0)
    return QwenImageTransformer2DModel(patch_size=2, in_channels=16, out_channels=4, num_layers=1,
                                       attention_head_dim=16, num_attention_heads=2, joint_attention_dim=16,
                                       axes_dims_rope=(8, 4, 4)).eval()


def qwen_inputs(device="cpu"):
    g = torch.Generator().manual_seed(2)
    mask = torch.ones(1, 7)
    mask[0, -2:] = 0  # two padded text tokens
    x = dict(hidden_states=torch.randn(1, 16, 16, generator=g),
             encoder_hidden_states=torch.randn(1, 7, 16, generator=g),
             encoder_hidden_states_mask=mask, timestep=torch.tensor([0.3]))
    return {k: v.to(device) for k, v in x.items()} | {"img_shapes": [(1, 4, 4)]}


# ---------------------------------------------------------------- the ranks


def _shard_info(model, name):
    from torch.distributed.tensor import DTensor

    p = model.get_parameter(name)
    assert isinstance(p, DTensor), f"{name} is not sharded ({type(p).__name__})"
    local = p.to_local()
    return dict(mesh=p.device_mesh.device_type, placements=str(p.placements),
                local_shape=tuple(local.shape), local_device=str(local.device), shape=tuple(p.shape))


def _tp_rank(rank, world_size, flux_path):
    import torch.distributed as dist
    from diffusers import FluxTransformer2DModel, TensorParallelConfig
    from torch._dynamo.utils import counters
    from torch.distributed.device_mesh import init_device_mesh

    dist.init_process_group()  # torch picks the backend registered for axon
    out = dict(backend_config=str(dist.get_backend_config()))

    # 1. enable_parallelism over an explicit axon DeviceMesh, eager.
    mesh = init_device_mesh("axon", (world_size,), mesh_dim_names=("tp",))
    flux = flux_model().to("axon")
    flux.enable_parallelism(config=TensorParallelConfig(mesh=mesh))
    out["flux_shards"] = {n: _shard_info(flux, n) for n in (
        "transformer_blocks.0.attn.to_q.weight",                # colwise
        "transformer_blocks.0.ff.net.2.weight",                 # rowwise
        "single_transformer_blocks.0.proj_out.weight")}         # packed rowwise
    x = flux_inputs("axon")
    with torch.no_grad():
        y = flux(**x).sample
    out["flux_eager"] = (y.cpu(), str(y.device))

    # 2. from_pretrained(parallel_config=TensorParallelConfig(tp_degree=2)): the mesh comes
    # from the current accelerator; each rank reads its slices of the checkpoint.
    for dtype in (torch.float32, torch.bfloat16):
        loaded = FluxTransformer2DModel.from_pretrained(
            flux_path, torch_dtype=dtype, parallel_config=TensorParallelConfig(tp_degree=world_size))
        q = _shard_info(loaded, "transformer_blocks.0.attn.to_q.weight")
        with torch.no_grad():
            y = loaded(**flux_inputs("axon", dtype)).sample
        out[f"loaded_{dtype}"] = (y.cpu(), str(y.device), q, str(loaded.dtype))
        del loaded

    # 3. QwenImage, mesh built from tp_degree by enable_parallelism.
    qwen = qwen_model().to("axon")
    qwen.enable_parallelism(config=TensorParallelConfig(tp_degree=world_size))
    out["qwen_shards"] = _shard_info(qwen, "transformer_blocks.0.img_mlp.net.2.weight")
    with torch.no_grad():
        y = qwen(**qwen_inputs("axon")).sample
    out["qwen"] = (y.cpu(), str(y.device))

    # 4. A device type Diffusers does not list is still refused with upstream's message.
    cpu_mesh = init_device_mesh("cpu", (world_size,))
    try:
        flux_model().enable_parallelism(config=TensorParallelConfig(mesh=cpu_mesh))
    except ValueError as e:
        out["cpu_error"] = str(e)

    # 5. The repeated blocks compiled as in the reference recipe.
    counters.clear()
    flux.compile_repeated_blocks(fullgraph=True, dynamic=False)
    with torch.no_grad():
        y = flux(**x).sample
        y2 = flux(**x).sample  # a second call reuses the graphs
    out["flux_compiled"] = (y.cpu(), y2.cpu(), str(y.device))
    out["compile_stats"] = dict(counters["stats"])
    out["graph_breaks"] = sum(counters["graph_break"].values())

    # 6. Context parallelism: ring attention with the "_native_flash" backend
    # (aten::_scaled_dot_product_flash_attention for its logsumexp), and Ulysses.
    from diffusers import ContextParallelConfig

    for degree in ("ring_degree", "ulysses_degree"):
        cp = flux_model().to("axon")
        cp.set_attention_backend("_native_flash")
        cp.enable_parallelism(config=ContextParallelConfig(**{degree: world_size}))
        with torch.no_grad():
            y = cp(**flux_inputs("axon"), return_dict=False)[0]  # (CP gathers tuples)
        out[f"cp_{degree}"] = (y.cpu(), str(y.device))
    return ship(out)


@pytest.fixture(scope="module")
def tp_run(tmp_path_factory):
    """The CPU references and the ranks' results (one spawn for every test here)."""
    path = tmp_path_factory.mktemp("tiny_flux")
    flux = flux_model()
    flux.save_pretrained(path)
    with torch.no_grad():
        ref = {torch.float32: flux(**flux_inputs()).sample,
               torch.bfloat16: flux.to(torch.bfloat16)(**flux_inputs(dtype=torch.bfloat16)).sample,
               "qwen": qwen_model()(**qwen_inputs()).sample}
    # Outputs far from zero at the tolerances: a wrong shard or a missing all-reduce shows.
    assert ref[torch.float32].abs().mean() > 0.1 and ref["qwen"].abs().mean() > 0.1
    # Kernel choices by measurement (auto), as a user runs it: the ranks agree on them
    # through the process group's store, so the replicated parts of the model match to
    # the bit across ranks (the cross-rank checks below).
    env = {"AXON_KERNEL_SELECT": "auto", "AXON_KERNEL_THREADS": "auto"}
    return ref, unship(run_ranks(_tp_rank, WORLD, str(path), env=env))


# ---------------------------------------------------------------- tests


def test_flux_enable_parallelism_matches_cpu(tp_run):
    ref, results = tp_run
    for rank, r in enumerate(results):
        assert "axon:axon" in r["backend_config"], r["backend_config"]
        shards = r["flux_shards"]
        for name, s in shards.items():
            assert s["mesh"] == "axon" and s["local_device"] == f"axon:{rank}", (name, s)
        col = shards["transformer_blocks.0.attn.to_q.weight"]
        assert col["placements"] == "(Shard(dim=0),)" and col["local_shape"] == (16, 32)
        row = shards["transformer_blocks.0.ff.net.2.weight"]
        assert row["placements"] == "(Shard(dim=1),)" and row["local_shape"] == (32, 64)
        packed = shards["single_transformer_blocks.0.proj_out.weight"]  # input: [attn 32 | mlp 128]
        assert packed["local_shape"] == (32, 80) and packed["shape"] == (32, 160)
        y, device = r["flux_eager"]
        assert device == f"axon:{rank}"
        torch.testing.assert_close(y, ref[torch.float32], **F32)
    assert torch.equal(results[0]["flux_eager"][0], results[1]["flux_eager"][0])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
def test_flux_from_pretrained_parallel_config_matches_cpu(tp_run, dtype):
    ref, results = tp_run
    for rank, r in enumerate(results):
        y, device, q, model_dtype = r[f"loaded_{dtype}"]
        assert device == f"axon:{rank}" and model_dtype == str(dtype)
        assert q["mesh"] == "axon" and q["local_shape"] == (16, 32) and q["local_device"] == f"axon:{rank}"
        assert y.dtype == dtype
        torch.testing.assert_close(y, ref[dtype], **(F32 if dtype == torch.float32 else BF16))
    assert torch.equal(results[0][f"loaded_{dtype}"][0], results[1][f"loaded_{dtype}"][0])


def test_qwen_image_tp_matches_cpu(tp_run):
    ref, results = tp_run
    for rank, r in enumerate(results):
        s = r["qwen_shards"]
        assert s["mesh"] == "axon" and s["placements"] == "(Shard(dim=1),)" and s["local_shape"] == (32, 64)
        y, device = r["qwen"]
        assert device == f"axon:{rank}"
        torch.testing.assert_close(y, ref["qwen"], **F32)


@pytest.mark.parametrize("degree", ["ring_degree", "ulysses_degree"])
def test_flux_context_parallel_matches_cpu(tp_run, degree):
    """ContextParallelConfig with the "_native_flash" attention backend: ring
    attention merges the ranks' partial attentions by their logsumexp."""
    ref, results = tp_run
    for rank, r in enumerate(results):
        y, device = r[f"cp_{degree}"]
        assert device == f"axon:{rank}"
        torch.testing.assert_close(y, ref[torch.float32], **F32)


def test_flux_tp_compiled_blocks_match_cpu(tp_run):
    """compile_repeated_blocks(fullgraph=True, dynamic=False) on the sharded model."""
    ref, results = tp_run
    for rank, r in enumerate(results):
        y, y2, device = r["flux_compiled"]
        assert device == f"axon:{rank}"
        # One graph per repeated block class (FluxTransformerBlock, FluxSingleTransformerBlock).
        assert r["compile_stats"].get("unique_graphs") == 2, r["compile_stats"]
        assert r["graph_breaks"] == 0
        torch.testing.assert_close(y, ref[torch.float32], **F32)
        torch.testing.assert_close(y2, y, rtol=0, atol=0)


def test_unsupported_mesh_device_still_refused(tp_run):
    _, results = tp_run
    for r in results:
        msg = r.get("cpu_error", "")
        assert msg.startswith("Tensor parallelism is not supported on device type 'cpu'. "
                              "Supported device types are ["), msg
        assert "'axon'" in msg and "'cuda'" in msg


# ---------------------------------------------------------------- the patch itself


def test_patch_lists_axon_once_and_is_a_no_op_upstream():
    from diffusers.hooks import tensor_parallel

    from torch_axon.integrations import _hooks
    from torch_axon.integrations.hf_diffusers import tensor_parallel_devices

    # Registered for the module it patches; the docstring names the list and its entries.
    assert tensor_parallel_devices in _hooks._patches["diffusers.hooks.tensor_parallel"]
    assert tensor_parallel_devices.__doc__.startswith(
        "Patch ``diffusers.hooks.tensor_parallel._SUPPORTED_TP_DEVICES``")
    assert '("cuda", "neuron", "tpu", "xpu")' in tensor_parallel_devices.__doc__
    assert tensor_parallel._axon_patch

    devices = tensor_parallel._SUPPORTED_TP_DEVICES
    assert isinstance(devices, tuple) and devices.count("axon") == 1
    assert {"cuda", "xpu", "neuron", "tpu"} <= set(devices)  # upstream's entries kept
    tensor_parallel_devices(tensor_parallel)  # idempotent
    assert tensor_parallel._SUPPORTED_TP_DEVICES == devices

    fake = types.SimpleNamespace(_SUPPORTED_TP_DEVICES=("cuda",))
    tensor_parallel_devices(fake)
    assert fake._SUPPORTED_TP_DEVICES == ("cuda", "axon")
    listed = ("cuda", "axon", "xpu")  # upstream lists axon itself: untouched
    fake = types.SimpleNamespace(_SUPPORTED_TP_DEVICES=listed)
    tensor_parallel_devices(fake)
    assert fake._SUPPORTED_TP_DEVICES is listed
    fake = types.SimpleNamespace()  # upstream dropped the list: nothing to do
    tensor_parallel_devices(fake)
    assert not hasattr(fake, "_SUPPORTED_TP_DEVICES")
