"""Operators on axon against the same computation on the CPU.

A parametrized sweep: dtypes float32/bfloat16/float16 (ints and bools where
they apply), contiguous, transposed, sliced, expanded and zero-size operands
(built on axon with the same view ops as on the CPU), in-place and out=
forms, views that must alias their input, copies between devices, dtypes and
layouts, .item(), and autograd.
"""

import copy
import warnings

import pytest
import torch
import torch.nn.functional as F

from conftest import (FLOAT_DTYPES, INT_DTYPES, LAYOUTS, assert_same, layout_pair, make, run_python,
                      tol)

ALL_DTYPES = FLOAT_DTYPES + INT_DTYPES + (torch.bool,)


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


# ---------------------------------------------------------------- elementwise unary

POS = dict(low=0.1, high=4.0)   # strictly positive inputs
UNIT = dict(low=-0.95, high=0.95)

UNARY = {
    "abs": (torch.abs, {}), "neg": (torch.neg, {}), "exp": (torch.exp, {}),
    "exp2": (torch.exp2, {}), "expm1": (torch.expm1, {}), "log": (torch.log, POS),
    "log2": (torch.log2, POS), "log1p": (torch.log1p, POS), "sqrt": (torch.sqrt, POS),
    "rsqrt": (torch.rsqrt, POS), "reciprocal": (torch.reciprocal, POS),
    "sin": (torch.sin, {}), "cos": (torch.cos, {}), "tan": (torch.tan, UNIT),
    "asin": (torch.asin, UNIT), "atan": (torch.atan, {}), "tanh": (torch.tanh, {}),
    "sinh": (torch.sinh, {}), "sigmoid": (torch.sigmoid, {}), "erf": (torch.erf, {}),
    "erfinv": (torch.erfinv, UNIT), "floor": (torch.floor, {}), "ceil": (torch.ceil, {}),
    "round": (torch.round, {}), "trunc": (torch.trunc, {}), "frac": (torch.frac, {}),
    "sign": (torch.sign, {}), "square": (torch.square, {}),
    "pow2": (lambda x: x ** 2, {}), "pow_half": (lambda x: x ** 0.5, POS),
    "clamp": (lambda x: x.clamp(-1, 1.5), {}), "clamp_min": (lambda x: x.clamp(min=0.5), {}),
    "relu": (F.relu, {}), "gelu": (F.gelu, {}), "gelu_tanh": (lambda x: F.gelu(x, approximate="tanh"), {}),
    "silu": (F.silu, {}), "mish": (F.mish, {}), "elu": (F.elu, {}),
    "leaky_relu": (lambda x: F.leaky_relu(x, 0.1), {}), "hardtanh": (F.hardtanh, {}),
    "softplus": (F.softplus, {}), "logsigmoid": (F.logsigmoid, {}),
    "nan_to_num": (lambda x: torch.nan_to_num(x.log()), {}),
    "isnan": (lambda x: torch.isnan(x.log()), {}), "isfinite": (torch.isfinite, {}),
    "to_int": (lambda x: x.to(torch.int32), {}), "to_float32": (lambda x: x.float(), {}),
    "to_bool": (lambda x: x.round().bool(), {}),
}


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("op", list(UNARY))
def test_unary(op, dtype, layout):
    fn, domain = UNARY[op]
    c, a = layout_pair(layout, dtype, **domain)
    compare(fn, [c], [a])


INT_UNARY = {
    "abs": torch.abs, "neg": torch.neg, "sign": torch.sign, "square": torch.square,
    "bitwise_not": torch.bitwise_not, "clamp": lambda x: x.clamp(-1, 2),
    "to_float": lambda x: x.float(), "to_half": lambda x: x.half(), "eq0": lambda x: x == 0,
}


@pytest.mark.parametrize("layout", ["contiguous", "transposed", "expanded", "zero_size"])
@pytest.mark.parametrize("dtype", INT_DTYPES)
@pytest.mark.parametrize("op", list(INT_UNARY))
def test_unary_int(op, dtype, layout):
    c, a = layout_pair(layout, dtype, low=-5, high=5)
    compare(INT_UNARY[op], [c], [a])


@pytest.mark.parametrize("layout", ["contiguous", "sliced"])
@pytest.mark.parametrize("op", ["logical_not", "bitwise_not", "to_float", "sum", "any", "all"])
def test_unary_bool(op, layout):
    fn = {"logical_not": torch.logical_not, "bitwise_not": torch.bitwise_not,
          "to_float": lambda x: x.float(), "sum": lambda x: x.sum(1),
          "any": lambda x: x.any(0), "all": lambda x: x.all(1)}[op]
    c, a = layout_pair(layout, torch.bool)
    compare(fn, [c], [a])


# ---------------------------------------------------------------- elementwise binary

BINARY = {
    "add": torch.add, "add_alpha": lambda x, y: torch.add(x, y, alpha=-2),
    "sub": torch.sub, "mul": torch.mul, "div": torch.div,
    "div_floor": lambda x, y: torch.div(x, y, rounding_mode="floor"),
    "div_trunc": lambda x, y: torch.div(x, y, rounding_mode="trunc"),
    "remainder": torch.remainder, "fmod": torch.fmod, "pow": lambda x, y: x.abs() ** y,
    "maximum": torch.maximum, "minimum": torch.minimum, "atan2": torch.atan2,
    "hypot": torch.hypot, "copysign": torch.copysign,
    "eq": torch.eq, "ne": torch.ne, "lt": torch.lt, "le": torch.le, "gt": torch.gt, "ge": torch.ge,
    "logical_and": torch.logical_and, "logical_xor": torch.logical_xor,
    "lerp": lambda x, y: torch.lerp(x, y, 0.3),
    "where": lambda x, y: torch.where(x > y, x, y),
    "xlogy": lambda x, y: torch.xlogy(x, y.abs()),
}

# (rhs shape or kind, lhs layout): broadcasting, scalars, non-contiguous operands
BIN_CASES = ["same", "noncontig", "row", "col", "outer", "python_scalar", "axon_0dim",
             "cpu_0dim", "zero_size"]


def binary_operands(case, dtype):
    """((x_cpu, y_cpu), (x_axon, y_axon)) for a BIN_CASES case; y never 0."""
    def nz(t):  # keep divisors away from zero
        if t.dtype.is_floating_point:
            return torch.where(t.abs() < 0.25, torch.full_like(t, 0.5), t)
        return torch.where(t == 0, torch.ones_like(t), t)

    if case == "noncontig":
        xc, xa = layout_pair("transposed", dtype, seed=1)
        yb = nz(make((5, 13), dtype, seed=2))
        return (xc, yb[1:, 1::2]), (xa, yb.axon()[1:, 1::2])
    if case == "zero_size":
        xc, xa = layout_pair("zero_size", dtype, seed=1)
        y = nz(make((6,), dtype, seed=2))
        return (xc, y), (xa, y.axon())
    if case == "outer":
        x = make((4, 1), dtype, seed=1)
        y = nz(make((1, 6), dtype, seed=2))
        return (x, y), (x.axon(), y.axon())
    x = make((4, 6), dtype, seed=1)
    if case == "python_scalar":
        y = 1.75 if dtype.is_floating_point else 3
        return (x, y), (x.axon(), y)
    shape = {"same": (4, 6), "row": (6,), "col": (4, 1), "axon_0dim": (), "cpu_0dim": ()}[case]
    y = nz(make(shape, dtype, seed=2))
    if case == "axon_0dim" and y.item() == 0:
        y = torch.ones((), dtype=dtype)
    return (x, y), (x.axon(), y if case == "cpu_0dim" else y.axon())


TENSOR_ONLY = ("atan2", "hypot", "copysign", "maximum", "minimum", "logical_and",
               "logical_xor", "lerp", "where", "xlogy")  # no Python-scalar overload


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("op,case", [(op, case) for op in BINARY for case in BIN_CASES
                                     if not (op in TENSOR_ONLY and case == "python_scalar")])
