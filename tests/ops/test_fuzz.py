"""A differential fuzzer: random short programs of ops, axon against the CPU (issue 15, item 8).

Each program starts from a few random tensors -- float32, bfloat16, float16,
int64 or bool; 0 to 3 dimensions, zero-size ones included; contiguous,
transposed, sliced with a step, offset into a larger storage, or expanded --
and applies 3 to 7 random ops: elementwise (with type promotion and
broadcasting against another live tensor or a Python number), reductions,
views and reshapes, casts, indexing, sorting, matmul, and in-place ops
(through views, so that writes must reach their bases).  The same program runs
on the CPU and on axon.  After every op:
- either both raised, with the same exception type and first line of the
  message, at the call (nothing may be left for a later synchronising call),
- or both returned results of the same dtype and shape and values within the
  dtype's tolerance (conftest.tol(accum=True); exact for integers and bools);
  every live tensor (bases of views included) is compared, so a lost or
  misplaced in-place write is found.

Seeds are fixed: program i uses seed AXON_FUZZ_SEED + i (default 0).  The run
stops after AXON_FUZZ_SECONDS (default 20) or AXON_FUZZ_PROGRAMS programs
(default 3000): `make test`; `make fuzz` runs longer.  A failure prints the seed and the program, and
`AXON_FUZZ_SEED=<seed> AXON_FUZZ_PROGRAMS=1 pytest tests/ops/test_fuzz.py -k fuzz -s`
replays it alone.
"""

from __future__ import annotations

import math
import os
import random
import re
import time
import warnings

import pytest
import torch

from conftest import tol

DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.int64, torch.bool)
FLOATS = (torch.float32, torch.bfloat16, torch.float16)


def _is_float(t):
    return t.dtype in FLOATS


def _is_int(t):
    return t.dtype == torch.int64


# ---------------------------------------------------------------- inputs

def _values(rng: random.Random, shape, dtype):
    g = torch.Generator().manual_seed(rng.randrange(2**31))
    if dtype == torch.bool:
        return torch.rand(shape, generator=g) < 0.5
    if dtype == torch.int64:
        return torch.randint(-5, 6, shape, generator=g)
    return (torch.randn(shape, generator=g) * 2).to(dtype)


def make_input(rng: random.Random, dtype=None):
    """(cpu, axon, description): the same values and the same view geometry."""
    dtype = dtype or rng.choice(DTYPES)
    ndim = rng.choice((0, 1, 1, 2, 2, 2, 3))
    sizes = [rng.choice((0, 1, 2, 3, 3, 4, 5)) if rng.random() < 0.08 else rng.choice((1, 2, 3, 4, 5))
             for _ in range(ndim)]
    layout = rng.choice(("contiguous", "transposed", "sliced", "offset", "expanded")) if ndim else "contiguous"
    if layout == "transposed" and ndim >= 2:
        base = _values(rng, sizes[::-1], dtype)
        make = lambda b: b.permute(*range(ndim - 1, -1, -1))  # noqa: E731
    elif layout == "sliced":
        d = rng.randrange(ndim)
        big = list(sizes)
        big[d] = sizes[d] * 2 + 1
        base = _values(rng, big, dtype)
        make = lambda b: b[(slice(None),) * d + (slice(1, None, 2),)]  # noqa: E731
    elif layout == "offset":
        n = math.prod(sizes)
        base = _values(rng, [n + 3], dtype)
        make = lambda b: b[3:].view(sizes)  # noqa: E731
    elif layout == "expanded" and 1 in sizes:
        small = [1 if s == 1 else s for s in sizes]
        base = _values(rng, small, dtype)
        target = [s if s != 1 else rng.choice((1, 3)) for s in sizes]
        make = lambda b: b.expand(target)  # noqa: E731
    else:
        layout = "contiguous"
        base = _values(rng, sizes, dtype)
        make = lambda b: b  # noqa: E731
    cpu = make(base.clone())
    axon = make(base.to("axon"))
    assert cpu.shape == axon.shape and cpu.stride() == axon.stride()
    return cpu, axon, f"{layout} {dtype} {list(cpu.shape)} strides {cpu.stride()}"


