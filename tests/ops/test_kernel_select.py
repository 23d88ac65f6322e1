"""Kernel selection (csrc/aten/KernelSelect.h): every op with a kernel of ours and
ATen's gives the CPU's results (within the op's tolerances) whichever side runs,
forced (own, library) or chosen by measurement (auto); a table file decides auto's
choice; AXON_KERNEL_SELECT's bad values warn; python -m torch_axon.tune runs.

Covered ops: linear (mm/addmm and out=, up to 8 rows), last-dim softmax and
log_softmax forward and backward, layer_norm forward, rms_norm forward, fused Adam/AdamW
(selected by trials over launches); attention and layer_norm backward:
test_kernel_select_backward.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from conftest import FLOAT_DTYPES, assert_same, make
from op_util import compare_fwd_bwd, run_python, select_runs

import torch_axon  # noqa: F401
from torch_axon import _C


@pytest.fixture
def isolated(kernel_select_isolated):
    return kernel_select_isolated


runs = select_runs


def check_side(op: str, mode: str, before: tuple[int, int]) -> None:
    own, lib = runs(op)
    if mode == "own":
        assert own > before[0] and lib == before[1]
    elif mode == "library":
        assert lib > before[1] and own == before[0]
    else:
        assert own + lib > sum(before)


MODES = ["own", "library", "auto"]


# ---------------------------------------------------------------- linear

@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("rows", [1, 3, 8])
@pytest.mark.parametrize("layout", ["contiguous", "strided"])
def test_linear(mode, dtype, rows, layout, isolated, no_fallback):
    torch.ops.axon._set_kernel_select(mode)
    k, n = 48, 72
    if layout == "contiguous":
        x = make((rows, k), dtype, seed=1)
    else:  # rows of x not packed (a slice of wider rows)
        x = make((rows, 2 * k), dtype, seed=1)[:, :k]
    w, b = make((n, k), dtype, seed=2), make((n,), dtype, seed=3)
    before = runs("linear")
    for bias in (None, b):
        expected = F.linear(x, w, bias)
        got = F.linear(x.axon(), w.axon(), None if bias is None else bias.axon())
        assert_same(got, expected, dtype=dtype, accum=True)
        # out= (what torch.compile's generated code calls)
        out = torch.empty(rows, n, dtype=dtype, device="axon")
        if bias is None:
            torch.mm(x.axon(), w.axon().t(), out=out)
        else:
            torch.addmm(bias.axon(), x.axon(), w.axon().t(), out=out)
        assert_same(out, expected, dtype=dtype, accum=True)
    check_side("linear", mode, before)


@pytest.mark.parametrize("mode", ["own", "library"])
def test_linear_zero_size_and_other_shapes(mode, isolated, no_fallback):
    """Shapes the selection does not see (no rows, many rows) still match."""
    torch.ops.axon._set_kernel_select(mode)
    for m, k, n in [(0, 16, 8), (2, 0, 8), (2, 16, 0), (32, 16, 8)]:
        x, w = make((m, k), torch.float32, seed=1), make((n, k), torch.float32, seed=2)
        assert_same(F.linear(x.axon(), w.axon()), F.linear(x, w), accum=True)


# ---------------------------------------------------------------- float32 GEMM

@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("layout", ["contiguous", "transposed", "strided"])
def test_gemm(mode, layout, isolated, no_fallback):
    """float32 mm / addmm beyond the small-M kernel: oneDNN's GEMM ("own") or ATen's
    (MKL), every form: mm, F.linear, addmm with beta/alpha and a 1-D, 2-D or broadcast
    bias, beta=0 ignoring a NaN bias, and the out= forms."""
    torch.ops.axon._set_kernel_select(mode)
    m, k, n = 40, 24, 36
    if layout == "contiguous":
        a, b = make((m, k), torch.float32, seed=1), make((k, n), torch.float32, seed=2)
    elif layout == "transposed":  # F.linear's weight.t()
        a, b = make((m, k), torch.float32, seed=1), make((n, k), torch.float32, seed=2).t()
    else:  # every other column / row
        a = make((m, 2 * k), torch.float32, seed=1)[:, ::2]
        b = make((2 * k, n), torch.float32, seed=2)[::2]
    before = runs("gemm")
    aa, ba = a.axon(), b.axon()
    assert_same(torch.mm(aa, ba), torch.mm(a, b), accum=True)
    for bias in (make((n,), torch.float32, seed=3), make((m, n), torch.float32, seed=4),
                 make((m, 1), torch.float32, seed=5)):
        # alpha 0: beta * bias (oneDNN alone left the result untouched), zeros for beta 0
        for beta, alpha in ((1, 1), (0.5, 2.0), (0.5, 0.0), (0, 0.0), (2, 0)):
            expected = torch.addmm(bias, a, b, beta=beta, alpha=alpha)
            got = torch.addmm(bias.axon(), aa, ba, beta=beta, alpha=alpha)
            assert_same(got, expected, accum=True)
            out = torch.full((m, n), float("nan"), device="axon")
            torch.addmm(bias.axon(), aa, ba, beta=beta, alpha=alpha, out=out)
            assert_same(out, expected, accum=True)
    nan_bias = torch.full((n,), float("nan"))
    got = torch.addmm(nan_bias.axon(), aa, ba, beta=0)
    assert_same(got, torch.addmm(nan_bias, a, b, beta=0), accum=True)
    assert not got.isnan().any()
    out = torch.empty(m, n, device="axon")
    torch.mm(aa, ba, out=out)
    assert_same(out, torch.mm(a, b), accum=True)
    # bmm, and matmul's batched products, in the same layouts
    a3 = torch.stack([a, a * 2, -a]) if layout != "strided" else make(
        (3, m, 2 * k), torch.float32, seed=6)[:, :, ::2]
    b3 = torch.stack([b, b + 1, b * 0.5])
    if layout == "transposed":
        b3 = make((3, n, k), torch.float32, seed=7).transpose(1, 2)
    assert_same(torch.bmm(a3.axon(), b3.axon()), torch.bmm(a3, b3), accum=True)
    assert_same(torch.matmul(a3.axon(), b3.axon()), torch.matmul(a3, b3), accum=True)
    check_side("gemm", mode, before)


def test_gemm_other_forms_take_aten(isolated, no_fallback):
    """What the GEMM selection does not take (16-bit, zero-size, an out= that aliases an
    operand, a non-contiguous out=, mkldnn disabled) still matches the CPU."""
    torch.ops.axon._set_kernel_select("own")
    before = runs("gemm")
    for dtype in (torch.bfloat16, torch.float16):
        a, b = make((20, 16), dtype, seed=1), make((16, 12), dtype, seed=2)
        assert_same(torch.mm(a.axon(), b.axon()), torch.mm(a, b), dtype=dtype, accum=True)
    for m, k, n in [(0, 16, 8), (20, 0, 8), (20, 16, 0)]:
        a, b = make((m, k), torch.float32, seed=1), make((k, n), torch.float32, seed=2)
        assert_same(torch.mm(a.axon(), b.axon()), torch.mm(a, b), accum=True)
        a3, b3 = make((2, m, k), torch.float32, seed=1), make((2, k, n), torch.float32, seed=2)
        assert_same(torch.bmm(a3.axon(), b3.axon()), torch.bmm(a3, b3), accum=True)
    a3, b3 = make((0, 4, 4), torch.float32, seed=1), make((0, 4, 4), torch.float32, seed=2)
    assert_same(torch.bmm(a3.axon(), b3.axon()), torch.bmm(a3, b3), accum=True)
    with pytest.raises(RuntimeError, match="batch1 must be a 3D tensor"):
        torch.bmm(make((4, 4), torch.float32).axon(), make((2, 4, 4), torch.float32).axon())
    with pytest.raises(RuntimeError, match="Expected size for first two dimensions of batch2"):
        torch.bmm(make((2, 4, 4), torch.float32).axon(), make((3, 4, 4), torch.float32).axon())
    a = make((16, 16), torch.float32, seed=3)
    aa = a.axon()
    torch.mm(aa, aa.clone(), out=aa)  # out aliases an operand: ATen's checks
    assert_same(aa, torch.mm(a, a.clone(), out=a), accum=True)
    out = torch.empty(16, 32, device="axon")[:, ::2]
    torch.mm(aa, aa, out=out)
    assert_same(out, torch.mm(a, a), accum=True)
    assert runs("gemm") == before
    torch._C._set_mkldnn_enabled(False)  # torch.backends.mkldnn.flags(enabled=False)
    try:
        b = make((16, 16), torch.float32, seed=4)
        assert_same(torch.mm(aa, b.axon()), torch.mm(a, b), accum=True)
    finally:
        torch._C._set_mkldnn_enabled(True)
    assert runs("gemm") == before


# ---------------------------------------------------------------- softmax

@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("log", [False, True])
def test_softmax(mode, dtype, log, isolated, no_fallback):
    torch.ops.axon._set_kernel_select(mode)
    fn = torch.log_softmax if log else torch.softmax
    name = "log_softmax" if log else "softmax"
    before = runs(name), runs(name + "_backward")
    x = make((4, 5, 33), dtype, seed=4)
    compare_fwd_bwd(lambda t: fn(t, dim=-1), [x], dtype, accum=False)
    # non-contiguous input: ATen's kernel whatever the mode; zero-size: no kernel
    compare_fwd_bwd(lambda t: fn(t, dim=-1), [make((33, 4), dtype, seed=5).t()], dtype,
                    accum=False)
    compare_fwd_bwd(lambda t: fn(t, dim=-1), [make((0, 7), dtype)], dtype, accum=False)
    check_side(name, mode, before[0])
    check_side(name + "_backward", mode, before[1])


# ---------------------------------------------------------------- norms

@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("affine", [False, True])
def test_norms(mode, dtype, affine, isolated, no_fallback):
    torch.ops.axon._set_kernel_select(mode)
    before = runs("layer_norm"), runs("rms_norm")
    for shape in [(3, 5, 40), (0, 40)]:
        x = make(shape, dtype, seed=6)
        w, b = make((40,), dtype, seed=7), make((40,), dtype, seed=8)
        if affine:
            compare_fwd_bwd(lambda t, w, b: F.layer_norm(t, (40,), w, b), [x, w, b], dtype)
            compare_fwd_bwd(lambda t, w: F.rms_norm(t, (40,), w, 1e-5), [x, w], dtype)
        else:
            compare_fwd_bwd(lambda t: F.layer_norm(t, (40,)), [x], dtype)
            compare_fwd_bwd(lambda t: F.rms_norm(t, (40,)), [x], dtype)
    # non-contiguous input (our kernel reads a contiguous copy)
    x = make((40, 6), dtype, seed=9).t()
    compare_fwd_bwd(lambda t: F.layer_norm(t, (40,)), [x], dtype)
    # the statistics the forward returns are the same whichever side ran
    xa = make((6, 40), dtype, seed=10)
    out, mean, rstd = torch.native_layer_norm(xa.axon(), (40,), None, None, 1e-5)
    assert mean.dtype == rstd.dtype == torch.float32
    assert_same(out, F.layer_norm(xa, (40,)), dtype=dtype, accum=True)
    assert_same(mean.view(-1), xa.float().mean(-1), dtype=dtype, accum=True)
    check_side("layer_norm", mode, before[0])
    check_side("rms_norm", mode, before[1])


# ---------------------------------------------------------------- Adam (trials)

def _adam_steps(opt_cls, dtype, steps, amsgrad, device, **kw):
    """Parameters after `steps` fused steps from the same start and gradients."""
    params = [make(s, dtype, seed=20 + i).to(device).requires_grad_(True)
              for i, s in enumerate([(33, 7), (5,), (0, 3), (40, 2)])]
    # a non-contiguous parameter's gradient lives in its own contiguous buffer
    opt = opt_cls(params, lr=0.01, weight_decay=0.1, amsgrad=amsgrad, fused=True, **kw)
    for step in range(steps):
        for i, p in enumerate(params):
            p.grad = make(p.shape, dtype, seed=100 * step + i).to(device)
        opt.step()
    return [p.detach() for p in params]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("opt_cls", [torch.optim.Adam, torch.optim.AdamW])
@pytest.mark.parametrize("amsgrad", [False, True])
def test_fused_adam(mode, dtype, opt_cls, amsgrad, isolated, no_fallback):
    """Adam updates its inputs: auto decides by trials over launches, never by running twice."""
    torch.ops.axon._set_kernel_select(mode)
    steps = 20  # enough for auto's trials (a warm-up and 3 timed runs of each variant)
    got = _adam_steps(opt_cls, dtype, steps, amsgrad, "axon")
    expected = _adam_steps(opt_cls, dtype, steps, amsgrad, "cpu")
    for g, e in zip(got, expected):
        assert_same(g, e, dtype=dtype, accum=True)
    own, lib = runs("adam")
    assert own + lib == steps
    if mode == "own":
        assert lib == 0
    elif mode == "library":
        assert own == 0
    else:
        [row] = [r for r in _C._kernel_select_table() if r[0] == "adam"]
        assert row[6] == "measured" and row[4] in ("own", "library")
        assert row[7] > 0 and row[9] > 0 and own >= 3 and lib >= 3
        assert row[3] == ("amsgrad" if amsgrad else "-")


def test_fused_adam_with_grad_scaling_is_not_selected(isolated):
    """A learning rate in device memory or gradient scaling: our kernel only (no table row)."""
    torch.ops.axon._set_kernel_select("library")
    for kw in (dict(lr=torch.tensor(0.01, device="axon")),
               dict(lr=0.01, grad_scale=torch.tensor(2.0, device="axon"),
                    found_inf=torch.tensor(0.0, device="axon"))):
        ps = [make((9, 4), torch.float32, seed=i) for i in range(4)]
        step = torch.tensor(1.0)
        expected = [p.clone() for p in ps]
        args = dict(beta1=0.9, beta2=0.999, weight_decay=0.0, eps=1e-8, amsgrad=False,
                    maximize=False)
        cpu_kw = {k: v.cpu() if isinstance(v, torch.Tensor) else v for k, v in kw.items()}
        torch._fused_adamw_([expected[0]], [expected[1]], [expected[2]], [expected[3]], [],
                            [step.clone()], **cpu_kw, **args)
        got = [p.axon() for p in ps]
        torch._fused_adamw_([got[0]], [got[1]], [got[2]], [got[3]], [], [step.axon()], **kw,
                            **args)
        for g, e in zip(got, expected):
            assert_same(g, e)
    torch.axon.synchronize()
    assert [r for r in _C._kernel_select_table() if r[0] == "adam"] == []


# ---------------------------------------------------------------- the table

def _linear_once(dtype=torch.float32):
    x, w = make((1, 64), dtype, seed=1), make((96, 64), dtype, seed=2)
    got = F.linear(x.axon(), w.axon())
    assert_same(got, F.linear(x, w), dtype=dtype, accum=True)


def test_auto_measures_once_persists_and_follows_a_table(monkeypatch, isolated):
    monkeypatch.setenv("AXON_KERNEL_SELECT_CACHE", "1")
    torch.ops.axon._set_kernel_select("auto")
    path = torch.ops.axon._kernel_select_path()
    assert path.startswith(str(isolated)) and os.path.basename(path).startswith("kernel_select-")
    for _ in range(3):
        _linear_once()
    torch.axon.synchronize()
    [row] = [r for r in _C._kernel_select_table() if r[0] == "linear"]
    assert row[1:4] == ("float32", "m<=1 k<=64 n<=128", "-") and row[6] == "measured"
    assert row[4] in ("own", "library") and row[5] in ("worker", "team")
    team = torch.get_num_threads() > 1
    # every variant this machine has was timed (the team's only with more than one thread)
    assert row[7] > 0 and row[9] > 0 and (row[8] > 0 and row[10] > 0) == team
    assert row[11] + row[12] == 3  # the measuring launch counts as one of the winner's
    assert (row[11] == 3) == (row[4] == "own")
    # the winner is the smallest time after handicaps (KernelSelect.cpp): ATen's kernel
    # must be 5% faster; a team (ours: the runtime's compute team; ATen's: OpenMP's,
    # timed with starting its threads) 5% faster than the worker alone
    handicapped = {("own", "worker"): row[7], ("own", "team"): row[8] / 0.95,
                   ("library", "worker"): row[9] / 0.95,
                   ("library", "team"): row[10] / 0.95 / 0.95}
    if not team:
        del handicapped[("own", "team")], handicapped[("library", "team")]
    assert (row[4], row[5]) == min(handicapped, key=handicapped.get)
    # written to this machine's file once saved (at most once a second, at exit, or now)
    torch.ops.axon._kernel_select_save()
    with open(path) as f:
        data = json.load(f)
    [entry] = data["entries"]
    assert entry["op"] == "linear" and entry["choice"] == row[4] and entry["threads"] == row[5]
    assert entry["shape"] == "m<=1 k<=64 n<=128"
    assert entry["own_worker_us"] == pytest.approx(row[7], rel=1e-4)
    # a table that says otherwise decides, with no measurement (times far enough apart
    # not to be a close call, which one measurement would not settle)
    for forced, threads in (("library", "team"), ("own", "worker")):
        entry.update(choice=forced, threads=threads, own_worker_us=2.0, library_worker_us=1.0,
                     own_team_us=4.0, library_team_us=8.0)
        with open(path, "w") as f:
            json.dump(data, f, indent=1)
        torch.ops.axon._kernel_select_reset()
        for _ in range(2):
            _linear_once()
        [row] = [r for r in _C._kernel_select_table() if r[0] == "linear"]
        assert row[4:8] == (forced, threads, "loaded", 2.0) and row[9] == 1.0
        assert (row[11], row[12]) == ((2, 0) if forced == "own" else (0, 2))
    # a new key adds its entry and keeps the loaded one
    _linear_once(torch.bfloat16)
    torch.axon.synchronize()
    torch.ops.axon._kernel_select_save()
    with open(path) as f:
        entries = json.load(f)["entries"]
    assert sorted(e["dtype"] for e in entries) == ["bfloat16", "float32"]
    assert [e["choice"] for e in entries if e["dtype"] == "float32"] == ["own"]


def test_close_calls_from_few_measurements_are_measured_again(monkeypatch, isolated):
    """A table entry from fewer than 3 measurements whose runner-up is within 1.5x of the
    winner (after handicaps) is measured again by the next process that uses it, keeping
    each variant's minimum; confirmed or clear-cut entries are not."""
    monkeypatch.setenv("AXON_KERNEL_SELECT_CACHE", "1")
    torch.ops.axon._set_kernel_select("auto")
    path = torch.ops.axon._kernel_select_path()
    _linear_once()
    torch.axon.synchronize()
    torch.ops.axon._kernel_select_save()
    with open(path) as f:
        data = json.load(f)
    [entry] = data["entries"]
    assert entry["measurements"] == 1

    def reload(**fields):
        entry.update(fields)
        with open(path, "w") as f:
            json.dump(data, f, indent=1)
        torch.ops.axon._kernel_select_reset()
        for _ in range(2):
            _linear_once()
        torch.axon.synchronize()
        [row] = [r for r in _C._kernel_select_table() if r[0] == "linear"]
        return row

    # times no real run beats: the merged minimum keeps them
    close = dict(choice="own", threads="worker", own_worker_us=0.05, library_worker_us=0.052,
                 own_team_us=1e6, library_team_us=1e6)
    row = reload(measurements=1, **close)
    assert row[6] == "measured" and row[13] == 2
    assert row[7] == 0.05 and row[9] == 0.052
    if torch.get_num_threads() > 1:  # the team's variants measured too (else the file's)
        assert row[8] < 1e6
    assert (row[4], row[5]) == ("own", "worker")
    row = reload(measurements=2, **close)
    assert row[6] == "measured" and row[13] == 3
    # three measurements, a clear winner, or no count (written by hand): as the file says
    for fields in (dict(measurements=3, **close),
                   dict(close, measurements=1, library_worker_us=50.0),
                   dict(close, measurements=None)):
        if fields["measurements"] is None:
            del fields["measurements"]
            entry.pop("measurements")
        row = reload(**fields)
        assert row[6] == "loaded" and row[7] == 0.05 and row[8] == 1e6
        assert row[13] == fields.get("measurements", 3)


