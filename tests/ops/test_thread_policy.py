"""The thread policy (csrc/aten/KernelSelect.h): kernels without a selection (ATen's CPU
kernels run as stream work) run on the stream worker alone or on its team as timed trials of
their first launches decided, per (kernel, elements class); results are the CPU's whichever
side ran, also for in-place ops that the trials cannot run twice; a table file decides;
AXON_KERNEL_THREADS forces a side and its bad values warn.
"""

from __future__ import annotations

import json

import pytest
import torch

from op_util import run_python
from conftest import FLOAT_DTYPES, assert_same, make

import torch_axon  # noqa: F401
from torch_axon import _C

TEAM = torch.get_num_threads() > 1
N = 1 << 17  # elements per tensor: above ATen's parallel grain (32768)


@pytest.fixture
def isolated(kernel_select_isolated):
    return kernel_select_isolated


def rows(kernel: str) -> list[tuple]:
    torch.axon.synchronize()
    return [r for r in _C._thread_policy_table() if r[0] == kernel]


@pytest.mark.skipif(not TEAM, reason="one thread: the team is the worker, nothing to decide")
def test_trials_decide_and_results_match(isolated):
    torch.ops.axon._set_kernel_threads("auto")
    x, y = make((N,), torch.float32, seed=1), make((N,), torch.float32, seed=2)
    xa, ya = x.axon(), y.axon()
    launches = 16  # the compute team's trials: worker, team, team, ...; 4 worker runs
    for _ in range(launches):
        assert_same(xa * ya, x * y)
    [row] = rows("aten::mul.Tensor")
    # x, y and the result: 3 * 2^17 float32 elements, 1.5 MiB: class <= 2^21 bytes
    assert row[1] == "<=2^21" and row[3] == "measured" and row[2] in ("worker", "team")
    assert row[4] > 0 and row[5] > 0
    # a pointwise kernel's team is the compute team (its rows split there); a team has
    # to be 5% faster
    assert (row[2] == "team") == (row[5] / 0.95 < row[4])
    # a warm-up and 3 timed runs a side (the first launch runs at the call, untimed)
    assert row[6] + row[7] == launches and row[6] >= 4 and row[7] >= 4


@pytest.mark.skipif(not TEAM, reason="one thread: the team is the worker, nothing to decide")
def test_our_kernels_are_measured_for_the_compute_team(isolated):
    """Our kernels without a selection (here rms_norm's backward) run their loops on the
    runtime's compute team, whose helpers sleep after a loop: it has to be 5% faster."""
    torch.ops.axon._set_kernel_threads("auto")
    x, w = make((512, 512), torch.float32, seed=4), make((512,), torch.float32, seed=5)
    g = make((512, 512), torch.float32, seed=6)
    xr, wr = x.clone().requires_grad_(), w.clone().requires_grad_()
    torch.nn.functional.rms_norm(xr, (512,), wr, 1e-6).backward(g)
    launches = 16  # the compute team's trials: worker, team, team, ...; 4 worker runs
    for _ in range(launches):
        xa, wa = x.axon().requires_grad_(), w.axon().requires_grad_()
        torch.nn.functional.rms_norm(xa, (512,), wa, 1e-6).backward(g.axon())
        assert_same(xa.grad, xr.grad, accum=True)
        assert_same(wa.grad, wr.grad, accum=True)
    [row] = rows("aten::_fused_rms_norm_backward")
    assert row[3] == "measured" and row[4] > 0 and row[5] > 0
    assert (row[2] == "team") == (row[5] / 0.95 < row[4])
    assert row[6] + row[7] == launches