def test_binary(op, dtype, case):
    cpu, ax = binary_operands(case, dtype)
    compare(BINARY[op], cpu, ax)


INT_BINARY = {
    "add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div,
    "floor_divide": torch.floor_divide, "remainder": torch.remainder,
    "bitwise_and": torch.bitwise_and, "bitwise_or": torch.bitwise_or,
    "bitwise_xor": torch.bitwise_xor, "shift_left": lambda x, y: x << y.abs().clamp(max=3),
    "maximum": torch.maximum, "eq": torch.eq, "lt": torch.lt, "ge": torch.ge,
}


@pytest.mark.parametrize("case", ["same", "noncontig", "row", "col", "cpu_0dim", "zero_size"])
@pytest.mark.parametrize("dtype", INT_DTYPES)
@pytest.mark.parametrize("op", list(INT_BINARY))
def test_binary_int(op, dtype, case):
    cpu, ax = binary_operands(case, dtype)
    compare(INT_BINARY[op], cpu, ax)


@pytest.mark.parametrize("op", ["and", "or", "xor", "eq", "add", "mul"])
def test_binary_bool(op):
    fn = {"and": torch.logical_and, "or": torch.bitwise_or, "xor": torch.logical_xor,
          "eq": torch.eq, "add": torch.add, "mul": torch.mul}[op]
    x, y = make((4, 6), torch.bool, seed=1), make((6,), torch.bool, seed=2)
    compare(fn, [x, y], [x.axon(), y.axon()])


PROMOTION_PAIRS = [
    (torch.float32, torch.bfloat16), (torch.float16, torch.bfloat16),
    (torch.float16, torch.float32), (torch.int64, torch.float16), (torch.int32, torch.int64),
    (torch.bool, torch.int32), (torch.bool, torch.float32), (torch.uint8, torch.int8),
    (torch.int32, torch.bfloat16), (torch.float64, torch.float32),
]


@pytest.mark.parametrize("op", ["add", "mul", "div", "maximum", "eq", "where"])
@pytest.mark.parametrize("dtypes", PROMOTION_PAIRS, ids=lambda p: f"{p[0]}-{p[1]}".replace("torch.", ""))
def test_type_promotion(dtypes, op):
    fn = {"add": torch.add, "mul": torch.mul, "div": torch.div, "maximum": torch.maximum,
          "eq": torch.eq, "where": lambda x, y: torch.where(x != 0, x, y)}[op]
    x = make((3, 4), dtypes[0], low=1, high=5, seed=1)
    y = make((4,), dtypes[1], low=1, high=5, seed=2)
    expected = compare(fn, [x, y], [x.axon(), y.axon()])
    assert expected is not None
    # also against a 0-dim tensor and a Python scalar (which do not promote as much)
    compare(fn, [x, y[0]], [x.axon(), y[0].axon()])
    compare(lambda a: a * 2.5, [x], [x.axon()])


# ---------------------------------------------------------------- in-place and out=

INPLACE = {
    "add_": lambda x, y: x.add_(y), "mul_": lambda x, y: x.mul_(y),
    "sub_": lambda x, y: x.sub_(y, alpha=0.5), "div_": lambda x, y: x.div_(y.abs() + 1),
    "clamp_": lambda x, y: x.clamp_(-1, 1), "exp_": lambda x, y: x.exp_(),
    "copy_": lambda x, y: x.copy_(y), "fill_": lambda x, y: x.fill_(2.5),
    "zero_": lambda x, y: x.zero_(), "masked_fill_": lambda x, y: x.masked_fill_(y > 0, -7),
    "addcmul_": lambda x, y: x.addcmul_(y, y, value=0.5), "lerp_": lambda x, y: x.lerp_(y, 0.25),
    "relu_": lambda x, y: F.relu(x, inplace=True), "sigmoid_": lambda x, y: x.sigmoid_(),
    "index_fill_": lambda x, y: x.index_fill_(1, torch.tensor([0, 2], device=x.device), 9),
    "setitem_slice": lambda x, y: x.__setitem__((slice(None), slice(1, 3)), y[:, :2]),
    "setitem_scalar": lambda x, y: x.__setitem__(1, 4.0),
    "setitem_mask": lambda x, y: x.__setitem__(y > 0.5, 0.0),
}


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("op,layout", [
    (op, layout) for op in INPLACE for layout in ("contiguous", "transposed", "sliced", "zero_size")
    if not (op == "setitem_scalar" and layout == "zero_size")])  # no row 1 to set
def test_inplace(op, dtype, layout):
    # x is the target in the layout; for views, the base must see the writes.
    xc, xa = layout_pair(layout, dtype, seed=3)
    yc = make(tuple(xc.shape), dtype, seed=4)
    ya = yc.axon()
    base_c = xc._base if xc._base is not None else xc
    base_a = xa._base if xa._base is not None else xa
    ptr = xa.data_ptr()
    version = xa._version
    rc = INPLACE[op](xc, yc)
    ra = INPLACE[op](xa, ya)
    assert xa.data_ptr() == ptr  # in place: no new memory
    assert xa._version > version or xa.numel() == 0
    if isinstance(rc, torch.Tensor):
        assert ra is xa
    assert_same(xa, xc)
    assert_same(base_a, base_c)


def test_inplace_int_and_bool():
    x = make((4, 6), torch.int64, low=-9, high=9)
    xa = x.axon()
    for fn in (lambda t: t.add_(3), lambda t: t.mul_(-2), lambda t: t.bitwise_and_(6),
               lambda t: t.clamp_(-5, 5), lambda t: t.t().sub_(1)):
        fn(x)
        fn(xa)
        assert_same(xa, x)
    b = make((4, 6), torch.bool)
    ba = b.axon()
    b.logical_not_()
    ba.logical_not_()
    b[0] = True
    ba[0] = True
    assert_same(ba, b)


OUT_OPS = {
    "add": (lambda a, b, out: torch.add(a, b, out=out), (3, 4)),
    "mul": (lambda a, b, out: torch.mul(a, 2.0, out=out), (3, 4)),
    "sin": (lambda a, b, out: torch.sin(a, out=out), (3, 4)),
    "mm": (lambda a, b, out: torch.mm(a, b.t(), out=out), (3, 3)),
    "sum": (lambda a, b, out: torch.sum(a, 1, out=out), (3,)),
    "cat": (lambda a, b, out: torch.cat([a, b], 0, out=out), (6, 4)),
    "where": (lambda a, b, out: torch.where(a > b, a, b, out=out), (3, 4)),
    "index_select": (lambda a, b, out: torch.index_select(a, 1, torch.tensor([3, 0], device=a.device), out=out), (3, 2)),
    "cumsum": (lambda a, b, out: torch.cumsum(a, 1, out=out), (3, 4)),
    "clamp": (lambda a, b, out: torch.clamp(a, -1, 1, out=out), (3, 4)),
}


@pytest.mark.parametrize("out_kind", ["right_size", "wrong_size_bigger", "wrong_size_smaller",
                                      "empty", "noncontig"])
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("op", list(OUT_OPS))
def test_out_variants(op, dtype, out_kind):
    fn, shape = OUT_OPS[op]
    a, b = make((3, 4), dtype, seed=5), make((3, 4), dtype, seed=6)
    n = 1
    for s in shape:
        n *= s
    if out_kind == "right_size":
        oc = torch.full(shape, 99.0, dtype=dtype)
        oa = oc.axon()
    elif out_kind == "wrong_size_bigger":
        oc, oa = torch.zeros(n + 7, dtype=dtype), torch.zeros(n + 7, dtype=dtype, device="axon")
    elif out_kind == "wrong_size_smaller":
        oc, oa = torch.zeros(2, dtype=dtype), torch.zeros(2, dtype=dtype, device="axon")
    elif out_kind == "empty":
        oc, oa = torch.empty(0, dtype=dtype), torch.empty(0, dtype=dtype, device="axon")
    else:  # correctly sized but transposed: written through its strides
        oc = torch.zeros(tuple(reversed(shape)), dtype=dtype).t() if len(shape) == 2 else \
            torch.zeros(2 * n, dtype=dtype)[::2]
        oa = torch.zeros(tuple(reversed(shape)), dtype=dtype, device="axon").t() if len(shape) == 2 \
            else torch.zeros(2 * n, dtype=dtype, device="axon")[::2]
    with warnings.catch_warnings(record=True) as wc:
        warnings.simplefilter("always")
        rc = fn(a, b, oc)
    with warnings.catch_warnings(record=True) as wa:
        warnings.simplefilter("always")
        ra = fn(a.axon(), b.axon(), oa)
    assert ra is oa and rc is oc
    assert oa.shape == oc.shape == torch.Size(shape)
    assert oa.device.type == "axon"
    assert_same(oa, oc, accum=op in ("mm", "sum", "cumsum"))
    # resizing a non-empty out= tensor warns exactly as on the CPU
    resized = lambda ws: any("resized" in str(w.message) for w in ws)  # noqa: E731
    assert resized(wa) == resized(wc)
    # the resized out tensor is a working axon tensor afterwards
    assert_same(oa * 2, oc * 2, accum=op in ("mm", "sum", "cumsum"))


