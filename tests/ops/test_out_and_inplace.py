"""The in-place and out= forms of ops (every family): in-place ops write
through views into their base, out= tensors are resized (with PyTorch's
warning), written through their strides, and rejected when they live on
another device (the fallback, the data-dependent-shape ops, every op_db op).
"""

from __future__ import annotations

import re
import warnings

import pytest
import torch
import torch.nn.functional as F

from conftest import AXON, FLOAT_DTYPES, assert_same, layout_pair, make
from op_util import SKIP_PREFIX, on_device, tensors, to_device

pytestmark = pytest.mark.usefixtures("quick_op_samples")  # conftest: the samples, faster


# ---------------------------------------------------------------- in-place

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


# ---------------------------------------------------------------- out=

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


def test_mode_out_on_axon():
    """torch.mode(..., out=) raised on axon ("mode only supports CPU, CUDA and
    XPU device type": ATen's composite mode_out); now it matches the CPU."""
    for dtype in (torch.float32, torch.bfloat16, torch.int64):
        x = make((4, 7), dtype, low=0, high=3)
        for dim, keepdim in ((1, False), (0, True)):
            want = torch.mode(x, dim, keepdim)
            v = torch.empty(0, dtype=dtype, device=AXON)
            i = torch.empty(0, dtype=torch.long, device=AXON)
            r = torch.mode(x.to(AXON).t().contiguous().t(), dim, keepdim, out=(v, i))
            assert r[0] is v and r[1] is i
            assert_same(v, want.values)
            assert_same(i, want.indices)
    v = torch.empty(0, device=AXON)
    with pytest.raises(RuntimeError, match="expected scalar type 'Float' but got 'Long' for "
                                           "values output"):
        torch.mode(torch.zeros(3, device=AXON), out=(torch.empty(0, dtype=torch.long,
                                                                  device=AXON), v.long()))
    with pytest.raises(RuntimeError, match="expected device 'axon:0' but got 'cpu' for values"):
        torch.mode(torch.zeros(3, device=AXON), out=(torch.empty(0), v.long()))


# ---------------------------------------------------------------- out= on another device

SAME_DEVICE = "Expected all tensors to be on the same device, but found at least two devices"


def _data_dependent_out_calls():
    """{name: (call(outs), output dtypes)}: ops whose result size depends on
    the data, and ops that reach the synchronous fallback or the generic stream
    kernel (both find the device with ``OpDevice``) with out=."""
    x = make((4, 5), torch.float32).to(AXON)
    m = x > 0
    v = make((7,), torch.int64, low=0, high=4).to(AXON)
    srt = torch.tensor([0.0, 1.0, 2.0, 3.0], device=AXON)
    idx = torch.tensor([0, 3, 7], device=AXON)
    a = torch.ops.aten
    return {
        "aten::nonzero.out": (lambda o: torch.nonzero(x, out=o[0]), [torch.long]),
        "aten::nonzero_static.out": (lambda o: torch.nonzero_static(x, size=4, out=o[0]),
                                     [torch.long]),
        "aten::masked_select.out": (lambda o: torch.masked_select(x, m, out=o[0]),
                                    [torch.float32]),
        "aten::_unique2.out": (lambda o: a._unique2.out(v, out0=o[0], out1=o[1], out2=o[2]),
                               [torch.long, torch.long, torch.long]),
        "aten::_unique.out": (lambda o: a._unique.out(v, out0=o[0], out1=o[1]),
                              [torch.long, torch.long]),
        "aten::unique_dim.out": (lambda o: a.unique_dim.out(v, 0, out0=o[0], out1=o[1],
                                                            out2=o[2]),
                                 [torch.long, torch.long, torch.long]),
        "aten::unique_consecutive.out": (
            lambda o: a.unique_consecutive.out(v, out0=o[0], out1=o[1], out2=o[2]),
            [torch.long, torch.long, torch.long]),
        "aten::bincount.out": (lambda o: a.bincount.out(v, out=o[0]), [torch.long]),
        "aten::histc.out": (lambda o: torch.histc(x, 4, out=o[0]), [torch.float32]),
        "aten::histogram.bin_ct_out": (lambda o: torch.histogram(x.view(-1), 4, out=(o[0], o[1])),
                                       [torch.float32, torch.float32]),
        "aten::take.out": (lambda o: torch.take(x, idx, out=o[0]), [torch.float32]),
        "aten::repeat_interleave.Tensor_out": (
            lambda o: a.repeat_interleave.Tensor_out(v, out=o[0]), [torch.long]),
        "aten::count_nonzero.out": (lambda o: a.count_nonzero.out(x, out=o[0]), [torch.long]),
        "aten::kthvalue.values": (lambda o: torch.kthvalue(x, 2, out=(o[0], o[1])),
                                  [torch.float32, torch.long]),
        "aten::logsumexp.out": (lambda o: torch.logsumexp(x, 1, out=o[0]), [torch.float32]),
        "aten::linalg_vector_norm.out": (lambda o: torch.linalg.vector_norm(x, out=o[0]),
                                         [torch.float32]),
        "aten::searchsorted.Tensor_out": (lambda o: torch.searchsorted(srt, x, out=o[0]),
                                          [torch.long]),
        "aten::addr.out": (lambda o: torch.addr(x, x[:, 0], x[0], out=o[0]), [torch.float32]),
    }


