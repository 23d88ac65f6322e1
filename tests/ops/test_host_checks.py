"""Errors the host can see are raised at the call, every time (issue 15, items 4 and 5c).

An op on axon runs as stream work: the host checks the arguments and enqueues
the CPU kernel.  Only what depends on the data in device memory (an index value
out of range, as CUDA's device-side asserts) may surface later, at a
synchronising call.  Everything else -- shapes, dtypes, Scalar kinds and values,
broadcasting, overlap between arguments -- is raised at the call with the CPU's
exception type and message, also when the same op ran before with valid
arguments (until 2026-12 only the first launch of each dtype combination was
checked by the CPU kernel; later ones deferred the CPU kernel's errors to
whatever op ran next, as RuntimeError).  Kernel warnings reach Python's
`warnings` once per call, as on the CPU, never stderr.
"""

from __future__ import annotations

import re
import warnings

import pytest
import torch
import torch.nn.functional as F

from conftest import run_python

pytestmark = pytest.mark.usefixtures("quick_op_samples")  # conftest: the samples, faster


def _first_line(e: BaseException) -> str:
    return str(e).splitlines()[0] if str(e) else ""


# Each case: (id, setup(device) -> state dict, valid(state), invalid(state)).
# `valid` runs twice first (so its launch signature is known and later calls of
# it are asynchronous), then `invalid` must raise at the call.
def _tensors(d, **kw):
    return {k: v(d) if callable(v) else v for k, v in kw.items()}


