"""Ranks agree on kernel choices (csrc/aten/KernelSelect.h, "Agreement").

Each rank of a job chooses kernels (ours or ATen's) and thread counts by measurement, and
the variants round differently; ranks computing the same thing must still get the same
bits at every launch (replicated DTensors, DDP/FSDP replicas).  The ops:
- two linears (selection by measurement: our kernel against ATen's),
- fused Adam (selection by trials: it updates its inputs, so it cannot run twice),
- a large dot product (ATen's kernel: the thread policy, worker against team).
Every launch's result is kept and compared across ranks bit for bit, and with the CPU
(conftest's accumulation tolerances).

- Contradicting tables: each rank starts from its own table file, whose choices
  contradict the other rank's for the same keys.  With the process group's store the
  ranks run the same choices; with AXON_KERNEL_SELECT_AGREE=0 (the control) the same
  setup gives different bits, which shows the check can fail.
- Uneven history: no files; before the job the ranks ran the ops a different number of
  times (rank 0 finished its trials and measurements, rank 1 is in the middle of them).
- Lost store: rank 0 (the store's server) exits; rank 1's next choice warns once and it
  goes on alone with correct results.
- Held-back trials: the trials run on a stream held behind a sleep; launches of the same
  keys on other streams wait AXON_KERNEL_SELECT_WAIT seconds, warn and run the job's
  default, the same on both ranks.
"""

from __future__ import annotations

import json
import os

import torch
import torch.distributed as dist

from conftest import tol
from dist_util import run_ranks, ship, unship

STEPS = 12
ADAM_TRIALS = 16  # fused Adam: a warm-up and 3 timed runs of each of 4 variants


def _inputs():
    g = torch.Generator().manual_seed(7)
    return {
        "x": torch.randn(1, 512, generator=g),
        "w": torch.randn(1408, 512, generator=g) / 16,
        "x2": torch.randn(3, 256, generator=g),
        "w2": torch.randn(704, 256, generator=g) / 16,
        "big": torch.randn(1 << 20, generator=g),
        "p": torch.randn(1 << 16, generator=g),
        "grad": torch.randn(1 << 16, generator=g),
    }


def _run(t, steps: int, adam_steps: int):
    """The ops under test on axon, every launch's result stacked (on the CPU)."""
    xa, wa = t["x"].axon(), t["w"].axon()
    x2, w2 = t["x2"].axon(), t["w2"].axon()
    big = t["big"].axon()
    out = {"linear": [], "linear2": [], "dot": [], "adam": []}
    for _ in range(steps):
        out["linear"].append(torch.nn.functional.linear(xa, wa))
        out["linear2"].append(torch.nn.functional.linear(x2, w2))
        out["dot"].append(torch.dot(big, big))
    p = torch.nn.Parameter(t["p"].axon().clone())
    opt = torch.optim.Adam([p], lr=1e-2, fused=True)
    for _ in range(adam_steps):
        p.grad = t["grad"].axon().clone()
        opt.step()
        out["adam"].append(p.detach().clone())
    torch.axon.synchronize()
    return {k: torch.stack(v).cpu() for k, v in out.items() if v}


def _sel(_C):
    """The selection table: (op, shape) -> (choice, threads, source)."""
    return {(r[0], r[2]): (r[4], r[5], r[6]) for r in _C._kernel_select_table()}


def _thr(_C):
    """The thread policy of the dot: (kernel, bytes class) -> (threads, source)."""
    return {(r[0], r[1]): (r[2], r[3]) for r in _C._thread_policy_table()
            if r[0].startswith("aten::dot")}


def _set_choices(path: str, rank: int):
    """Rewrites this rank's table file: rank 0's says our kernels on the worker, rank 1's
    ATen's on the team (times to match, far apart: no close call), each confirmed by 3
    measurements; the second linear only in rank 0's."""
    with open(path) as f:
        table = json.load(f)
    entries = []
    for e in table["entries"]:
        if e["op"] == "linear" and e["shape"].startswith("m<=4 ") and rank != 0:
            continue
        choice = "own_worker_us" if rank == 0 else "library_team_us"
        e["choice"], e["threads"] = ("own", "worker") if rank == 0 else ("library", "team")
        for field in ("own_worker_us", "own_team_us", "library_worker_us", "library_team_us"):
            e[field] = 1.0 if field == choice else 1e6
        e["measurements"] = 3
        entries.append(e)
    for e in table["threads"]:
        e["threads"] = "worker" if rank == 0 else "team"
        e["worker_us"], e["team_us"] = (1.0, 1e6) if rank == 0 else (1e6, 1.0)
        e["measurements"] = 3
    table["entries"] = entries
    with open(path, "w") as f:
        json.dump(table, f)


