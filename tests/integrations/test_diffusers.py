"""Diffusers on axon: a tiny UNet2DModel (with attention blocks) trains with the
DDPM objective and samples with the DDPM scheduler, equal to the same model on
the CPU and with no op in the synchronous fallback; and the ops a UNet adds to a
language model's (group norm on channels-last activations, upsampling
backward) against the CPU across dtypes."""

import copy

import pytest
import torch
import torch.nn.functional as F

from conftest import FLOAT_DTYPES, assert_same, make


def tiny_unet():
    from diffusers import UNet2DModel
    torch.manual_seed(0)
    return UNet2DModel(sample_size=16, in_channels=3, out_channels=3, layers_per_block=1,
                       block_out_channels=(32, 64),
                       down_block_types=("DownBlock2D", "AttnDownBlock2D"),
                       up_block_types=("AttnUpBlock2D", "UpBlock2D"), norm_num_groups=8)


def test_unet_ddpm_training_step_matches_cpu():
    from diffusers import DDPMScheduler
    cpu = tiny_unet()
    ax = copy.deepcopy(cpu).to("axon")
    sched = DDPMScheduler(num_train_timesteps=100)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 3, 16, 16, generator=g)
    noise = torch.randn(2, 3, 16, 16, generator=g)
    t = torch.randint(0, 100, (2,), generator=g)
    noisy = sched.add_noise(x, noise, t)
    torch.axon.reset_fallback_stats()
    losses = []
    for model, dev in ((cpu, "cpu"), (ax, "axon")):
        # SGD: updates proportional to the gradients.  (With AdamW the key
        # projection's bias, whose gradient is zero up to rounding since softmax
        # ignores it, moves by +-lr on either device depending on that rounding.)
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        step_losses = []
        for _ in range(2):
            loss = F.mse_loss(model(noisy.to(dev), t.to(dev)).sample, noise.to(dev))
            loss.backward()
            opt.step()
            opt.zero_grad()
            step_losses.append(loss.detach())
        losses.append(step_losses)
    assert torch.axon.fallback_stats() == {}
    for lc, la in zip(*losses):
        assert_same(la, lc, accum=True)
    assert losses[0][1] != losses[0][0]  # the step changed the weights
    for (name, p), q in zip(cpu.named_parameters(), ax.parameters()):
        torch.testing.assert_close(q.detach().cpu(), p.detach(), rtol=1e-4, atol=1e-5, msg=name)


def test_unet_ddpm_sampling_matches_cpu():
    from diffusers import DDPMScheduler
    cpu = tiny_unet().eval()
    ax = copy.deepcopy(cpu).to("axon")
    start = torch.randn(1, 3, 16, 16, generator=torch.Generator().manual_seed(2))
    results = []
    torch.axon.reset_fallback_stats()
    for model, dev in ((cpu, "cpu"), (ax, "axon")):
        sched = DDPMScheduler(num_train_timesteps=100)
        sched.set_timesteps(4)
        sample = start.to(dev)
        with torch.no_grad():
            for step in sched.timesteps:
                # Deterministic steps: the variance noise comes from the CPU generator.
                out = sched.step(model(sample, step).sample, step, sample,
                                 generator=torch.Generator().manual_seed(int(step)))
                sample = out.prev_sample
        results.append(sample)
    assert torch.axon.fallback_stats() == {}
    assert_same(results[1], results[0], accum=True)