# out= forms PyTorch generates from the functional kernel (CompositeExplicitAutograd
# wrappers: call the axon kernel, resize out=, then check its device and copy),
# with their message.

GENERATED_OUT = {"aten::_unique2.out", "aten::_unique.out", "aten::unique_dim.out",
                 "aten::unique_consecutive.out", "aten::bincount.out",
                 "aten::repeat_interleave.Tensor_out", "aten::count_nonzero.out"}


@pytest.mark.parametrize("kind", ["cpu_0dim", "cpu_sized", "axon:1"])
def test_out_on_another_device_raises_fallback_and_data_dependent(kind):
    """torch.nonzero(t, out=cpu_0dim) used to write the CPU tensor (a CPU 0-dim
    tensor passed as a "scalar"); asynchronous ops even wrote it later."""
    for name, (call, dtypes) in _data_dependent_out_calls().items():
        if kind == "axon:1":
            outs = [torch.full((3,), 7, dtype=d, device="axon:1") for d in dtypes]
            other = "axon:1"
        else:
            outs = [torch.full(() if kind == "cpu_0dim" else (3,), 7, dtype=d) for d in dtypes]
            other = "cpu"
        before = [o.cpu().clone() for o in outs]
        message = (f"Expected out tensor to have device axon:0, but got {other} instead"
                   if name in GENERATED_OUT else
                   f"{SAME_DEVICE}, axon:0 and {other}! (when checking arguments for {name})")
        with pytest.raises(RuntimeError, match=re.escape(message)):
            call(outs)
        torch.axon.synchronize()
        if name in GENERATED_OUT:
            continue  # the generated wrapper resizes out= before its check (as on CUDA)
        for o, b in zip(outs, before):
            assert o.shape == b.shape and torch.equal(o.cpu(), b), name
    # The same calls with axon:0 outputs work and match the CPU (a check that
    # the loop's calls are valid ones).
    for name, (call, dtypes) in _data_dependent_out_calls().items():
        outs = [torch.empty(0, dtype=d, device=AXON) for d in dtypes]
        call(outs)
        assert all(o.device == torch.device("axon", 0) for o in outs), name


