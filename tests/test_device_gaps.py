"""Gaps found where libraries and PyTorch APIs meet a renamed PrivateUse1 device:

- safetensors: ``load_file``/``safe_open`` with ``device="axon"``/``"axon:1"``
  (``integrations/safetensors_device.py``), and what Transformers and
  Accelerate pass to it;
- ``torch.accelerator.get_device_capability()`` (``AxonGuardImpl``) and
  ``torch.axon.get_device_capability()``;
- quantized tensors: ops that would make one on axon raise NotImplementedError
  at the call; ``fake_quantize_*`` (float results) match the CPU;
- DLPack: ``torch.from_dlpack(axon_tensor)`` (``integrations/torch_dlpack.py``);
- ``out=`` tensors on another device (a CPU 0-dim one included) raise instead of
  being written: the fallback, the data-dependent-shape ops, every ``op_db`` op.
"""

from __future__ import annotations

import re

import pytest
import torch
from torch.utils.dlpack import DLDeviceType

from conftest import AXON, assert_same, make, run_python

SAME_DEVICE = "Expected all tensors to be on the same device, but found at least two devices"


def bits(t: torch.Tensor) -> torch.Tensor:
    """The bytes of t on the CPU (bitwise comparison for every dtype)."""
    return t.cpu().contiguous().reshape(-1).view(torch.uint8)


# ------------------------------------------------------------ safetensors

SAFETENSORS_DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.int8,
                      torch.int16, torch.int32, torch.int64, torch.uint8, torch.uint16,
                      torch.uint32, torch.uint64, torch.bool, torch.complex64,
                      torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e8m0fnu,
                      torch.float8_e4m3fnuz, torch.float8_e5m2fnuz, torch.float4_e2m1fn_x2)


def _state() -> dict[str, torch.Tensor]:
    state = {}
    for dtype in SAFETENSORS_DTYPES:
        name = str(dtype).removeprefix("torch.")
        base = make((3, 5), torch.float32, seed=len(state))
        if dtype.is_complex:
            t = torch.complex(base, base.flip(0))
        elif dtype in (torch.uint16, torch.uint32, torch.uint64):
            t = (base.abs() * 10).to(torch.int64).to(dtype)
        elif dtype == torch.float4_e2m1fn_x2:  # packed pairs: raw bytes
            t = make((3, 5), torch.uint8, low=0, high=255, seed=len(state)).view(dtype)
        elif dtype == torch.bool or not dtype.is_floating_point:
            t = make((3, 5), dtype, seed=len(state))
        else:
            t = base.to(dtype)
        state[name] = t
    state["zero_size"] = torch.empty(0, 4)
    state["scalar"] = torch.tensor(2.5)
    return state


@pytest.fixture(scope="module")
def st_file(tmp_path_factory):
    from safetensors.torch import save_file

    state = _state()
    path = tmp_path_factory.mktemp("st") / "w.safetensors"
    save_file(state, str(path), metadata={"format": "pt"})
    return str(path), state


def _check_loaded(loaded, state, index):
    assert set(loaded) == set(state)
    for k, want in state.items():
        got = loaded[k]
        assert got.device == torch.device("axon", index), (k, got.device)
        assert got.dtype == want.dtype and got.shape == want.shape, k
        assert torch.equal(bits(got), bits(want)), k


@pytest.mark.parametrize("device,index", [("axon", 0), ("axon:0", 0), ("axon:1", 1),
                                          (torch.device("axon", 1), 1),
                                          (torch.device("axon"), 0)],
                         ids=["axon", "axon:0", "axon:1", "device(axon,1)", "device(axon)"])
def test_safetensors_load_file_on_axon_every_dtype(st_file, device, index):
    from safetensors.torch import load_file

    path, state = st_file
    _check_loaded(load_file(path, device=device), state, index)


def test_safetensors_axon_without_index_is_the_current_device(st_file):
    """"axon" means the current device, as in tensor.to("axon")."""
    from safetensors.torch import load_file

    path, state = st_file
    with torch.axon.device(1):
        _check_loaded(load_file(path, device="axon"), state, 1)