def _agreement(rank, world, cache_root, scenario):
    os.environ["AXON_CACHE_DIR"] = os.path.join(cache_root, f"rank{rank}")
    os.environ["AXON_KERNEL_SELECT_CACHE"] = "1"
    from torch_axon import _C

    torch.ops.axon._kernel_select_reset()
    t = _inputs()
    forced = {}
    if scenario == "uneven":
        # Before the job: rank 0 finishes every measurement and trial, rank 1 is
        # in the middle of the thread policy's and fused Adam's trials.
        _run(t, steps=12 if rank == 0 else 3, adam_steps=20 if rank == 0 else 5)
    else:
        # This rank's own table, made before the job, then rewritten to
        # contradict the other rank's.
        _run(t, steps=STEPS, adam_steps=ADAM_TRIALS + 4)
        torch.ops.axon._kernel_select_save()
        _set_choices(torch.ops.axon._kernel_select_path(), rank)
        # Each kernel forced (the test's precondition: they round differently).
        for mode in ("own", "library"):
            torch.ops.axon._kernel_select_reset()
            torch.ops.axon._set_kernel_select(mode)
            forced[mode] = _run(t, steps=1, adam_steps=ADAM_TRIALS + 4)
        torch.ops.axon._set_kernel_select("")
        torch.ops.axon._kernel_select_reset()
    dist.init_process_group("axon")
    out = _run(t, steps=STEPS, adam_steps=ADAM_TRIALS + STEPS)
    dist.barrier()
    return ship({"out": out, "sel": _sel(_C), "thr": _thr(_C), "forced": forced,
                 "team": torch.get_num_threads() > 1})


def _job(tmp_path, scenario: str, agree: bool = True):
    env = {"AXON_KERNEL_SELECT": "auto", "AXON_KERNEL_THREADS": "auto"}
    if not agree:
        env["AXON_KERNEL_SELECT_AGREE"] = "0"
    root = tmp_path / f"{scenario}-{'agree' if agree else 'alone'}"
    root.mkdir()
    return unship(run_ranks(_agreement, 2, str(root), scenario, env=env, timeout=300))


def _check_cpu(out, t):
    """Every launch's result against the CPU."""
    f32 = tol(torch.float32, True)
    torch.testing.assert_close(out["linear"], torch.nn.functional.linear(t["x"], t["w"])
                               .expand_as(out["linear"]), **f32)
    torch.testing.assert_close(out["linear2"], torch.nn.functional.linear(t["x2"], t["w2"])
                               .expand_as(out["linear2"]), **f32)
    torch.testing.assert_close(out["dot"], torch.dot(t["big"], t["big"])
                               .expand_as(out["dot"]), **f32)
    p = torch.nn.Parameter(t["p"].clone())
    opt = torch.optim.Adam([p], lr=1e-2)
    for i in range(len(out["adam"])):
        p.grad = t["grad"].clone()
        opt.step()
        torch.testing.assert_close(out["adam"][i], p.detach(), **f32)


def _choices(rank_result, op):
    return {shape: v[:2] for (o, shape), v in rank_result["sel"].items() if o == op}


def _threads(rank_result):
    return {k: v[0] for k, v in rank_result["thr"].items()}


def _same_on_both(r0, r1):
    for k in r0["out"]:
        same = (r0["out"][k] == r1["out"][k]).reshape(len(r0["out"][k]), -1).all(1)
        assert bool(same.all()), f"{k}: launches {(~same).nonzero().flatten().tolist()} differ"
    for op in ("linear", "adam"):
        c0, c1 = _choices(r0, op), _choices(r1, op)
        assert c0 and c0 == c1 and "-" not in {v[0] for v in c0.values()}, (op, c0, c1)
        assert all("agreed" in v[2] for (o, _), v in r0["sel"].items() if o == op)
    if r0["team"]:  # one thread: the thread policy has nothing to decide
        assert r0["thr"] and _threads(r0) == _threads(r1)
        assert all("agreed" in v[1] for v in r0["thr"].values())


