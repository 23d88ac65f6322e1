"""torch.axon's legacy per-dtype storage classes (torch.axon.FloatStorage, ...),
as torch.cuda has them: ``tensor.storage_type()`` of an axon tensor returns one
(TypedStorage looks them up on the PrivateUse1 module), and
``torch.axon.FloatStorage(n)`` makes a typed storage on the current axon device.
Like torch.cuda's, they are deprecated with TypedStorage itself."""

from __future__ import annotations

import torch
from torch._utils import classproperty
from torch.storage import _LegacyStorage, _warn_typed_storage_removal

_DTYPES = {
    "ByteStorage": torch.uint8, "DoubleStorage": torch.double, "FloatStorage": torch.float,
    "HalfStorage": torch.half, "LongStorage": torch.long, "IntStorage": torch.int,
    "ShortStorage": torch.short, "CharStorage": torch.int8, "BoolStorage": torch.bool,
    "BFloat16Storage": torch.bfloat16, "ComplexDoubleStorage": torch.cdouble,
    "ComplexFloatStorage": torch.cfloat,
}

__all__ = list(_DTYPES)


class _AxonLegacyStorage(_LegacyStorage):
    @classmethod
    def from_buffer(cls, *args, **kwargs):
        _warn_typed_storage_removal()
        raise RuntimeError("from_buffer: Not available for axon storage")

    @classmethod
    def _new_with_weak_ptr(cls, *args, **kwargs):
        raise RuntimeError("_new_with_weak_ptr: Not available for axon storage")

    @classmethod
    def _new_shared_filename(cls, manager, obj, size, *, device=None, dtype=None):
        raise RuntimeError("_new_shared_filename: Not available for axon storage")


def _make(name: str, dtype: torch.dtype) -> type:
    def _dtype(cls):
        return dtype

    def _public_dtype(cls):
        _warn_typed_storage_removal()
        return dtype

    # The module's last part names the device (torch.storage._get_device_from_module).
    return type(name, (_AxonLegacyStorage,), {
        "__module__": "torch_axon.axon", "__qualname__": name,
        "_dtype": classproperty(_dtype), "dtype": classproperty(_public_dtype)})


for _name, _dtype_value in _DTYPES.items():
    globals()[_name] = _make(_name, _dtype_value)
    torch._storage_classes.add(globals()[_name])
del _name, _dtype_value
