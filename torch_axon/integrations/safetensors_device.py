"""safetensors: load straight onto axon (``device="axon"``, ``"axon:1"``)."""

from __future__ import annotations

import torch

from ._hooks import on_import
from ._tools import replace_function


def _axon_index(device) -> int | None:
    """The axon device index that ``device`` names, or None if it names no axon
    device (None, an int, "cpu", "cuda:0", ... are safetensors' business)."""
    if isinstance(device, str):
        if device != "axon" and not device.startswith("axon:"):
            return None
        device = torch.device(device)
    if not isinstance(device, torch.device) or device.type != "axon":
        return None
    index = device.index if device.index is not None else torch.axon.current_device()
    torch.axon.get_device_properties(index)  # raises for an index out of range
    return index


def _integer_is_axon(index: int) -> bool:
    """safetensors hands an integer device to ``tensor.to(index)``, which torch
    resolves to the current accelerator: axon unless another one (CUDA) is."""
    return torch.device(index) == torch.device("axon", index)


class _SafeOpenType(type):
    def __instancecheck__(cls, obj):
        return isinstance(obj, cls._axon_original)

    def __subclasscheck__(cls, sub):
        return issubclass(sub, cls._axon_original)


class _MovingSafeOpen:
    """A ``safe_open`` on the CPU whose tensors are moved to ``device`` (used
    only when integers do not mean axon in this process)."""

    def __init__(self, handle, device: torch.device):
        self._handle = handle
        self._device = device

    def __enter__(self):
        self._handle.__enter__()
        return self

    def __exit__(self, *exc):
        return self._handle.__exit__(*exc)

    def get_tensor(self, name):
        return self._handle.get_tensor(name).to(self._device)

    def get_tensors(self):
        return {k: v.to(self._device) for k, v in self._handle.get_tensors().items()}

    def get_slice(self, name):
        return _MovingSlice(self._handle.get_slice(name), self._device)

    def __getattr__(self, name):  # keys, metadata, offset_keys, ...
        return getattr(self._handle, name)


class _MovingSlice:
    def __init__(self, sl, device: torch.device):
        self._slice = sl
        self._device = device

    def __getitem__(self, index):
        return self._slice[index].to(self._device)

    def __getattr__(self, name):  # get_shape, get_dtype
        return getattr(self._slice, name)


def _make_safe_open(original):
    class safe_open(metaclass=_SafeOpenType):  # noqa: N801 (safetensors' name)
        __doc__ = original.__doc__
        _axon_original = original
        _axon_patch = True

        def __new__(cls, filename, framework, device="cpu", *args, **kwargs):
            index = _axon_index(device)
            if index is None:
                return original(filename, framework, device, *args, **kwargs)
            if _integer_is_axon(index):
                return original(filename, framework, index, *args, **kwargs)
            handle = original(filename, framework, "cpu", *args, **kwargs)
            return _MovingSafeOpen(handle, torch.device("axon", index))

    safe_open.__module__ = getattr(original, "__module__", "safetensors")
    safe_open.__qualname__ = "safe_open"
    return safe_open


@on_import("safetensors")
def safe_open_axon_device(safetensors) -> None:
    """Patch ``safetensors.safe_open`` (and so ``safetensors.torch.load_file``,
    ``load_model``, Accelerate's ``load_state_dict``, Diffusers' loaders).

    The Rust side (bindings/python/src/lib.rs, ``impl FromPyObject for
    Device``) parses a device string from a fixed set (cpu, cuda, mps, npu,
    xpu, xla, mlu, hpu, musa, with ``:index``) and raises "device axon is
    invalid" for anything else, including ``torch.device`` objects; an integer
    passes as an "anonymous" device that it hands to ``tensor.to(index)``, which
    torch resolves to the current accelerator.  The wrapper turns ``"axon"``,
    ``"axon:i"`` and ``torch.device("axon", i)`` into that integer (the current
    device for ``"axon"``, as ``tensor.to("axon")`` does), so the Rust loader
    places every tensor on ``axon:i`` itself; in a process whose current
    accelerator is another device it opens on the CPU and moves each tensor.
    Every other device value goes to safetensors unchanged, so once the Rust
    side accepts any torch device string this changes nothing.  ``safe_open``
    stays usable with ``isinstance``; modules that imported it already
    (``safetensors.torch``, Accelerate, Transformers) get the wrapper too.
    """
    original = safetensors.safe_open
    if getattr(original, "_axon_patch", False):
        return
    replace_function(safetensors, "safe_open", _make_safe_open(original))