@pytest.mark.parametrize("backend", ["mmap", "pread"])
def test_safetensors_safe_open_on_axon(st_file, backend):
    import safetensors

    path, state = st_file
    with safetensors.safe_open(path, framework="pt", device="axon:1", backend=backend) as f:
        assert isinstance(f, safetensors.safe_open)
        assert sorted(f.keys()) == sorted(state) and f.metadata() == {"format": "pt"}
        t = f.get_tensor("float32")
        assert t.device == torch.device("axon", 1) and torch.equal(t.cpu(), state["float32"])
        sl = f.get_slice("bfloat16")
        part = sl[1:, ::2]
        assert sl.get_shape() == [3, 5] and sl.get_dtype() == "BF16"
        assert part.device == torch.device("axon", 1)
        assert torch.equal(part.cpu(), state["bfloat16"][1:, ::2])
        # safetensors 0.8.0's pread path mis-shapes packed float4 (on the CPU too).
        skip = {"float4_e2m1fn_x2"} if backend == "pread" else set()
        want = {k: v for k, v in state.items() if k not in skip}
        got = {k: f.get_tensor(k) for k in want} if skip else f.get_tensors()
        _check_loaded(got, want, 1)


def test_safetensors_other_devices_unchanged(st_file):
    """Anything that names no axon device goes to safetensors as before."""
    import safetensors
    from safetensors.torch import load_file

    path, state = st_file
    assert load_file(path)["float32"].device.type == "cpu"
    assert load_file(path, device="cpu")["float32"].device.type == "cpu"
    assert load_file(path, device=1)["float32"].device == torch.device("axon", 1)
    with pytest.raises(safetensors.SafetensorError, match="device axonx is invalid"):
        load_file(path, device="axonx")
    with pytest.raises(RuntimeError, match=r"Invalid device index: axon:99; the device count is"):
        load_file(path, device="axon:99")


def test_safetensors_when_integers_name_another_accelerator(st_file, monkeypatch):
    """In a process whose current accelerator is not axon (integers would mean
    it), the file is opened on the CPU and each tensor is moved to axon."""
    import safetensors
    from safetensors.torch import load_file

    from torch_axon.integrations import safetensors_device

    monkeypatch.setattr(safetensors_device, "_integer_is_axon", lambda index: False)
    path, state = st_file
    _check_loaded(load_file(path, device="axon:1"), state, 1)
    with safetensors.safe_open(path, framework="pt", device="axon:1") as f:
        assert sorted(f.keys()) == sorted(state)
        part = f.get_slice("float16")[:2]
        assert part.device == torch.device("axon", 1)
        assert torch.equal(part.cpu(), state["float16"][:2])


def test_safetensors_patch_idempotent_and_first_import(tmp_path):
    """Applying the patch twice wraps once; `from safetensors.torch import
    load_file` as a script's first line (torch loads inside safetensors.torch)
    loads on axon."""
    import safetensors

    from torch_axon.integrations import safetensors_device

    before = safetensors.safe_open
    safetensors_device.safe_open_axon_device(safetensors)
    assert safetensors.safe_open is before
    import safetensors.torch as st_torch
    assert st_torch.safe_open is before and before._axon_original.__name__ == "safe_open"

    path = tmp_path / "a.safetensors"
    r = run_python(f"""
        from safetensors.torch import load_file, save_file
        import torch
        save_file({{"w": torch.arange(6.).view(2, 3)}}, {str(path)!r})
        t = load_file({str(path)!r}, device="axon:1")["w"]
        assert t.device == torch.device("axon", 1), t.device
        assert torch.equal(t.cpu(), torch.arange(6.).view(2, 3))
        print("ok")
    """)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr


def test_accelerate_load_state_dict_on_axon(st_file):
    """Accelerate's load_state_dict (load_checkpoint_in_model) hands the
    device_map's device string to safetensors' load_file: "axon" used to fail."""
    from accelerate.utils.modeling import load_state_dict

    path, state = st_file
    _check_loaded(load_state_dict(path, device_map={"": "axon"}), state, 0)
    loaded = load_state_dict(path, device_map={"float32": "axon:1", "int8": "cpu"})
    assert loaded["float32"].device == torch.device("axon", 1)
    assert loaded["int8"].device.type == "cpu" and torch.equal(loaded["int8"], state["int8"])


def test_transformers_from_pretrained_device_map_axon(tmp_path, monkeypatch):
    """from_pretrained(device_map="axon") opens the checkpoint with
    safe_open(device="cpu") (Transformers 5.24, modeling_utils; "mps" with
    backend="pread" on MPS) and moves each weight to the device_map's device:
    the weights land on axon equal to the saved ones."""
    import transformers.modeling_utils as mu
    from conftest import tiny_causal_lm
    from transformers import AutoModelForCausalLM

    model = tiny_causal_lm("llama")
    model.save_pretrained(tmp_path)
    seen = []
    real = mu.safe_open

    def spy(*args, **kwargs):
        seen.append((args[2] if len(args) > 2 else kwargs.get("device"), kwargs.get("backend")))
        return real(*args, **kwargs)

    monkeypatch.setattr(mu, "safe_open", spy)
    for device_map, index in (("axon", 0), ("axon:1", 1)):
        loaded = AutoModelForCausalLM.from_pretrained(tmp_path, device_map=device_map)
        want = model.state_dict()
        for name, p in loaded.state_dict().items():
            assert p.device == torch.device("axon", index), name
            assert torch.equal(p.cpu(), want[name]), name
    assert seen and all(s == ("cpu", "mmap") for s in seen), seen


