"""DLPack with axon tensors: ``torch.from_dlpack(axon_tensor)``
(``integrations/torch_dlpack.py``), round trips on every device, stream
ordering, errors and foreign consumers, the patch's idempotence.
"""

from __future__ import annotations

import pytest
import torch
from torch.utils.dlpack import DLDeviceType

from conftest import AXON, assert_same, make


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