@pytest.mark.filterwarnings("ignore")  # deprecations and out= resizes of the samples
def test_out_on_another_device_raises_every_op_db_op():
    """Every op of op_db with an out= form, on its first sample: CPU outputs
    (sized like the result, and 0-dim) and axon:1 outputs raise PyTorch's device
    error (each op's own wording) and sized CPU outputs are left untouched."""
    pytest.importorskip("expecttest", reason="op_db needs expecttest (requirements.txt pins it)")
    from torch.testing._internal.common_methods_invocations import op_db

    # torch.lu is Python: it copies the results into out= with copy_ (on CUDA too).
    copies_into_out = {"lu"}
    # linspace/logspace(Tensor start, Tensor end, out=) read their 0-dim tensor
    # arguments as numbers (.item()), so any out= device is valid, as on CUDA.
    scalar_inputs = {"linspace", "logspace"}
    failures, checked = [], 0
    for op in op_db:
        if not op.supports_out or op.name.startswith(SKIP_PREFIX) or op.name in copies_into_out:
            continue
        dtypes = op.supported_dtypes("cpu")
        dtype = torch.float32 if torch.float32 in dtypes else next(iter(dtypes))
        try:
            sample = next(iter(op.sample_inputs("cpu", dtype)))
            want = op(sample.input, *sample.args, **sample.kwargs)
        except Exception:  # noqa: BLE001  (no usable sample)
            continue
        wants = [want] if isinstance(want, torch.Tensor) else list(want) \
            if isinstance(want, (tuple, list)) else []
        if not wants or not all(isinstance(w, torch.Tensor) for w in wants):
            continue
        try:  # the out= form of this call exists (on the CPU)
            outs_c = [torch.empty_like(w) for w in wants]
            op(sample.input, *sample.args, **sample.kwargs,
               out=outs_c[0] if isinstance(want, torch.Tensor) else tuple(outs_c))
        except Exception:  # noqa: BLE001
            continue
        inp = to_device(sample.input, "axon")
        args = on_device(to_device(sample.args, "axon"), "axon")
        kw = on_device(to_device(sample.kwargs, "axon"), "axon")
        if not any(t.device.type == "axon" for t in tensors((inp, args, kw))):
            continue  # a CPU call (factories with out=)
        checked += 1
        for kind in ("cpu_sized", "cpu_0dim", "axon:1"):
            if kind == "cpu_sized":
                outs = [torch.full_like(w, 7) for w in wants]
            elif kind == "cpu_0dim":
                outs = [torch.full((), 7, dtype=w.dtype) for w in wants]
            else:
                outs = [torch.full_like(w, 7, device="axon:1") for w in wants]
            before = [o.cpu().clone() for o in outs]
            out = outs[0] if isinstance(want, torch.Tensor) else tuple(outs)
            label = f"{op.name}.{op.variant_test_name} ({kind})"
            try:
                op(inp, *args, **kw, out=out)
            except RuntimeError as e:
                if "device" not in str(e).lower():
                    failures.append(f"{label}: unexpected error {str(e).splitlines()[0][:150]}")
            else:
                if not (kind == "axon:1" and op.name in scalar_inputs):
                    failures.append(f"{label}: no error")
            torch.axon.synchronize()
            if kind != "cpu_0dim" and not all(torch.equal(o.cpu(), b) for o, b in zip(outs, before)):
                failures.append(f"{label}: out= written")
    assert checked > 300, checked
    assert not failures, f"{len(failures)} out= calls:\n" + "\n".join(failures)


# ---------------------------------------------------------------- found by PyTorch's own
# test_ops (TestCommon) on axon

@pytest.mark.parametrize("op", ["floor_divide_", "div_floor", "add_", "mul_", "atan2_",
                                "copysign_", "fmod_", "remainder_"])
def test_inplace_op_that_would_resize_self_raises_like_cpu(op):
    """An in-place op whose broadcast shape is not self's raises the CPU's error
    (axon's floor_divide_ used to resize self to [5, 5] with a warning)."""
    fn = {"floor_divide_": lambda a, b: a.floor_divide_(b),
          "div_floor": lambda a, b: a.div_(b, rounding_mode="floor"),
          "add_": lambda a, b: a.add_(b), "mul_": lambda a, b: a.mul_(b),
          "atan2_": lambda a, b: a.atan2_(b), "copysign_": lambda a, b: a.copysign_(b),
          "fmod_": lambda a, b: a.fmod_(b), "remainder_": lambda a, b: a.remainder_(b)}[op]
    a, b = make((5, 1), torch.float32), make((5,), torch.float32, low=1, high=4, seed=2)
    with pytest.raises(RuntimeError, match=re.escape("doesn't match the broadcast shape")):
        fn(a.clone(), b)
    ad = a.to("axon")
    with pytest.raises(RuntimeError, match=re.escape(
            "output with shape [5, 1] doesn't match the broadcast shape [5, 5]")):
        fn(ad, b.to("axon"))
    assert ad.shape == (5, 1)
    assert_same(ad, a)  # untouched


