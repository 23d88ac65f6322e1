"""torch.autocast("axon"): the CUDA op policies, compared with the same
computation done on the CPU in the dtype autocast picks (and with CPU
autocast where the two policies agree)."""

import copy

import pytest
import torch
import torch.nn.functional as F

from conftest import assert_same, make, tol

AMP_DTYPES = (torch.bfloat16, torch.float16)

LOW_PRECISION = {
    "matmul": ((4, 8), (8, 5), torch.matmul),
    "mm": ((4, 8), (8, 5), torch.mm),
    "bmm": ((2, 4, 8), (2, 8, 5), torch.bmm),
    "linear": ((4, 8), (5, 8), lambda x, w: F.linear(x, w, w[:, 0])),
    "addmm": ((4, 8), (8, 5), lambda a, b: torch.addmm(torch.ones(4, 5, device=a.device), a, b)),
    "baddbmm": ((2, 4, 8), (2, 8, 5), lambda a, b: torch.baddbmm(torch.ones(2, 4, 5, device=a.device), a, b)),
    "matmul_noncontig": ((8, 4), (5, 8), lambda a, b: a.t() @ b.t()),
}


@pytest.mark.parametrize("dtype", AMP_DTYPES)
@pytest.mark.parametrize("op", list(LOW_PRECISION))
def test_lower_precision_ops(op, dtype):
    sa, sb, fn = LOW_PRECISION[op]
    a, b = make(sa, torch.float32, -1, 1, seed=1), make(sb, torch.float32, -1, 1, seed=2)
    with torch.autocast("axon", dtype=dtype):
        out = fn(a.axon(), b.axon())
    assert out.dtype == dtype
    # reference: the op on the CPU with inputs cast as autocast casts them
    ref = fn(a.to(dtype), b.to(dtype)) if op not in ("addmm", "baddbmm") else \
        {"addmm": lambda: torch.addmm(torch.ones(4, 5, dtype=dtype), a.to(dtype), b.to(dtype)),
         "baddbmm": lambda: torch.baddbmm(torch.ones(2, 4, 5, dtype=dtype), a.to(dtype), b.to(dtype))}[op]()
    assert_same(out, ref, accum=True)
    # and CPU autocast in the same dtype
    with torch.autocast("cpu", dtype=dtype):
        cpu_amp = fn(a, b)
    assert cpu_amp.dtype == dtype
    assert_same(out, cpu_amp, accum=True)


FP32_OPS = {
    "exp": lambda x: torch.exp(x), "log": lambda x: torch.log(x),
    "softmax": lambda x: torch.softmax(x, -1), "log_softmax": lambda x: F.log_softmax(x, -1),
    "layer_norm": lambda x: F.layer_norm(x, (8,)), "sum": lambda x: x.sum(-1),
    "cumsum": lambda x: x.cumsum(-1), "logsumexp": lambda x: x.logsumexp(-1),
    "pow": lambda x: torch.pow(x, 2), "softplus": lambda x: F.softplus(x),
}


@pytest.mark.parametrize("dtype", AMP_DTYPES)
@pytest.mark.parametrize("op", list(FP32_OPS))
def test_fp32_ops_run_in_fp32(op, dtype):
    x = make((4, 8), dtype, 0.1, 3, seed=3)  # low-precision input, as matmul outputs are
    with torch.autocast("axon", dtype=dtype):
        out = FP32_OPS[op](x.axon())
    assert out.dtype == torch.float32
    assert_same(out, FP32_OPS[op](x.float()), accum=True)


@pytest.mark.parametrize("dtype", AMP_DTYPES)
def test_fp32_inputs_stay_fp32_outside_lists(dtype):
    x = make((4, 8), torch.float32, seed=4)
    with torch.autocast("axon", dtype=dtype):
        for fn in (torch.relu, lambda t: t + 1, lambda t: t * t, torch.sigmoid,
                   lambda t: t.max(-1).values, lambda t: torch.cat([t, t])):
            out = fn(x.axon())
            assert out.dtype == torch.float32
            assert_same(out, fn(x))


