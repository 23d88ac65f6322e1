"""Optimizers and the ops they use on axon against the CPU: SGD, Adam, AdamW
and RMSprop steps (default, foreach and fused implementations), the fused
Adam/AdamW kernels (amsgrad, maximize, weight decay, 16-bit parameters, a
tensor learning rate, grad_scale and found_inf), _foreach ops and
clip_grad_norm_.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

from conftest import FLOAT_DTYPES, assert_same, make
from op_util import compare, sleep_on_stream, tiny_mlp


OPTIMIZERS = {
    "sgd_momentum": lambda p, **kw: torch.optim.SGD(p, lr=0.1, momentum=0.9, nesterov=True, **kw),
    "adam": lambda p, **kw: torch.optim.Adam(p, lr=0.01, **kw),
    "adamw": lambda p, **kw: torch.optim.AdamW(p, lr=0.01, weight_decay=0.1, **kw),
    "rmsprop": lambda p, **kw: torch.optim.RMSprop(p, lr=0.01, **kw),
}


@pytest.mark.parametrize("impl", ["default", "foreach", "fused"])
@pytest.mark.parametrize("opt", list(OPTIMIZERS))
def test_optimizer_steps_match_cpu(opt, impl):
    if impl == "fused" and opt == "rmsprop":
        impl = "foreach"  # RMSprop has no fused implementation in PyTorch
    model_c = tiny_mlp(torch.float32)
    model_a = copy.deepcopy(model_c).axon()
    kw_a = {} if impl == "default" else {impl: True}
    opt_c = OPTIMIZERS[opt](model_c.parameters())  # the CPU reference: default implementation
    opt_a = OPTIMIZERS[opt](model_a.parameters(), **kw_a)
    x = make((10, 6), torch.float32, seed=36)
    target = torch.arange(10) % 3
    for _ in range(3):
        for model, o, xx, tt in ((model_c, opt_c, x, target), (model_a, opt_a, x.axon(), target.axon())):
            o.zero_grad()
            F.cross_entropy(model(xx), tt).backward()
            o.step()
    for pc, pa in zip(model_c.parameters(), model_a.parameters()):
        torch.testing.assert_close(pa.detach().cpu(), pc.detach(), rtol=1e-4, atol=1e-5)


# ---------------------------------------------------------------- fused Adam and AdamW

PARAM_SHAPES = [(7,), (3, 5), (2, 3, 4), (1,), (33,)]


def params_for(dtype, device):
    return [torch.nn.Parameter(make(s, dtype, -1, 1, seed=i).to(device))
            for i, s in enumerate(PARAM_SHAPES)]


def run_optimizer(cls, dtype, device, steps=3, **kw):
    params = params_for(dtype, device)
    opt = cls(params, **kw)
    for step in range(steps):
        for i, p in enumerate(params):
            p.grad = make(p.shape, dtype, -1, 1, seed=100 * step + i).to(device)
        opt.step()
    return params, opt


OPT_CONFIGS = {
    "adamw_fused": (torch.optim.AdamW, dict(fused=True)),
    "adam_fused": (torch.optim.Adam, dict(fused=True)),
    "adamw_foreach": (torch.optim.AdamW, {}),  # the default on axon (foreach)
    "adam_foreach": (torch.optim.Adam, dict(foreach=True)),
}


@pytest.mark.parametrize("maximize", [False, True], ids=["min", "max"])
@pytest.mark.parametrize("amsgrad", [False, True], ids=["adam", "amsgrad"])
@pytest.mark.parametrize("weight_decay", [0.0, 0.1])
@pytest.mark.parametrize("config", list(OPT_CONFIGS))
def test_adam_steps_match_cpu(config, weight_decay, amsgrad, maximize, no_fallback):
    cls, extra = OPT_CONFIGS[config]
    kw = dict(lr=0.05, betas=(0.8, 0.95), eps=1e-6, weight_decay=weight_decay,
              amsgrad=amsgrad, maximize=maximize, **extra)
    cpu_params, cpu_opt = run_optimizer(cls, torch.float32, "cpu", **kw)
    ax_params, ax_opt = run_optimizer(cls, torch.float32, "axon", **kw)
    for pa, pc in zip(ax_params, cpu_params):
        assert_same(pa.detach(), pc.detach(), accum=True)
        sa, sc = ax_opt.state[pa], cpu_opt.state[pc]
        for key in ("exp_avg", "exp_avg_sq") + (("max_exp_avg_sq",) if amsgrad else ()):
            assert_same(sa[key], sc[key], accum=True)
        assert sa["step"].item() == sc["step"].item() == 3


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("config", ["adamw_fused", "adam_fused"])
def test_fused_adam_low_precision_params(config, dtype, no_fallback):
    cls, extra = OPT_CONFIGS[config]
    kw = dict(lr=0.05, weight_decay=0.1, **extra)
    cpu_params, _ = run_optimizer(cls, dtype, "cpu", **kw)
    ax_params, _ = run_optimizer(cls, dtype, "axon", **kw)
    for pa, pc in zip(ax_params, cpu_params):
        assert pa.dtype == dtype
        assert_same(pa.detach(), pc.detach(), accum=True)


def test_fused_adamw_tensor_lr_and_grad_scaler(no_fallback):
    # a tensor learning rate (the _fused_adamw_.tensor_lr overload), on the CPU or on axon
    kw = dict(weight_decay=0.01, fused=True)
    cpu_params, _ = run_optimizer(torch.optim.AdamW, torch.float32, "cpu",
                                  lr=torch.tensor(0.02), **kw)
    for lr_device in ("cpu", "axon"):
        ax_params, _ = run_optimizer(torch.optim.AdamW, torch.float32, "axon",
                                     lr=torch.tensor(0.02).to(lr_device), **kw)
        for pa, pc in zip(ax_params, cpu_params):
            assert_same(pa.detach(), pc.detach(), accum=True)
    # found_inf skips the step
    params = params_for(torch.float32, "axon")
    before = [p.detach().cpu() for p in params]
    opt = torch.optim.AdamW(params, lr=0.1, fused=True)
    for p in params:
        p.grad = torch.ones_like(p)
    grad_scale = torch.tensor(1.0, device="axon")
    found_inf = torch.tensor(1.0, device="axon")
    torch._fused_adamw_(params, [p.grad for p in params],
                        [torch.zeros_like(p) for p in params],
                        [torch.zeros_like(p) for p in params], [],
                        [torch.tensor(1.0, device="axon") for _ in params],
                        lr=0.1, beta1=0.9, beta2=0.999, weight_decay=0.0, eps=1e-8,
                        amsgrad=False, maximize=False, grad_scale=grad_scale,
                        found_inf=found_inf)
    for p, b in zip(params, before):
        torch.testing.assert_close(p.detach().cpu(), b, rtol=0, atol=0)
    del opt


def test_fused_adam_reads_cpu_scalars_at_the_call():
    """A CPU grad_scale is read when the step is launched, not when the stream gets to
    it: changing it right after the call (stream still busy) changes nothing."""
    def step(device, scale):
        p = torch.ones(4, device=device)
        torch._fused_adamw_([p], [torch.full((4,), 2.0, device=device)],
                            [torch.zeros(4, device=device)], [torch.zeros(4, device=device)], [],
                            [torch.ones((), device=device)], lr=0.1, beta1=0.9, beta2=0.999,
                            weight_decay=0.0, eps=1e-8, amsgrad=False, maximize=False,
                            grad_scale=scale)
        return p

    scale = torch.tensor(2.0)
    sleep_on_stream(0, 200)
    p = step("axon", scale)
    scale.fill_(1e30)
    torch.testing.assert_close(p.cpu(), step("cpu", torch.tensor(2.0)), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("found_inf", [0.0, 1.0])
def test_fused_adamw_unscales_gradients_like_cpu(dtype, found_inf):
    """With grad_scale, ATen's fused kernels leave grad / grad_scale in the gradients
    (when no inf was found); so does axon's."""
    def step(device):
        p = make((37,), dtype, seed=1).to(device)
        g = make((37,), dtype, seed=2).to(device)
        torch._fused_adamw_([p], [g], [torch.zeros_like(p)], [torch.zeros_like(p)], [],
                            [torch.ones((), device=device)], lr=0.1, beta1=0.9, beta2=0.999,
                            weight_decay=0.01, eps=1e-8, amsgrad=False, maximize=False,
                            grad_scale=torch.tensor(4.0, device=device),
                            found_inf=torch.tensor(found_inf, device=device))
        return p, g

    (pa, ga), (pc, gc) = step("axon"), step("cpu")
    assert_same(pa, pc, dtype=dtype, accum=True)
    assert_same(ga, gc, dtype=dtype, accum=True)