@pytest.mark.parametrize("params", ["same_dtype", "float32"])
@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_group_norm_forward_backward_matches_cpu(dtype, layout, params):
    """ATen's composite group norm for other backends views its input, which a
    channels-last activation (a UNet after an attention block) cannot do; and
    float32 weight and bias with 16-bit activations, as the CPU allows."""
    x = make((2, 16, 5, 6), dtype, seed=1)
    if layout == "channels_last":
        x = x.contiguous(memory_format=torch.channels_last)
    pdt = dtype if params == "same_dtype" else torch.float32
    w, b = make((16,), pdt, seed=2), make((16,), pdt, seed=3)
    torch.axon.reset_fallback_stats()
    results = []
    for dev in ("cpu", "axon"):
        xd, wd, bd = (t.to(dev).requires_grad_() for t in (x, w, b))
        y = F.group_norm(xd, 4, wd, bd)
        grads = torch.autograd.grad((y.float() ** 2).sum(), (xd, wd, bd))
        results.append((y, *grads))
    for got, want in zip(results[1], results[0]):
        assert got.dtype == want.dtype
        assert_same(got, want, dtype=dtype, accum=True)
    assert torch.axon.fallback_stats() == {}


@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
@pytest.mark.parametrize("mode", ["nearest", "bilinear"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_upsampling_backward_matches_cpu(mode, dtype, layout):
    x = make((2, 4, 5, 6), dtype, seed=4)
    if layout == "channels_last":
        x = x.contiguous(memory_format=torch.channels_last)
    kw = dict(scale_factor=2, mode=mode) if mode == "nearest" else \
        dict(size=(9, 13), mode=mode, align_corners=False)
    torch.axon.reset_fallback_stats()
    xc, xa = x.clone().requires_grad_(), x.axon().requires_grad_()
    yc, ya = F.interpolate(xc, **kw), F.interpolate(xa, **kw)
    gc, = torch.autograd.grad((yc.float() ** 2).sum(), xc)
    ga, = torch.autograd.grad((ya.float() ** 2).sum(), xa)
    assert_same(ya, yc, dtype=dtype, accum=True)
    assert_same(ga, gc, dtype=dtype, accum=True)
    assert torch.axon.fallback_stats() == {}


# Image-model ops beyond a UNet's (pooling, padding, bicubic upsampling, grid
# sampling, distances, activations), forward and backward: stream work, equal
# to the CPU, in both layouts (a channels-last input made replication_pad2d's
# CPU kernel restride its out= view, which gave wrong values on axon).
IMAGE_OPS = {
    "avg_pool2d": lambda x: F.avg_pool2d(x, 3, stride=2, padding=1),
    "max_pool2d": lambda x: F.max_pool2d(x, 2),
    "pad_reflect": lambda x: F.pad(x, (1, 2, 2, 1), mode="reflect"),
    "pad_replicate": lambda x: F.pad(x, (1, 2, 2, 1), mode="replicate"),
    "bicubic": lambda x: F.interpolate(x, size=(9, 11), mode="bicubic", align_corners=False),
    "grid_sample": lambda x: F.grid_sample(
        x, torch.linspace(-0.9, 0.9, 2 * 3 * 4 * 2, dtype=x.dtype).view(2, 3, 4, 2).to(x.device),
        align_corners=False),
    "cdist": lambda x: torch.cdist(x.flatten(2), x.flatten(2).flip(1)),
    "hardswish": lambda x: F.hardswish(x),
    "glu": lambda x: F.glu(x, 1),
}


@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("op", list(IMAGE_OPS))
def test_image_ops_forward_backward_match_cpu(op, dtype, layout):
    if op == "cdist" and dtype != torch.float32:
        return  # torch.cdist takes float32/float64 only, on the CPU too
    x = make((2, 4, 6, 7), dtype, seed=5)
    if layout == "channels_last":
        x = x.contiguous(memory_format=torch.channels_last)
    torch.axon.reset_fallback_stats()
    xc, xa = x.clone().requires_grad_(), x.axon().requires_grad_()
    yc, ya = IMAGE_OPS[op](xc), IMAGE_OPS[op](xa)
    gc, = torch.autograd.grad((yc.float() ** 2).sum(), xc)
    ga, = torch.autograd.grad((ya.float() ** 2).sum(), xa)
    assert_same(ya, yc, dtype=dtype, accum=True)
    assert_same(ga, gc, dtype=dtype, accum=True)
    assert torch.axon.fallback_stats() == {}


# Batch norm (CNNs, VAEs with BatchNorm): stream work, and in training mode its
# running statistics are updated in place on the device, as on the CPU.
@pytest.mark.parametrize("params", ["same_dtype", "float32"])
@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
@pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_batch_norm_matches_cpu(dtype, training, layout, params):
    x = make((3, 6, 4, 5), dtype, seed=11)
    if layout == "channels_last":
        x = x.contiguous(memory_format=torch.channels_last)
    pdt = dtype if params == "same_dtype" else torch.float32
    w, b = make((6,), pdt, seed=12), make((6,), pdt, seed=13)
    mean0 = make((6,), pdt, seed=14, low=-0.5, high=0.5)
    var0 = make((6,), pdt, seed=15, low=0.5, high=2.0)
    torch.axon.reset_fallback_stats()
    results = []
    for dev in ("cpu", "axon"):
        xd, wd, bd = (t.to(dev).requires_grad_() for t in (x, w, b))
        rm, rv = mean0.to(dev, copy=True), var0.to(dev, copy=True)
        y = F.batch_norm(xd, rm, rv, wd, bd, training=training, momentum=0.3, eps=1e-4)
        grads = torch.autograd.grad((y.float() ** 2).sum(), (xd, wd, bd))
        stats = torch.ops.aten.native_batch_norm(xd.detach(), wd.detach(), bd.detach(), rm.clone(),
                                                 rv.clone(), training, 0.3, 1e-4)[1:]
        results.append((y, *grads, rm, rv, *stats))
    for got, want in zip(results[1], results[0]):
        assert got.dtype == want.dtype and got.shape == want.shape
        assert_same(got, want, dtype=dtype, accum=True)
    assert results[1][0].stride() == results[0][0].stride()
    assert torch.axon.fallback_stats() == {}


def test_batch_norm_module_and_aten_variants_match_cpu():
    torch.manual_seed(0)
    cpu = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8), torch.nn.ReLU())
    ax = copy.deepcopy(cpu).to("axon")
    x = torch.randn(4, 3, 9, 9)
    torch.axon.reset_fallback_stats()
    for step in range(3):  # training: running statistics move each step
        yc, ya = cpu(x), ax(x.axon())
        yc.sum().backward()
        ya.sum().backward()
        assert_same(ya, yc, accum=True)
    cpu.eval(), ax.eval()
    assert_same(ax(x.axon()), cpu(x), accum=True)
    for pc, pa in zip(cpu.state_dict().values(), ax.state_dict().values()):
        assert_same(pa, pc, accum=True)  # running stats, num_batches_tracked
    for pc, pa in zip(cpu.parameters(), ax.parameters()):
        assert_same(pa.grad, pc.grad, accum=True)
    # The forms export and decompositions use, with the CPU's saved statistics
    # (empty in eval mode; torch.compile's decompositions say the same on axon).
    xa = x.axon()
    args = lambda d: [t.to(d) for t in (torch.ones(3), torch.zeros(3), torch.zeros(3),
                                         torch.ones(3))]
    aten = torch.ops.aten
    for name, call in [
        ("legit", lambda t, w, b, m, v: aten._native_batch_norm_legit(t, w, b, m, v, True, .1, 1e-5)),
        ("no_stats", lambda t, w, b, m, v: aten._native_batch_norm_legit.no_stats(t, w, b, True, .1, 1e-5)),
        ("no_training", lambda t, w, b, m, v: aten._native_batch_norm_legit_no_training(t, w, b, m, v, .1, 1e-5)),
        ("with_update", lambda t, w, b, m, v: aten._batch_norm_with_update(t, w, b, m, v, .1, 1e-5)),
        ("no_update", lambda t, w, b, m, v: aten._batch_norm_no_update(t, w, b, m, v, .1, 1e-5)),
    ]:
        ac, aa = args("cpu"), args("axon")
        want, got = call(x, *ac), call(xa, *aa)
        assert len(got) == len(want), name
        for g, w in zip(got, want):
            assert g.shape == w.shape and g.dtype == w.dtype, name
            assert_same(g, w, accum=True)
        for g, w in zip(aa, ac):  # running statistics
            assert_same(g, w, accum=True)
    assert torch.axon.fallback_stats() == {}


@pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])
@pytest.mark.parametrize("case", ["strided", "empty_batch", "empty_plane"])
def test_batch_norm_non_contiguous_and_zero_size(case, training):
    x = {"strided": make((3, 12, 4, 5), torch.float32, seed=16)[:, ::2].transpose(2, 3),
         "empty_batch": torch.randn(0, 6, 4, 5), "empty_plane": torch.randn(3, 6, 0, 5)}[case]
    torch.axon.reset_fallback_stats()
    results = []
    for dev in ("cpu", "axon"):
        rm, rv = torch.full((6,), 0.25, device=dev), torch.full((6,), 1.5, device=dev)
        y = F.batch_norm(x.to(dev), rm, rv, training=training, momentum=0.2)
        results.append((y, rm, rv))
    for got, want in zip(results[1], results[0]):
        # (Output strides: a transposed input gives a contiguous result, as on
        # CUDA and in the Meta kernel, where the CPU follows the input's order.)
        assert got.shape == want.shape
        assert_same(got, want, accum=True)
    assert torch.axon.fallback_stats() == {}


def _ddpm_pipe():
    from diffusers import DDPMPipeline, DDPMScheduler
    pipe = DDPMPipeline(unet=tiny_unet().eval(), scheduler=DDPMScheduler(num_train_timesteps=4))
    pipe.set_progress_bar_config(disable=True)
    return pipe


