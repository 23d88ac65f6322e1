"""Random numbers on axon: seeding, reproducibility, generator state, explicit
generators, the statistics of the common random ops, their reproducibility
whatever the stream timing, and dropout.

Statistical bounds are 6 standard errors of the estimate for the sample size,
so a correct generator fails them with probability < 1e-8 (and every test is
seeded, hence deterministic).
"""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F

from conftest import FLOAT_DTYPES, make, run_python, tol
from op_util import Z, leaf, nn_functional_test, sleep_on_stream


# ---------------------------------------------------------------- seeding and generators

N = 20000  # samples for statistics


def draws(seed, device="axon"):
    torch.manual_seed(seed)
    return [torch.randn(50, device=device).cpu(), torch.rand(7, 3, device=device).cpu(),
            torch.randint(0, 1000, (20,), device=device).cpu(),
            torch.randperm(30, device=device).cpu()]


def test_manual_seed_reproducible():
    a, b = draws(123), draws(123)
    for x, y in zip(a, b):
        torch.testing.assert_close(x, y, rtol=0, atol=0)


def test_different_seeds_differ():
    a, b = draws(1), draws(2)
    for x, y in zip(a, b):
        assert not torch.equal(x, y)


def test_successive_draws_differ():
    torch.manual_seed(5)
    x, y = torch.rand(100, device="axon"), torch.rand(100, device="axon")
    assert not torch.equal(x.cpu(), y.cpu())


def test_torch_axon_manual_seed_and_seed_functions():
    torch.axon.manual_seed(7)
    assert torch.axon.initial_seed() == 7
    x = torch.rand(10, device="axon").cpu()
    torch.axon.manual_seed(7)
    torch.testing.assert_close(torch.rand(10, device="axon").cpu(), x, rtol=0, atol=0)
    torch.axon.manual_seed_all(9)
    assert all(torch.axon.get_rng_state(i)[:8].view(torch.int64).item() == 9
               for i in range(torch.axon.device_count()))
    torch.axon.seed()
    s = torch.axon.initial_seed()
    torch.axon.seed()
    assert torch.axon.initial_seed() != s  # fresh non-deterministic seeds


def test_torch_manual_seed_seeds_every_axon_device():
    torch.manual_seed(11)
    assert [torch.axon.default_generators[i].initial_seed()
            for i in range(torch.axon.device_count())] == [11] * torch.axon.device_count()
    x1 = torch.rand(5, device="axon:1").cpu()
    torch.manual_seed(11)
    torch.testing.assert_close(torch.rand(5, device="axon:1").cpu(), x1, rtol=0, atol=0)


def test_devices_have_independent_generators():
    torch.manual_seed(3)
    a0 = torch.rand(8, device="axon:0").cpu()
    a1 = torch.rand(8, device="axon:1").cpu()
    # same seed and same position: each device starts the same sequence
    torch.testing.assert_close(a0, a1, rtol=0, atol=0)
    # drawing on axon:0 does not advance axon:1
    torch.manual_seed(3)
    torch.rand(8, device="axon:0")
    torch.rand(8, device="axon:0")
    torch.testing.assert_close(torch.rand(8, device="axon:1").cpu(), a1, rtol=0, atol=0)


def test_rng_state_round_trip():
    torch.manual_seed(21)
    torch.rand(4, device="axon")
    state = torch.axon.get_rng_state()
    assert state.dtype == torch.uint8 and state.shape == (16,) and state.device.type == "cpu"
    x = [torch.randn(6, device="axon").cpu(), torch.bernoulli(torch.full((9,), 0.5, device="axon")).cpu()]
    assert not torch.equal(torch.axon.get_rng_state(), state)  # the offset advanced
    torch.axon.set_rng_state(state)
    y = [torch.randn(6, device="axon").cpu(), torch.bernoulli(torch.full((9,), 0.5, device="axon")).cpu()]
    for a, b in zip(x, y):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    # per-device state, and the _all variants
    states = torch.axon.get_rng_state_all()
    assert len(states) == torch.axon.device_count()
    z = torch.rand(3, device="axon:2").cpu()
    torch.axon.set_rng_state_all(states)
    torch.testing.assert_close(torch.rand(3, device="axon:2").cpu(), z, rtol=0, atol=0)
    torch.axon.set_rng_state(torch.axon.get_rng_state("axon:2"), "axon:2")