# ---------------------------------------------------------------- ops

def _dim(rng, t):
    return rng.randrange(t.dim()) if t.dim() else None


def _other(rng, pool, t):
    """A second operand for t: a live tensor, a fresh one shaped to broadcast
    (or not, sometimes), or a Python number."""
    r = rng.random()
    if r < 0.25:
        return ("number", rng.choice((2, -1, 0.5, True, 3.0)))
    if r < 0.55 and len(pool) > 1:
        return ("pool", rng.randrange(len(pool)))
    shape = list(t.shape)
    if shape and rng.random() < 0.5:
        shape = shape[rng.randrange(len(shape)):]          # trailing dims
    if shape and rng.random() < 0.3:
        shape[rng.randrange(len(shape))] = 1               # broadcast
    if rng.random() < 0.05:
        shape = shape + [7]                                # not broadcastable
    dtype = t.dtype if rng.random() < 0.6 else rng.choice(DTYPES)
    return ("fresh", (shape, dtype, rng.randrange(2**31)))


def _resolve(spec, pool, device):
    kind, v = spec
    if kind == "number":
        return v
    if kind == "pool":
        return pool[v][0 if device == "cpu" else 1]
    shape, dtype, seed = v
    t = _values(random.Random(seed), shape, dtype)
    return t if device == "cpu" else t.to("axon")