def test_forced_modes_measure_only_what_they_allow(isolated):
    """own / library restrict the kernel, worker / team the threads; one variant left: no timing."""
    for kernel, threads in [("own", "worker"), ("library", "team"), ("own", "auto"),
                            ("auto", "worker")]:
        torch.ops.axon._kernel_select_reset()
        torch.ops.axon._set_kernel_select(kernel)
        torch.ops.axon._set_kernel_threads(threads)
        _linear_once()
        torch.axon.synchronize()
        [row] = [r for r in _C._kernel_select_table() if r[0] == "linear"]
        timed = [v for v, t in zip(("own/worker", "own/team", "library/worker", "library/team"),
                                   row[7:11]) if t >= 0]
        if kernel != "auto" and threads != "auto":
            assert timed == [] and row[6] == "not measured"
        elif kernel == "own":
            assert timed == (["own/worker", "own/team"] if torch.get_num_threads() > 1
                             else ["own/worker"])
        else:
            assert timed == ["own/worker", "library/worker"]
        assert (row[11] > 0) == (kernel != "library") and (row[12] > 0) == (kernel == "library")
    torch.ops.axon._set_kernel_threads("")


def test_set_kernel_threads_bad_value():
    with pytest.raises(RuntimeError,
                       match=r"_set_kernel_threads: expected 'worker', 'team', 'auto' or '', "
                             r"got 'all'"):
        torch.ops.axon._set_kernel_threads("all")