def test_out_with_two_outputs_resized():
    x = make((4, 6), torch.float32)
    vc, ic = torch.empty(0), torch.empty(0, dtype=torch.long)
    va, ia = torch.empty(0, device="axon"), torch.empty(0, dtype=torch.long, device="axon")
    torch.sort(x, 1, out=(vc, ic))
    torch.sort(x.axon(), 1, out=(va, ia))
    assert_same(va, vc)
    assert_same(ia, ic)
    with warnings.catch_warnings():  # (4, 6) outs resized to (4, 3): deprecated, warns
        warnings.simplefilter("ignore")
        torch.topk(x, 3, out=(vc, ic))
        torch.topk(x.axon(), 3, out=(va, ia))
    assert va.shape == (4, 3)
    assert_same(va, vc)
    assert_same(ia, ic)


# ---------------------------------------------------------------- reductions

REDUCTIONS = {
    "sum": lambda x: x.sum(), "sum0": lambda x: x.sum(0), "sum1_keep": lambda x: x.sum(1, keepdim=True),
    "sum_f32": lambda x: x.sum(1, dtype=torch.float32), "mean": lambda x: x.mean(),
    "mean1": lambda x: x.mean(1), "prod1": lambda x: x.prod(1), "amax": lambda x: x.amax(1),
    "amin0": lambda x: x.amin(0), "max_all": lambda x: x.max(), "max_dim": lambda x: x.max(1),
    "min_dim": lambda x: x.min(0, keepdim=True), "argmax": lambda x: x.argmax(1),
    "argmin": lambda x: x.argmin(0), "std": lambda x: x.std(1), "var": lambda x: x.var(0, correction=0),
    "var_mean": lambda x: torch.var_mean(x, 1), "norm": lambda x: x.norm(), "norm1": lambda x: x.norm(p=1, dim=1),
    "logsumexp": lambda x: x.logsumexp(1), "all": lambda x: (x > 0).all(1), "any": lambda x: (x > 2).any(),
    "count_nonzero": lambda x: torch.count_nonzero(x > 0, 1), "aminmax": lambda x: torch.aminmax(x, dim=1),
    "nansum": lambda x: x.nansum(1), "median": lambda x: x.median(1), "sum_dims": lambda x: x.sum((0, 1)),
}


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("op", list(REDUCTIONS))
def test_reduction(op, dtype, layout):
    c, a = layout_pair(layout, dtype, seed=7)
    compare(REDUCTIONS[op], [c], [a], accum=True)


@pytest.mark.parametrize("dtype", INT_DTYPES + (torch.bool,))
@pytest.mark.parametrize("op", ["sum", "sum0", "prod1", "amax", "max_dim", "argmax", "min_dim"])
def test_reduction_int(op, dtype):
    c, a = layout_pair("transposed", dtype, low=-4, high=4, seed=7)
    compare(REDUCTIONS[op], [c], [a])


@pytest.mark.parametrize("dim", [0, 1, -1])
@pytest.mark.parametrize("layout", ["contiguous", "transposed", "zero_size"])
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("fn", ["softmax", "log_softmax", "softmax_f32"])
def test_softmax(fn, dtype, layout, dim):
    f = {"softmax": lambda x: torch.softmax(x, dim),
         "log_softmax": lambda x: F.log_softmax(x, dim),
         "softmax_f32": lambda x: torch.softmax(x, dim, dtype=torch.float32)}[fn]
    c, a = layout_pair(layout, dtype, seed=8)
    compare(f, [c], [a], accum=True)


@pytest.mark.parametrize("layout", ["contiguous", "transposed", "sliced", "zero_size"])
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("op", ["cumsum", "cumprod", "cummax", "logcumsumexp", "cumsum0"])
def test_scans(op, dtype, layout):
    f = {"cumsum": lambda x: x.cumsum(1), "cumprod": lambda x: (x / 3).cumprod(1),
         "cummax": lambda x: x.cummax(1), "logcumsumexp": lambda x: x.logcumsumexp(1),
         "cumsum0": lambda x: torch.cumsum(x, 0, dtype=torch.float32)}[op]
    c, a = layout_pair(layout, dtype, seed=9)
    compare(f, [c], [a], accum=True)


def test_cumsum_int():
    c, a = layout_pair("transposed", torch.int32, low=-5, high=5)
    compare(lambda x: x.cumsum(0), [c], [a])  # int32 accumulates to int64 on both


# ---------------------------------------------------------------- matmul family

MATMUL = {
    "mm": ((3, 5), (5, 4), torch.mm),
    "mm_t": ((5, 3), (4, 5), lambda a, b: torch.mm(a.t(), b.t())),
    "bmm": ((2, 3, 5), (2, 5, 4), torch.bmm),
    "matmul_bcast": ((2, 1, 3, 5), (3, 5, 4), torch.matmul),
    "matmul_vec": ((3, 5), (5,), torch.matmul),
    "matmul_1d_2d": ((5,), (5, 4), torch.matmul),
    "mv": ((3, 5), (5,), torch.mv),
    "dot": ((5,), (5,), torch.dot),
    "vdot": ((5,), (5,), torch.vdot),
    "outer": ((3,), (4,), torch.outer),
    "addmm": ((3, 5), (5, 4), lambda a, b: torch.addmm(torch.ones(3, 4, dtype=a.dtype, device=a.device), a, b, beta=0.5, alpha=2)),
    "baddbmm": ((2, 3, 5), (2, 5, 4), lambda a, b: torch.baddbmm(torch.ones(1, 3, 4, dtype=a.dtype, device=a.device), a, b)),
    "linear": ((3, 5), (4, 5), lambda a, b: F.linear(a, b, b[:, 0])),
    "linear_nobias": ((2, 3, 5), (4, 5), F.linear),
    "einsum": ((2, 3, 5), (2, 5, 4), lambda a, b: torch.einsum("bij,bjk->bik", a, b)),
    "einsum_trace": ((4, 5), (5, 4), lambda a, b: torch.einsum("ij,ji->", a, b)),
    "tensordot": ((3, 5), (5, 4), lambda a, b: torch.tensordot(a, b, dims=1)),
    "matmul_empty_k": ((3, 0), (0, 4), torch.matmul),
    "matmul_empty_m": ((0, 5), (5, 4), torch.matmul),
    "bmm_empty_batch": ((0, 3, 5), (0, 5, 4), torch.bmm),
    "sdpa": ((2, 4, 8), (2, 4, 8), lambda q, k: F.scaled_dot_product_attention(q, k, k)),
    "sdpa_causal": ((1, 2, 4, 8), (1, 2, 4, 8), lambda q, k: F.scaled_dot_product_attention(q, k, k, is_causal=True)),
}


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("op", list(MATMUL))
def test_matmul(op, dtype):
    sa, sb, fn = MATMUL[op]
    a, b = make(sa, dtype, -1, 1, seed=10), make(sb, dtype, -1, 1, seed=11)
    compare(fn, [a, b], [a.axon(), b.axon()], accum=True)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_matmul_noncontiguous_operands(dtype):
    a = make((6, 10), dtype, -1, 1, seed=12)
    b = make((10, 5), dtype, -1, 1, seed=13)
    fn = lambda x, y: x[::2, ::2] @ y[::2, :]  # noqa: E731  (3x5) @ (5x5)
    compare(fn, [a, b], [a.axon(), b.axon()], accum=True)
    compare(lambda x, y: x.t()[::2].t() @ y.t()[:, ::2], [a, b], [a.axon(), b.axon()], accum=True)