def build_op(rng: random.Random, pool):
    """A random op on pool[i] (and maybe another operand): (description,
    function(device) -> result), the function drawing nothing random."""
    i = rng.randrange(len(pool))
    t = pool[i][0]
    d = _dim(rng, t)
    nd = t.dim()
    choices = []

    def add(name, fn, weight=1):
        choices.extend([(name, fn)] * weight)

    def a(dev):
        return pool[i][0 if dev == "cpu" else 1]

    # elementwise, unary
    for name in ("neg", "abs", "sin", "tanh", "sigmoid", "relu", "floor", "round", "sign",
                 "logical_not", "bitwise_not", "square", "trunc", "isnan", "signbit"):
        add(name, lambda dev, n=name: getattr(torch, n)(a(dev)))
    add("sqrt(abs)", lambda dev: a(dev).abs().sqrt())
    add("log1p(abs)", lambda dev: a(dev).abs().log1p())
    add("exp(clamp)", lambda dev: a(dev).clamp(-3, 3).exp())
    add("clamp(-1,1)", lambda dev: a(dev).clamp(-1, 1))
    add("gelu", lambda dev: torch.nn.functional.gelu(a(dev)))
    add("silu", lambda dev: torch.nn.functional.silu(a(dev)))
    if d is not None:
        add("softmax", lambda dev: a(dev).softmax(d))
        add("log_softmax", lambda dev: a(dev).log_softmax(d))
    # elementwise, binary (type promotion, broadcasting)
    o = _other(rng, pool, t)
    for name in ("add", "sub", "mul", "div", "maximum", "minimum", "eq", "lt", "ge",
                 "logical_and", "bitwise_and", "atan2", "fmod", "remainder", "floor_divide",
                 "pow"):
        add(name, lambda dev, n=name: getattr(torch, n)(a(dev), _resolve(o, pool, dev)), 2)
    add("where(a>0)", lambda dev: torch.where(a(dev) > 0, a(dev), _resolve(o, pool, dev)))
    add("lerp(0.3)", lambda dev: torch.lerp(a(dev), _resolve(o, pool, dev), 0.3))
    add("addcmul", lambda dev: torch.addcmul(a(dev), a(dev), _resolve(o, pool, dev), value=0.5))
    # reductions
    keep = rng.random() < 0.5
    add("sum()", lambda dev: a(dev).sum())
    add("prod()", lambda dev: a(dev).prod())
    add("any()", lambda dev: a(dev).any())
    add("max()", lambda dev: a(dev).max())
    if d is not None:
        add("sum(d)", lambda dev: a(dev).sum(d, keepdim=keep))
        add("mean(d)", lambda dev: a(dev).mean(d, keepdim=keep))
        add("amax(d)", lambda dev: a(dev).amax(d, keepdim=keep))
        add("argmax(d)", lambda dev: a(dev).argmax(d, keepdim=keep))
        add("max(d)", lambda dev: a(dev).max(d, keepdim=keep))
        add("cumsum(d)", lambda dev: a(dev).cumsum(d))
        add("all(d)", lambda dev: a(dev).all(d))
        add("std(d)", lambda dev: a(dev).std(d))
        add("norm(d)", lambda dev: torch.linalg.vector_norm(a(dev), dim=d))
        add("sort(d)", lambda dev: a(dev).sort(d, stable=True))
        k = rng.randrange(0, t.shape[d] + 2)
        add("topk", lambda dev: a(dev).topk(k, d)[0])
        add("flip(d)", lambda dev: a(dev).flip(d))
        add("roll(d)", lambda dev: a(dev).roll(1, d))
        add("narrow(d)", lambda dev: a(dev).narrow(d, 0, min(1, t.shape[d])))
        add("slice ::2", lambda dev: a(dev)[(slice(None),) * d + (slice(None, None, 2),)])
        add("unsqueeze(d)", lambda dev: a(dev).unsqueeze(d))
        add("cat", lambda dev: torch.cat([a(dev), _resolve(o, pool, dev)]
                                          if o[0] != "number" else [a(dev), a(dev)], d))
        n_idx = rng.randrange(0, 4)
        idx = [rng.randrange(-t.shape[d] - 1, t.shape[d] + 1) if t.shape[d] else 0
               for _ in range(n_idx)]
        add("index_select", lambda dev: a(dev).index_select(
            d, torch.tensor(idx, dtype=torch.long, device=a(dev).device)))
        add("gather", lambda dev: a(dev).gather(
            d, torch.zeros_like(a(dev), dtype=torch.long)))
    # shapes and views
    add("clone", lambda dev: a(dev).clone())
    add("contiguous", lambda dev: a(dev).contiguous())
    add("reshape(-1)", lambda dev: a(dev).reshape(-1))
    add("flatten", lambda dev: a(dev).flatten())
    add("t", lambda dev: a(dev).t())
    if nd >= 2:
        add("transpose", lambda dev: a(dev).transpose(0, nd - 1))
        add("diagonal", lambda dev: a(dev).diagonal())
    add("stack", lambda dev: torch.stack([a(dev), a(dev)]))
    # casts
    to = rng.choice(DTYPES)
    add("to", lambda dev: a(dev).to(to), 2)
    # indexing
    add("a[a>0]", lambda dev: a(dev)[a(dev) > 0])
    add("masked_fill", lambda dev: a(dev).masked_fill(a(dev) > 0, -1))
    add("nonzero", lambda dev: a(dev).nonzero())
    if nd >= 1 and t.shape[0] > 0:
        rows = [rng.randrange(t.shape[0]) for _ in range(rng.randrange(1, 4))]
        add("a[list]", lambda dev: a(dev)[rows])
    # matmul
    if nd in (1, 2):
        add("a @ a.mT", lambda dev: a(dev) @ a(dev).mT, 2)
    if nd == 3:
        add("bmm", lambda dev: torch.bmm(a(dev), a(dev).transpose(1, 2)))
    # in place (through views: writes must reach the bases)
    add("add_", lambda dev: a(dev).add_(_resolve(o, pool, dev)), 2)
    add("mul_(2)", lambda dev: a(dev).mul_(2))
    add("clamp_", lambda dev: a(dev).clamp_(-1, 1))
    add("fill_", lambda dev: a(dev).fill_(rng_value))
    add("zero_", lambda dev: a(dev).zero_())
    add("copy_", lambda dev: a(dev).copy_(_resolve(o, pool, dev)), 2)
    add("masked_fill_", lambda dev: a(dev).masked_fill_(a(dev) > 0, rng_value))
    add("relu_", lambda dev: a(dev).relu_())
    if d is not None:
        add("index_fill_", lambda dev: a(dev).index_fill_(
            d, torch.tensor([0], device=a(dev).device), rng_value))
        add("index_add_", lambda dev: a(dev).index_add_(
            d, torch.zeros(t.shape[d], dtype=torch.long, device=a(dev).device), a(dev)))
        add("scatter_add_", lambda dev: a(dev).scatter_add_(
            d, torch.zeros_like(a(dev), dtype=torch.long), a(dev)))
    # out= (sometimes the input itself, or a view of it: overlap checks)
    add("mul(out=a)", lambda dev: torch.mul(a(dev), 2, out=a(dev)))
    add("atan2(out=a)", lambda dev: torch.atan2(a(dev), _resolve(o, pool, dev), out=a(dev)))
    if d is not None and t.shape[d] > 1:
        add("add(out=shifted)", lambda dev: torch.add(
            a(dev).narrow(d, 0, t.shape[d] - 1), 1,
            out=a(dev).narrow(d, 1, t.shape[d] - 1)))
    # less frequent ops (the generic stream kernel)
    add("nan_to_num", lambda dev: torch.nan_to_num(a(dev)))
    add("hardtanh", lambda dev: torch.nn.functional.hardtanh(a(dev)))
    if d is not None:
        add("logsumexp(d)", lambda dev: a(dev).logsumexp(d))
        add("cumprod(d)", lambda dev: a(dev).cumprod(d))
        add("index_put_ acc", lambda dev: a(dev).index_put_(
            (torch.zeros(2, dtype=torch.long, device=a(dev).device),), a(dev)[:1].sum(0)
            if t.shape[0] else a(dev).sum(0), accumulate=True) if nd else a(dev))
    if nd >= 1 and t.shape[0] > 0:
        add("a[0] = b", lambda dev: a(dev).__setitem__(0, _resolve(o, pool, dev)))
    rng_value = rng.choice((1, -2.5, True, 0, 1000))
    name, fn = rng.choice(choices)
    return f"{name}(#{i}" + (f", {o}" if "o" in fn.__code__.co_freevars else "") + ")", fn