def test_set_rng_state_validates():
    with pytest.raises(RuntimeError, match="16 bytes"):
        torch.axon.set_rng_state(torch.zeros(8, dtype=torch.uint8))
    with pytest.raises(RuntimeError, match="ByteTensor"):
        torch.axon.set_rng_state(torch.zeros(16, dtype=torch.float32))


def test_explicit_generator():
    g = torch.Generator(device="axon")
    assert g.device == torch.device("axon:0")
    g.manual_seed(99)
    assert g.initial_seed() == 99
    x = torch.rand(10, device="axon", generator=g).cpu()
    y = torch.randn(10, device="axon", generator=g).cpu()
    g.manual_seed(99)
    torch.testing.assert_close(torch.rand(10, device="axon", generator=g).cpu(), x, rtol=0, atol=0)
    torch.testing.assert_close(torch.randn(10, device="axon", generator=g).cpu(), y, rtol=0, atol=0)
    # an explicit generator does not touch the default one
    torch.manual_seed(0)
    d1 = torch.rand(5, device="axon").cpu()
    torch.manual_seed(0)
    torch.rand(5, device="axon", generator=g)
    torch.testing.assert_close(torch.rand(5, device="axon").cpu(), d1, rtol=0, atol=0)
    # state of a generator
    st = g.get_state()
    a = torch.rand(4, device="axon", generator=g).cpu()
    g.set_state(st)
    torch.testing.assert_close(torch.rand(4, device="axon", generator=g).cpu(), a, rtol=0, atol=0)
    g1 = torch.Generator(device="axon:1")
    assert g1.device == torch.device("axon:1")


@pytest.mark.parametrize("op", ["normal_", "uniform_", "bernoulli_", "exponential_",
                                "random_", "dropout", "multinomial", "randperm"])
def test_generator_reproduces_each_op(op):
    g = torch.Generator(device="axon")

    def run():
        g.manual_seed(1234)
        t = torch.empty(64, device="axon")
        if op == "normal_":
            return t.normal_(2, 3, generator=g)
        if op == "uniform_":
            return t.uniform_(-1, 1, generator=g)
        if op == "bernoulli_":
            return t.bernoulli_(0.3, generator=g)
        if op == "exponential_":
            return t.exponential_(2.0, generator=g)
        if op == "random_":
            return t.random_(0, 10, generator=g)
        if op == "dropout":
            torch.manual_seed(1234)  # dropout uses the default generator
            return F.dropout(torch.ones(64, device="axon"), 0.5)
        if op == "multinomial":
            return torch.multinomial(torch.ones(64, device="axon"), 10, generator=g)
        return torch.randperm(64, device="axon", generator=g)

    torch.testing.assert_close(run().cpu(), run().cpu(), rtol=0, atol=0)


def test_random_op_rejects_a_cpu_generator_like_cuda():
    with pytest.raises(RuntimeError, match="Expected a 'axon' device type for generator"):
        torch.empty(3, device="axon").uniform_(generator=torch.Generator())


# ---------------------------------------------------------------- statistics

def assert_mean_std(x, mean, std):
    """Sample mean/std of x (axon) agree with the distribution's within Z SE."""
    assert x.device.type == "axon"
    x = x.cpu().double()
    n = x.numel()
    se_mean = std / math.sqrt(n)
    assert abs(x.mean().item() - mean) < Z * se_mean, (x.mean().item(), mean)
    # SE of the sample variance for these (light-tailed) distributions <= 2*var/sqrt(n)
    se_var = 2 * std ** 2 / math.sqrt(n)
    assert abs(x.var().item() - std ** 2) < Z * se_var, (x.var().item(), std ** 2)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_normal_statistics(dtype):
    torch.manual_seed(100)
    x = torch.empty(N, device="axon", dtype=dtype).normal_(1.5, 2.0)
    assert x.dtype == dtype
    assert_mean_std(x, 1.5, 2.0)
    assert_mean_std(torch.randn(N, device="axon", dtype=dtype), 0.0, 1.0)
    m = torch.normal(torch.full((N,), -1.0, device="axon"), torch.full((N,), 0.5, device="axon"))
    assert_mean_std(m, -1.0, 0.5)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_uniform_statistics(dtype):
    torch.manual_seed(101)
    x = torch.empty(N, device="axon", dtype=dtype).uniform_(-2, 4)
    xc = x.cpu()
    assert xc.min() >= -2 and xc.max() <= 4
    assert_mean_std(x, 1.0, 6 / math.sqrt(12))
    r = torch.rand(N, device="axon", dtype=dtype)
    assert r.cpu().min() >= 0 and r.cpu().max() < 1
    assert_mean_std(r, 0.5, 1 / math.sqrt(12))


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_bernoulli_statistics(p):
    torch.manual_seed(102)
    x = torch.bernoulli(torch.full((N,), p, device="axon"))
    assert set(x.cpu().unique().tolist()) <= {0.0, 1.0}
    assert_mean_std(x, p, math.sqrt(p * (1 - p)))
    y = torch.empty(N, device="axon", dtype=torch.bfloat16).bernoulli_(p)
    assert_mean_std(y, p, math.sqrt(p * (1 - p)))


