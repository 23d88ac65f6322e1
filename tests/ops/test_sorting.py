"""Sorting and order statistics on axon against the CPU, on every layout:
sort (stable, descending), argsort, msort, topk, kthvalue, searchsorted,
bucketize; float, integer and bool (where the CPU raises, axon raises alike).
"""

from __future__ import annotations

import torch

from op_util import shape_ops_int_bool_test, shape_ops_test


# name: function of one (4, 6) tensor in any layout
SHAPE = {
    "sort": lambda x: x.sort(dim=1, stable=True),
    "sort_desc": lambda x: torch.sort(x, dim=0, descending=True, stable=True),
    "argsort": lambda x: x.argsort(dim=1, stable=True),
    "topk": lambda x: x.topk(3, 1),
    "topk_smallest": lambda x: x.topk(2, 0, largest=False),
    "kthvalue": lambda x: x.kthvalue(2, 1),
    "msort": lambda x: torch.msort(x),
    "searchsorted": lambda x: torch.searchsorted(x.sort(1).values, x[:, :2].contiguous()),
    "bucketize": lambda x: torch.bucketize(x, torch.tensor([-1.0, 0.0, 1.0], dtype=x.dtype, device=x.device)),
}


test_shape_ops = shape_ops_test(SHAPE)
test_shape_ops_int_bool = shape_ops_int_bool_test(SHAPE, ["sort", "topk"])