CASES = [
    # ---- structured ops (meta function on the host; functional, out=, in-place)
    ("index.Tensor shape mismatch",
     lambda d: _tensors(d, a=lambda d: torch.arange(9.0, device=d).view(3, 3)),
     lambda s: s["a"][[0, 1], [0, 1]],
     lambda s: s["a"][[0, 1], [0, 1, 2]]),
    ("add.out not broadcastable",
     lambda d: _tensors(d, a=lambda d: torch.ones(4, device=d), b=lambda d: torch.ones(4, device=d),
                        c=lambda d: torch.ones(5, device=d), o=lambda d: torch.zeros(4, device=d)),
     lambda s: torch.add(s["a"], s["b"], out=s["o"]),
     lambda s: torch.add(s["a"], s["c"], out=s["o"])),
    ("add_ partial overlap",
     lambda d: _tensors(d, x=lambda d: torch.arange(6.0, device=d), y=lambda d: torch.ones(5, device=d)),
     lambda s: s["x"][1:].add_(s["y"]),
     lambda s: s["x"][1:].add_(s["x"][:-1])),
    ("mul.out into an expanded tensor",
     lambda d: _tensors(d, a=lambda d: torch.ones(3, device=d), o=lambda d: torch.zeros(3, device=d),
                        e=lambda d: torch.zeros(1, device=d)),
     lambda s: torch.mul(s["a"], 2, out=s["o"]),
     lambda s: torch.mul(s["a"], 2, out=s["e"].expand(3))),
    ("bitwise_and of floats",
     lambda d: _tensors(d, i=lambda d: torch.arange(4, device=d), f=lambda d: torch.ones(4, device=d)),
     lambda s: s["i"] & s["i"],
     lambda s: s["f"] & s["f"]),
    # ---- the generic stream kernel (Meta kernel on meta stand-ins)
    ("index_put_ indices not broadcastable (IndexError)",
     lambda d: _tensors(d, a=lambda d: torch.zeros(3, 3, device=d)),
     lambda s: s["a"].__setitem__(([0, 1], [0, 1]), 1.0),
     lambda s: s["a"].__setitem__(([0, 1], [0, 1, 2]), 0.0)),
    ("index_put_ bool mask, value not broadcastable",
     lambda d: _tensors(d, x=lambda d: torch.zeros(4, device=d),
                        m=lambda d: torch.tensor([True, False, True, False], device=d),
                        v2=lambda d: torch.tensor([1.0, 2.0], device=d),
                        v3=lambda d: torch.tensor([1.0, 2.0, 3.0], device=d)),
     lambda s: s["x"].__setitem__(s["m"], s["v2"]),
     lambda s: s["x"].__setitem__(s["m"], s["v3"])),
    ("index_put_ scalar through a uint8 mask (the CPU's masked_fill_ error)",
     lambda d: _tensors(d, x=lambda d: torch.zeros(4, device=d),
                        mb=lambda d: torch.tensor([True, False, True, False], device=d),
                        mu=lambda d: torch.tensor([1, 0, 1, 0], dtype=torch.uint8, device=d)),
     lambda s: s["x"].__setitem__(s["mb"], 5.0),
     lambda s: s["x"].__setitem__(s["mu"], 5.0)),
    ("index_fill_ complex value on a real tensor",
     lambda d: _tensors(d, x=lambda d: torch.zeros(3, 4, device=d), i=lambda d: torch.tensor([0, 2], device=d)),
     lambda s: s["x"].index_fill_(1, s["i"], 1.0),
     lambda s: s["x"].index_fill_(1, s["i"], 1 + 1j)),
    ("atan2.out partial overlap",
     lambda d: _tensors(d, x=lambda d: torch.linspace(1, 2, 6, device=d), y=lambda d: torch.ones(5, device=d),
                        o=lambda d: torch.zeros(5, device=d)),
     lambda s: torch.atan2(s["y"], s["y"], out=s["o"]),
     lambda s: torch.atan2(s["x"][:-1], s["y"], out=s["x"][1:])),
    ("kthvalue out= is the input",
     lambda d: _tensors(d, t=lambda d: torch.arange(10.0, device=d), i=lambda d: torch.zeros((), dtype=torch.long, device=d),
                        v=lambda d: torch.zeros((), device=d)),
     lambda s: torch.kthvalue(s["t"], 5, out=(s["v"], s["i"])),
     lambda s: torch.kthvalue(s["t"], 5, out=(s["t"], s["i"]))),
    ("conv2d negative padding (the CPU's message, not the Meta kernel's)",
     lambda d: _tensors(d, x=lambda d: torch.ones(1, 2, 5, 5, device=d), w=lambda d: torch.ones(3, 2, 3, 3, device=d)),
     lambda s: F.conv2d(s["x"], s["w"], padding=1),
     lambda s: F.conv2d(s["x"], s["w"], padding=-1)),
    # ---- native ops with hand-written checks
    ("fill_ value overflows int8",
     lambda d: _tensors(d, x=lambda d: torch.zeros(4, dtype=torch.int8, device=d)),
     lambda s: s["x"].fill_(1),
     lambda s: s["x"].fill_(1000)),
    ("masked_fill_ value overflows int8",
     lambda d: _tensors(d, x=lambda d: torch.zeros(4, dtype=torch.int8, device=d),
                        m=lambda d: torch.tensor([True, False, True, False], device=d)),
     lambda s: s["x"].masked_fill_(s["m"], 1),
     lambda s: s["x"].masked_fill_(s["m"], 1000)),
    ("masked_fill_ complex value on a real tensor",
     lambda d: _tensors(d, x=lambda d: torch.zeros(4, device=d),
                        m=lambda d: torch.tensor([True, False, True, False], device=d)),
     lambda s: s["x"].masked_fill_(s["m"], 2.0),
     lambda s: s["x"].masked_fill_(s["m"], 2 + 1j)),
    ("where.out partial overlap",
     lambda d: _tensors(d, x=lambda d: torch.arange(6.0, device=d), y=lambda d: torch.ones(5, device=d),
                        c=lambda d: torch.tensor([True, False] * 2 + [True], device=d),
                        o=lambda d: torch.zeros(5, device=d)),
     lambda s: torch.where(s["c"], s["y"], s["y"], out=s["o"]),
     lambda s: torch.where(s["c"], s["x"][:-1], s["y"], out=s["x"][1:])),
    ("where.out of the wrong dtype",
     lambda d: _tensors(d, y=lambda d: torch.ones(5, device=d), c=lambda d: torch.ones(5, dtype=torch.bool, device=d),
                        o=lambda d: torch.zeros(5, device=d), oi=lambda d: torch.zeros(5, dtype=torch.long, device=d)),
     lambda s: torch.where(s["c"], s["y"], s["y"], out=s["o"]),
     lambda s: torch.where(s["c"], s["y"], s["y"], out=s["oi"])),
    ("index_select.out overlapping the input",
     lambda d: _tensors(d, x=lambda d: torch.arange(6.0, device=d), i=lambda d: torch.tensor([0, 1], device=d),
                        o=lambda d: torch.zeros(2, device=d)),
     lambda s: torch.index_select(s["x"], 0, s["i"], out=s["o"]),
     lambda s: torch.index_select(s["x"], 0, s["i"], out=s["x"][:2])),
    ("index_select 2-d index (IndexError)",
     lambda d: _tensors(d, x=lambda d: torch.arange(6.0, device=d), i=lambda d: torch.tensor([0, 1], device=d)),
     lambda s: s["x"].index_select(0, s["i"]),
     lambda s: s["x"].index_select(0, s["i"].view(2, 1))),
    ("relu_ of an expanded tensor",
     lambda d: _tensors(d, x=lambda d: torch.ones(3, device=d), e=lambda d: torch.ones(1, device=d)),
     lambda s: s["x"].relu_(),
     lambda s: s["e"].expand(3).relu_()),
    # ---- copy_ (item 5c)
    ("copy_ overlapping (same dtype)",
     lambda d: _tensors(d, x=lambda d: torch.arange(6.0, device=d), y=lambda d: torch.ones(5, device=d)),
     lambda s: s["x"][1:].copy_(s["y"]),
     lambda s: s["x"][1:].copy_(s["x"][:-1])),
    ("copy_ overlapping through a view of another dtype",
     lambda d: _tensors(d, x=lambda d: torch.arange(6.0, device=d), y=lambda d: torch.ones(5, device=d)),
     lambda s: s["x"].view(torch.int32)[1:].copy_(s["y"]),
     lambda s: s["x"].view(torch.int32)[1:].copy_(s["x"][:-1])),
    ("copy_ into an expanded tensor",
     lambda d: _tensors(d, x=lambda d: torch.ones(3, device=d), e=lambda d: torch.zeros(1, device=d)),
     lambda s: s["x"].copy_(torch.arange(3.0, device=s["x"].device)),
     lambda s: s["e"].expand(3).copy_(s["x"])),
    # ---- out= aliasing that meta functions do not check (the CPU kernel does):
    # a new aliasing class is a new launch signature, checked at the call
    ("cumsum.out overlapping the input",
     lambda d: _tensors(d, a=lambda d: torch.arange(8.0, device=d), o=lambda d: torch.zeros(4, device=d)),
     lambda s: torch.cumsum(s["a"][:4], 0, out=s["o"]),
     lambda s: torch.cumsum(s["a"][:4], 0, out=s["a"][2:6])),
    # interleaved views of one storage are "too hard" for ATen (allowed), dense
    # overlapping ones "partial" (refused): different signatures
    ("cumsum.out interleaved, then overlapping the input",
     lambda d: _tensors(d, a=lambda d: torch.arange(8.0, device=d)),
     lambda s: torch.cumsum(s["a"][0::2], 0, out=s["a"][1::2]),
     lambda s: torch.cumsum(s["a"][:4], 0, out=s["a"][2:6])),
    ("sort.out values overlapping the input",
     lambda d: _tensors(d, a=lambda d: torch.arange(8.0, device=d).flip(0), o=lambda d: torch.zeros(4, device=d),
                        i=lambda d: torch.zeros(4, dtype=torch.long, device=d)),
     lambda s: torch.sort(s["a"][:4], out=(s["o"], s["i"])),
     lambda s: torch.sort(s["a"][:4], out=(s["a"][2:6], s["i"]))),
    ("topk.out values overlapping the input",
     lambda d: _tensors(d, a=lambda d: torch.arange(8.0, device=d), o=lambda d: torch.zeros(2, device=d),
                        i=lambda d: torch.zeros(2, dtype=torch.long, device=d)),
     lambda s: torch.topk(s["a"][:4], 2, out=(s["o"], s["i"])),
     lambda s: torch.topk(s["a"][:4], 2, out=(s["a"][3:5], s["i"]))),
    # (the CPU writes a sum into it before its division refuses it: not compared)
    ("mean.out into an expanded tensor",
     lambda d: _tensors(d, a=lambda d: torch.arange(8.0, device=d), o=lambda d: torch.zeros(4, device=d)),
     lambda s: torch.mean(s["a"].view(4, 2), 1, out=s["o"]),
     lambda s: torch.mean(s["a"].view(4, 2), 1,
                          out=torch.zeros(1, device=s["a"].device).expand(4))),
    ("mm.out into an expanded tensor",
     lambda d: _tensors(d, a=lambda d: torch.ones(3, 2, device=d), b=lambda d: torch.ones(2, 3, device=d),
                        o=lambda d: torch.zeros(3, 3, device=d), e=lambda d: torch.zeros(1, 3, device=d)),
     lambda s: torch.mm(s["a"], s["b"], out=s["o"]),
     lambda s: torch.mm(s["a"], s["b"], out=s["e"].expand(3, 3))),
    ("addmm.out into an expanded tensor",
     lambda d: _tensors(d, a=lambda d: torch.ones(3, 2, device=d), b=lambda d: torch.ones(2, 3, device=d),
                        c=lambda d: torch.ones(3, device=d), o=lambda d: torch.zeros(3, 3, device=d),
                        e=lambda d: torch.zeros(3, 1, device=d)),
     lambda s: torch.addmm(s["c"], s["a"], s["b"], out=s["o"]),
     lambda s: torch.addmm(s["c"], s["a"], s["b"], out=s["e"].expand(3, 3))),
    # ---- fused kernels
    ("layer_norm weight of the wrong shape",
     lambda d: _tensors(d, x=lambda d: torch.ones(2, 4, device=d), w4=lambda d: torch.ones(4, device=d),
                        w5=lambda d: torch.ones(5, device=d)),
     lambda s: F.layer_norm(s["x"], (4,), s["w4"]),
     lambda s: F.layer_norm(s["x"], (4,), s["w5"])),
]