# ------------------------------------------------------------ device capability

AXON_CAPABILITY = {
    torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16, torch.float32,
    torch.float64, torch.complex32, torch.complex64, torch.complex128, torch.bool, torch.bfloat16,
    torch.float8_e5m2, torch.float8_e4m3fn, torch.float8_e5m2fnuz, torch.float8_e4m3fnuz,
    torch.float8_e8m0fnu, torch.uint16, torch.uint32, torch.uint64,
}


@pytest.mark.parametrize("device", [None, 0, 1, "axon", "axon:1", torch.device("axon", 1)],
                         ids=str)
def test_accelerator_device_capability(device):
    cap = (torch.accelerator.get_device_capability() if device is None
           else torch.accelerator.get_device_capability(device))
    assert set(cap) == {"supported_dtypes"}
    assert cap["supported_dtypes"] == AXON_CAPABILITY


@pytest.mark.filterwarnings("ignore:ComplexHalf support is experimental")
@pytest.mark.filterwarnings("ignore:Casting complex values to real")
def test_device_capability_contract_allocation_and_conversion():
    """The contract: tensors of every reported dtype can be allocated on axon
    and converted between each other there (bit-identical to the CPU, or the
    same error); the dtypes left out cannot be allocated on axon."""
    values = torch.tensor([0.0, 1.0, 2.0, 0.5, 3.0, 4.0, -0.0])
    dtypes = sorted(torch.accelerator.get_device_capability()["supported_dtypes"], key=str)
    for src in dtypes:
        cpu = values.to(src)
        ax = cpu.to(AXON)
        assert torch.equal(bits(ax), bits(cpu)), src
        assert torch.empty(2, 3, dtype=src, device=AXON).dtype == src
        for dst in dtypes:
            try:
                want = cpu.to(dst)
            except Exception as e:  # noqa: BLE001
                with pytest.raises(type(e)):
                    ax.to(dst)
                continue
            got = ax.to(dst)
            assert got.device.type == "axon" and torch.equal(bits(got), bits(want)), (src, dst)
    for left_out in (torch.quint8, torch.qint8, torch.qint32):
        with pytest.raises(NotImplementedError, match="Quantizedaxon"):
            torch.empty(2, dtype=left_out, device=AXON)


def test_device_capability_errors():
    with pytest.raises(RuntimeError, match=r"Invalid device index: axon:99; the device count is \d+"):
        torch.accelerator.get_device_capability(99)
    with pytest.raises(ValueError, match="cpu doesn't match the current accelerator axon"):
        torch.accelerator.get_device_capability("cpu")


def test_axon_get_device_capability_mirrors_cuda():
    """torch.cuda.get_device_capability(device=None) -> (major, minor) of the
    device's properties; torch.axon's does the same."""
    props = torch.axon.get_device_properties(1)
    for device in (1, "axon:1", torch.device("axon", 1)):
        cap = torch.axon.get_device_capability(device)
        assert isinstance(cap, tuple) and cap == (props.major, props.minor)
    with torch.axon.device(1):
        assert torch.axon.get_device_capability() == (props.major, props.minor)
    with pytest.raises(ValueError, match="Expected an axon device, but got: cpu"):
        torch.axon.get_device_capability("cpu")


# ------------------------------------------------------------ quantized tensors

def _quantizing_calls():
    t = make((2, 3), torch.float32).to(AXON)
    i8 = make((2, 3), torch.int8).to(AXON)
    scales = torch.tensor([0.1, 0.2], device=AXON)
    zps = torch.tensor([0, 1], device=AXON)
    return {
        "quantize_per_tensor": (lambda: torch.quantize_per_tensor(t, 0.1, 0, torch.quint8),
                                "quint8"),
        "quantize_per_tensor.tensor_qparams": (
            lambda: torch.quantize_per_tensor(t, torch.tensor(0.1, device=AXON),
                                              torch.tensor(0, device=AXON), torch.qint8), "qint8"),
        "quantize_per_tensor.tensors": (
            lambda: torch.quantize_per_tensor([t, t], torch.tensor([0.1, 0.2], device=AXON),
                                              torch.tensor([0, 0], device=AXON), torch.qint32),
            "qint32"),
        "quantize_per_tensor_dynamic": (
            lambda: torch.quantize_per_tensor_dynamic(t, torch.quint8, False), "quint8"),
        "quantize_per_channel": (
            lambda: torch.quantize_per_channel(t, scales, zps, 0, torch.quint8), "quint8"),
        "_make_per_tensor_quantized_tensor": (
            lambda: torch._make_per_tensor_quantized_tensor(i8, 0.1, 0), "qint8"),
        "_make_per_channel_quantized_tensor": (
            lambda: torch._make_per_channel_quantized_tensor(i8, scales.double(), zps, 0),
            "qint8"),
    }