def test_contradicting_tables_agree(tmp_path):
    agreed = _job(tmp_path, "tables")
    alone = _job(tmp_path, "tables", agree=False)
    t = _inputs()
    for r in agreed + alone:
        _check_cpu(r["out"], t)
    a0, a1 = agreed
    b0, b1 = alone
    # Preconditions: our kernels and ATen's round differently on these inputs.
    for k in ("linear", "adam"):
        assert not torch.equal(a0["forced"]["own"][k], a0["forced"]["library"][k]), k
    # Control: without agreement each rank runs its own table's choices.
    for op in ("linear", "adam"):
        assert _choices(b0, op) and _choices(b0, op) != _choices(b1, op), op
    assert not torch.equal(b0["out"]["linear"], b1["out"]["linear"])
    if a0["team"]:
        assert b0["thr"] and _threads(b0) != _threads(b1)
        assert not torch.equal(b0["out"]["dot"], b1["out"]["dot"])
    # With agreement: the same choices and bits at every launch.
    _same_on_both(a0, a1)


def test_uneven_history_agrees(tmp_path):
    """Trials and measurements that ended before the job on one rank and not on the
    other: in the job, the first launches of a key that updates its inputs are trials on
    every rank, then the job's choice, whatever happened before."""
    r0, r1 = _job(tmp_path, "uneven")
    t = _inputs()
    for r in (r0, r1):
        _check_cpu(r["out"], t)
    _same_on_both(r0, r1)