@pytest.mark.parametrize("dtype", FLOAT_DTYPES + (torch.float64, torch.int32, torch.int64,
                                                   torch.int8, torch.uint8, torch.bool))
@pytest.mark.parametrize("layout", ["contiguous", "transposed", "sliced", "zero_size"])
def test_bernoulli_with_a_number_every_dtype_and_layout(dtype, layout, no_fallback):
    """bernoulli_(p): 0 and 1 only, in self's dtype, at rate p; p = 0 and 1
    exact; elements outside a strided self untouched; the same seed draws the
    same, the next call anew; the draws follow memory order and the generator."""
    shape = {"contiguous": (120, 97), "transposed": (97, 120), "sliced": (120, 194),
             "zero_size": (0, 7)}[layout]
    fill = True if dtype == torch.bool else 7
    base = torch.full(shape, fill, dtype=dtype, device="axon")
    x = {"transposed": base.t(), "sliced": base[:, ::2]}.get(layout, base)
    torch.manual_seed(5)
    x.bernoulli_(0.3)
    got = x.cpu()
    assert got.dtype == dtype and set(got.unique().tolist()) <= {0, 1}
    if layout == "sliced":  # the skipped columns keep their value
        assert (base[:, 1::2].cpu() == fill).all()
    if got.numel():
        frac = got.double().mean().item()
        assert abs(frac - 0.3) < Z * math.sqrt(0.21 / got.numel()), frac
    torch.manual_seed(5)
    again = torch.empty_like(x).bernoulli_(0.3).cpu()
    if layout != "sliced":  # same layout, same draws
        assert torch.equal(again, got)
    assert (x.bernoulli_(0.0).cpu() == 0).all() and (x.bernoulli_(1.0).cpu() == 1).all()
    g1 = torch.Generator("axon").manual_seed(9)
    g2 = torch.Generator("axon").manual_seed(9)
    a = torch.empty(1000, device="axon", dtype=dtype).bernoulli_(0.5, generator=g1).cpu()
    b = torch.empty(1000, device="axon", dtype=dtype).bernoulli_(0.5, generator=g2).cpu()
    c = torch.empty(1000, device="axon", dtype=dtype).bernoulli_(0.5, generator=g2).cpu()
    assert torch.equal(a, b) and not torch.equal(b, c)


def test_bernoulli_with_a_number_errors_like_cpu():
    for call in (lambda d: torch.empty(3, device=d).bernoulli_(1.5),
                 lambda d: torch.empty(3, device=d).bernoulli_(float("nan")),
                 lambda d: torch.empty(1, device=d).expand(4).bernoulli_(0.5)):
        with pytest.raises(RuntimeError) as cpu_error:
            call("cpu")
        with pytest.raises(RuntimeError) as axon_error:
            call("axon")
        assert str(axon_error.value) == str(cpu_error.value)
    with pytest.raises(RuntimeError, match="not implemented for 'ComplexFloat'"):
        torch.empty(3, device="axon", dtype=torch.complex64).bernoulli_(0.5)
    with pytest.raises(RuntimeError, match="Expected a 'axon' device type for generator"):
        torch.empty(3, device="axon").bernoulli_(0.5, generator=torch.Generator())