# ---------------------------------------------------------------- foreach ops and gradient clipping

@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_foreach_ops(dtype):
    xs = [make((3, 4), dtype, seed=42), make((5,), dtype, seed=43), make((0, 2), dtype, seed=44)]
    ys = [make(tuple(t.shape), dtype, seed=45 + i) for i, t in enumerate(xs)]
    xa, ya = [t.axon() for t in xs], [t.axon() for t in ys]
    compare(lambda x, y: torch._foreach_add(x, y, alpha=2), [xs, ys], [xa, ya])
    compare(lambda x, y: torch._foreach_mul(x, 1.5), [xs, ys], [xa, ya])
    compare(lambda x, y: torch._foreach_norm(x), [xs, ys], [xa, ya], accum=True)
    compare(lambda x, y: torch._foreach_addcmul(x, y, y, value=0.5), [xs, ys], [xa, ya])
    xc = [t.clone() for t in xs]
    torch._foreach_lerp_(xc, ys, 0.25)
    torch._foreach_lerp_(xa, ya, 0.25)
    for a, c in zip(xa, xc):
        assert_same(a, c)


def test_clip_grad_norm_matches_cpu():
    params_c = [torch.nn.Parameter(make(s, torch.float32, seed=i)) for i, s in enumerate([(3, 4), (7,)])]
    for i, p in enumerate(params_c):
        p.grad = make(tuple(p.shape), torch.float32, seed=10 + i) * 5
    params_a = [torch.nn.Parameter(p.detach().axon()) for p in params_c]
    for p, q in zip(params_a, params_c):
        p.grad = q.grad.axon()
    nc = torch.nn.utils.clip_grad_norm_(params_c, 1.0)
    na = torch.nn.utils.clip_grad_norm_(params_a, 1.0)
    assert_same(na, nc, accum=True)
    for p, q in zip(params_a, params_c):
        assert_same(p.grad, q.grad, accum=True)


