"""Elementwise ops on axon against the same computation on the CPU: unary and
binary math, activations and special functions, comparisons and logical ops,
type promotion and broadcasting; float32/bfloat16/float16 (ints and bools
where they apply) on contiguous, transposed, sliced, expanded and zero-size
operands.
"""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

from conftest import FLOAT_DTYPES, INT_DTYPES, LAYOUTS, assert_same, layout_pair, make, run_python
from op_util import POSITIVE, compare, nn_functional_test, stream_op_test, stream_op_zero_size_test


# ---------------------------------------------------------------- unary

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


# ---------------------------------------------------------------- binary

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


# ---------------------------------------------------------------- activations and layouts

# name: (input shape, function of the input)
NN = {
    "glu": ((3, 4), lambda x: F.glu(x)),
}

test_nn_functional = nn_functional_test(NN)


def test_relu_and_dropout_keep_channels_last_like_cpu():
    x = make((2, 3, 4, 5), torch.float32, seed=4).to(memory_format=torch.channels_last)
    assert torch.relu(x.axon()).stride() == torch.relu(x).stride()
    assert F.dropout(x.axon(), 0.5).stride() == F.dropout(x, 0.5).stride()
    assert_same(torch.relu(x.axon()), torch.relu(x))


# ---------------------------------------------------------------- special functions and more (the generic stream kernel)

# Ops the generic stream kernel runs (found by an OpInfo sweep of the fallback);
# name: (function of the inputs, input shapes, value range, differentiable)
STREAM_OPS = {
    "rsub_tensor": (lambda a, b: torch.rsub(a, b, alpha=2), [(4, 6), (4, 6)], None, True),
    "rsub_scalar": (lambda a: 1.5 - a, [(4, 6)], None, True),
    "hardtanh": (lambda a: F.hardtanh(a, -1.0, 2.0), [(4, 6)], None, True),
    "hardtanh_": (lambda a: F.hardtanh(a.clone(), -1.0, 2.0, inplace=True), [(4, 6)], None,
                  True),
    "relu6": (lambda a: F.relu6(a), [(4, 6)], None, True),
    "hardswish_": (lambda a: F.hardswish(a.clone(), inplace=True), [(4, 6)], (-4, 4), True),
    "logit": (lambda a: torch.logit(a, eps=1e-3), [(4, 6)], (0.01, 0.99), True),
    "erfc": (lambda a: torch.erfc(a), [(4, 6)], None, True),
    "sinc": (lambda a: torch.sinc(a), [(4, 6)], None, True),
    "threshold": (lambda a: F.threshold(a, 0.3, -2.0), [(4, 6)], None, True),
    "round_decimals": (lambda a: torch.round(a * 10, decimals=1), [(4, 6)], None, False),
    "round_decimals_": (lambda a: (a * 10).round_(decimals=-1), [(4, 6)], None, False),
    "logaddexp": (lambda a, b: torch.logaddexp(a, b), [(4, 6), (4, 6)], None, True),
    "logaddexp2": (lambda a, b: torch.logaddexp2(a, b), [(4, 6), (4, 6)], None, True),
    "fmax": (lambda a, b: torch.fmax(a, b), [(4, 6), (4, 6)], None, True),
    "fmin": (lambda a, b: torch.fmin(a, b), [(4, 6), (4, 6)], None, True),
    "hardshrink": (lambda a: F.hardshrink(a, 0.7), [(4, 6)], None, True),
    "softshrink": (lambda a: F.softshrink(a, 0.7), [(4, 6)], None, True),
    "frexp": (lambda a: torch.frexp(a), [(4, 6)], None, False),
    "i0": (lambda a: torch.i0(a), [(4, 6)], None, True),
    "i1": (lambda a: torch.special.i1(a), [(4, 6)], None, True),
    "nextafter": (lambda a, b: torch.nextafter(a, b), [(4, 6), (4, 6)], None, False),
    "igamma": (lambda a, b: torch.igamma(a, b), [(4, 6), (4, 6)], POSITIVE, False),
    "igammac": (lambda a, b: torch.igammac(a, b), [(4, 6), (4, 6)], POSITIVE, False),
    "polygamma": (lambda a: torch.polygamma(1, a), [(4, 6)], POSITIVE, True),
    "angle": (lambda a: torch.angle(a), [(4, 6)], None, False),
    "prelu": (lambda a, w: F.prelu(a, w), [(2, 3, 4, 5), (3,)], None, True),
    "rrelu_eval": (lambda a: F.rrelu(a, training=False), [(4, 6)], None, True),
    "i0e": (lambda a: torch.special.i0e(a), [(4, 6)], None, True),
    "i1e": (lambda a: torch.special.i1e(a), [(4, 6)], None, True),
    "entr": (lambda a: torch.special.entr(a), [(4, 6)], None, True),
    "erfcx": (lambda a: torch.special.erfcx(a), [(4, 6)], None, True),
    "log_ndtr": (lambda a: torch.special.log_ndtr(a), [(4, 6)], None, True),
    "ndtri": (lambda a: torch.special.ndtri(a), [(4, 6)], (0.01, 0.99), True),
    "xlog1py": (lambda a, b: torch.special.xlog1py(a, b), [(4, 6), (4, 6)], POSITIVE, True),
    "zeta": (lambda a, b: torch.special.zeta(a + 1, b), [(4, 6), (4, 6)], POSITIVE, False),
    "bessel_j0": (lambda a: torch.special.bessel_j0(a), [(4, 6)], None, False),
    "modified_bessel_k1": (lambda a: torch.special.modified_bessel_k1(a), [(4, 6)], POSITIVE, False),
    "chebyshev_t": (lambda a: torch.special.chebyshev_polynomial_t(a, 3), [(4, 6)], (-1, 1),
                    False),
    "hermite_h": (lambda a: torch.special.hermite_polynomial_h(a, 4), [(4, 6)], None, False),
}