# ---------------------------------------------------------------- comparison

def _flatten(r):
    if isinstance(r, torch.Tensor):
        return [r]
    if isinstance(r, (tuple, list)):
        return [x for e in r for x in _flatten(e)]
    return []


def _compare(cpu, axon, what):
    assert axon.device.type == "axon", f"{what}: result on {axon.device}"
    assert cpu.dtype == axon.dtype, f"{what}: dtype {axon.dtype}, CPU {cpu.dtype}"
    assert cpu.shape == axon.shape, f"{what}: shape {list(axon.shape)}, CPU {list(cpu.shape)}"
    got = axon.cpu()
    if cpu.dtype in FLOATS:
        torch.testing.assert_close(got.float(), cpu.float(), equal_nan=True,
                                   **tol(cpu.dtype, accum=True), msg=lambda m: f"{what}: {m}")
    else:
        assert torch.equal(got, cpu), f"{what}: values differ\naxon {got}\ncpu  {cpu}"


def _normalise(message: str) -> str:
    # Tensor::toString() names a PrivateUse1 tensor's type "axonLongType"
    # where a CPU one is "torch.LongTensor" (upstream formatting).
    message = re.sub(r"torch\.(\w+)Tensor\b", r"axon\1Type", message)
    return re.sub(r"\bCPU(\w+)Type\b", r"axon\1Type", message)