def test_inplace_dropout_keeps_at_one_minus_p_and_scales():
    torch.manual_seed(8)
    x = torch.full((N,), 2.0, device="axon")
    y = F.dropout(x, 0.25, training=True, inplace=True)
    assert y.data_ptr() == x.data_ptr()
    got = y.cpu()
    # the kept value as the CPU computes it
    kept = F.dropout(torch.full((100,), 2.0), 0.25, training=True, inplace=True).max().item()
    assert set(got.unique().tolist()) <= {0.0, kept}
    frac = (got != 0).double().mean().item()
    assert abs(frac - 0.75) < Z * math.sqrt(0.75 * 0.25 / N)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("p", [0.2, 0.5])
def test_dropout(dtype, p):
    torch.manual_seed(103)
    x = torch.full((N,), 2.0, device="axon", dtype=dtype)
    y = F.dropout(x, p, training=True).cpu().float()
    kept = y != 0
    # kept elements are scaled by 1/(1-p), exactly as on the CPU
    # the kept value as the CPU computes it in this dtype
    expected_scale = F.dropout(torch.full((100,), 2.0, dtype=dtype), p).float().max().item()
    torch.testing.assert_close(y[kept], torch.full_like(y[kept], expected_scale), rtol=0, atol=0)
    frac = kept.double().mean().item()
    assert abs(frac - (1 - p)) < Z * math.sqrt(p * (1 - p) / N)
    # eval mode is the identity; the module form works
    torch.testing.assert_close(F.dropout(x, p, training=False).cpu(), x.cpu(), rtol=0, atol=0)
    m = torch.nn.Dropout(p).axon()
    assert (m(x).cpu() == 0).any()


def test_randperm():
    torch.manual_seed(104)
    for n in (0, 1, 7, 1000):
        r = torch.randperm(n, device="axon")
        assert r.device.type == "axon" and r.dtype == torch.int64
        assert torch.equal(r.cpu().sort().values, torch.arange(n))
    # every position is uniformly distributed: position 0 over 2000 perms of 10
    firsts = torch.stack([torch.randperm(10, device="axon")[0] for _ in range(2000)]).cpu()
    counts = torch.bincount(firsts, minlength=10).double()
    expected = 200.0
    assert ((counts - expected).abs() < Z * math.sqrt(expected)).all(), counts


def test_multinomial():
    torch.manual_seed(105)
    probs = torch.tensor([0.1, 0.2, 0.3, 0.4])
    s = torch.multinomial(probs.axon(), N, replacement=True)
    assert s.device.type == "axon"
    freq = torch.bincount(s.cpu(), minlength=4).double() / N
    se = torch.sqrt(probs.double() * (1 - probs.double()) / N)
    assert ((freq - probs.double()).abs() < Z * se).all(), freq
    # without replacement: distinct indices, never a zero-probability one
    w = torch.tensor([[0.0, 1, 2, 3, 4], [5, 0, 1, 1, 0]], device="axon")
    d = torch.multinomial(w, 3).cpu()
    for row, weights in zip(d, w.cpu()):
        assert len(set(row.tolist())) == 3
        assert all(weights[i] > 0 for i in row.tolist())


def test_randint_and_random_ranges():
    torch.manual_seed(106)
    r = torch.randint(-3, 5, (N,), device="axon")
    rc = r.cpu()
    assert rc.min() == -3 and rc.max() == 4
    counts = torch.bincount(rc + 3).double()
    assert ((counts - N / 8).abs() < Z * math.sqrt(N / 8)).all()
    b = torch.empty(1000, dtype=torch.bool, device="axon").random_()
    assert 0 < b.cpu().sum() < 1000


def test_exponential_statistics():
    torch.manual_seed(107)
    x = torch.empty(N, device="axon").exponential_(2.0)
    assert (x.cpu() >= 0).all()
    xc = x.cpu().double()
    assert abs(xc.mean().item() - 0.5) < Z * 0.5 / math.sqrt(N)


def test_fork_rng_restores_axon_state():
    torch.manual_seed(12)
    torch.rand(3, device="axon")
    expected = torch.rand(3, device="axon").cpu()
    torch.manual_seed(12)
    torch.rand(3, device="axon")
    with torch.random.fork_rng(devices=[0], device_type="axon"):
        torch.rand(100, device="axon")
    torch.testing.assert_close(torch.rand(3, device="axon").cpu(), expected, rtol=0, atol=0)


