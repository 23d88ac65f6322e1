"""Helpers shared by the op tests (tests/ops/): the same computation on axon
and on the CPU, compared at conftest's tolerances (tol(dtype) for elementwise
results, tol(dtype, accum=True) for anything that sums).

- compare(fn, cpu_args, axon_args): results, errors and warnings alike;
- fwd_bwd / compare_fwd_bwd: forward and backward of a fixed upstream gradient;
- cpu_and_axon_raise_alike: an error raised at the call, even with the stream busy;
- stream_op_test, stream_op_zero_size_test, nn_functional_test,
  shape_ops_test, shape_ops_int_bool_test: the parametrized tests the family
  files make of their STREAM_OPS, NN and SHAPE tables;
- to_device / on_device / tensors: OpInfo samples moved to axon with their layout.

Imported as ``op_util`` by the files of tests/ops/ (pytest puts a test file's
folder on sys.path); fixtures live in tests/conftest.py.
"""

from __future__ import annotations

import re
import warnings

import pytest
import torch
from torch.utils._pytree import tree_leaves, tree_map

from conftest import FLOAT_DTYPES, INT_DTYPES, LAYOUTS, assert_same, layout_pair, make, tol


ALL_DTYPES = FLOAT_DTYPES + INT_DTYPES + (torch.bool,)

Z = 6.0  # standard errors allowed in statistical checks
sleep_on_stream = torch.axon._C._test_sleep_on_stream  # (device index, milliseconds)


# ---------------------------------------------------------------- comparison with the CPU

def _messages(ws):
    return {str(w.message).splitlines()[0] for w in ws}


def compare(fn, cpu_args, ax_args, accum=False, **kw):
    """fn on axon equals fn on the CPU; if the CPU raises, axon raises the same
    type; axon emits no warning the CPU does not."""
    with warnings.catch_warnings(record=True) as wc:
        warnings.simplefilter("always")
        try:
            expected = fn(*cpu_args)
        except Exception as e:  # noqa: BLE001 - any error the CPU gives, axon must give too
            with pytest.raises(type(e)):
                fn(*ax_args)
            return None
    with warnings.catch_warnings(record=True) as wa:
        warnings.simplefilter("always")
        actual = fn(*ax_args)
    extra = _messages(wa) - _messages(wc)
    assert not extra, f"warnings on axon only: {extra}"
    if isinstance(expected, (bool, int, float)):
        assert type(actual) is type(expected)
        if isinstance(expected, float):
            t = kw.get("dtype_tol", tol(torch.float32))
            assert actual == pytest.approx(expected, rel=t["rtol"], abs=t["atol"])
        else:
            assert actual == expected
    else:
        assert_same(actual, expected, accum=accum)
    return expected


def leaf(t: torch.Tensor, device, grad=True) -> torch.Tensor:
    """A fresh leaf copy of t on device."""
    return t.detach().to(device).requires_grad_(grad)


def upstream_grad(shape, dtype, layout, device, seed=99):
    """A fixed gradient for an output of shape: contiguous, non-contiguous
    (a permuted contiguous tensor) or expanded (stride 0 in the last dim)."""
    if layout == "contiguous":
        return make(shape, dtype, -1, 1, seed=seed).to(device)
    if layout == "permuted":
        perm = list(reversed(range(len(shape))))
        return make([shape[i] for i in perm], dtype, -1, 1, seed=seed).to(device).permute(perm)
    if layout == "expanded":
        return make(tuple(shape[:-1]) + (1,), dtype, -1, 1, seed=seed).to(device).expand(shape)
    raise ValueError(layout)


def fwd_bwd(fn, inputs, device="cpu", n_grad=None, grad_layout="contiguous"):
    """fn(*inputs) on device, then backward of a fixed upstream gradient;
    returns (output, [grads of the floating inputs among the first n_grad],
    output.grad_fn name)."""
    n_grad = len(inputs) if n_grad is None else n_grad
    xs = [leaf(t, device, t.is_floating_point() and i < n_grad)
          if isinstance(t, torch.Tensor) else t for i, t in enumerate(inputs)]
    out = fn(*xs)
    name = out.grad_fn.name() if out.grad_fn is not None else None
    out.backward(upstream_grad(out.shape, out.dtype, grad_layout, device))
    grads = [x.grad for x in xs if isinstance(x, torch.Tensor) and x.requires_grad]
    return out.detach(), grads, name


def compare_fwd_bwd(fn, inputs, dtype, accum=True, n_grad=None, grad_layout="contiguous", **kw):
    """fn forward and backward on axon match the CPU; returns the axon grad_fn
    name of the output."""
    out_c, grads_c, _ = fwd_bwd(fn, inputs, "cpu", n_grad, grad_layout)
    out_a, grads_a, name = fwd_bwd(fn, inputs, "axon", n_grad, grad_layout)
    assert_same(out_a, out_c, dtype=dtype, accum=accum, **kw)
    assert len(grads_a) == len(grads_c)
    for ga, gc in zip(grads_a, grads_c):
        assert ga is not None and ga.shape == gc.shape and ga.dtype == gc.dtype
        assert_same(ga, gc, dtype=dtype, accum=accum, **kw)
    return name