test_stream_op_matches_cpu = stream_op_test(STREAM_OPS)


ZERO_SIZE = {  # name: shapes of its inputs with no elements
    "hardtanh": [(4, 0)],
    "logaddexp": [(4, 0), (4, 0)],
    "rsub_scalar": [(4, 0)],
}

test_stream_op_zero_size = stream_op_zero_size_test(STREAM_OPS, ZERO_SIZE)


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("form", ["tensor", "scalar", "inplace", "out", "broadcast"])
def test_integer_trunc_division_of_the_minimum_by_minus_one_does_not_trap(dtype, form):
    """The CPU's kernel traps (SIGFPE kills the process) on int32/int64
    minimum // -1 rounding toward zero; a device does not trap: that quotient
    is the wrapped value (the minimum), as CUDA's, and every other element is
    what the CPU computes."""
    lo = torch.iinfo(dtype).min
    a_vals = [lo, 5, -7, lo, 9, lo + 1]
    b_vals = [-1, -1, 2, 3, -1, -1]
    a = torch.tensor(a_vals, dtype=dtype)
    b = torch.tensor(b_vals, dtype=dtype)

    def trunc(x, y):  # Python integers, wrapped to dtype
        q = abs(x) // abs(y) * (1 if (x < 0) == (y < 0) else -1)
        bits = torch.iinfo(dtype).bits
        return (q + 2 ** (bits - 1)) % 2 ** bits - 2 ** (bits - 1)

    if form == "scalar":
        want = [trunc(x, -1) for x in a_vals]
        got = torch.div(a.axon(), -1, rounding_mode="trunc")
    elif form == "broadcast":
        want = [[trunc(x, y) for x in a_vals] for y in (-1, 3)]
        got = torch.div(a.axon(), torch.tensor([[-1], [3]], dtype=dtype).axon(),
                        rounding_mode="trunc")
    else:
        want = [trunc(x, y) for x, y in zip(a_vals, b_vals)]
        x, y = a.axon(), b.axon()
        if form == "tensor":
            got = torch.div(x, y, rounding_mode="trunc")
        elif form == "inplace":
            got = x.div_(y, rounding_mode="trunc")
        else:
            got = torch.empty_like(x)
            torch.div(x, y, rounding_mode="trunc", out=got)
    assert got.dtype == dtype
    assert got.cpu().tolist() == want
    # The elements that do not overflow: the CPU's own results.
    keep = [i for i, (x, y) in enumerate(zip(a_vals, b_vals)) if not (x == lo and y == -1)]
    cpu = torch.div(a[keep], b[keep], rounding_mode="trunc")
    assert torch.div(a.axon()[keep], b.axon()[keep], rounding_mode="trunc").cpu().equal(cpu)


def test_round_with_huge_decimals_is_as_quick_as_the_cpu():
    """round(decimals=d) for |d| up to 10**7: the CPU's kernel gives NaN or the
    input at once; the op's meta in C++ (Python's decomposition would compute
    10**d as an exact integer, minutes for d = 10**7). A child with a timeout,
    so that a hang fails only this test."""
    r = run_python("""
        import json, torch
        x = torch.tensor([1.25, -3.5, 0.0, 7.0])
        res = []
        for d in (10**7, -10**7, 400, -400):
            for dt in (torch.float32, torch.bfloat16, torch.float16):
                a = x.to(dt)
                got = torch.round(a.to("axon"), decimals=d).cpu()
                want = torch.round(a, decimals=d)
                res.append(got.dtype == want.dtype and torch.equal(got.isnan(), want.isnan())
                           and torch.equal(got.nan_to_num(), want.nan_to_num()))
        print(json.dumps(res))
    """, timeout=60)
    assert r.returncode == 0, r.stderr[-800:]
    assert json.loads(r.stdout) == [True] * 12


