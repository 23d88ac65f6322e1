"""Views on axon: every view op aliases its input (writes go both ways), views
of views, in-place metadata ops (t_, as_strided_, resize_...), set_ and
untyped storages, channels-last memory format.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from conftest import FLOAT_DTYPES, assert_same, make


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