@pytest.mark.parametrize("amsgrad", [False, True], ids=["adam", "amsgrad"])
@pytest.mark.parametrize("layout", ["channels_last", "grad_contiguous", "state_transposed"])
@pytest.mark.parametrize("decoupled", [False, True], ids=["adam", "adamw"])
def test_fused_adam_any_layout_matches_cpu(layout, amsgrad, decoupled):
    """The fused kernels walk memory flat: dense tensors sharing the parameter's strides
    (channels_last conv weights) step in place; any other mix of layouts steps through
    contiguous copies, written back. Against ATen's CPU fused kernel on contiguous copies
    (on mixed layouts the CPU kernel itself pairs elements by memory order: wrong)."""
    fused = torch._fused_adamw_ if decoupled else torch._fused_adam_

    def tensors(device):
        def t(seed, cl=True):
            x = make((4, 3, 5, 5), torch.float32, seed=seed).to(device)
            return x.to(memory_format=torch.channels_last) if cl else x

        p, g = t(1), t(2, cl=layout != "grad_contiguous")
        m, v = t(3), t(4).abs()
        if layout == "state_transposed":
            m = m.transpose(0, 1).contiguous().transpose(0, 1)  # dense, other strides
        vmax = [v.clone() + 0.5] if amsgrad else []
        return p, g, m, v, vmax

    results = {}
    for device in ("cpu", "axon"):
        p, g, m, v, vmax = tensors(device)
        if device == "cpu":
            p, g, m, v = (x.contiguous() for x in (p, g, m, v))
            vmax = [x.contiguous() for x in vmax]
        strides = [x.stride() for x in (p, g, m, v, *vmax)]
        fused([p], [g], [m], [v], vmax, [torch.full((), 3.0, device=device)], lr=0.1,
              beta1=0.9, beta2=0.99, weight_decay=0.01, eps=1e-8, amsgrad=amsgrad,
              maximize=False, grad_scale=None, found_inf=None)
        assert [x.stride() for x in (p, g, m, v, *vmax)] == strides  # updated in place
        results[device] = (p, m, v, *vmax)
    for a, c in zip(results["axon"], results["cpu"]):
        torch.testing.assert_close(a.cpu(), c, atol=1e-6, rtol=1e-6)