def test_trunc_division_overflow_in_the_computation_type():
    """The quotient's dtype decides: an operand that becomes the minimum or -1
    only when cast to it (a 0-dim int64 2**31 or a Python 2**32 - 1 beside
    int32) overflows too, and a uint8 255 is not -1. Expected values are
    Python integers wrapped to int32; a child process, so that a trap fails
    only this test."""
    r = run_python("""
        import json, torch
        lo = -2**31
        def wrap(q):
            return (q + 2**31) % 2**32 - 2**31
        def trunc(x, y):
            return wrap(abs(x) // abs(y) * (1 if (x < 0) == (y < 0) else -1))
        got, want = [], []
        i32 = lambda v: torch.tensor(v, dtype=torch.int32, device="axon")
        # 0-dim int64 2**31 (int32's minimum once cast) by int32 [-1, 2]
        r = torch.div(torch.tensor(2**31, device="axon"), i32([-1, 2]), rounding_mode="trunc")
        got.append([str(r.dtype), r.cpu().tolist()])
        want.append(["torch.int32", [trunc(lo, -1), trunc(lo, 2)]])
        # int32 by a Python 2**32 - 1 (-1 once cast)
        r = torch.div(i32([lo, 6]), 2**32 - 1, rounding_mode="trunc")
        got.append([str(r.dtype), r.cpu().tolist()])
        want.append(["torch.int32", [trunc(lo, -1), trunc(6, -1)]])
        # int32 by uint8 255: 255, not -1 (the CPU's own result)
        b = torch.tensor([255, 255], dtype=torch.uint8)
        r = torch.div(i32([lo, 7]), b.to("axon"), rounding_mode="trunc")
        c = torch.div(torch.tensor([lo, 7], dtype=torch.int32), b, rounding_mode="trunc")
        got.append([str(r.dtype), r.cpu().tolist()])
        want.append([str(c.dtype), c.tolist()])
        print(json.dumps([got, want]))
    """)
    assert r.returncode == 0, r.stderr[-800:]
    got, want = json.loads(r.stdout)
    assert got == want


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_lcm_of_the_minimum_does_not_trap(dtype):
    """ATen's lcm is |a / gcd(a, b) * b|; gcd(minimum, odd) can be -1 (|minimum|
    wraps) and the CPU then traps (SIGFPE). Axon gives CUDA's wrapped value,
    |minimum * b| wrapped: the minimum for odd b, 0 for even b; every other
    element is the CPU's. Expected values are Python integers; a child
    process, so that a trap fails only this test."""
    r = run_python(f"""
        import json, torch
        dt = {dtype}
        lo, hi = torch.iinfo(dt).min, torch.iinfo(dt).max
        a = [lo, lo, lo, 12, lo, -9]
        b = [hi, 4, lo, 18, -hi, 6]
        got = torch.lcm(torch.tensor(a, dtype=dt, device="axon"),
                        torch.tensor(b, dtype=dt, device="axon"))
        out = torch.empty(0, dtype=dt, device="axon")
        torch.lcm(torch.tensor(a, dtype=dt, device="axon"), torch.tensor(hi, dtype=dt, device="axon"),
                  out=out)
        keep = [1, 2, 3, 5]  # no trap on the CPU
        cpu = torch.lcm(torch.tensor(a, dtype=dt)[keep], torch.tensor(b, dtype=dt)[keep])
        cpu_out = torch.lcm(torch.tensor(a, dtype=dt)[[3, 5]], torch.tensor(hi, dtype=dt))
        print(json.dumps([got.cpu().tolist(), out.cpu().tolist(), cpu.tolist(), cpu_out.tolist(),
                          keep, lo, hi]))
    """)
    assert r.returncode == 0, r.stderr[-800:]
    got, out, cpu, cpu_out, keep, lo, hi = json.loads(r.stdout)
    assert [got[i] for i in keep] == cpu
    assert [out[3], out[5]] == cpu_out
    # gcd(lo, hi) = gcd(lo, -hi) = -1 there: |lo * odd| wraps to lo
    assert got[0] == got[4] == lo
    assert out[0] == out[1] == out[2] == out[4] == lo


def test_lcm_of_the_minimum_into_a_narrower_out():
    """int64 lcm into an int32 out=: the int64 results cast as the kernel casts them
    (its wrapped value for the trapping element, the CPU's for the others)."""
    r = run_python("""
        import json, torch
        lo, hi = -2**63, 2**63 - 1
        a, b = [lo, 12, -9], [hi, 18, 6]
        out = torch.empty(3, dtype=torch.int32, device="axon")
        torch.lcm(torch.tensor(a, device="axon"), torch.tensor(b, device="axon"), out=out)
        cpu = torch.lcm(torch.tensor(a[1:]), torch.tensor(b[1:]), out=torch.empty(2, dtype=torch.int32))
        print(json.dumps([out.cpu().tolist(), cpu.tolist()]))
    """)
    assert r.returncode == 0, r.stderr[-800:]
    got, cpu = json.loads(r.stdout)
    assert got == [0] + cpu  # -2**63 cast to int32 is 0