def test_cache_disabled_writes_nothing(isolated):
    torch.ops.axon._set_kernel_select("auto")
    assert torch.ops.axon._kernel_select_path() == ""
    _linear_once()
    torch.axon.synchronize()
    assert [r[6] for r in _C._kernel_select_table() if r[0] == "linear"] == ["measured"]
    torch.ops.axon._kernel_select_save()
    assert os.listdir(isolated) == []


def test_set_kernel_select_bad_value():
    with pytest.raises(RuntimeError,
                       match=r"_set_kernel_select: expected 'own', 'library', 'auto' or '', "
                             r"got 'fastest'"):
        torch.ops.axon._set_kernel_select("fastest")


_python = run_python


def test_env_modes_and_bad_value_warns():
    code = ("import torch, torch_axon\n"
            "x = torch.randn(2, 32, device='axon'); w = torch.randn(16, 32, device='axon')\n"
            "torch.nn.functional.linear(x, w); torch.nn.functional.linear(x, w)\n"
            "torch.axon.synchronize()\n"
            "print([r[11:13] for r in torch_axon._C._kernel_select_table()])\n")
    r = _python(code, AXON_KERNEL_SELECT="library")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[(0, 2)]"
    r = _python(code, AXON_KERNEL_SELECT=" OWN ")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[(2, 0)]"
    r = _python(code, AXON_KERNEL_SELECT="fastest")
    assert r.returncode == 0, r.stderr
    assert r.stderr.count("axon: ignoring AXON_KERNEL_SELECT='fastest' "
                          "(expected own, library or auto); using auto") == 1
    (own, lib), = eval(r.stdout.strip())
    assert own + lib == 2