def test_fused_adamw_channels_last_conv_trains_like_cpu():
    """The case as a user meets it: a channels_last model with AdamW(fused=True)."""
    def run(device):
        torch.manual_seed(0)
        m = torch.nn.Conv2d(3, 4, 3).to(device).to(memory_format=torch.channels_last)
        opt = torch.optim.AdamW(m.parameters(), lr=1e-2, fused=True)
        x = make((2, 3, 8, 8), torch.float32, seed=5).to(device).to(
            memory_format=torch.channels_last)
        for _ in range(3):
            opt.zero_grad()
            m(x).square().mean().backward()
            opt.step()
        return [p.detach().cpu() for p in m.parameters()]

    for a, c in zip(run("axon"), run("cpu")):
        torch.testing.assert_close(a, c, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("decoupled", [False, True], ids=["adam", "adamw"])
def test_fused_adam_size_one_dimensions_with_other_strides(decoupled):
    """A (5, 1) parameter's gradient may have other strides in its size-1 dimension (the
    layout contract allows it): both are contiguous and walk flat (this recursed forever
    when the stride vectors alone decided)."""
    def run(device):
        torch.manual_seed(0)
        p = torch.nn.Parameter(make((5, 1), torch.float32, seed=1).to(device))
        x = make((3, 5), torch.float32, seed=2).to(device)
        (x * p.t()).square().sum().backward()
        opt = (torch.optim.AdamW if decoupled else torch.optim.Adam)([p], lr=0.1, fused=True)
        opt.step()
        return p.detach().cpu(), p.grad.stride()

    (pa, stride), (pc, _) = run("axon"), run("cpu")
    torch.testing.assert_close(pa, pc, atol=1e-6, rtol=1e-6)
    for grad_strides in ((1, 5), (1, 1)):  # and directly, whatever autograd gave
        p = make((5, 1), torch.float32, seed=3).axon()
        g = torch.empty_strided((5, 1), grad_strides, device="axon").copy_(
            make((5, 1), torch.float32, seed=4))
        ref_p = make((5, 1), torch.float32, seed=3)
        fused = torch._fused_adamw_ if decoupled else torch._fused_adam_
        for t, gt in ((p, g), (ref_p, make((5, 1), torch.float32, seed=4))):
            dev = t.device
            fused([t], [gt], [torch.zeros_like(t)], [torch.zeros_like(t)], [],
                  [torch.ones((), device=dev)], lr=0.1, beta1=0.9, beta2=0.99,
                  weight_decay=0.01, eps=1e-8, amsgrad=False, maximize=False,
                  grad_scale=None, found_inf=None)
        torch.testing.assert_close(p.cpu(), ref_p, atol=1e-6, rtol=1e-6)


# float64 parameters (ATen's CPU fused Adam as stream work: our kernel has no float64)
@pytest.mark.parametrize("amsgrad", [False, True])
@pytest.mark.parametrize("lr", ["number", "cpu_tensor", "axon_tensor"])
@pytest.mark.parametrize("config", ["adamw_fused", "adam_fused"])
def test_fused_adam_float64_matches_cpu(config, lr, amsgrad, no_fallback):
    cls, extra = OPT_CONFIGS[config]

    def lr_for(device):
        return 0.05 if lr == "number" else torch.tensor(0.05, dtype=torch.float64).to(
            "axon" if (lr == "axon_tensor" and device == "axon") else "cpu")

    kw = dict(weight_decay=0.1, amsgrad=amsgrad, **extra)
    cpu_params, _ = run_optimizer(cls, torch.float64, "cpu", lr=lr_for("cpu"), **kw)
    ax_params, _ = run_optimizer(cls, torch.float64, "axon", lr=lr_for("axon"), **kw)
    for pa, pc in zip(ax_params, cpu_params):
        assert pa.dtype == torch.float64
        assert_same(pa.detach(), pc.detach())


# torch.optim hands a CPU tensor lr to the fused kernels as the user made it: 0-dim or
# shape (1,) (CUDA reads a CPU lr on the host)
@pytest.mark.parametrize("shape", [(), (1,)])
@pytest.mark.parametrize("cls", [torch.optim.SGD, torch.optim.Adagrad, torch.optim.Adam])
def test_fused_optimizers_take_a_one_element_cpu_lr(cls, shape):
    kw = dict(momentum=0.9) if cls is torch.optim.SGD else {}
    results = {}
    for device in ("cpu", "axon"):
        params, _ = run_optimizer(cls, torch.float32, device,
                                  lr=torch.full(shape, 0.02), fused=True, **kw)
        results[device] = [p.detach().cpu() for p in params]
    for pa, pc in zip(results["axon"], results["cpu"]):
        torch.testing.assert_close(pa, pc, rtol=1e-5, atol=1e-6)
