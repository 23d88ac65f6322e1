"""Indexing on axon against the CPU: index_select, gather/scatter, take,
advanced getitem/setitem (axon or CPU index tensors), masks, nonzero, index
put/add/copy/fill (also into views of a larger tensor: a static KV cache),
embedding and embedding_bag.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from conftest import FLOAT_DTYPES, assert_same, layout_pair, make
from op_util import compare, stream_op_test


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


# Ops the generic stream kernel runs (found by an OpInfo sweep of the fallback);
# name: (function of the inputs, input shapes, value range, differentiable)
STREAM_OPS = {
    "nonzero_static": (lambda a: torch.nonzero_static(a > 0, size=30), [(4, 6)], None, False),
}


test_stream_op_matches_cpu = stream_op_test(STREAM_OPS)