def test_tune_cli(tmp_path):
    env = dict(os.environ, AXON_CACHE_DIR=str(tmp_path), AXON_KERNEL_SELECT_CACHE="1")
    env.pop("AXON_KERNEL_SELECT", None)
    run = lambda *args: subprocess.run([sys.executable, "-m", "torch_axon.tune", *args],
                                       capture_output=True, text=True, env=env, timeout=300)
    r = run()
    assert r.returncode == 0, r.stderr
    assert "(empty)" in r.stdout and "machine: " in r.stdout
    r = run("--run")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[2].split()[:3] == ["op", "dtype", "shape"]
    body = "\n".join(lines[4:])
    for op in ("linear", "softmax", "log_softmax_backward", "layer_norm", "rms_norm"):
        assert f"\n{op} " in "\n" + body
    assert "m<=1 k<=512 n<=32768" in body and "bfloat16" in body and "float16" in body
    [file] = [p for p in os.listdir(tmp_path) if p.endswith(".json")]
    r = run()
    assert r.returncode == 0 and "loaded" in r.stdout
    r = run("--clear")
    assert r.returncode == 0 and f"removed {tmp_path / file}" in r.stdout
    assert not (tmp_path / file).exists()


_DETERMINISTIC_RUN = """
import hashlib, sys, torch, torch_axon
import torch.nn.functional as F
torch.use_deterministic_algorithms(sys.argv[1] == "1")
g = torch.Generator().manual_seed(0)
x = torch.randn(64, 512, generator=g).to("axon")
w = torch.randn(1408, 512, generator=g).to("axon")
img = torch.randn(1, 96, 16, 16, generator=g).to("axon")
conv = torch.randn(32, 96, 1, 1, generator=g).to("axon")
big = torch.randn(1 << 18, generator=g).to("axon")
ops = {
    "linear_row": lambda: F.linear(x[:1], w),
    "linear": lambda: F.linear(x, w),
    "softmax_bf16": lambda: torch.softmax(x.bfloat16() * 3, -1),
    "layer_norm": lambda: F.layer_norm(x, (512,)),
    "conv1x1": lambda: F.conv2d(img, conv),
    "sum": lambda: big.sum(),
    "cumsum": lambda: big.cumsum(0),
}
digests = []
for name, op in ops.items():
    runs = {hashlib.sha256(op().cpu().float().numpy().tobytes()).hexdigest() for _ in range(6)}
    digests.append(f"{name}:{len(runs)}:{min(runs)[:16]}")
print(" ".join(digests))
"""