@pytest.mark.parametrize("use_reentrant", [False, True])
def test_checkpoint_recomputes_the_same_dropout_mask(use_reentrant):
    from torch.utils.checkpoint import checkpoint

    torch.manual_seed(0)
    lin = torch.nn.Linear(8, 8).axon()

    def f(x):
        return (F.dropout(lin(x), 0.5, training=True) ** 2).sum()

    x0 = torch.randn(4, 8)
    grads = []
    for ckpt in (False, True):
        x = x0.axon().requires_grad_()
        torch.manual_seed(1)
        y = checkpoint(f, x, use_reentrant=use_reentrant) if ckpt else f(x)
        y.backward()
        grads.append((y.detach().cpu(), x.grad.cpu()))
    torch.testing.assert_close(grads[0], grads[1], rtol=0, atol=0)
    # dropout really was random: another draw gives another loss
    assert not torch.equal(f(x0.axon()).detach().cpu(), grads[0][0])


# ---------------------------------------------------------------- random ops as stream work

def random_draws(seed, busy=False, dtype=torch.float32):
    torch.manual_seed(seed)
    if busy:
        sleep_on_stream(0, 100)
    x = torch.ones(200, device="axon", dtype=dtype)
    out = [torch.rand(50, device="axon", dtype=dtype), torch.randn(7, 9, device="axon", dtype=dtype),
           torch.bernoulli(torch.full((64,), 0.3, device="axon", dtype=dtype)),
           F.dropout(x, 0.4, training=True),
           torch.multinomial(torch.arange(1.0, 11.0, device="axon"), 6),
           torch.multinomial(torch.ones(4, device="axon"), 30, replacement=True),
           torch.empty(33, device="axon", dtype=dtype).uniform_(-2, 2),
           torch.empty(20, device="axon", dtype=dtype).normal_(1, 3)]
    return [t.cpu() for t in out]


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_random_ops_reproducible_with_same_seed(dtype):
    a = random_draws(31, dtype=dtype)
    b = random_draws(31, dtype=dtype)
    c = random_draws(32, dtype=dtype)
    for x, y in zip(a, b):
        torch.testing.assert_close(x, y, rtol=0, atol=0)
    assert sum(not torch.equal(x, y) for x, y in zip(a, c)) >= len(a) - 1