@pytest.mark.parametrize("dtype", AMP_DTYPES)
def test_promote_ops_widen(dtype):
    a = make((6,), dtype, seed=5)
    b = make((6,), torch.float32, seed=6)
    with torch.autocast("axon", dtype=dtype):
        out = torch.dot(a.axon(), b.axon())  # mixed dtypes: an error without autocast
    assert out.dtype == torch.float32
    assert_same(out, torch.dot(a.float(), b), accum=True)
    with pytest.raises(RuntimeError, match="dtype"):
        torch.dot(a.axon(), b.axon())


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_binary_cross_entropy_is_refused_as_under_cuda(dtype):
    # CUDA's autocast refuses F.binary_cross_entropy / BCELoss (unsafe in float16) and
    # lets the with-logits form run in float32; outside autocast it runs as usual
    p = make((4, 3), torch.float32, low=0.1, high=0.9, seed=3)
    t = make((4, 3), torch.float32, low=0.0, high=1.0, seed=4)
    with torch.autocast("axon", dtype=dtype):
        with pytest.raises(RuntimeError, match="binary_cross_entropy and torch.nn.BCELoss are "
                                               "unsafe to autocast"):
            torch.nn.BCELoss()(p.axon(), t.axon())
        got = F.binary_cross_entropy_with_logits(p.axon().to(dtype), t.axon())
    assert got.dtype == torch.float32
    assert_same(got, F.binary_cross_entropy_with_logits(p.to(dtype).float(), t), dtype=torch.float32)
    assert_same(F.binary_cross_entropy(p.axon(), t.axon()), F.binary_cross_entropy(p, t))


def test_autocast_state_and_disabling():
    assert not torch.is_autocast_enabled("axon")
    x = make((3, 3), torch.float32).axon()
    with torch.autocast("axon", dtype=torch.bfloat16):
        assert torch.is_autocast_enabled("axon")
        assert torch.get_autocast_dtype("axon") == torch.bfloat16
        assert (x @ x).dtype == torch.bfloat16
        with torch.autocast("axon", enabled=False):
            assert (x @ x).dtype == torch.float32
        with torch.autocast("axon", dtype=torch.float16):
            assert (x @ x).dtype == torch.float16
        assert (x @ x).dtype == torch.bfloat16
    assert not torch.is_autocast_enabled("axon")
    assert (x @ x).dtype == torch.float32


def test_autocast_is_per_device_type():
    x = make((3, 3), torch.float32)
    with torch.autocast("axon", dtype=torch.bfloat16):
        assert (x @ x).dtype == torch.float32  # CPU tensors unaffected
    with torch.autocast("cpu", dtype=torch.bfloat16):
        a = x.axon()
        assert (a @ a).dtype == torch.float32  # CPU autocast does not touch axon


def test_unsupported_autocast_dtype_warns_and_disables():
    x = make((3, 3), torch.float32).axon()
    with pytest.warns(UserWarning, match="axon"):
        with torch.autocast("axon", dtype=torch.float64):
            assert (x @ x).dtype == torch.float32


@pytest.mark.parametrize("op", list(LOW_PRECISION))
@pytest.mark.parametrize("dtype", AMP_DTYPES)
def test_float32_autocast_computes_low_precision_ops_in_float32(op, dtype):
    """autocast(dtype=torch.float32), as CUDA's accepts it: the lower-precision ops cast
    their 16-bit (and mixed) inputs to float32 (before, axon warned and disabled
    autocast, so mixed inputs raised)."""
    sa, sb, fn = LOW_PRECISION[op]
    a, b = make(sa, dtype, -1, 1, seed=1), make(sb, torch.float32, -1, 1, seed=2)
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with torch.autocast("axon", dtype=torch.float32):
            assert torch.is_autocast_enabled("axon")
            out = fn(a.axon(), b.axon())
    assert out.dtype == torch.float32
    assert_same(out, fn(a.float(), b), accum=True)


def test_default_autocast_dtype_is_supported():
    assert torch.get_autocast_dtype("axon") in torch.axon.get_amp_supported_dtype()
    x = make((3, 3), torch.float32).axon()
    with torch.autocast("axon"):
        assert (x @ x).dtype == torch.get_autocast_dtype("axon")


@pytest.mark.parametrize("dtype", AMP_DTYPES)
def test_training_step_under_autocast_matches_cpu(dtype):
    torch.manual_seed(0)
    model_c = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
    model_a = copy.deepcopy(model_c).axon()
    x = make((6, 8), torch.float32, seed=7)
    t = torch.tensor([0, 1, 2, 0, 1, 2])
    with torch.autocast("axon", dtype=dtype):
        logits = model_a(x.axon())
        loss_a = F.cross_entropy(logits, t.axon())
    assert logits.dtype == dtype and loss_a.dtype == torch.float32
    with torch.autocast("cpu", dtype=dtype):
        loss_c = F.cross_entropy(model_c(x), t)
    assert_same(loss_a, loss_c, dtype=dtype, accum=True)  # computed from `dtype` logits
    loss_a.backward()
    loss_c.backward()
    for pc, pa in zip(model_c.parameters(), model_a.parameters()):
        assert pa.grad.dtype == torch.float32  # fp32 master weights get fp32 grads
        t_ = tol(dtype, accum=True)
        torch.testing.assert_close(pa.grad.cpu(), pc.grad, rtol=t_["rtol"] * 2, atol=t_["atol"] * 2)