def _sample(pipe, device):
    g = torch.Generator(device).manual_seed(3)
    return pipe(batch_size=1, generator=g, num_inference_steps=2, output_type="np").images


@pytest.mark.parametrize("offload", ["sequential", "model"])
def test_pipeline_to_axon_after_offloading(offload, monkeypatch):
    """A pipeline offloaded with Accelerate hooks, then moved with .to("axon"): Diffusers'
    own checks, as for cuda (upstream runs them only for ["cuda", "xpu"]): sequential
    offloading (weights on the meta device) raises its ValueError, model offloading
    warns; the pipeline stays usable and samples what the CPU does."""
    from diffusers.pipelines import pipeline_utils
    warnings = []
    monkeypatch.setattr(pipeline_utils.logger, "warning", lambda msg, *a: warnings.append(msg))
    cpu = _sample(_ddpm_pipe(), "cpu")
    pipe = _ddpm_pipe()
    if offload == "sequential":
        pipe.enable_sequential_cpu_offload(device="axon")
        with pytest.raises(ValueError, match="activated sequential model offloading"):
            pipe.to("axon")
        with pytest.raises(ValueError, match="activated sequential model offloading"):
            pipe.to(device=torch.device("axon:0"), dtype=torch.float32)
        assert not any("model offloading" in w for w in warnings)
    else:
        pipe.enable_model_cpu_offload(device="axon")
        pipe.to("axon")
        assert sum("activated model offloading by calling `enable_model_cpu_offload`" in w
                   for w in warnings) == 1, warnings
        assert pipe.unet.device.type == "axon"
    torch.testing.assert_close(_sample(pipe, "cpu"), cpu, rtol=1e-4, atol=1e-4)
    # A pipeline without offloading moves without either.
    plain = _ddpm_pipe()
    warnings.clear()
    plain.to("axon")
    assert warnings == [] and plain.unet.device.type == "axon"
    torch.testing.assert_close(_sample(plain, "cpu"), cpu, rtol=1e-4, atol=1e-4)
