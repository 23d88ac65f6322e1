"""The device's capability: ``torch.accelerator.get_device_capability()``
(``AxonGuardImpl``) and ``torch.axon.get_device_capability()``: the dtypes it
lists allocate and convert, bad devices raise, the same shape as CUDA's.
"""

from __future__ import annotations

import pytest
import torch

from conftest import AXON, bits


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
        with pytest.raises(NotImplementedError, match="axon has no quantized tensors"):
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