def test_strided_out_of_the_right_shape_keeps_its_strides():
    """out= with the result's shape but a stride keeps that stride and is written
    in place, as on the CPU (linalg_solve's Meta kernel restrided it)."""
    A = make((5, 5), torch.float32) + 5 * torch.eye(5)
    b = make((5,), torch.float32, seed=3)
    for fn in [lambda A, b, out: torch.linalg.solve(A, b, out=out),
               lambda A, b, out: torch.linalg.solve_ex(A, b, out=(out, torch.empty(
                   (), dtype=torch.int32, device=out.device)))]:
        base_c, base_a = torch.zeros(10), torch.zeros(10, device="axon")
        out_c, out_a = base_c[::2], base_a[::2]
        fn(A, b, out_c)
        fn(A.to("axon"), b.to("axon"), out_a)
        assert out_a.stride() == out_c.stride() == (2,)
        assert_same(base_a, base_c)


@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
def test_multi_margin_loss_of_a_0dim_input_is_a_scalar(reduction):
    """multi_margin_loss of a 0-dim input and target: a scalar for every
    reduction, as on the CPU (reduction='none' gave the Meta kernel's [1])."""
    x, t = torch.tensor(0.3), torch.tensor(0)
    want = F.multi_margin_loss(x, t, p=1, margin=0.5, reduction=reduction)
    got = F.multi_margin_loss(x.to("axon"), t.to("axon"), p=1, margin=0.5, reduction=reduction)
    assert got.shape == want.shape
    assert_same(got, want)


def test_conj_physical_inplace_on_complex():
    """conj_physical_ on complex axon tensors (contiguous and transposed) as on
    the CPU (it stopped at an internal DispatchStub assertion)."""
    for dtype in [torch.complex64, torch.complex128, torch.float32]:
        x = make((4, 6), dtype)
        if dtype.is_complex:
            x = x + 1j * make((4, 6), dtype, seed=5)
        for view in [lambda t: t, lambda t: t.t()]:
            want = view(x.clone()).conj_physical_()
            got = view(x.to("axon")).conj_physical_()
            assert_same(got, want)


@pytest.mark.parametrize("repeat", [3])
def test_repeated_calls_warn_and_compute_like_the_first(repeat):
    # the generic kernel reuses a Meta kernel's results for a repeated argument signature
    # (addmv's Meta kernel is a Python decomposition): every call still computes its own
    # values, and an out= resize still warns on every call, as on the CPU
    import warnings
    w, x, b = (make(s, torch.float32, seed=i) for i, s in enumerate([(3, 4), (4,), (3,)]))
    for i in range(repeat):
        xi = x * (i + 1)
        got = torch.addmv(b.axon(), w.axon(), xi.axon())
        assert_same(got, torch.addmv(b, w, xi))
        caught = {}
        for dev in ("cpu", "axon"):
            out = torch.empty(5, device=dev)
            with warnings.catch_warnings(record=True) as rec:
                warnings.simplefilter("always")
                torch.addmv(b.to(dev), w.to(dev), xi.to(dev), out=out)
            caught[dev] = [str(r.message).split(" (Triggered")[0] for r in rec]
            assert out.shape == (3,)
        # (the texts differ: axon's comes from the Python Meta kernel's resize_output)
        for dev in ("cpu", "axon"):
            assert len(caught[dev]) == 1, caught
            assert caught[dev][0].startswith("An output with one or more elements was resized")