def test_random_ops_independent_of_stream_timing():
    """The generator's offsets are reserved on the host at the call, so the
    results do not depend on when the kernels run (or on which stream)."""
    a = random_draws(41, busy=True)
    torch.manual_seed(41)
    b = []
    for f in (lambda: torch.rand(50, device="axon"), lambda: torch.randn(7, 9, device="axon"),
              lambda: torch.bernoulli(torch.full((64,), 0.3, device="axon"))):
        b.append(f().cpu())
        torch.axon.synchronize()
    side = torch.axon.Stream()
    with torch.axon.stream(side):
        b.append(F.dropout(torch.ones(200, device="axon"), 0.4, training=True).cpu())
    for x, y in zip(a, b):
        torch.testing.assert_close(x, y, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_native_dropout_mask_matches_output(dtype, no_fallback):
    x = make((40, 50), dtype, 0.5, 2, seed=1)
    torch.manual_seed(3)
    out, mask = torch.native_dropout(x.axon(), 0.3, True)
    assert mask.dtype == torch.bool and mask.shape == x.shape
    out, mask = out.cpu(), mask.cpu()
    torch.testing.assert_close(out, x * mask * (1 / 0.7), **tol(dtype))
    frac = mask.double().mean().item()
    assert abs(frac - 0.7) < Z * math.sqrt(0.21 / mask.numel())
    # backward uses the same mask
    xa = leaf(x, "axon")
    torch.manual_seed(3)
    y = F.dropout(xa, 0.3, training=True)
    y.backward(torch.ones_like(y))
    torch.testing.assert_close(y.detach().cpu(), out, rtol=0, atol=0)
    torch.testing.assert_close(xa.grad.cpu(), (mask * (1 / 0.7)).to(dtype), **tol(dtype))


# Layouts of a dropout input: (shape to make, view applied on both devices).
DROPOUT_LAYOUTS = {
    "contiguous": ((37, 53), lambda t: t),
    "transposed": ((53, 37), lambda t: t.t()),
    "sliced": ((37, 106), lambda t: t[:, ::2]),
    "channels_last": ((2, 5, 7, 9), lambda t: t.contiguous(memory_format=torch.channels_last)),
    "expanded": ((37, 1), lambda t: t.expand(37, 53)),
    "zero_size": ((0, 53), lambda t: t),
}


@pytest.mark.parametrize("dtype", FLOAT_DTYPES + (torch.float64,))
@pytest.mark.parametrize("layout", DROPOUT_LAYOUTS)
@pytest.mark.parametrize("p", [0.0, 0.1, 0.5, 1.0])
def test_native_dropout_equals_the_cpu_formula_with_its_mask(dtype, layout, p, no_fallback):
    """Every layout and dtype, with NaN and inf inputs: the output is what the
    CPU's native_dropout computes from the same mask (input * mask * scale,
    so a dropped NaN or inf gives NaN), bit for bit, and the output and mask
    have the layout torch.empty_like gives."""
    shape, view = DROPOUT_LAYOUTS[layout]
    base = make(shape, dtype, -4, 4, seed=5)
    if base.numel() > 3:
        base.view(-1)[:3] = torch.tensor([float("nan"), float("inf"), -float("inf")])
    x_cpu, x = view(base), view(base.axon())
    torch.manual_seed(21)
    out, mask = torch.native_dropout(x, p, True)
    like = torch.empty_like(x_cpu)
    assert out.shape == mask.shape == x_cpu.shape and mask.dtype == torch.bool
    if layout not in ("sliced", "expanded"):  # dense: empty_like keeps the strides
        assert out.stride() == mask.stride() == like.stride()
    out, mask = out.cpu(), mask.cpu()
    scale = 0.0 if p == 1 else 1 / (1 - p)
    torch.testing.assert_close(out, x_cpu.mul(mask).mul_(scale), rtol=0, atol=0, equal_nan=True)
    if p == 0:
        assert mask.all()
    elif p == 1:
        assert not mask.any()
    elif mask.numel() > 1000:
        frac = mask.double().mean().item()
        assert abs(frac - (1 - p)) < Z * math.sqrt(p * (1 - p) / mask.numel())
    # The same seed draws the same; the next call draws anew.
    torch.manual_seed(21)
    again, mask_again = torch.native_dropout(x, p, True)
    _, mask_next = torch.native_dropout(x, p, True)
    assert torch.equal(mask_again.cpu(), mask)
    if 0 < p < 1 and mask.numel() > 100:
        assert not torch.equal(mask_next.cpu(), mask)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES + (torch.float64,))
@pytest.mark.parametrize("case", ["dense", "transposed", "expanded_grad", "channels_last",
                                  "float_mask", "broadcast_mask", "zero_size"])
def test_native_dropout_backward_equals_cpu(dtype, case, no_fallback):
    """native_dropout_backward (grad * mask * scale) on any layout and mask
    dtype: bitwise what the CPU computes, NaN and inf gradients included."""
    shape = (0, 9) if case == "zero_size" else (2, 3, 5, 7) if case == "channels_last" else (33, 47)
    grad = make(shape, dtype, -3, 3, seed=2)
    if grad.numel():
        grad.view(-1)[:2] = torch.tensor([float("nan"), float("inf")])
    mask = make(shape, torch.bool, seed=3)
    if case == "transposed":
        grad, mask = grad.t(), mask.t()
    elif case == "expanded_grad":
        grad = grad[:1].expand(shape)
    elif case == "channels_last":
        grad = grad.contiguous(memory_format=torch.channels_last)
        mask = mask.contiguous(memory_format=torch.channels_last)
    elif case == "float_mask":
        mask = mask.to(dtype)
    elif case == "broadcast_mask":
        mask = mask[:, :1]
    scale = 1 / (1 - 0.3)
    want = torch.ops.aten.native_dropout_backward(grad, mask, scale)
    got = torch.ops.aten.native_dropout_backward(grad.axon(), mask.axon(), scale)
    assert got.shape == want.shape and got.dtype == want.dtype
    if case in ("dense", "transposed", "channels_last"):
        assert got.stride() == want.stride()
    torch.testing.assert_close(got.cpu(), want, rtol=0, atol=0, equal_nan=True)