def _run(device, case):
    _, setup, valid, invalid = case
    state = setup(device)
    valid(state)
    valid(state)
    try:
        invalid(state)
    except Exception as e:  # noqa: BLE001 - the exception is the result
        return e, state
    return None, state


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_second_call_invalid_raises_at_the_call(case):
    expected, cpu_state = _run("cpu", case)
    assert expected is not None, "the case is valid on the CPU: fix the test"
    got, axon_state = _run("axon", case)
    assert got is not None, f"no error at the call (CPU: {type(expected).__name__}: {expected})"
    assert type(got) is type(expected), (type(got), got, type(expected), expected)
    assert _first_line(got) == _first_line(expected)
    torch.axon.synchronize()  # nothing was deferred
    for k, v in cpu_state.items():
        if isinstance(v, torch.Tensor):
            torch.testing.assert_close(axon_state[k].cpu(), v, equal_nan=True, msg=k)


@pytest.mark.parametrize("op", ["_softmax", "_log_softmax", "_softmax_backward_data",
                                "_log_softmax_backward_data"])
def test_softmax_out_into_an_expanded_tensor_is_refused(op):
    """The CPU's softmax out= kernels do not check that their out= has one element per
    location: into an expanded tensor they write past its storage (on the CPU the heap
    is corrupted and the process aborts, so there is nothing to compare with).  On axon
    the call raises TensorIterator's error and no other tensor changes."""
    a = torch.randn(64, 64, device="axon")
    before = torch.randn(64, device="axon")
    out = torch.zeros(1, 64, device="axon")
    after = torch.randn(64, device="axon")
    snapshot = [t.cpu() for t in (a, before, after)]
    fn = getattr(torch.ops.aten, op).out
    forward = op in ("_softmax", "_log_softmax")
    args = (a, 1, False) if forward else (a, a, 1, torch.float32)
    name = "grad_input" if op == "_softmax_backward_data" else "out"
    fn(*args, **{name: torch.zeros(64, 64, device="axon")})  # valid, known signature
    with pytest.raises(RuntimeError, match="more than one element of the written-to tensor"):
        fn(*args, **{name: out.expand(64, 64)})
    torch.axon.synchronize()
    for t, s in zip((a, before, after), snapshot):
        assert torch.equal(t.cpu(), s)
    assert torch.equal(out.cpu(), torch.zeros(1, 64))