def run_program(seed: int) -> list[str]:
    """Runs program `seed`; returns its log (raises AssertionError on a mismatch)."""
    rng = random.Random(seed)
    pool, log = [], []
    for _ in range(rng.randrange(1, 4)):
        c, x, desc = make_input(rng)
        pool.append((c, x))
        log.append(f"input #{len(pool) - 1}: {desc}")
    for step in range(rng.randrange(3, 8)):
        # Floating results agree within a tolerance (fused kernels round
        # differently); a discontinuous op (floor, comparisons, argmax) would
        # magnify that, so the CPU continues from axon's values.
        for c, x in pool:
            if c.dtype in FLOATS and c.numel():
                xc = x.cpu()
                if not torch.equal(c, xc):
                    try:
                        c.copy_(xc)
                    except RuntimeError:
                        pass  # expanded: read-only
        desc, fn = build_op(rng, pool)
        log.append(f"step {step}: {desc}")
        errors = {}
        results = {}
        for dev in ("cpu", "axon"):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                try:
                    results[dev] = fn(dev)
                except Exception as e:  # noqa: BLE001 - compared below
                    errors[dev] = e
        try:
            torch.axon.synchronize()
        except Exception as e:  # noqa: BLE001
            # Allowed only for what depends on device data (an integer
            # division by zero, an index out of range), which the CPU raises.
            c = errors.get("cpu")
            if c is None or "axon" in errors or str(c).splitlines()[0] not in str(e):
                raise AssertionError(f"{desc}: error deferred past the call: {e}\n"
                                     + "\n".join(log)) from None
            log.append("  (data-dependent error, deferred as allowed)")
            return log
        if errors or len(results) != 2:
            c, x = errors.get("cpu"), errors.get("axon")
            def line(e):
                return f"{type(e).__name__}: {_normalise(str(e).splitlines()[0] if str(e) else '')}"
            assert c is not None and x is not None, \
                f"{desc}: CPU {line(c) if c else 'ok'}, axon {line(x) if x else 'ok'}\n" + "\n".join(log)
            assert type(c) is type(x) and line(c) == line(x), \
                f"{desc}: CPU {line(c)}, axon {line(x)}\n" + "\n".join(log)
            continue
        rc, rx = _flatten(results["cpu"]), _flatten(results["axon"])
        assert len(rc) == len(rx), f"{desc}: {len(rx)} results, CPU {len(rc)}"
        try:
            for k, (c, x) in enumerate(zip(rc, rx)):
                _compare(c, x, f"{desc} result {k}")
            for k, (c, x) in enumerate(pool):
                _compare(c, x, f"{desc}: live tensor #{k}")
        except AssertionError as e:
            raise AssertionError(f"{e}\n" + "\n".join(log)) from None
        for c, x in zip(rc, rx):
            if len(pool) < 8:
                pool.append((c, x))
                log.append(f"  -> #{len(pool) - 1}: {c.dtype} {list(c.shape)} strides {c.stride()}")
    return log


def test_fuzz_axon_matches_cpu():
    seconds = float(os.environ.get("AXON_FUZZ_SECONDS", "20"))
    first = int(os.environ.get("AXON_FUZZ_SEED", "0"))
    # `make test`: seeds 0..2999 (or 20 s, whichever comes first), the same
    # programs on every machine fast enough; `make fuzz` lifts both bounds.
    limit = int(os.environ.get("AXON_FUZZ_PROGRAMS", "3000"))
    deadline = time.monotonic() + seconds
    failures, ran = [], 0
    seed = first
    while time.monotonic() < deadline and ran < limit:
        try:
            run_program(seed)
        except AssertionError as e:
            failures.append(f"seed {seed}: {e}")
        ran += 1
        seed += 1
    print(f"fuzz: {ran} programs (seeds {first}..{seed - 1}), {len(failures)} mismatches")
    assert ran >= min(limit, 50), f"only {ran} programs ran in {seconds} s"
    assert not failures, "\n\n".join(failures[:5])