def test_deterministic_algorithms_give_the_same_bits_every_call_and_process(tmp_path):
    """Under torch.use_deterministic_algorithms(True) nothing is chosen by measurement
    (kernel variants and thread counts round differently), and a new signature's first
    launch, which runs on the host, uses the device's thread count: every call of an op
    gives the same bits, in a process with an empty kernel-selection table, in one whose
    table a measuring process wrote, and with the selection forced."""
    env = {"AXON_CACHE_DIR": str(tmp_path)}
    outputs = []
    for deterministic, extra in (("1", {}), ("0", {}), ("1", {}),
                                 ("1", {"AXON_KERNEL_SELECT": "own"})):
        code = _DETERMINISTIC_RUN.replace("sys.argv[1]", repr(deterministic))
        code = "import os; os.environ['AXON_KERNEL_SELECT_CACHE'] = '1'\n" + code  # persisted
        r = _python(code, timeout=300, **env, **extra)
        assert r.returncode == 0, r.stderr[-3000:]
        outputs.append(r.stdout.split())
    for fields in (outputs[0], outputs[2], outputs[3]):  # the deterministic runs
        assert all(f.split(":")[1] == "1" for f in fields), fields  # one result per op
    assert outputs[0] == outputs[2] == outputs[3]  # the same in every process