@pytest.mark.parametrize("op", ["_softmax", "_log_softmax", "_softmax_backward_data",
                                "_log_softmax_backward_data"])
@pytest.mark.parametrize("layout", ["transposed", "sliced", "as_strided"])
def test_softmax_out_of_another_layout_gets_the_values(op, layout):
    """Softmax's CPU out= kernels write as if their out= were contiguous (wrong places;
    past the storage of a non-dense one).  On axon such an out= gets the functional
    result where it says (and no other tensor changes), in every dtype."""
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        x = torch.randn(16, 16, dtype=dtype)
        forward = op in ("_softmax", "_log_softmax")
        args = (lambda t: (t, 1, False)) if forward else (lambda t: (t, t, 1, dtype))
        name = "grad_input" if op == "_softmax_backward_data" else "out"
        expected = getattr(torch.ops.aten, op)(*args(x))
        big = torch.zeros(16, 40, dtype=dtype, device="axon")
        guard = torch.randn(64, dtype=dtype, device="axon")
        snapshot = guard.cpu()
        out = {"transposed": torch.zeros(16, 16, dtype=dtype, device="axon").t(),
               "sliced": big[:, :16],
               "as_strided": torch.zeros(31, dtype=dtype, device="axon").as_strided(
                   (16, 16), (1, 1))}[layout]
        getattr(torch.ops.aten, op).out(*args(x.to("axon")), **{name: out})
        if layout == "as_strided":  # overlapping: only that it stays inside its storage
            torch.axon.synchronize()
        else:
            assert torch.equal(out.cpu(), expected), (dtype, layout)
        assert torch.equal(guard.cpu(), snapshot)
        assert torch.equal(big[:, 16:].cpu(), torch.zeros(16, 24, dtype=dtype))


