"""Reductions and scans on axon against the CPU: sum/mean/prod, min/max and
arg-forms, var/std, norms, logsumexp, median, any/all, cumulative ops; every
layout, float and integer dtypes.
"""

from __future__ import annotations

import pytest
import torch

from conftest import FLOAT_DTYPES, INT_DTYPES, LAYOUTS, layout_pair
from op_util import compare, cpu_and_axon_raise_alike, stream_op_test


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


# ---------------------------------------------------------------- scans

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


def test_ops_without_meta_kernels_check_on_the_host():
    """logcumsumexp's dimension is checked when it is called (the op has no
    Meta kernel to do it), with PyTorch's error."""
    for x in (torch.ones(3, 4), torch.ones(3, 4, device="axon")):
        with pytest.raises(IndexError, match="Dimension out of range"):
            torch.logcumsumexp(x, 2)


@pytest.mark.parametrize("lo,hi", [(3.0, 1.0), (float("nan"), 1.0), (0.0, float("inf"))])
def test_histc_bad_range_raises_at_the_call_like_cpu(lo, hi):
    cpu_and_axon_raise_alike(lambda a: torch.histc(a, bins=4, min=lo, max=hi), [torch.ones(3)])


# ---------------------------------------------------------------- the generic stream kernel

# Ops the generic stream kernel runs (found by an OpInfo sweep of the fallback);
# name: (function of the inputs, input shapes, value range, differentiable)
STREAM_OPS = {
    "nansum": (lambda a: torch.nansum(torch.where(a > 2, float("nan"), a), dim=1), [(4, 6)],
               None, True),
    "count_nonzero": (lambda a: torch.count_nonzero(a > 0.5, dim=1), [(4, 6)], None, False),
    "median": (lambda a: torch.median(a), [(4, 6)], None, True),
    "nanmedian": (lambda a: torch.nanmedian(torch.where(a > 2, float("nan"), a)), [(4, 6)],
                  None, True),
    "nanmedian_dim": (lambda a: torch.nanmedian(a, dim=1), [(4, 6)], None, True),
    "logcumsumexp": (lambda a: torch.logcumsumexp(a, 1), [(4, 6)], None, True),
    "logcumsumexp_dim0": (lambda a: torch.logcumsumexp(a, 0), [(4, 6)], None, True),
    "cummax": (lambda a: torch.cummax(a, 1), [(4, 6)], None, True),
    "cummin": (lambda a: torch.cummin(a, 0), [(4, 6)], None, True),
}


test_stream_op_matches_cpu = stream_op_test(STREAM_OPS)


@pytest.mark.parametrize("op", ["nansum", "sum", "mean", "amax", "logsumexp"])
@pytest.mark.parametrize("keepdim", [False, True])
def test_empty_dim_list_reduces_like_cpu(op, keepdim):
    """dim=[]: whatever each op does with it on the CPU (nansum, sum and mean
    reduce every dimension; nansum on axon used to reduce none)."""
    x = torch.tensor([[1.0, float("nan"), 2.0], [3.0, 4.0, 5.0]])
    fn = {"nansum": lambda t: torch.nansum(t, dim=[], keepdim=keepdim),
          "sum": lambda t: torch.sum(t, dim=[], keepdim=keepdim),
          "mean": lambda t: torch.mean(t, dim=[], keepdim=keepdim),
          "amax": lambda t: torch.amax(t, dim=[], keepdim=keepdim),
          "logsumexp": lambda t: torch.logsumexp(t, dim=[], keepdim=keepdim)}[op]
    compare(fn, [x], [x.to("axon")])
    out_c = torch.empty(0)
    out_a = torch.empty(0, device="axon")
    if op == "nansum":
        torch.nansum(x, dim=[], keepdim=keepdim, out=out_c)
        torch.nansum(x.to("axon"), dim=[], keepdim=keepdim, out=out_a)
        assert out_a.shape == out_c.shape
        torch.testing.assert_close(out_a.cpu(), out_c, equal_nan=True)