# ---------------------------------------------------------------- NaN in attention

@pytest.mark.parametrize("mode", ["own", "library"])
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("shape", [(5, 7, 16), (1, 3000, 64)], ids=["rows", "decode_split_keys"])
@pytest.mark.parametrize("causal", [False, True])
def test_attention_nan_in_a_query_row_gives_a_nan_row(mode, dtype, shape, causal, isolated):
    """As softmax (and the CPU's math path): a query row with a NaN attends to
    NaN.  ATen's CPU flash kernel gives 0 there (its row max skips NaN scores, so
    the row reads as fully masked); whichever kernel the selection runs, axon's
    result is the same."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    torch.ops.axon._set_kernel_select(mode)
    L, S, D = shape
    q, k, v = (make((1, 2, n, D), dtype, seed=i) for i, n in enumerate((L, S, S)))
    q[0, 1, L // 2, 3] = float("nan")
    before = runs("attention")
    with sdpa_kernel(SDPBackend.MATH):
        expected = F.scaled_dot_product_attention(q.double(), k.double(), v.double(),
                                                  is_causal=causal)
    got = F.scaled_dot_product_attention(q.to("axon"), k.to("axon"), v.to("axon"),
                                         is_causal=causal).cpu()
    check_side("attention", mode, before)
    assert torch.equal(got.isnan(), expected.isnan())
    assert got.isnan().any()
    ok = ~expected.isnan()
    torch.testing.assert_close(got[ok].double(), expected[ok], rtol=2e-2, atol=2e-2)