def test_matmul_int():
    a = make((3, 4), torch.int64, -5, 5, seed=1)
    b = make((4, 2), torch.int64, -5, 5, seed=2)
    compare(torch.mm, [a, b], [a.axon(), b.axon()])


# ---------------------------------------------------------------- nn functional

NN = {
    "layer_norm": ((2, 3, 8), lambda x: F.layer_norm(x, (8,), torch.linspace(0.5, 1.5, 8, dtype=x.dtype, device=x.device), torch.linspace(-1, 1, 8, dtype=x.dtype, device=x.device))),
    "layer_norm_2d": ((2, 3, 8), lambda x: F.layer_norm(x, (3, 8))),
    "rms_norm": ((2, 3, 8), lambda x: F.rms_norm(x, (8,), torch.linspace(0.5, 1.5, 8, dtype=x.dtype, device=x.device))),
    "group_norm": ((2, 4, 5), lambda x: F.group_norm(x, 2)),
    "batch_norm_eval": ((4, 3, 5), lambda x: F.batch_norm(x, torch.zeros(3, dtype=x.dtype, device=x.device), torch.ones(3, dtype=x.dtype, device=x.device))),
    "conv1d": ((2, 4, 9), lambda x: F.conv1d(x, torch.linspace(-1, 1, 6 * 4 * 3, dtype=x.dtype, device=x.device).view(6, 4, 3), padding=1)),
    "conv2d": ((2, 4, 6, 6), lambda x: F.conv2d(x, torch.linspace(-1, 1, 4 * 2 * 9, dtype=x.dtype, device=x.device).view(4, 2, 3, 3), stride=2, padding=1, groups=2)),
    "max_pool2d": ((2, 3, 6, 6), lambda x: F.max_pool2d(x, 2)),
    "avg_pool2d": ((2, 3, 6, 6), lambda x: F.avg_pool2d(x, 3, stride=2, padding=1)),
    "adaptive_avg_pool2d": ((2, 3, 6, 6), lambda x: F.adaptive_avg_pool2d(x, (2, 3))),
    "interpolate_nearest": ((1, 2, 3, 4), lambda x: F.interpolate(x, scale_factor=2)),
    "interpolate_bilinear": ((1, 2, 3, 4), lambda x: F.interpolate(x, size=(5, 7), mode="bilinear", align_corners=False)),
    "pad_constant": ((2, 3, 4), lambda x: F.pad(x, (1, 2, 0, 1), value=-1.0)),
    "pad_reflect": ((2, 3, 4), lambda x: F.pad(x, (2, 1), mode="reflect")),
    "dropout_eval": ((3, 4), lambda x: F.dropout(x, 0.5, training=False)),
    "normalize": ((3, 4), lambda x: F.normalize(x, dim=1)),
    "cosine_similarity": ((3, 4), lambda x: F.cosine_similarity(x, x.flip(0))),
    "glu": ((3, 4), lambda x: F.glu(x)),
    "mse_loss": ((3, 4), lambda x: F.mse_loss(x, x.flip(1))),
    "smooth_l1": ((3, 4), lambda x: F.smooth_l1_loss(x, x.flip(0))),
    "bce_logits": ((3, 4), lambda x: F.binary_cross_entropy_with_logits(x, torch.sigmoid(x.flip(0)))),
    "kl_div": ((3, 4), lambda x: F.kl_div(F.log_softmax(x, 1), F.softmax(x.flip(0), 1), reduction="batchmean")),
}


NN_MARKS: dict = {}


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("op", [pytest.param(k, marks=NN_MARKS.get(k, ())) for k in NN])
def test_nn_functional(op, dtype):
    shape, fn = NN[op]
    x = make(shape, dtype, seed=14)
    compare(fn, [x], [x.axon()], accum=True)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_cross_entropy_and_nll(dtype, reduction):
    logits = make((5, 7), dtype, seed=15)
    target = torch.tensor([0, 6, 3, -100, 2])
    fn = lambda x, t: (F.cross_entropy(x, t, reduction=reduction, ignore_index=-100),  # noqa: E731
                       F.cross_entropy(x, t.clamp(min=0), label_smoothing=0.1, reduction=reduction),
                       F.nll_loss(F.log_softmax(x, 1), t.clamp(min=0), reduction=reduction))
    compare(fn, [logits, target], [logits.axon(), target.axon()], accum=True)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_batch_norm_training_updates_running_stats(dtype):
    x = make((6, 3, 4), dtype, seed=16)
    bn_c = torch.nn.BatchNorm1d(3).to(dtype)
    bn_a = copy.deepcopy(bn_c).axon()
    for _ in range(2):
        yc, ya = bn_c(x), bn_a(x.axon())
        assert_same(ya, yc, accum=True)
    assert_same(bn_a.running_mean, bn_c.running_mean, accum=True)
    assert_same(bn_a.running_var, bn_c.running_var, accum=True)
    assert_same(bn_a.num_batches_tracked, bn_c.num_batches_tracked)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_embedding(dtype):
    w = make((10, 4), dtype, seed=17)
    idx = torch.tensor([[1, 0, 9], [3, 3, 2]])
    compare(lambda w, i: F.embedding(i, w), [w, idx], [w.axon(), idx.axon()])
    compare(lambda w, i: F.embedding(i, w, padding_idx=3), [w, idx], [w.axon(), idx.axon()])
    compare(lambda w, i: F.embedding(i, w.t().contiguous().t()), [w, idx], [w.axon(), idx.axon()])
    compare(lambda w, i: F.embedding(i[:, :0], w), [w, idx], [w.axon(), idx.axon()])
    # max_norm renormalises the used rows of the weight in place
    wc, wa = w.float().clone(), w.float().axon()
    F.embedding(idx, wc, max_norm=1.0)
    F.embedding(idx.axon(), wa, max_norm=1.0)
    assert_same(wa, wc)
    for mode in ("mean", "sum", "max"):
        bag_c = F.embedding_bag(idx, w.float(), mode=mode)
        assert_same(F.embedding_bag(idx.axon(), w.float().axon(), mode=mode), bag_c)
    flat, offsets = idx.flatten(), torch.tensor([0, 2, 2])  # with an empty bag
    assert_same(F.embedding_bag(flat.axon(), w.float().axon(), offsets.axon(), mode="sum"),
                F.embedding_bag(flat, w.float(), offsets, mode="sum"))


def _spd(a):
    return a @ a.t() + torch.eye(a.shape[0], dtype=a.dtype, device=a.device)