def test_grad_scaler_matches_cpu():
    torch.manual_seed(0)
    model_c = torch.nn.Linear(4, 2)
    model_a = copy.deepcopy(model_c).axon()
    opt_c = torch.optim.SGD(model_c.parameters(), lr=0.1)
    opt_a = torch.optim.SGD(model_a.parameters(), lr=0.1)
    sc_c = torch.amp.GradScaler("cpu", init_scale=2.0 ** 10)
    sc_a = torch.amp.GradScaler("axon", init_scale=2.0 ** 10)
    x = make((3, 4), torch.float32, seed=8)
    for model, opt, sc, xx in ((model_c, opt_c, sc_c, x), (model_a, opt_a, sc_a, x.axon())):
        loss = model(xx).pow(2).sum()
        sc.scale(loss).backward()
        sc.step(opt)
        sc.update()
        # a step with non-finite gradients is skipped and halves the scale
        opt.zero_grad()
        sc.scale(model(xx).sum() * float("inf")).backward()
        sc.step(opt)
        sc.update()
    assert sc_a.get_scale() == sc_c.get_scale() == 2.0 ** 9
    for pc, pa in zip(model_c.parameters(), model_a.parameters()):
        assert_same(pa.detach(), pc.detach(), accum=True)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_higher_order_ops_under_autocast_match_cpu(dtype):
    """torch.cond (any higher-order op) under torch.autocast("axon"): its body autocasts as on the CPU."""
    def body(x):
        return torch.cond(x.sum() > 0, lambda y: y @ y, lambda y: (y - 1) @ y, (x,))

    x = torch.randn(8, 8, generator=torch.Generator().manual_seed(0))
    for sign in (1, -1):
        with torch.autocast("cpu", dtype=dtype):
            want = body(sign * x)
        with torch.autocast("axon", dtype=dtype):
            got = body((sign * x).to("axon"))
        assert got.dtype == want.dtype == dtype
        torch.testing.assert_close(got.cpu(), want, **tol(dtype, accum=True))


def test_deprecated_torch_axon_amp_names_work_and_warn():
    # code written against torch.cuda.amp: the same names under torch.axon.amp warn as
    # CUDA's do and act as torch.amp's with device_type="axon"
    import torch.axon.amp as amp

    x = make((4, 8), torch.float32, seed=1).axon()
    w = make((8, 8), torch.float32, seed=2).axon()
    with pytest.warns(FutureWarning, match=r"torch.amp.autocast\('axon'"):
        ctx = amp.autocast(dtype=torch.bfloat16)
    with ctx:
        assert torch.is_autocast_enabled("axon")
        y = x @ w
    assert y.dtype == torch.bfloat16 and not torch.is_autocast_enabled("axon")
    with torch.autocast("axon", dtype=torch.bfloat16):
        assert torch.equal((x @ w).cpu(), y.cpu())
    with pytest.warns(FutureWarning, match=r"torch.amp.GradScaler\('axon'"):
        scaler = amp.GradScaler(init_scale=4.0)
    assert scaler._device == "axon" and scaler.get_scale() == 4.0
    assert amp.amp_definitely_not_available() is False


def test_grad_scaler_disables_itself_without_an_axon_device():
    """As GradScaler("cuda") without CUDA: a warning, then plain (unscaled) steps,
    equal to the same steps without a scaler."""
    from conftest import run_python

    r = run_python("""
        import warnings, torch
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            s = torch.amp.GradScaler("axon")
        print(s.is_enabled(), sum("axon is not available" in str(x.message) for x in w))
        torch.manual_seed(0)
        a = torch.nn.Linear(3, 1)
        b = torch.nn.Linear(3, 1)
        b.load_state_dict(a.state_dict())
        oa, ob = torch.optim.SGD(a.parameters(), 0.1), torch.optim.SGD(b.parameters(), 0.1)
        x = torch.randn(4, 3)
        s.scale(a(x).sum()).backward(); s.step(oa); s.update()
        b(x).sum().backward(); ob.step()
        print(all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters())))
    """, env={"AXON_NUM_DEVICES": "0"})
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["False", "1", "True"]
    assert torch.amp.GradScaler("axon").is_enabled()  # with devices: on