def cpu_and_axon_raise_alike(fn, cpu_args, stream_busy=True, same_message=True):
    """fn raises the same exception type (and first message line) on axon as on
    the CPU, at the call, even while the axon stream is busy."""
    with pytest.raises(Exception) as cpu_err:  # noqa: PT011 - the CPU's error defines it
        fn(*cpu_args)
    ax_args = [a.axon() if isinstance(a, torch.Tensor) else a for a in cpu_args]
    torch.axon.synchronize()
    if stream_busy:
        sleep_on_stream(0, 150)
    match = re.escape(str(cpu_err.value).splitlines()[0]) if same_message else None
    with pytest.raises(cpu_err.type, match=match):
        fn(*ax_args)
    # the device keeps working after the error
    assert (torch.ones(2, device="axon") * 3).sum().item() == 6


def tiny_mlp(dtype):
    """A small seeded MLP (Linear, GELU, LayerNorm, Tanh) in dtype."""
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.GELU(), torch.nn.LayerNorm(16),
                               torch.nn.Linear(16, 8), torch.nn.Tanh(),
                               torch.nn.Linear(8, 3)).to(dtype)


# ---------------------------------------------------------------- the families' STREAM_OPS tables

def inputs(shapes, rng, dtype, strided, device):
    """The inputs on device; strided: every one a view of every other element
    of a wider tensor made on the device (the same values on both devices)."""
    low, high = rng or (-3.0, 3.0)
    out = []
    for i, shape in enumerate(shapes):
        if strided:
            wide = shape[:-1] + (2 * shape[-1],)
            out.append(make(wide, dtype, low, high, seed=10 + i).to(device)[..., ::2])
        else:
            out.append(make(shape, dtype, low, high, seed=10 + i).to(device))
    return out


def floats(x):
    return [t for t in (x if isinstance(x, (tuple, list)) else [x])
            if isinstance(t, torch.Tensor) and t.is_floating_point()]


POSITIVE = (0.2, 3.0)  # value range of strictly positive inputs in the STREAM_OPS tables


def check_stream_op(entry, dtype, strided):
    """An entry of a family's STREAM_OPS table, (function of the inputs, input
    shapes, value range, differentiable), runs as stream work (no fallback),
    equal to the CPU, contiguous or on a non-contiguous input; where the CPU has
    no kernel for dtype, axon raises too. Differentiable ones are checked
    backward as well.

    (These ops came from an OpInfo sweep of the fallback on 2026-11-30: every op
    of PyTorch's op_db on its first sample inputs against the CPU, now
    test_opinfo.py. What it left in the fallback is linear algebra (LAPACK
    errors stay synchronous), data-dependent shapes (unique, histogram,
    segment_reduce), index-checking ops (take, put_, index_reduce, max_unpool)
    and embedding_bag.)"""
    fn, shapes, rng, grad = entry
    cpu_in = inputs(shapes, rng, dtype, strided, "cpu")
    ax_in = inputs(shapes, rng, dtype, strided, "axon")
    if strided:
        assert not any(t.is_contiguous() for t in ax_in)
    try:
        want = fn(*cpu_in)
    except (RuntimeError, NotImplementedError) as e:
        # No kernel for this dtype on the CPU: axon says the same.
        with pytest.raises(type(e), match=str(e).split("\n")[0][:40].replace("(", r"\(")
                           .replace(")", r"\)").replace("'", ".")):
            fn(*ax_in)
        return
    torch.axon.reset_fallback_stats()
    got = fn(*ax_in)
    assert_same(got, want, dtype=dtype, accum=True)
    if grad:
        leaves_c = [t.detach().requires_grad_() for t in cpu_in]
        leaves_a = [t.detach().requires_grad_() for t in ax_in]
        outs_c, outs_a = floats(fn(*leaves_c)), floats(fn(*leaves_a))
        try:
            gc = torch.autograd.grad(sum((o.float() ** 2).sum() for o in outs_c), leaves_c)
        except NotImplementedError as e:  # i1's backward in bfloat16: as on the CPU
            with pytest.raises(NotImplementedError, match=str(e)[:20]):
                torch.autograd.grad(sum((o.float() ** 2).sum() for o in outs_a), leaves_a)
        else:
            ga = torch.autograd.grad(sum((o.float() ** 2).sum() for o in outs_a), leaves_a)
            for a, c in zip(ga, gc):
                assert_same(a, c, dtype=dtype, accum=True)
    assert torch.axon.fallback_stats() == {}