def test_data_dependent_errors_may_be_deferred():
    # An index value out of range depends on device memory: it may surface at
    # the next synchronising call (as CUDA's device-side asserts), but it must
    # surface.  The first launch of the signature is checked at the call.
    x = torch.arange(4.0, device="axon")
    good = torch.tensor([0, 1], device="axon")
    bad = torch.tensor([0, 7], device="axon")
    x.index_select(0, good)
    x.index_select(0, good)
    try:
        x.index_select(0, bad)
        torch.axon.synchronize()
    except (IndexError, RuntimeError) as e:
        assert "out of range" in str(e) or "index" in str(e).lower()
    else:
        pytest.fail("an out-of-range index was never reported")
    torch.axon.synchronize()


def _checked():
    return torch.ops.axon._checked_launches()


def test_changing_scalars_and_shapes_stay_asynchronous():
    # The price of checking at every call must not be synchronising every
    # call: once a launch signature ran (synchronously, checked by the CPU
    # kernel), the same op with a learning rate that changes every step
    # (structured ops: only the range class of a Scalar counts), new arange
    # bounds, or new values of the same shapes launches asynchronously.
    x = torch.randn(64, device="axon")
    y = torch.randn(64, device="axon")
    m = x > 0
    steps = [lambda i: x.add_(y, alpha=0.001 * (i + 1)),
             lambda i: torch.mul(x, 1.0 + i, out=y),
             lambda i: x.masked_fill(m, -1e9),
             lambda i: torch.where(m, x, y),
             lambda i: x.to(torch.bfloat16),
             lambda i: x.view(8, 8).t().contiguous(),
             lambda i: x.index_select(0, m.nonzero().flatten()[:3]),
             lambda i: torch.arange(i, 100, device="axon"),
             lambda i: x.clone().fill_(0.5 + i),
             lambda i: torch.flip(x, (0,)),
             lambda i: torch.atan2(x, y)]
    for f in steps:
        f(0)  # (arange's start: zero and nonzero are two range classes)
        f(1)
    torch.axon.synchronize()
    before = _checked()
    for i in range(2, 7):
        for f in steps:
            f(i)
    torch.axon.synchronize()
    assert _checked() == before