@pytest.mark.filterwarnings("ignore:.*quantized tensor creation functions.*deprecated")
def test_quantizing_ops_raise_at_the_call():
    """Ops that take dense axon tensors and return quantized ones used to return
    a half-built tensor (dtype quint8, is_quantized False, unprintable)."""
    for name, (call, dtype) in _quantizing_calls().items():
        with pytest.raises(NotImplementedError,
                           match=re.escape(f"Could not run 'aten::{name}' on axon: it makes a "
                                           f"quantized tensor (torch.{dtype}), and axon has no "
                                           "quantized tensors")):
            call()
    torch.axon.synchronize()


@pytest.mark.filterwarnings("ignore:.*quantized tensor creation functions.*deprecated")
def test_quantized_factories_and_copies_raise():
    """Factories dispatched on a quantized dtype, and moving a CPU quantized
    tensor to axon, stop at the dispatcher (as for CUDA's missing quantized
    kernels: "Could not run ... 'QuantizedCUDA' backend")."""
    q = torch.quantize_per_tensor(torch.randn(4), 0.1, 0, torch.quint8)
    calls = {
        "_empty_affine_quantized": lambda: torch._empty_affine_quantized(
            (3,), scale=0.1, zero_point=0, dtype=torch.quint8, device=AXON),
        "_empty_per_channel_affine_quantized": lambda: torch._empty_per_channel_affine_quantized(
            (3,), scales=torch.ones(3, device=AXON),
            zero_points=torch.zeros(3, dtype=torch.long, device=AXON), axis=0,
            dtype=torch.quint8, device=AXON),
        "empty.memory_format": lambda: torch.zeros(3, dtype=torch.qint8, device=AXON),
        "empty_strided": lambda: make((3,), torch.float32).to(AXON).to(torch.quint8),
        "empty_quantized": lambda: q.to(AXON),
        "_copy_from": lambda: torch.empty(4, device=AXON).copy_(q),
    }
    for name, call in calls.items():
        with pytest.raises(NotImplementedError,
                           match=re.escape(f"Could not run 'aten::{name}' with arguments from "
                                           "the 'Quantizedaxon' backend")):
            call()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("layout", ["contiguous", "transposed"])
def test_fake_quantize_matches_cpu(dtype, layout):
    """fake_quantize_* return float tensors: forward and backward as on the CPU."""
    base = make((6, 4), torch.float32, low=-2, high=2)
    x = base.t() if layout == "transposed" else base  # channels along dim 0
    scale = torch.tensor([0.05, 0.1, 0.02, 0.2] if layout == "transposed" else
                         [0.05, 0.1, 0.02, 0.2, 0.07, 0.03])
    zp = torch.tensor([0, 3, -2, 1] if layout == "transposed" else [0, 3, -2, 1, 0, 5],
                      dtype=torch.int32)

    def run(device):
        xi = x.detach().to(device=device, dtype=dtype, copy=True).requires_grad_()
        s, z = scale.to(device), zp.to(device)
        outs = [
            torch.fake_quantize_per_tensor_affine(xi, 0.05, 3, -128, 127),
            torch.fake_quantize_per_tensor_affine(xi, s[:1].clone(), z[:1].clone(), 0, 255),
        ]
        if dtype == torch.float32:  # the per-channel kernels take float32 only
            outs.append(torch.fake_quantize_per_channel_affine(xi, s, z, 0, -128, 127))
            sl = s[:1].clone().requires_grad_()
            zl = z[:1].float().requires_grad_()
            outs.append(torch._fake_quantize_learnable_per_tensor_affine(xi, sl, zl, 0, 255, 1.0))
        sum(o.float().sum() * (i + 1) for i, o in enumerate(outs)).backward()
        return [o.detach() for o in outs] + [xi.grad]

    want = run("cpu")
    got = run(AXON)
    for g, w in zip(got, want):
        assert_same(g, w, dtype=dtype)
    # Zero-size input.
    e = torch.fake_quantize_per_tensor_affine(torch.empty(0, 3, device=AXON), 0.1, 0, 0, 255)
    assert e.shape == (0, 3) and e.device.type == "axon"