@pytest.mark.parametrize("mode", ["worker", "team", "auto"])
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_in_place_ops_run_once_whichever_side(mode, dtype, isolated):
    """Trials alternate sides between launches (on the compute team: worker, team, team);
    no launch runs twice (add_ would add twice). The first launch of a signature runs at
    the call, untimed."""
    torch.ops.axon._set_kernel_threads(mode)
    x = make((N // 2, 2), dtype, seed=3)
    xa = x.axon()
    xt = xa.t()  # non-contiguous
    for _ in range(8):
        x.add_(0.5)
        xa.add_(0.5)
    x.t().mul_(2)
    xt.mul_(2)
    assert_same(xa, x, dtype=dtype)
    if mode != "auto" or not TEAM:
        assert rows("aten::add_.Tensor") == []  # no trials: a forced side, or no team
    else:
        [row] = rows("aten::add_.Tensor")
        assert row[6] + row[7] == 8 and row[6] >= 3 and row[7] >= 3



@pytest.mark.skipif(not TEAM, reason="one thread: the team is the worker, nothing to decide")
@pytest.mark.parametrize("op", ["mul", "add_"])
def test_launches_queued_behind_the_trials_run_the_decision(op, isolated):
    """A host far ahead of its stream: every launch is queued before the first trial
    runs. A trial's side is picked when it runs, so the side that lost runs only its
    trials (a warm-up and kTrialRuns timed runs, twice as many team runs on the compute
    team, and the first launch, untimed at the call), not a third of the queue."""
    torch.ops.axon._set_kernel_threads("auto")
    x, y = make((N,), torch.float32, seed=11), make((N,), torch.float32, seed=12)
    xa, ya = x.axon(), y.axon()
    launches = 150
    if op == "mul":
        assert_same(xa * ya, x * y)  # the signature's first launch, at the call
    else:
        xa.add_(ya)
        x.add_(y)
    torch.axon.synchronize()
    _C._test_sleep_on_stream(xa.device.index, 300)  # the stream is busy: all queue up
    out = []
    for _ in range(launches):
        if op == "mul":
            out.append(xa * ya)
        else:
            xa.add_(ya)
    [row] = rows("aten::mul.Tensor" if op == "mul" else "aten::add_.Tensor")
    assert row[3] == "measured" and row[6] + row[7] == launches + 1
    trials = 2 * (3 + 1) + 1  # the team's runs while the worker's 4 are timed, + 1
    assert min(row[6], row[7]) <= trials, row
    if op == "mul":
        for o in out:
            assert_same(o, x * y)
    else:
        for _ in range(launches):
            x.add_(y)
        assert_same(xa, x)

def test_small_and_zero_size_kernels_have_no_trials(isolated):
    torch.ops.axon._set_kernel_threads("auto")
    for shape in [(100,), (0,), (0, 7)]:
        x = make(shape, torch.float32, seed=4)
        for _ in range(4):
            assert_same(x.axon() + 1, x + 1)
    assert rows("aten::add.Tensor") == []


def _neg_entry(monkeypatch, seed):
    """Trials of aten::neg decided and saved: (x, table path, file data, neg's entry or
    None without a team)."""
    monkeypatch.setenv("AXON_KERNEL_SELECT_CACHE", "1")
    torch.ops.axon._set_kernel_threads("auto")
    path = torch.ops.axon._kernel_select_path()
    x = make((N,), torch.float32, seed=seed).axon()
    for _ in range(16):
        x.neg()
    torch.axon.synchronize()
    torch.ops.axon._kernel_select_save()
    with open(path) as f:
        data = json.load(f)
    entries = [t for t in data["threads"] if t["kernel"] == "aten::neg"]
    if not TEAM:  # no trials with one thread
        assert entries == []
        return x, path, data, None
    [entry] = entries
    return x, path, data, entry


def _rerun_with(path, data, x, launches):
    """Writes data as the table file, forgets the tables, launches x.neg(); neg's row."""
    with open(path, "w") as f:
        json.dump(data, f, indent=1)
    torch.ops.axon._kernel_select_reset()
    for _ in range(launches):
        x.neg()
    [row] = rows("aten::neg")
    return row


def test_table_file_decides_and_persists(monkeypatch, isolated):
    x, path, data, entry = _neg_entry(monkeypatch, seed=5)
    if entry is None:
        return
    assert entry["bytes"] == "<=2^20" and entry["bytes_class"] == 20  # 2 x 2^17 floats
    # a file that says otherwise decides, with no trials (from 3 measurements: fewer
    # are tried again when the call is close, test_close_calls_...)
    for threads in ("team", "worker"):
        entry["threads"] = threads
        entry["measurements"] = 3
        row = _rerun_with(path, data, x, 3)
        assert row[2:4] == (threads, "loaded")
        assert (row[6], row[7]) == ((3, 0) if threads == "worker" else (0, 3))


_python = run_python


def test_close_calls_from_few_measurements_are_tried_again(monkeypatch, isolated):
    """As for kernel selection (test_kernel_select.py): a close call from fewer than 3
    measurements is timed again by trials in the next process, keeping the minimum."""
    x, path, data, entry = _neg_entry(monkeypatch, seed=6)
    if entry is None:
        return
    assert entry["measurements"] == 1
    # neg is pointwise: its team is the compute team, whose handicap is 5%: 400 us on
    # the worker against 300 on the team is a close call (within 1.5x), 1e6 against
    # 300 is not.
    for measurements, worker_us, source, samples in ((1, 400.0, "measured", 2),
                                                     (2, 400.0, "measured", 3),
                                                     (3, 400.0, "loaded", 3),
                                                     (1, 1e6, "loaded", 1)):
        entry.update(threads="worker", worker_us=worker_us, team_us=300.0,
                     measurements=measurements)
        row = _rerun_with(path, data, x, 16)
        assert row[3] == source and row[8] == samples
        if source == "loaded":  # as the file says
            assert (row[4], row[5]) == (worker_us, 300.0)
        assert torch.equal(x.neg().cpu(), -x.cpu())


def test_close_calls_are_measured_again_in_a_long_process(monkeypatch, isolated):
    """A compute-team kernel's close call (within 1.5x after the 5% handicap) from fewer
    than 3 measurements is timed again in the same process after 128 more launches
    (KernelSelect.cpp kRecheckRuns), each side keeping its minimum, until 3 measurements
    decide it: a transient slowdown during the first trials does not decide a long run."""
    if not TEAM:
        pytest.skip("one thread: the team is the worker, nothing to decide")
    x, path, data, entry = _neg_entry(monkeypatch, seed=7)
    # times no trial can beat: the call stays close however the trials come out
    entry.update(threads="team", worker_us=1.0, team_us=1.0, measurements=1)
    row = _rerun_with(path, data, x, 16)  # the file's close call confirmed: 2 measurements
    assert row[3] == "measured" and row[8] == 2 and (row[4], row[5]) == (1.0, 1.0)
    assert row[2] == "worker"  # 1.0 / 0.95 on the team is not 5% faster
    want = -x.cpu()
    done = 16
    for samples in (3, 3):  # measured again once, then decided
        for _ in range(128 + 16):
            assert_same(x.neg(), want)
            done += 1
        [row] = rows("aten::neg")
        assert row[3] == "measured" and row[8] == samples and (row[4], row[5]) == (1.0, 1.0)
        assert row[6] + row[7] == done  # every launch counted once
    torch.ops.axon._kernel_select_save()
    with open(path) as f:
        [saved] = [t for t in json.load(f)["threads"] if t["kernel"] == "aten::neg"]
    assert saved["measurements"] == 3


def test_env_forces_a_side_and_bad_value_warns():
    code = ("import torch, torch_axon\n"
            f"x = torch.randn({N}, device='axon')\n"
            "for _ in range(16): x.exp()\n"
            "torch.axon.synchronize()\n"
            "print([r[2:4] + r[6:8] for r in torch_axon._C._thread_policy_table()\n"
            "       if r[0] == 'aten::exp'])\n")
    r = _python(code, AXON_KERNEL_THREADS="worker")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"  # forced: no trial, no entry
    r = _python(code, AXON_KERNEL_THREADS="most")
    assert r.returncode == 0, r.stderr
    assert r.stderr.count("axon: ignoring AXON_KERNEL_THREADS='most' "
                          "(expected worker, team or auto); using auto") == 1
    if TEAM:
        [(threads, source, worker, team)] = eval(r.stdout.strip())
        assert source == "measured" and worker + team == 16


def test_worker_team_size_is_what_the_launch_asked():
    """ATen's first parallel loop on a thread resets its OpenMP team size (libtorch's own
    lazy init): a later launch on the worker alone must still run on one thread."""
    code = ("import torch, torch_axon\n"
            "probe = torch.ops.axon._worker_omp_threads\n"
            "print(probe(0, 1))\n"  # the worker's first kernel: on one thread
            "x = torch.randn(1 << 20, device='axon')\n"
            "torch.ops.axon._set_kernel_threads('team')\n"
            "(x * 2).sum().item()\n"  # ATen's parallel loops on the worker
            "torch.ops.axon._set_kernel_threads('worker')\n"
            "(x + 1).sum().item()\n"
            "print(probe(0, 1), probe(0, 0), probe(0, 1))\n")
    r = _python(code)
    assert r.returncode == 0, r.stderr
    first, rest = r.stdout.split("\n")[0], r.stdout.split("\n")[1]
    team = torch.get_num_threads()
    assert first == "1" and rest.split() == ["1", str(team), "1"]


def test_worker_mkl_threads_follow_the_launch():
    """Once torch.set_num_threads was called, libtorch's lazy init gives each new thread
    MKL's per-thread count (mkl_set_num_threads_local), which MKL's GEMMs obey before
    OpenMP's: a launch on the worker alone must leave MKL one thread too, and a team
    launch the whole team. -1: this torch has no MKL (nothing to check)."""
    code = ("import torch, torch_axon\n"
            "torch.set_num_threads(torch.get_num_threads())\n"
            "probe = torch.ops.axon._worker_mkl_threads\n"
            "x = torch.randn(256, 256, device='axon')\n"
            "torch.ops.axon._set_kernel_threads('team')\n"
            "(x @ x).sum().item()\n"  # ATen's parallel loops and MKL on the worker
            "print(probe(0, 1), probe(0, 0), probe(0, 1))\n")
    r = _python(code)
    assert r.returncode == 0, r.stderr
    got = r.stdout.split()
    team = torch.get_num_threads()
    assert got in (["1", str(team), "1"], ["-1", "-1", "-1"]), got



@pytest.mark.skipif(not TEAM, reason="one thread: no OpenMP team to start")
def test_worker_openmp_team_ends_with_its_kernel():
    """A kernel on OpenMP's team (ATen's GEMM and reductions) starts OpenMP threads on
    the stream worker (they take its name); they end when the worker goes idle (or
    before a kernel on the worker alone), and right after the kernel when a new
    signature's first launch runs at the call on autograd's device thread (backward).
    A live team outside the process's first thread made libgomp count more threads than
    cores, after which the host's own parallel CPU ops slept between loops (~10x slower
    for small ones), and a worker's spun for milliseconds on the cores the host and the
    compute team need. The CPU's own team is left alone; results are the CPU's."""
    code = ("import os, torch, torch_axon\n"
            "def workers():\n"
            "    names = []\n"
            "    for t in os.listdir('/proc/self/task'):\n"
            "        with open(f'/proc/self/task/{t}/comm') as f: names.append(f.read().strip())\n"
            "    return names.count('axon0:s0'), names.count('pt_autograd_0')\n"
            "x = torch.randn(512, 1024); w = torch.randn(1024, 1024)\n"
            "cpu = (x @ w, x.sum(0))\n"
            "torch.ops.axon._set_kernel_select('library')\n"
            "torch.ops.axon._set_kernel_threads('team')\n"
            "xa, wa = x.axon(), w.axon()\n"
            "for _ in range(3):\n"  # the first launch of a signature runs at the call
            "    got = (xa @ wa, xa.sum(0))\n"
            "g = torch.randn(512, 768, device='axon', requires_grad=True)\n"
            "(g @ wa[:768]).cumsum(0).sum().backward()\n"  # on autograd's thread for axon:0
            "torch.axon.synchronize()\n"
            "import time; time.sleep(0.1)\n"  # the worker goes idle (after its 50 us spin)
            "print(*workers(), int(torch.allclose(got[0].cpu(), cpu[0], rtol=1e-5, atol=1e-4)), "
            "int(torch.allclose(got[1].cpu(), cpu[1], rtol=1e-5, atol=1e-4)))\n")
    r = _python(code)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["1", "1", "1", "1"], r.stdout


@pytest.mark.skipif(not TEAM, reason="one thread: the team is the worker, nothing to split")
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_pointwise_kernels_split_over_the_compute_team(dtype, isolated):
    """ATen's pointwise kernels given the team run their output's rows split over the
    runtime's compute team (CpuKernel.h, runSplit): the CPU's values (within the
    dtype's tolerance: a row boundary may move an element between ATen's vectorised
    loop and its scalar tail, as ATen's own split over threads does) for broadcast
    operands along the split dimension and not, optional tensors, numbers, 0-dim
    tensors, non-contiguous inputs and outputs, in-place and out=; the loops ran on
    the team; an error in a part reaches the stream."""
    torch.ops.axon._set_kernel_threads("team")
    shape = (64, 2063)  # twice ATen's grain and more; rows of an odd length
    x, y = make(shape, dtype, seed=1), make(shape, dtype, seed=2)
    col, row = make((64, 1), dtype, seed=3), make((2063,), dtype, seed=4)
    lo, hi = make(shape, dtype, low=-2, high=-1, seed=5), make((2063,), dtype, low=1, high=2,
                                                              seed=6)
    cases = {
        "add": lambda x, y: x + y,
        "mul_row": lambda x, y: x * row.to(x.device),
        "sub_col": lambda x, y: x - col.to(x.device),
        "exp_transposed": lambda x, y: torch.exp(x.t()),
        "gelu_sliced": lambda x, y: torch.nn.functional.gelu(x[:, ::2]),
        "clamp_tensors": lambda x, y: torch.clamp(x, lo.to(x.device), hi.to(x.device)),
        "addcmul": lambda x, y: torch.addcmul(x, y, col.to(x.device), value=0.5),
        "pow_number": lambda x, y: torch.pow(x.abs(), 1.7),
        "promote_0dim": lambda x, y: torch.arange(x.numel(), device=x.device).view(x.shape)
                                     * torch.tensor(0.5, device=x.device, dtype=x.dtype),
        "expanded": lambda x, y: torch.sigmoid(row.to(x.device).expand(shape)),
        "inplace": lambda x, y: x.clone().mul_(y),
        "out_transposed": lambda x, y: torch.add(x, y, out=torch.empty(
            shape[::-1], dtype=x.dtype, device=x.device).t()),
    }
    wide = make((1, 70001), dtype, seed=7)  # one row: the split is along dimension 1
    cases["wide_rows"] = lambda x, y: torch.tanh(wide.to(x.device)) + row[:1].to(x.device)
    xa, ya = x.axon(), y.axon()
    for name, fn in cases.items():
        fn(xa, ya)  # the first launch runs at the call (a new signature)
        torch.axon.synchronize()
        before = _C._team_stats()["loops"]
        got = fn(xa, ya)
        torch.axon.synchronize()
        assert _C._team_stats()["loops"] > before, name
        assert_same(got, fn(x, y))
        # The parts depend only on the shape: every launch (the first, at the call,
        # too) computes the same values.
        first = fn(xa, ya).cpu()
        assert torch.equal(fn(xa, ya).cpu(), first), name
    # A TensorIterator op that is not pointwise (indexing: a list of index tensors)
    # is not split.
    table = make((4096, 64), dtype, seed=8)
    idx = torch.randint(0, 4096, (4096,), generator=torch.Generator().manual_seed(9))
    for _ in range(3):
        assert_same(table.axon()[idx.axon()], table[idx])
    # An error raised in a part (integer division by zero) reaches the stream.
    a = torch.arange(64 * 2063, dtype=torch.int32).view(shape).axon()
    ones = torch.ones(shape, dtype=torch.int32, device="axon")
    torch.div(a, ones, rounding_mode="floor")
    torch.axon.synchronize()
    zeros = ones.clone()
    zeros[50, 7] = 0
    torch.div(a, zeros, rounding_mode="floor")
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        torch.axon.synchronize()