LINALG = {
    "inv": lambda a, b: torch.linalg.inv(a), "solve": lambda a, b: torch.linalg.solve(a, b),
    "qr": lambda a, b: torch.linalg.qr(a), "cholesky": lambda a, b: torch.linalg.cholesky(_spd(a)),
    "det": lambda a, b: torch.linalg.det(a), "slogdet": lambda a, b: torch.linalg.slogdet(a),
    "svdvals": lambda a, b: torch.linalg.svdvals(a), "eigvalsh": lambda a, b: torch.linalg.eigvalsh(_spd(a)),
    "lu_factor": lambda a, b: torch.linalg.lu_factor(a), "lstsq": lambda a, b: torch.linalg.lstsq(a, b).solution,
    "matrix_norm": lambda a, b: torch.linalg.matrix_norm(a), "vector_norm": lambda a, b: torch.linalg.vector_norm(a, 3),
    "pinv": lambda a, b: torch.linalg.pinv(a), "cdist": lambda a, b: torch.cdist(a, b.t()),
    "solve_triangular": lambda a, b: torch.linalg.solve_triangular(a.triu(), b, upper=True),
    "matrix_exp": lambda a, b: torch.linalg.matrix_exp(a / 10), "cross": lambda a, b: torch.linalg.cross(a[:, :3], a[:, 1:]),
    "kron": lambda a, b: torch.kron(a[:2, :2], b[:2]), "rfft": lambda a, b: torch.fft.rfft(a),
    "fft2_abs": lambda a, b: torch.fft.fft2(a).abs(), "complex_ops": lambda a, b: torch.complex(a, -a) * torch.complex(a, a.flip(0)),
    "view_as_real": lambda a, b: torch.view_as_real(torch.complex(a, a)), "bincount": lambda a, b: torch.bincount((a.abs() * 3).long().flatten()),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("transposed", [False, True])
@pytest.mark.parametrize("op", list(LINALG))
def test_linalg_and_misc(op, dtype, transposed):
    a = make((4, 4), dtype, seed=40) + 4 * torch.eye(4, dtype=dtype)
    b = make((4, 2), dtype, seed=41)
    ac, aa = (a.t(), a.axon().t()) if transposed else (a, a.axon())
    compare(LINALG[op], [ac, b], [aa, b.axon()], accum=True)


def test_conj_and_neg_bits():
    # in a subprocess: the failure mode is a crash of the interpreter
    r = run_python("""
        import torch
        a = torch.complex(torch.arange(4.0), torch.arange(4.0) - 2)
        x = a.axon()
        r = torch.arange(4.0)

        def grad_of(t):  # complex autograd conjugates gradients
            t = t.detach().requires_grad_()
            (t * t).abs().sum().backward()
            return t.grad.cpu()

        cases = {
            "conj_to_cpu": (lambda: x.conj().cpu(), a.conj().resolve_conj()),
            "mul_by_conj": (lambda: (x * x.conj()).cpu(), a * a.conj()),
            "neg_view": (lambda: (r.axon()._neg_view() + 1).cpu(), r._neg_view() + 1),
            "complex_autograd": (lambda: grad_of(x), grad_of(a)),
        }
        for name, (fn, ref) in cases.items():
            print(name, flush=True)
            torch.testing.assert_close(fn(), ref, rtol=0, atol=0)
        print("OK")
    """)
    assert r.returncode == 0 and r.stdout.split()[-1] == "OK", (r.returncode, r.stdout, r.stderr[-300:])


def test_efficient_zero_tensor():
    z = torch._efficientzerotensor(3, device="axon")
    assert_same(z + 1, torch._efficientzerotensor(3) + 1)
    assert_same(z.clone(), torch.zeros(3))


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


def test_channels_last():
    x = make((2, 3, 4, 5), torch.float32, seed=46)
    c = x.contiguous(memory_format=torch.channels_last)
    a = x.axon().contiguous(memory_format=torch.channels_last)
    assert a.stride() == c.stride() and a.is_contiguous(memory_format=torch.channels_last)
    assert_same(a, c)
    e = torch.empty(2, 3, 4, 5, device="axon", memory_format=torch.channels_last)
    assert e.stride() == c.stride()
    assert_same(F.max_pool2d(a, 2), F.max_pool2d(c, 2))
    assert_same(a.to(memory_format=torch.contiguous_format), x)


# ---------------------------------------------------------------- indexing

INDEXING = {
    "index_select0": lambda x, i: x.index_select(0, i),
    "index_select1": lambda x, i: torch.index_select(x, 1, i),
    "gather": lambda x, i: x.gather(1, i.expand(x.shape[0], -1)),
    "take": lambda x, i: torch.take(x, i),
    "getitem_tensor": lambda x, i: x[i],
    "getitem_2tensors": lambda x, i: x[i, i.flip(0)],
    "getitem_mixed": lambda x, i: x[1:, i],
    "getitem_mask": lambda x, i: x[x > 0],
    "masked_select": lambda x, i: x.masked_select(x < 0),
    "nonzero": lambda x, i: (x > 0).nonzero(),
    "nonzero_tuple": lambda x, i: torch.nonzero(x > 0, as_tuple=True),
    "argwhere": lambda x, i: torch.argwhere(x < 1),
    "scatter": lambda x, i: torch.zeros(4, 6, dtype=x.dtype, device=x.device).scatter(1, i.expand(4, -1), x[:, :3]),
    "scatter_add": lambda x, i: torch.ones_like(x).scatter_add(1, i.expand(4, -1), x[:, :3]),
    "scatter_reduce_amax": lambda x, i: torch.zeros_like(x).scatter_reduce(1, i.expand(4, -1), x[:, :3], "amax", include_self=False),
    "index_add": lambda x, i: x.index_add(1, i, x[:, :3], alpha=2),
    "index_copy": lambda x, i: x.index_copy(1, i, x[:, 3:]),
    "index_put": lambda x, i: x.index_put((i,), torch.tensor(5.0, dtype=x.dtype, device=x.device)),
    "index_put_accumulate": lambda x, i: x.index_put((i.clamp(max=1),), x[:3], accumulate=True),
    "masked_fill": lambda x, i: x.masked_fill(x > 1, -1.0),
    "masked_fill_tensor": lambda x, i: x.masked_fill(x > 1, torch.tensor(3.0, dtype=x.dtype, device=x.device)),
    "masked_scatter": lambda x, i: x.masked_scatter(x > 0, x.flip(1) * 10),
    "where_scalar": lambda x, i: torch.where(x > 0, x, 0.0),
    "where_cond_only": lambda x, i: torch.where(x > 0.5),
}


# CPU index tensors mix with axon tensors only for indexing ops (as with CUDA).
CPU_INDEX_OK = ("getitem_tensor", "getitem_2tensors", "getitem_mixed", "index_put",
                "index_put_accumulate")


@pytest.mark.parametrize("layout", ["contiguous", "transposed"])
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("op,index_device", [(op, "axon") for op in INDEXING] +
                         [(op, "cpu") for op in CPU_INDEX_OK])
def test_indexing(op, dtype, layout, index_device):
    xc, xa = layout_pair(layout, dtype, seed=18)
    i = torch.tensor([2, 0, 3])
    ia = i if index_device == "cpu" else i.axon()
    compare(INDEXING[op], [xc, i], [xa, ia])


@pytest.mark.parametrize("index_device", ["axon", "cpu"])
@pytest.mark.parametrize("dtype", FLOAT_DTYPES + (torch.int64,))
def test_setitem_advanced(dtype, index_device):
    x = make((5, 4), dtype, seed=19)
    xc, xa = x.clone(), x.axon()
    i = torch.tensor([4, 0, 2])
    ia = i if index_device == "cpu" else i.axon()
    m = torch.tensor([True, False, True, False, True])
    ma = m if index_device == "cpu" else m.axon()
    v = make((3, 4), dtype, seed=20)
    for c_op, a_op in [
        (lambda: xc.__setitem__(i, v), lambda: xa.__setitem__(ia, v.axon())),
        (lambda: xc.__setitem__((i, 1), 7), lambda: xa.__setitem__((ia, 1), 7)),
        (lambda: xc.__setitem__(m, v), lambda: xa.__setitem__(ma, v.axon())),
        (lambda: xc.index_put_((i,), v, accumulate=True), lambda: xa.index_put_((ia,), v.axon(), accumulate=True)),
        (lambda: xc.t().__setitem__((slice(None), i), v.t()), lambda: xa.t().__setitem__((slice(None), ia), v.axon().t())),
    ]:
        c_op()
        a_op()
        assert_same(xa, xc)


# In-place indexing ops write into self, which may be a view of a larger tensor
# (a static KV cache's layer): only the indexed slices change, and the rest of
# the base (outside the view too) keeps its values.  index_copy_ is the cache
# update of Transformers' StaticCache (keys.index_copy_(2, positions, new)).
INPLACE_INDEXING = {
    "index_copy_": lambda s, i, src: s.index_copy_(2, i, src),
    "index_add_": lambda s, i, src: s.index_add_(2, i, src, alpha=-2),
    "scatter_": lambda s, i, src: s.scatter_(2, i.view(1, 1, -1, 1).expand_as(src), src),
    "scatter_add_": lambda s, i, src: s.scatter_add_(2, i.view(1, 1, -1, 1).expand_as(src), src),
    "index_fill_": lambda s, i, src: s.index_fill_(2, i, -7.0),
}


@pytest.mark.parametrize("count", [2, 0])
@pytest.mark.parametrize("view", ["whole", "strided"])
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("op", list(INPLACE_INDEXING))
def test_inplace_indexing_into_views(op, dtype, view, count):
    base = make((3, 4, 9, 5), dtype, seed=23)
    src = make((3, 2, count, 5), dtype, seed=24)
    i = torch.tensor([6, 1][:count], dtype=torch.long)

    def run(b, s, j):
        self_ = b[:, :2] if view == "whole" else b[:, 1::2, :, 1:].transpose(2, 3).transpose(2, 3)
        if view == "strided":
            s = s[..., :4]
        out = INPLACE_INDEXING[op](self_, j, s)
        assert out is self_
        return b

    bc, ba = base.clone(), base.axon()
    expected = run(bc, src, i)
    actual = run(ba, src.axon(), i.axon())
    assert_same(actual, expected)
    if count:
        assert not torch.equal(expected, base)  # the op wrote something


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_index_copy_out_variants(dtype):
    """index_copy(out=): an empty out is resized, out=self works in place, and a
    wrong dtype raises as on the CPU."""
    x = make((4, 6), dtype, seed=25)
    src = make((4, 2), dtype, seed=26)
    i = torch.tensor([5, 0])
    for make_out in (lambda t: torch.empty(0, dtype=dtype, device=t.device), lambda t: t):
        xc, xa = x.clone(), x.axon()
        oc, oa = make_out(xc), make_out(xa)
        rc = torch.index_copy(xc, 1, i, src, out=oc)
        ra = torch.index_copy(xa, 1, i.axon(), src.axon(), out=oa)
        assert ra is oa and rc is oc
        assert_same(oa, oc)
        assert_same(xa, xc)
    compare(lambda t, j, s: torch.index_copy(t, 1, j, s, out=torch.empty(0, dtype=torch.int64, device=t.device)),
            [x, i, src], [x.axon(), i.axon(), src.axon()])


def test_index_ops_int_and_bool():
    x = make((4, 6), torch.int64, -9, 9, seed=21)
    i = torch.tensor([3, 1])
    for op in ("index_select1", "gather", "getitem_tensor", "scatter_add", "nonzero", "take"):
        compare(INDEXING[op], [x, i], [x.axon(), i.axon()])
    b = make((4, 6), torch.bool, seed=22)
    compare(lambda t, j: t[:, j], [b, i], [b.axon(), i.axon()])
    compare(lambda t, j: t.nonzero(), [b, i], [b.axon(), i.axon()])


# ---------------------------------------------------------------- shape ops

SHAPE = {
    "cat0": lambda x: torch.cat([x, x * 2], 0), "cat1": lambda x: torch.cat([x, x[:, :2]], 1),
    "cat_empty": lambda x: torch.cat([x, x[:0]], 0), "stack": lambda x: torch.stack([x, -x], 1),
    "hstack": lambda x: torch.hstack([x, x]), "vstack": lambda x: torch.vstack([x, x]),
    "split": lambda x: torch.split(x, 4, 1), "split_sizes": lambda x: x.split([1, 5], 1),
    "chunk": lambda x: x.chunk(3, 1), "unbind": lambda x: x.unbind(1),
    "tensor_split": lambda x: torch.tensor_split(x, [1, 4], 1),
    "flip": lambda x: x.flip(0, 1), "roll": lambda x: x.roll(2, 1), "rot90": lambda x: x.rot90(),
    "repeat": lambda x: x.repeat(2, 1, 3), "tile": lambda x: x.tile(2), "repeat_interleave": lambda x: x.repeat_interleave(2, 0),
    "contiguous": lambda x: x.contiguous(), "clone": lambda x: x.clone(),
    "reshape": lambda x: x.reshape(-1, 3), "flatten": lambda x: x.flatten(),
    "permute_contig": lambda x: x.unsqueeze(0).permute(2, 0, 1).contiguous(),
    "tril": lambda x: x.tril(), "tril_k": lambda x: torch.tril(x, -1), "triu": lambda x: x.triu(1),
    "triu_neg": lambda x: x.triu(-2), "diag": lambda x: torch.diag(x[:, 0]), "diag_embed": lambda x: torch.diag_embed(x[:2]),
    "trace": lambda x: x[:, :4].trace(), "sort": lambda x: x.sort(dim=1, stable=True),
    "sort_desc": lambda x: torch.sort(x, dim=0, descending=True, stable=True),
    "argsort": lambda x: x.argsort(dim=1, stable=True), "topk": lambda x: x.topk(3, 1),
    "topk_smallest": lambda x: x.topk(2, 0, largest=False), "kthvalue": lambda x: x.kthvalue(2, 1),
    "msort": lambda x: torch.msort(x), "unique": lambda x: torch.unique(x.round(), return_counts=True),
    "unique_inverse": lambda x: torch.unique(x.round(), sorted=True, return_inverse=True),
    "searchsorted": lambda x: torch.searchsorted(x.sort(1).values, x[:, :2].contiguous()),
    "bucketize": lambda x: torch.bucketize(x, torch.tensor([-1.0, 0.0, 1.0], dtype=x.dtype, device=x.device)),
    "clamp_tensor": lambda x: x.clamp(x[:1], x[:1] + 1), "addcdiv": lambda x: torch.addcdiv(x, x, x.abs() + 1, value=0.5),
    "histc": lambda x: torch.histc(x.float(), bins=5, min=-3, max=3),
}


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("op", list(SHAPE))
def test_shape_ops(op, dtype, layout):
    c, a = layout_pair(layout, dtype, seed=23)
    compare(SHAPE[op], [c], [a])


@pytest.mark.parametrize("dtype", INT_DTYPES + (torch.bool,))
@pytest.mark.parametrize("op", ["cat0", "stack", "split", "flip", "tril", "triu", "sort", "topk",
                                "unique", "repeat", "roll"])
def test_shape_ops_int_bool(op, dtype):
    # (topk/sort of bools raise on the CPU; compare checks axon raises alike)
    c, a = layout_pair("transposed", dtype, low=-4, high=4, seed=24)
    compare(SHAPE[op], [c], [a])


# ---------------------------------------------------------------- factories

FACTORIES = {
    "zeros": lambda d, dt: torch.zeros(3, 4, device=d, dtype=dt),
    "ones": lambda d, dt: torch.ones(2, 0, 3, device=d, dtype=dt),
    "full": lambda d, dt: torch.full((2, 3), 1.5, device=d, dtype=dt),
    "arange": lambda d, dt: torch.arange(0, 11, 3, device=d, dtype=dt),
    "arange_float_step": lambda d, dt: torch.arange(-1, 1, 0.25, device=d, dtype=dt),
    "linspace": lambda d, dt: torch.linspace(-2, 2, 9, device=d, dtype=dt),
    "logspace": lambda d, dt: torch.logspace(-1, 1, 5, device=d, dtype=dt),
    "eye": lambda d, dt: torch.eye(3, 5, device=d, dtype=dt),
    "tensor": lambda d, dt: torch.tensor([[1.5, -2], [0.25, 8]], device=d, dtype=dt),
    "zeros_like": lambda d, dt: torch.zeros_like(torch.empty(2, 3, device=d, dtype=dt)),
    "full_like": lambda d, dt: torch.full_like(torch.empty(2, 3, device=d, dtype=dt), 7),
    "empty_then_fill": lambda d, dt: torch.empty(5, device=d, dtype=dt).fill_(-3),
    "tril_indices": lambda d, dt: torch.tril_indices(3, 4, device=d),
    "scalar_tensor": lambda d, dt: torch.scalar_tensor(2.5, device=d, dtype=dt),
    "complex_polar": lambda d, dt: torch.polar(torch.ones(2, device=d), torch.zeros(2, device=d)),
}


@pytest.mark.parametrize("dtype", FLOAT_DTYPES + (torch.int64,))
@pytest.mark.parametrize("op", list(FACTORIES))
def test_factories(op, dtype):
    expected = compare(lambda d: FACTORIES[op](d, dtype), ["cpu"], ["axon"])
    if expected is None:
        return  # both raised alike (e.g. an integer arange with a fractional step)
    assert FACTORIES[op]("axon", dtype).device == torch.device("axon:0")
    with torch.axon.device(2):
        on2 = FACTORIES[op]("axon", dtype)
    assert on2.device == torch.device("axon:2")
    assert_same(on2, expected)


def test_tensor_new_methods_keep_device_and_dtype():
    a = torch.empty(2, dtype=torch.bfloat16, device="axon:1")
    c = torch.empty(2, dtype=torch.bfloat16)
    for name, fn in [("new_zeros", lambda t: t.new_zeros(2, 3)), ("new_ones", lambda t: t.new_ones(4)),
                     ("new_full", lambda t: t.new_full((2,), 3.5)),
                     ("new_tensor", lambda t: t.new_tensor([1.0, 2.5])),
                     ("new_empty_fill", lambda t: t.new_empty(3).fill_(1.25))]:
        r = fn(a)
        assert r.device == torch.device("axon:1") and r.dtype == torch.bfloat16, name
        assert_same(r, fn(c))


def test_factories_like_preserve_device_and_layout():
    a = torch.empty(3, 4, device="axon:1").t()
    for fn in (torch.zeros_like, torch.ones_like, torch.empty_like, torch.rand_like):
        r = fn(a)
        assert r.device == torch.device("axon:1") and r.shape == (4, 3)
        assert r.stride() == a.stride()  # preserve_format keeps the transposed layout


# ---------------------------------------------------------------- views alias their input

VIEWS = {
    # name: (view fn, writable)
    "transpose": (lambda x: x.transpose(0, 1), True), "t": (lambda x: x.t(), True),
    "narrow": (lambda x: x.narrow(1, 1, 3), True), "select": (lambda x: x.select(0, 2), True),
    "getitem_slice": (lambda x: x[1:3, ::2], True), "getitem_int": (lambda x: x[1], True),
    "unfold": (lambda x: x.unfold(1, 2, 2), True),
    "unfold_overlapping": (lambda x: x.unfold(1, 3, 1), False),
    "as_strided": (lambda x: x.as_strided((2, 2), (1, 3), 1), True),
    "view": (lambda x: x.view(2, 12), True), "reshape": (lambda x: x.reshape(6, 4), True),
    "flatten": (lambda x: x.flatten(), True), "view_dtype": (lambda x: x.view(torch.int16), True),
    "permute": (lambda x: x.unsqueeze(1).permute(2, 1, 0), True),
    "unsqueeze": (lambda x: x.unsqueeze(0), True), "squeeze": (lambda x: x[:1].squeeze(0), True),
    "expand": (lambda x: x[:1].expand(3, 6), False), "diagonal": (lambda x: x.diagonal(1), True),
    "movedim": (lambda x: x.movedim(0, 1), True), "split": (lambda x: x.split(2, 1)[1], True),
    "chunk": (lambda x: x.chunk(2, 0)[1], True), "unbind": (lambda x: x.unbind(1)[4], True),
    "detach": (lambda x: x.detach(), True), "view_as": (lambda x: x.view_as(x), True),
    "real": (lambda x: x.view(torch.complex64).real if x.dtype == torch.float32 else x.view(-1), True),
}


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("op", list(VIEWS))
def test_views_alias_input(op, dtype):
    fn, writable = VIEWS[op]
    if op == "view_dtype" and dtype == torch.float32:
        fn = lambda x: x.view(torch.int32)  # noqa: E731
    base_c = make((4, 6), dtype, seed=25)
    base_a = base_c.axon()
    vc, va = fn(base_c), fn(base_a)
    assert va.device.type == "axon"
    assert va.untyped_storage().data_ptr() == base_a.untyped_storage().data_ptr(), "not a view"
    assert va.shape == vc.shape and va.stride() == vc.stride()
    assert va.storage_offset() == vc.storage_offset()
    assert va.is_contiguous() == vc.is_contiguous()
    assert_same(va, vc)
    if not writable:
        return
    # writes through the view are seen by the base, and vice versa
    fill = 0.5 if va.dtype.is_floating_point else 3
    vc.fill_(fill)
    va.fill_(fill)
    assert_same(base_a, base_c)
    base_c.mul_(2)
    base_a.mul_(2)
    assert_same(va, vc)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_view_of_view_and_inplace_view_ops(dtype):
    x = make((4, 6), dtype, seed=26)
    xc, xa = x.clone(), x.axon()
    vc = xc.t()[1:4].unsqueeze(0).narrow(2, 1, 2)
    va = xa.t()[1:4].unsqueeze(0).narrow(2, 1, 2)
    assert va._base is xa
    vc.add_(1)
    va.add_(1)
    assert_same(xa, xc)
    # in-place metadata ops
    for f in (lambda t: t.t_(), lambda t: t.unsqueeze_(0), lambda t: t.squeeze_(0),
              lambda t: t.transpose_(0, 1), lambda t: t.as_strided_((3, 2), (2, 1), 2),
              lambda t: t.resize_(2, 3), lambda t: t.swapdims_(0, 1)):
        f(xc)
        f(xa)
        assert xa.shape == xc.shape and xa.stride() == xc.stride()
        assert_same(xa, xc)


def test_set_shares_storage():
    src = torch.arange(12.0, device="axon")
    t = torch.empty(0, device="axon")
    t.set_(src)
    assert t.untyped_storage().data_ptr() == src.untyped_storage().data_ptr()
    u = torch.empty(0, device="axon")
    u.set_(src.untyped_storage(), 2, (2, 3), (3, 1))
    u.fill_(-1)
    expected = torch.arange(12.0)
    expected[2:8] = -1
    assert_same(src, expected)
    assert_same(t, expected)
    with pytest.raises(RuntimeError):
        u.set_(torch.arange(3.0))  # a CPU storage cannot back an axon tensor


def test_untyped_storage():
    x = torch.arange(6.0)
    s = x.untyped_storage().axon()
    assert s.device == torch.device("axon:0") and s.is_axon and s.nbytes() == 24
    assert torch.equal(torch.tensor([], device="axon").set_(s).cpu(), x)
    a = torch.arange(6.0, device="axon")
    st = a.untyped_storage()
    assert st.device.type == "axon" and st.nbytes() == 24
    assert st.clone().data_ptr() != st.data_ptr()
    st.fill_(0)
    assert_same(a, torch.zeros(6))
    st.copy_(torch.ones(6).untyped_storage())
    assert_same(a, torch.ones(6))
    assert torch.equal(torch.frombuffer(bytearray(st.cpu()), dtype=torch.float32), torch.ones(6))


# ---------------------------------------------------------------- copies

COPY_DTYPES = [(torch.float32, torch.float32), (torch.float32, torch.bfloat16),
               (torch.float16, torch.float32), (torch.bfloat16, torch.float16),
               (torch.int64, torch.float32), (torch.float32, torch.int32),
               (torch.bool, torch.float16), (torch.float16, torch.bool), (torch.int32, torch.int64)]


@pytest.mark.parametrize("src_layout", ["contiguous", "transposed", "sliced", "expanded", "zero_size"])
@pytest.mark.parametrize("direction", ["h2d", "d2h", "d2d", "d2d_other_device"])
@pytest.mark.parametrize("dtypes", COPY_DTYPES, ids=lambda p: f"{p[0]}-{p[1]}".replace("torch.", ""))
def test_copy(dtypes, direction, src_layout):
    src_dtype, dst_dtype = dtypes
    sc, sa = layout_pair(src_layout, src_dtype, low=-3, high=3, seed=27)
    src = sc if direction == "h2d" else sa
    dst_dev = {"h2d": "axon", "d2h": "cpu", "d2d": "axon", "d2d_other_device": "axon:1"}[direction]
    expected = torch.full(sc.shape, 5, dtype=dst_dtype).copy_(sc)
    for dst in (torch.full(sc.shape, 5, dtype=dst_dtype, device=dst_dev),
                torch.full(tuple(reversed(sc.shape)), 5, dtype=dst_dtype, device=dst_dev).t()):
        r = dst.copy_(src)
        assert r is dst
        torch.testing.assert_close(dst.cpu(), expected, rtol=0, atol=0)
    # .to() as well
    moved = src.to(dst_dev, dst_dtype)
    assert moved.device.type == torch.device(dst_dev).type
    torch.testing.assert_close(moved.cpu(), expected, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_copy_broadcasts_and_writes_through_views(dtype):
    row = make((6,), dtype, seed=28)
    base_c, base_a = torch.zeros(4, 6, dtype=dtype), torch.zeros(4, 6, dtype=dtype, device="axon")
    base_c[1:3].copy_(row)
    base_a[1:3].copy_(row)  # CPU source broadcast into an axon view
    base_c.t()[::2, 3].copy_(row[:3])
    base_a.t()[::2, 3].copy_(row[:3].axon())
    base_c[0] = row[0]
    base_a[0] = row[0].axon()
    assert_same(base_a, base_c)


def test_copy_same_tensor_and_overlapping_views():
    x = torch.arange(10.0)
    a = x.axon()
    a.copy_(a)
    a[2:8].copy_(a[0:6].clone())
    x[2:8].copy_(x[0:6].clone())
    assert_same(a, x)


@pytest.mark.parametrize("non_blocking", [False, True])
def test_copy_non_blocking_flag_between_devices(non_blocking):
    x = make((8, 8), torch.float32, seed=29)
    a = x.to("axon", non_blocking=non_blocking)
    b = a.to("axon:3", non_blocking=non_blocking)
    c = b.to("cpu", non_blocking=non_blocking)
    torch.axon.synchronize(0)
    torch.axon.synchronize(3)
    torch.testing.assert_close(c, x, rtol=0, atol=0)


@pytest.mark.parametrize("then", ["free_and_reuse_source", "overwrite_source"])
def test_cross_device_copy_orders_source_device(then):
    x = torch.arange(256, dtype=torch.float32)
    src = x.to("axon:0")
    dst = torch.zeros(256, device="axon:1")
    torch.axon.synchronize(0)
    torch.axon.synchronize(1)
    torch.axon._C._test_sleep_on_stream(1, 200)  # axon:1's stream is busy
    dst.copy_(src)  # returns before the copy ran
    if then == "free_and_reuse_source":
        del src
        junk = torch.empty(256, device="axon:0")  # the cached block of src, same stream
        junk.fill_(-1.0)
    else:
        src.fill_(-1.0)  # work on the source device after the copy, in program order
    torch.axon.synchronize(1)
    torch.testing.assert_close(dst.cpu(), x, rtol=0, atol=0)


# ---------------------------------------------------------------- .item()

@pytest.mark.parametrize("dtype", ALL_DTYPES + (torch.float64, torch.uint8))
def test_item(dtype):
    x = make((3, 4), dtype, seed=30)
    a = x.axon()
    for idx in [(0, 0), (2, 3), (1,)]:
        if len(idx) == 1:
            c_val, a_val = x.t()[3, idx[0]].item(), a.t()[3, idx[0]].item()
        else:
            c_val, a_val = x[idx].item(), a[idx].item()
        assert type(a_val) is type(c_val)
        assert a_val == c_val
    assert a.sum().item() == pytest.approx(x.sum().item(), rel=tol(dtype, True)["rtol"])
    assert a.tolist() == x.tolist()
    if dtype == torch.bool:
        assert bool(a[0, 0]) == bool(x[0, 0])
    else:
        assert float(a[1, 1]) == float(x[1, 1]) and int(a[1, 1]) == int(x[1, 1])


def test_item_waits_for_pending_work():
    x = torch.tensor([42.0])
    src, dst = x.axon(), torch.zeros(1, device="axon")
    torch.axon.synchronize()
    torch.axon._C._test_sleep_on_stream(0, 100)
    dst.copy_(src)  # queued behind the sleep
    assert dst.item() == 42.0


def test_item_of_multi_element_tensor_raises():
    with pytest.raises(RuntimeError, match="element"):
        torch.ones(2, device="axon").item()


# ---------------------------------------------------------------- autograd

def _mlp(dtype):
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.GELU(), torch.nn.LayerNorm(16),
                               torch.nn.Linear(16, 8), torch.nn.Tanh(),
                               torch.nn.Linear(8, 3)).to(dtype)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_mlp_gradients_match_cpu(dtype):
    model_c = _mlp(dtype)
    model_a = copy.deepcopy(model_c).axon()
    x = make((10, 6), dtype, seed=31)
    target = torch.tensor([0, 1, 2, 1, 0, 2, 2, 1, 0, 1])
    loss_c = F.cross_entropy(model_c(x), target)
    loss_a = F.cross_entropy(model_a(x.axon()), target.axon())
    assert_same(loss_a, loss_c, accum=True)
    loss_c.backward()
    loss_a.backward()
    for (name, pc), pa in zip(model_c.named_parameters(), model_a.parameters()):
        assert pa.grad is not None and pa.grad.device.type == "axon", name
        assert pa.grad.dtype == pc.grad.dtype
        t = tol(dtype, accum=True)
        torch.testing.assert_close(pa.grad.cpu(), pc.grad, msg=name, **t)


def composite(x, y, w):
    a = torch.sin(x) * y.exp() / (1 + w.abs())
    b = (x @ y.t()).logsumexp(-1).mean()
    c = torch.where(x > 0, x ** 2, -x).sum()
    d = torch.cat([x, y], 0).index_select(0, torch.tensor([3, 0, 5], device=x.device)).softmax(1)
    e = x.t()[::2].unfold(1, 2, 2).sum() + x.gather(1, torch.tensor([[0], [2], [1], [0]], device=x.device)).sum()
    f = F.layer_norm(y, (5,)).pow(2).mean() + torch.cumsum(w, 0).max()
    return a.sum() + b + c + d.sum() * 0.1 + e + f


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_composite_gradients_match_cpu(dtype):
    x = make((4, 5), dtype, -1, 1, seed=32)
    y = make((4, 5), dtype, -1, 1, seed=33)
    w = make((5,), dtype, -1, 1, seed=34)
    leaves_c = [t.clone().requires_grad_() for t in (x, y, w)]
    leaves_a = [t.axon().requires_grad_() for t in (x, y, w)]
    out_c = composite(*leaves_c)
    out_a = composite(*leaves_a)
    assert_same(out_a, out_c, accum=True, rtol=tol(dtype, True)["rtol"] * 3,
                atol=tol(dtype, True)["atol"] * 3)
    grads_c = torch.autograd.grad(out_c, leaves_c)
    grads_a = torch.autograd.grad(out_a, leaves_a)
    for gc, ga in zip(grads_c, grads_a):
        assert ga.device.type == "axon"
        t = tol(dtype, accum=True)
        torch.testing.assert_close(ga.cpu(), gc, rtol=t["rtol"] * 3, atol=t["atol"] * 3)


def test_gradients_accumulate_and_flow_through_views():
    x = make((4, 6), torch.float32, seed=35)
    xc, xa = x.clone().requires_grad_(), x.axon().requires_grad_()
    for leaf in (xc, xa):
        for _ in range(2):
            v = leaf.t()[1:4]
            (v * v).sum().backward()
        tmp = leaf.clone()
        tmp[:, 1].mul_(3)  # in-place on a view of a non-leaf
        tmp.sum().backward()
    assert_same(xa.grad, xc.grad)


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
    model_c = _mlp(torch.float32)
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