def test_dropout_masks_of_one_call_are_independent_across_elements_and_calls():
    """The counter rule gives no visible structure: neighbouring elements and
    successive calls are uncorrelated, and each position keeps at 1 - p."""
    torch.manual_seed(0)
    x = torch.ones(64, 1024, device="axon")
    masks = torch.stack([torch.native_dropout(x, 0.5, True)[1].cpu() for _ in range(16)]).float()
    n = masks.numel()
    for a, b in ((masks[..., 1:], masks[..., :-1]), (masks[:, 1:], masks[:, :-1]),
                 (masks[1:], masks[:-1])):
        corr = torch.corrcoef(torch.stack([a.flatten(), b.flatten()]))[0, 1].item()
        assert abs(corr) < Z / math.sqrt(a.numel()), corr
    assert abs(masks.mean().item() - 0.5) < Z * 0.5 / math.sqrt(n)


# name: (input shape, function of the input)
NN = {
    "dropout_eval": ((3, 4), lambda x: F.dropout(x, 0.5, training=False)),
}

test_nn_functional = nn_functional_test(NN)


def test_axon_generator_for_cpu_work_raises_pytorchs_error():
    """An axon generator given to a CPU op (torch.randn on the CPU, a DataLoader's
    RandomSampler): the error CUDA's generators give, not an internal one."""
    g = torch.Generator("axon")
    for call in (lambda: torch.randn(3, generator=g), lambda: torch.randperm(5, generator=g),
                 lambda: torch.ones(3).uniform_(generator=g),
                 lambda: list(torch.utils.data.RandomSampler(range(4), generator=g))):
        with pytest.raises(RuntimeError,
                           match="Expected a 'cpu' device type for generator but found 'axon'"):
            call()
    with pytest.raises(RuntimeError,
                       match="Expected a 'axon' device type for generator but found 'cpu'"):
        torch.randn(3, device="axon", generator=torch.Generator())


# ---------------------------------------------------------------- samplers (torch.distributions)

def _sampler_cases():
    # (name, call(device), mean, std of one draw): analytic moments
    return {
        "poisson": (lambda d: torch.poisson(torch.full((N,), 3.5, device=d)), 3.5, math.sqrt(3.5)),
        "binomial": (lambda d: torch.binomial(torch.full((N,), 10.0, device=d),
                                              torch.full((N,), 0.3, device=d)),
                     3.0, math.sqrt(10 * 0.3 * 0.7)),
        "standard_gamma": (lambda d: torch._standard_gamma(torch.full((N,), 2.5, device=d)),
                           2.5, math.sqrt(2.5)),
        # first coordinate of Dirichlet(1, 2, 3): Beta(1, 5)
        "dirichlet": (lambda d: torch._sample_dirichlet(
            torch.tensor([1.0, 2.0, 3.0], device=d).expand(N, 3).contiguous())[:, 0],
            1 / 6, math.sqrt(1 * 5 / (36 * 7))),
    }


@pytest.mark.parametrize("name", list(_sampler_cases()))
def test_samplers_statistics_reproducibility_and_no_fallback(name, no_fallback):
    call, mean, std = _sampler_cases()[name]
    torch.manual_seed(5)
    x = call("axon")
    assert x.device.type == "axon" and x.dtype == torch.float32
    torch.manual_seed(5)
    assert torch.equal(call("axon").cpu(), x.cpu())
    assert not torch.equal(call("axon").cpu(), x.cpu())  # the counter moved on
    xc = x.cpu().double()
    assert abs(xc.mean().item() - mean) < Z * std / math.sqrt(N)
    # the same statistic of the CPU's sampler, as a sanity check of the bound
    assert abs(call("cpu").double().mean().item() - mean) < Z * std / math.sqrt(N)


def test_sampler_gradients_match_the_cpu():
    """Gamma and Dirichlet reparameterised samples: the gradients the CPU
    computes for the same samples (the samplers' gradient ops run on axon)."""
    alpha = make((64,), torch.float32, 0.5, 4.0, seed=3)
    x = torch._standard_gamma(alpha.to("axon"))
    got = torch._standard_gamma_grad(alpha.to("axon"), x)
    torch.testing.assert_close(got.cpu(), torch._standard_gamma_grad(alpha, x.cpu()),
                               **tol(torch.float32))
    conc = make((8, 4), torch.float32, 0.5, 3.0, seed=4)
    s = torch._sample_dirichlet(conc.to("axon"))
    total = conc.sum(-1, keepdim=True).expand_as(conc)
    got = torch._dirichlet_grad(s, conc.to("axon"), total.to("axon"))
    torch.testing.assert_close(got.cpu(), torch._dirichlet_grad(s.cpu(), conc, total),
                               **tol(torch.float32))
    a = alpha.to("axon").requires_grad_()
    torch.distributions.Gamma(a, torch.ones((), device="axon")).rsample().sum().backward()
    assert a.grad.isfinite().all()