def test_fake_quantize_modules_match_cpu():
    """torch.ao.quantization's FakeQuantize (observer + fake_quantize) and
    FusedMovingAvgObsFakeQuantize (fused_moving_avg_obs_fake_quant, which
    updates its statistics in place) on axon, against the CPU."""
    from torch.ao.quantization import FakeQuantize, FusedMovingAvgObsFakeQuantize

    for cls in (FakeQuantize, FusedMovingAvgObsFakeQuantize):
        torch.manual_seed(0)
        cpu = cls()
        ax = cls().to(AXON)
        for step in range(3):
            x = make((8, 5), torch.float32, low=-1 - step, high=2 + step, seed=step)
            want = cpu(x)
            got = ax(x.to(AXON))
            assert_same(got, want)
        for name, buf in cpu.state_dict().items():
            assert_same(ax.state_dict()[name], buf)


# ------------------------------------------------------------ DLPack

@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.int64,
                                   torch.bool], ids=str)
@pytest.mark.parametrize("index", [0, 1])
def test_from_dlpack_axon_roundtrip(dtype, index):
    """torch.from_dlpack(axon_tensor): the protocol path (__dlpack_device__,
    then __dlpack__) gives an axon tensor on the same device sharing memory."""
    device = torch.device("axon", index)
    base = make((5, 6), dtype).to(device)
    for t in (base, base[1:, ::2], base.t(), base[:0]):
        assert t.__dlpack_device__() == (DLDeviceType.kDLExtDev, index)
        u = torch.from_dlpack(t)
        assert u.device == device and u.dtype == dtype and u.shape == t.shape
        assert u.stride() == t.stride() or t.numel() == 0
        assert torch.equal(u.cpu(), t.cpu())
        if t.numel():
            assert u.data_ptr() == t.data_ptr()
    # Memory is shared: a write through the consumer's tensor shows in the producer's.
    if dtype != torch.bool:
        u = torch.from_dlpack(base)
        u[0, 0] = 7
        assert base[0, 0].item() == 7


def test_from_dlpack_ordering_and_devices():
    """Pending stream work is seen by the consumer (same stream), cross-device
    targets copy, and a CPU tensor's answer is upstream's."""
    x = torch.randn(256, 256, device=AXON)
    y = x @ x  # enqueued, maybe not run yet
    u = torch.from_dlpack(y)
    assert_same(u, (x.cpu() @ x.cpu()), accum=True)
    on_cpu = torch.from_dlpack(y, device="cpu")
    assert on_cpu.device.type == "cpu" and torch.equal(on_cpu, y.cpu())
    on_1 = torch.from_dlpack(y, device="axon:1")
    assert on_1.device == torch.device("axon", 1) and torch.equal(on_1.cpu(), y.cpu())
    copied = torch.from_dlpack(y, copy=True)
    assert copied.device == y.device and copied.data_ptr() != y.data_ptr()
    assert torch.equal(copied.cpu(), y.cpu())
    from_cpu = torch.from_dlpack(torch.arange(3.), device="axon")
    assert from_cpu.device.type == "axon" and torch.equal(from_cpu.cpu(), torch.arange(3.))
    assert torch.arange(3.).__dlpack_device__() == (DLDeviceType.kDLCPU, 0)
    # The capsule path worked before the patch and still does.
    v = torch.utils.dlpack.from_dlpack(y.__dlpack__())
    assert v.device == y.device and v.data_ptr() == y.data_ptr()


def test_dlpack_errors_and_foreign_consumers():
    t = torch.ones(3, device=AXON, requires_grad=True)
    with pytest.raises(BufferError, match="Can't export tensors that require gradient"):
        torch.from_dlpack(t)
    # A consumer that only reads host memory sees an extension device (kDLExtDev)
    # and refuses it, as it should: it cannot know axon memory is host-addressable.
    np = pytest.importorskip("numpy")
    with pytest.raises((RuntimeError, BufferError, ValueError)):
        np.from_dlpack(t.detach())


def test_dlpack_patch_idempotent():
    import torch._tensor

    from torch_axon.integrations import torch_dlpack

    before = torch.Tensor.__dlpack_device__
    torch_dlpack.tensor_dlpack_device(torch._tensor)
    assert torch.Tensor.__dlpack_device__ is before and before._axon_patch


# ------------------------------------------------------------ out= on another device

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
    from test_opinfo import SKIP_PREFIX, on_device, tensors, to_device

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