def check_stream_op_zero_size(fn, shapes):
    """fn on float32 inputs of shapes with no elements: as on the CPU, no fallback."""
    cpu_in = [make(s, torch.float32, seed=3) for s in shapes]
    torch.axon.reset_fallback_stats()
    assert_same(fn(*[t.axon() for t in cpu_in]), fn(*cpu_in))
    assert torch.axon.fallback_stats() == {}


# The parametrized tests each family file makes of its tables (one line there:
# ``test_stream_op_matches_cpu = stream_op_test(STREAM_OPS)``).

def stream_op_test(table):
    """test_stream_op_matches_cpu over a STREAM_OPS table: every entry in
    float32 and bfloat16, contiguous and strided (check_stream_op)."""
    @pytest.mark.parametrize("strided", [False, True], ids=["contiguous", "strided"])
    @pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
    @pytest.mark.parametrize("name", list(table))
    def test_stream_op_matches_cpu(name, dtype, strided):
        check_stream_op(table[name], dtype, strided)
    return test_stream_op_matches_cpu


def stream_op_zero_size_test(table, zero_size):
    """test_stream_op_zero_size over {name in table: input shapes with no elements}."""
    @pytest.mark.parametrize("name", list(zero_size))
    def test_stream_op_zero_size(name):
        check_stream_op_zero_size(table[name][0], zero_size[name])
    return test_stream_op_zero_size


def nn_functional_test(table):
    """test_nn_functional over {name: (input shape, function of the input)}:
    every float dtype, compared with the CPU at the accumulating tolerance."""
    @pytest.mark.parametrize("dtype", FLOAT_DTYPES)
    @pytest.mark.parametrize("op", list(table))
    def test_nn_functional(op, dtype):
        shape, fn = table[op]
        x = make(shape, dtype, seed=14)
        compare(fn, [x], [x.axon()], accum=True)
    return test_nn_functional

def shape_ops_test(table):
    """test_shape_ops over {name: function of one tensor}: every layout of a
    (4, 6) operand (conftest.LAYOUTS) in every float dtype."""
    @pytest.mark.parametrize("layout", LAYOUTS)
    @pytest.mark.parametrize("dtype", FLOAT_DTYPES)
    @pytest.mark.parametrize("op", list(table))
    def test_shape_ops(op, dtype, layout):
        c, a = layout_pair(layout, dtype, seed=23)
        compare(table[op], [c], [a])
    return test_shape_ops


def shape_ops_int_bool_test(table, names):
    """test_shape_ops_int_bool over the entries names of table: integer and
    bool operands (topk/sort of bools raise on the CPU; compare checks that
    axon raises alike)."""
    @pytest.mark.parametrize("dtype", INT_DTYPES + (torch.bool,))
    @pytest.mark.parametrize("op", names)
    def test_shape_ops_int_bool(op, dtype):
        c, a = layout_pair("transposed", dtype, low=-4, high=4, seed=24)
        compare(table[op], [c], [a])
    return test_shape_ops_int_bool


# ---------------------------------------------------------------- OpInfo samples on axon

SKIP_PREFIX = ("sparse", "_refs", "to_sparse")  # op_db entries not tested on axon


def to_device(x, device):
    """x's tensors on device, views re-made as the same views of their base
    (views of another dtype, such as view_as_real's, are copied)."""
    def move(t):
        if not isinstance(t, torch.Tensor):
            return t
        if t._base is not None and t.layout == torch.strided and t._base.dtype == t.dtype:
            base = t._base.detach().resolve_conj().resolve_neg().to(device)
            moved = base.as_strided(t.size(), t.stride(), t.storage_offset())
            if t.is_conj():  # a lazily conjugated (or negated) view stays one
                moved = moved.conj()
            if t.is_neg():
                moved = moved._neg_view()
        else:
            moved = t.detach().to(device)
        return moved.requires_grad_(t.requires_grad)
    return tree_map(move, x)


def on_device(x, device):
    """Device arguments (factory functions, ``to``) naming the CPU name device."""
    def swap(v):
        if isinstance(v, torch.device) and v.type == "cpu":
            return torch.device(device)
        return device if isinstance(v, str) and v == "cpu" else v
    return tree_map(swap, x)


def tensors(x):
    return [t for t in tree_leaves(x) if isinstance(t, torch.Tensor)]


# ---------------------------------------------------------------- kernel selection

def select_runs(op: str) -> tuple[int, int]:
    """(own, library) launches of a kernel-selection op (csrc/aten/KernelSelect.h), summed
    over its keys."""
    from torch_axon import _C
    torch.axon.synchronize()
    rows = [r for r in _C._kernel_select_table() if r[0] == op]
    return sum(r[11] for r in rows), sum(r[12] for r in rows)


def run_python(code: str, timeout: float = 120, **env):
    """A fresh interpreter running ``code`` with ``env`` added (kernel-selection tables in
    memory only); the CompletedProcess."""
    import os
    import subprocess
    import sys
    e = dict(os.environ, AXON_KERNEL_SELECT_CACHE="0", **env)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=e,
                          timeout=timeout)