def test_new_signatures_are_checked_once():
    # A Meta kernel on meta stand-ins does not see aliasing, so the generic
    # stream kernel's signature holds shapes, strides and overlap: each new
    # one runs checked once, then never again. Signatures are kept per process:
    # a geometry no other test gives atan2 (tests/ops/test_elementwise.py's are 4 x 6).
    x = torch.randn(29, 31, device="axon")
    a, b = x + 1, x - 1
    before = _checked()
    torch.atan2(x, x)
    assert _checked() == before + 1
    torch.atan2(x, x)
    torch.atan2(a, a)                    # other memory, same geometry: the same signature
    assert _checked() == before + 1
    torch.atan2(a, b)                    # two storages, not one: another signature
    assert _checked() == before + 2
    torch.atan2(x.t(), x.t())            # new strides
    assert _checked() == before + 3
    torch.axon.synchronize()


# ---------------------------------------------------------------- warnings

_WARN_SCRIPT = """
    import warnings, torch
    def count(device, f, calls=3):
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            for _ in range(calls):
                f(device)
            if device == "axon":
                torch.axon.synchronize()
        return len(w), sorted({str(m.message).splitlines()[0][:60] for m in w})
    def index_uint8(d):
        x = torch.arange(4.0, device=d)
        x[torch.tensor([1, 0, 1, 0], dtype=torch.uint8, device=d)]
    def index_put_uint8(d):
        x = torch.arange(4.0, device=d)
        x[torch.tensor([1, 0, 1, 0], dtype=torch.uint8, device=d)] = torch.tensor([5.0, 6.0], device=d)
    def masked_fill_expanded(d):
        x = torch.zeros(1, device=d).expand(3)
        x.masked_fill_(torch.tensor([True, False, True], device=d), 1.0)
    for f in (index_uint8, index_put_uint8, masked_fill_expanded):
        print(f.__name__, count("cpu", f) == count("axon", f), count("cpu", f), count("axon", f))
"""


def test_kernel_warnings_reach_python_once_per_call():
    r = run_python(_WARN_SCRIPT)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.strip().splitlines()
    assert len(lines) == 3, r.stdout
    for line in lines:
        assert " True " in line, line
        assert "(0, [])" not in line.split(" True ")[1], line  # the case does warn
    # Nothing printed by C++ from a stream worker.
    assert "Warning:" not in r.stderr, r.stderr


# ---------------------------------------------------------------- OpInfo error_inputs

def test_opinfo_error_inputs_raise_at_the_call_twice():
    """Every op_db error input the CPU rejects as declared: axon raises the same
    exception type and message (the OpInfo's regex) at the call, twice in a row,
    and nothing is left pending for the next synchronising call."""
    from torch.testing._internal.common_methods_invocations import op_db

    failures, checked = [], 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for op in op_db:
            if op.error_inputs_func is None:
                continue
            try:
                cpu_inputs = list(op.error_inputs("cpu"))
                axon_inputs = list(op.error_inputs("axon"))
            except Exception:  # noqa: BLE001 - generators that need another device
                continue
            for ce, ae in zip(cpu_inputs, axon_inputs):
                si = ce.sample_input
                try:
                    op(si.input, *si.args, **si.kwargs)
                    continue  # accepted on the CPU: not an error input here
                except Exception as e:  # noqa: BLE001
                    if not (isinstance(e, ce.error_type) and re.search(ce.error_regex, str(e))):
                        continue
                checked += 1
                si = ae.sample_input
                for attempt in range(2):
                    try:
                        op(si.input, *si.args, **si.kwargs)
                        got = None
                    except Exception as e:  # noqa: BLE001
                        got = e
                    try:
                        torch.axon.synchronize()
                        late = None
                    except Exception as e:  # noqa: BLE001
                        late = e
                    if (got is None or not isinstance(got, ae.error_type)
                            or not re.search(ae.error_regex, str(got)) or late is not None):
                        failures.append((op.name, attempt, type(got).__name__,
                                         str(got)[:100], str(late)[:100] if late else None))
    assert checked > 300, checked
    assert not failures, failures