def _store_lost(rank, world, out_path):
    import datetime

    dist.init_process_group("axon", timeout=datetime.timedelta(seconds=10))
    dist.barrier()
    if rank == 0:
        os._exit(0)  # the store's server goes with it
    import time

    time.sleep(1.0)
    t = _inputs()
    # A key no rank has chosen yet: the store is asked, fails, and this rank chooses alone.
    err = os.open(out_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    saved = os.dup(2)
    os.dup2(err, 2)
    try:
        got = torch.nn.functional.linear(t["x2"].axon(), t["w2"].axon()).cpu()
        torch.axon.synchronize()
    finally:
        os.dup2(saved, 2)
        os.close(err)
    with open(out_path) as f:
        return {"stderr": f.read(), "got": got}


def test_lost_store_warns_and_goes_on_alone(tmp_path):
    """The store's server (rank 0) is gone: the next choice warns once and the rank goes
    on choosing alone, with correct results."""
    results = run_ranks(_store_lost, 2, str(tmp_path / "stderr.txt"), timeout=120,
                        allow_failures=True)
    r1 = results[1]
    assert isinstance(r1, dict), r1
    t = _inputs()
    torch.testing.assert_close(r1["got"], torch.nn.functional.linear(t["x2"], t["w2"]),
                               **tol(torch.float32, True))
    assert r1["stderr"].count("axon: kernel selection cannot reach the process group's "
                              "store (") == 1, r1["stderr"]
    assert "from now on this process chooses kernels and threads alone" in r1["stderr"]



WAIT_S = 2  # AXON_KERNEL_SELECT_WAIT in the held-back test
HOLD_MS = 8000  # the side stream's hold: longer than the waits in a row on one stream


def _held_back(rank, world, out_path):
    """The trials of two keys (the dot's thread policy, fused Adam's variants) are queued
    on a side stream held behind a sleep; launches of the same keys on two other streams
    come after every trial was issued, so they decide on their workers, where they wait
    for trials that have not run."""
    from torch_axon import _C

    t = _inputs()
    big = t["big"].axon()
    # The kernels' first launches (a new signature runs at the call, after the stream's
    # work): before the job, whose trials start again.
    torch.dot(big, big)
    warm = torch.nn.Parameter(t["p"].axon().clone())
    warm.grad = t["grad"].axon().clone()
    torch.optim.Adam([warm], lr=1e-2, fused=True).step()
    torch.axon.synchronize()
    dist.init_process_group("axon")
    dist.barrier()
    dev = torch.axon.current_device()
    side, third = torch.axon.Stream(), torch.axon.Stream()
    trial_params = torch.nn.Parameter(t["p"].axon().clone())
    other_params = torch.nn.Parameter(t["p"].axon().clone())
    grad = t["grad"].axon()
    # Every gradient made here: their copies' trials run now, on this stream.
    grads = [grad.clone() for _ in range(ADAM_TRIALS + 1)]
    err = os.open(out_path + f".{rank}", os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    saved = os.dup(2)
    os.dup2(err, 2)
    try:
        side.wait_stream(torch.axon.current_stream())
        third.wait_stream(torch.axon.current_stream())
        with torch.axon.stream(side):
            _C._test_sleep_on_stream(dev, HOLD_MS)
            dots = [torch.dot(big, big) for _ in range(STEPS)]
            opt = torch.optim.Adam([trial_params], lr=1e-2, fused=True)
            for i in range(ADAM_TRIALS):
                trial_params.grad = grads[i]
                opt.step()
        assert not side.query()  # the trials have not run
        held = torch.dot(big, big)  # on the default stream
        with torch.axon.stream(third):
            other_params.grad = grads[-1]
            torch.optim.Adam([other_params], lr=1e-2, fused=True).step()
        # Both streams ran their launches after their waits, before the trials ran.
        torch.axon.current_stream().synchronize()
        third.synchronize()
        fell_back_first = not side.query()
        torch.axon.synchronize()
    finally:
        os.dup2(saved, 2)
        os.close(err)
    with open(out_path + f".{rank}") as f:
        stderr = f.read()
    dist.barrier()
    return ship({"stderr": stderr, "fell_back_first": fell_back_first, "dots": torch.stack(dots).cpu(), "held": held.cpu(),
                 "trial_params": trial_params.detach().cpu(),
                 "other_params": other_params.detach().cpu(),
                 "sel": _sel(_C), "thr": _thr(_C), "team": torch.get_num_threads() > 1})


def test_launches_waiting_for_held_back_trials_fall_back_together(tmp_path):
    """A launch deciding on its worker waits AXON_KERNEL_SELECT_WAIT seconds for trials
    queued on another stream (which may be waiting for it), then warns and runs the
    job's default, agreed between the ranks: the same bits on both, matching the CPU,
    with no deadlock and one warning per process."""
    env = {"AXON_KERNEL_SELECT": "auto", "AXON_KERNEL_THREADS": "auto",
           "AXON_KERNEL_SELECT_CACHE": "0", "AXON_KERNEL_SELECT_WAIT": str(WAIT_S)}
    r0, r1 = unship(run_ranks(_held_back, 2, str(tmp_path / "stderr"), env=env, timeout=120))
    t = _inputs()
    f32 = tol(torch.float32, True)
    p = torch.nn.Parameter(t["p"].clone())
    opt = torch.optim.Adam([p], lr=1e-2)
    for _ in range(ADAM_TRIALS):
        p.grad = t["grad"].clone()
        opt.step()
    q = torch.nn.Parameter(t["p"].clone())
    q.grad = t["grad"].clone()
    torch.optim.Adam([q], lr=1e-2).step()
    dot = torch.dot(t["big"], t["big"])
    for r in (r0, r1):
        torch.testing.assert_close(r["dots"], dot.expand_as(r["dots"]), **f32)
        torch.testing.assert_close(r["held"], dot, **f32)
        torch.testing.assert_close(r["trial_params"], p.detach(), **f32)
        torch.testing.assert_close(r["other_params"], q.detach(), **f32)
        assert r["fell_back_first"]
        # One warning per process, though both launches waited out.
        assert r["stderr"].count(f"waited {WAIT_S} s for this process's kernel trials") == 1, \
            r["stderr"]
        assert "it runs the job's default instead, agreed with the other ranks" in r["stderr"]
    for k in ("dots", "held", "trial_params", "other_params"):
        assert torch.equal(r0[k], r1[k]), k
    adam0, adam1 = _choices(r0, "adam"), _choices(r1, "adam")
    assert adam0 and adam0 == adam1
    assert all("agreed" in v[2] for (o, _), v in r0["sel"].items() if o == "adam")
    if r0["team"]:
        # The fallback (the worker alone) is the job's, though the trials ran afterwards.
        assert r0["thr"] and _threads(r0) == _threads(r1)
        assert set(_threads(r0).values()) == {"worker"}, r0["thr"]
        assert all("agreed" in v[1] for v in r0["thr"].values())