def test_sampler_errors_as_the_cpu():
    with pytest.raises(NotImplementedError, match="poisson_cpu.*Long"):
        torch.poisson(torch.tensor([1, 2], device="axon"))
    with pytest.raises(RuntimeError, match="expected rate to be non-negative"):
        torch.poisson(torch.tensor([-1.0], device="axon")).cpu()
    assert torch.poisson(torch.empty(0, 3, device="axon")).shape == (0, 3)


def test_samplers_draw_new_numbers_each_graph_replay_as_eager():
    rates = torch.full((256,), 4.0, device="axon")
    g = torch.axon.AxonGraph()
    with torch.axon.graph(g):
        p = torch.poisson(rates)
        q = torch._standard_gamma(rates)
    torch.axon.manual_seed(21)
    replays = []
    for _ in range(2):
        g.replay()
        replays.append((p.cpu().clone(), q.cpu().clone()))
    torch.axon.manual_seed(21)
    eager = [(torch.poisson(rates).cpu(), torch._standard_gamma(rates).cpu()) for _ in range(2)]
    for got, want in zip(replays, eager):
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    assert not torch.equal(replays[0][0], replays[1][0])


def test_binomial_broadcasts_as_the_cpu():
    """count (3, 1) and prob (1, 4): the CPU's result is (3, 4), with resize_output's
    deprecation warning; so is axon's, with the samples' moments."""
    import warnings

    shapes = {}
    for d in ("cpu", "axon"):
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            r = torch.binomial(torch.full((3, 1), 10.0, device=d), torch.full((1, 4), 0.3, device=d))
        shapes[d] = (tuple(r.shape), sum("was resized" in str(x.message) for x in w))
    assert shapes["axon"] == shapes["cpu"] == ((3, 4), 1)
    torch.manual_seed(2)
    big = torch.binomial(torch.full((N, 1), 10.0, device="axon"), torch.full((1, 2), 0.3, device="axon"))
    assert abs(big.cpu().double().mean().item() - 3.0) < Z * math.sqrt(2.1) / math.sqrt(2 * N)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_binomial_of_nan_or_infinite_counts_ends(dtype):
    """ATen's sampler loops forever on a NaN or infinite count with a probability in
    (0, 1) (the CPU hangs); on axon that would hang the stream. Those elements are
    NaN (a NaN count) or inf; every other element, NaN probabilities and counts with
    probability 0 or 1 included, is what the CPU gives (exact values: these do not
    draw). Run in a child with a timeout: a hang fails this test only."""
    r = run_python(f"""
        import json, torch
        nan, inf = float("nan"), float("inf")
        count = [nan, 5.0, inf, inf, 3.0, -inf, 7.0, nan, 0.0, nan, nan, inf]
        prob = [0.5, nan, 0.5, 0.0, 1.0, 0.5, 0.0, nan, nan, 0.0, 1.0, 1.0]
        got = torch.binomial(torch.tensor(count, dtype={dtype}, device="axon"),
                             torch.tensor(prob, dtype={dtype}, device="axon")).cpu()
        safe = [i for i in range(len(count)) if i not in (0, 2)]
        cpu = torch.binomial(torch.tensor(count, dtype={dtype})[safe],
                             torch.tensor(prob, dtype={dtype})[safe])
        print(json.dumps([got.dtype == {dtype}, got.tolist(), cpu.tolist(), safe]))
    """, timeout=60)
    assert r.returncode == 0, r.stderr[-800:]
    same_dtype, got, cpu, safe = json.loads(r.stdout)
    assert same_dtype
    assert math.isnan(got[0]) and got[2] == math.inf
    same = lambda a, b: a == b or (math.isnan(a) and math.isnan(b))  # noqa: E731
    assert all(same(got[i], c) for i, c in zip(safe, cpu)), (got, cpu)
