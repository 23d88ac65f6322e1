"""Factory functions on axon against the CPU: zeros/ones/full/arange/linspace/
eye/tensor and the *_like and new_* forms, on the current device or another
one, keeping dtype, device and layout; the efficient zero tensor.
"""

from __future__ import annotations

import re

import pytest
import torch

from conftest import FLOAT_DTYPES, assert_same
from op_util import compare


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


def test_arange_checks_and_sizes_match_the_cpu():
    """arange's argument checks and result size are axon's own code before the launch:
    over starts, ends, steps (zero, of the wrong sign, fractional for integer outputs)
    and output dtypes, axon raises what the CPU raises (type and message) or returns
    the CPU's values."""
    import itertools

    dtypes = [None, torch.int8, torch.uint8, torch.int32, torch.int64, torch.float16,
              torch.bfloat16, torch.float32, torch.float64, torch.uint16]
    for start, end, step, dtype in itertools.product(
            [0, -1, 2.5, 0.3], [10, 7.9, -7.9, 0.3], [1, -1, 0.5, 0.3, -0.7, 0, 0.0], dtypes):
        results = []
        for device in ("cpu", "axon"):
            try:
                results.append(torch.arange(start, end, step, dtype=dtype, device=device).cpu())
            except Exception as e:  # noqa: BLE001 - the error is the result
                results.append((type(e), str(e).splitlines()[0]))
        cpu, axon = results
        case = (start, end, step, dtype)
        if isinstance(cpu, torch.Tensor):
            assert isinstance(axon, torch.Tensor), (case, axon)
            assert axon.dtype == cpu.dtype and torch.equal(axon, cpu), (case, axon, cpu)
        else:
            assert axon == cpu, case


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


@pytest.mark.parametrize("factory", [
    lambda **kw: torch.empty(3, **kw), lambda **kw: torch.zeros(2, 3, **kw),
    lambda **kw: torch.empty_strided((2, 3), (1, 2), **kw), lambda **kw: torch.ones(4, **kw),
    lambda **kw: torch.full((2,), 1.5, **kw), lambda **kw: torch.arange(3.0, **kw)])
def test_pin_memory_on_axon_is_an_error_as_on_cuda(factory):
    # as CUDA's factories: device memory cannot be pinned
    with pytest.raises(RuntimeError, match="Only dense CPU tensors can be pinned"):
        factory(device="axon", pin_memory=True)
    assert factory(device="axon", pin_memory=False).device.type == "axon"
    assert factory(pin_memory=True).is_pinned()


def test_efficient_zero_tensor():
    z = torch._efficientzerotensor(3, device="axon")
    assert_same(z + 1, torch._efficientzerotensor(3) + 1)
    assert_same(z.clone(), torch.zeros(3))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int32, torch.uint8,
                                   torch.bool, torch.complex64])
def test_deterministic_mode_fills_uninitialized_memory_like_cpu(dtype):
    """torch.use_deterministic_algorithms(True) (fill_uninitialized_memory on by default):
    empty, empty_strided, empty_like and the new part of a resize_ are NaN (integers:
    their maximum), as on the CPU, even when the cache hands back a used block."""
    stale = torch.ones(64, device="axon", dtype=dtype)  # a block with old values, freed
    del stale
    torch.use_deterministic_algorithms(True)
    try:
        made = {
            "empty": lambda d: torch.empty(3, 4, device=d, dtype=dtype),
            "empty_strided": lambda d: torch.empty_strided((2, 3), (1, 2), device=d, dtype=dtype),
            "empty_like": lambda d: torch.empty_like(torch.zeros(5, device=d, dtype=dtype)),
            "resize_": lambda d: torch.zeros(2, device=d, dtype=dtype).resize_(6),
        }
        for name, make_it in made.items():
            a, c = make_it("axon").cpu(), make_it("cpu")
            assert a.stride() == c.stride(), name
            torch.testing.assert_close(a, c, equal_nan=True, atol=0, rtol=0, msg=name)
    finally:
        torch.use_deterministic_algorithms(False)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64, torch.int64],
                         ids=str)
@pytest.mark.parametrize("out_kind", ["narrow_view", "contiguous_2x2", "transposed",
                                      "wrong_numel", "exact"])
@pytest.mark.parametrize("factory", ["linspace", "logspace", "arange", "range", "eye"])
def test_factory_out_keeps_what_the_cpu_keeps(factory, out_kind, dtype):
    """out= of the range factories: an out with the right number of elements
    keeps its shape and strides and is filled in index order (linspace/logspace
    on axon used to resize it to [steps], writing outside a view); others are
    resized as on the CPU.  The out's base is compared whole."""
    import warnings

    calls = {
        "linspace": lambda out: torch.linspace(0, 3, 4, out=out),
        "logspace": lambda out: torch.logspace(0, 3, 4, out=out),
        "arange": lambda out: torch.arange(0, 4, out=out),
        "range": lambda out: torch.range(0, 3, out=out),
        "eye": lambda out: torch.eye(2, out=out),
    }

    def run(device):
        base = torch.full((2, 3), -1, dtype=dtype, device=device)
        out = {"narrow_view": lambda: base.narrow(1, 1, 2),
               "contiguous_2x2": lambda: base.view(-1)[:4].view(2, 2),
               "transposed": lambda: base[:, :2].t(),
               "wrong_numel": lambda: torch.empty(3, dtype=dtype, device=device),
               "exact": lambda: torch.empty(4, dtype=dtype, device=device)}[out_kind]()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            result = calls[factory](out)
        return base, out, result

    base_c, out_c, res_c = run("cpu")
    base_a, out_a, res_a = run("axon")
    assert res_a is out_a
    assert (out_a.shape, out_a.stride()) == (out_c.shape, out_c.stride())
    assert_same(out_a, out_c)
    assert_same(base_a, base_c)


@pytest.mark.parametrize("fn", ["arange", "fftfreq", "rfftfreq"])
@pytest.mark.parametrize("out_shape", [(), (0,), (7,), (3, 2)])
def test_range_out_resize_warns_like_cpu(fn, out_shape):
    # an out= with elements but the wrong count is resized with the CPU's warning (an
    # empty one silently); values and shapes match
    import warnings
    call = {"arange": lambda out: torch.arange(7, out=out),
            "fftfreq": lambda out: torch.fft.fftfreq(10, d=0.5, out=out),
            "rfftfreq": lambda out: torch.fft.rfftfreq(10, d=0.5, out=out)}[fn]
    results = {}
    for dev in ("cpu", "axon"):
        out = torch.empty(out_shape, device=dev)
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            call(out)
        results[dev] = (out.cpu(), sorted(re.sub(r" \(Triggered internally at .*\)$", "",
                                                 str(x.message)) for x in w))
    assert results["axon"][1] == results["cpu"][1]
    torch.testing.assert_close(results["axon"][0], results["cpu"][0], atol=0, rtol=0)
