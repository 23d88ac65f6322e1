"""Kernel selection (csrc/aten/KernelSelect.h): every op with a kernel of ours and
ATen's gives the CPU's results (within the op's tolerances) whichever side runs,
forced (own, library) or chosen by measurement (auto); a table file decides auto's
choice; AXON_KERNEL_SELECT's bad values warn; python -m torch_axon.tune runs.

Covered ops: linear (mm/addmm and out=, up to 8 rows), last-dim softmax and
log_softmax forward and backward, layer_norm forward, rms_norm forward.
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
from op_util import compare_fwd_bwd

import torch_axon  # noqa: F401
from torch_axon import _C


@pytest.fixture
def isolated(monkeypatch, tmp_path):
    """An empty in-memory table and a private table file; mode back to the environment after."""
    monkeypatch.setenv("AXON_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("AXON_KERNEL_SELECT_CACHE", "0")
    torch.axon.synchronize()
    torch.ops.axon._kernel_select_reset()
    yield tmp_path
    torch.axon.synchronize()
    torch.ops.axon._set_kernel_select("")
    torch.ops.axon._kernel_select_reset()


def runs(op: str) -> tuple[int, int]:
    """(own, library) launches of op, summed over its keys."""
    torch.axon.synchronize()
    rows = [r for r in _C._kernel_select_table() if r[0] == op]
    return sum(r[8] for r in rows), sum(r[9] for r in rows)


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
    assert row[1:6] == ("float32", "m<=1 k<=64 n<=128", "-", row[4], "measured")
    assert row[4] in ("own", "library") and row[6] > 0 and row[7] > 0
    assert row[8] + row[9] == 3  # the measuring launch counts as one of the winner's
    assert (row[8] == 3) == (row[4] == "own")
    # written to this machine's file
    with open(path) as f:
        data = json.load(f)
    [entry] = data["entries"]
    assert entry["op"] == "linear" and entry["choice"] == row[4]
    assert entry["shape"] == "m<=1 k<=64 n<=128"
    # a table that says otherwise decides, with no measurement
    for forced in ("library", "own"):
        entry.update(choice=forced, own_us=2.0, library_us=1.0)
        with open(path, "w") as f:
            json.dump(data, f, indent=1)
        torch.ops.axon._kernel_select_reset()
        for _ in range(2):
            _linear_once()
        [row] = [r for r in _C._kernel_select_table() if r[0] == "linear"]
        assert row[4:8] == (forced, "loaded", 2.0, 1.0)
        assert (row[8], row[9]) == ((2, 0) if forced == "own" else (0, 2))
    # a new key adds its entry and keeps the loaded one
    _linear_once(torch.bfloat16)
    torch.axon.synchronize()
    with open(path) as f:
        entries = json.load(f)["entries"]
    assert sorted(e["dtype"] for e in entries) == ["bfloat16", "float32"]
    assert [e["choice"] for e in entries if e["dtype"] == "float32"] == ["own"]


def test_cache_disabled_writes_nothing(isolated):
    torch.ops.axon._set_kernel_select("auto")
    assert torch.ops.axon._kernel_select_path() == ""
    _linear_once()
    torch.axon.synchronize()
    assert [r[5] for r in _C._kernel_select_table() if r[0] == "linear"] == ["measured"]
    assert os.listdir(isolated) == []


def test_set_kernel_select_bad_value():
    with pytest.raises(RuntimeError,
                       match=r"_set_kernel_select: expected 'own', 'library', 'auto' or '', "
                             r"got 'fastest'"):
        torch.ops.axon._set_kernel_select("fastest")


def _python(code: str, **env) -> subprocess.CompletedProcess:
    e = dict(os.environ, AXON_KERNEL_SELECT_CACHE="0", **env)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=e,
                          timeout=120)


def test_env_modes_and_bad_value_warns():
    code = ("import torch, torch_axon\n"
            "x = torch.randn(2, 32, device='axon'); w = torch.randn(16, 32, device='axon')\n"
            "torch.nn.functional.linear(x, w); torch.nn.functional.linear(x, w)\n"
            "torch.axon.synchronize()\n"
            "print([r[8:] for r in torch_axon._C._kernel_select_table()])\n")
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
