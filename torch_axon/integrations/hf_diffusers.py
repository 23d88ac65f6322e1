"""Diffusers: tensor parallelism over an axon DeviceMesh.

Diffusers shards a model's ``_tp_plan`` (``FluxTransformer2DModel``,
``QwenImageTransformer2DModel``, ...) with PyTorch's own
``torch.distributed.tensor.parallel.parallelize_module`` (``ColwiseParallel``,
``RowwiseParallel``, DTensor), which runs on any device with a c10d backend;
torch_axon registers the backend ``"axon"`` for axon tensors.  Only Diffusers'
device allow-list refuses the device.
"""

from __future__ import annotations

from ._hooks import on_import


@on_import("diffusers.hooks.tensor_parallel")
def tensor_parallel_devices(tensor_parallel) -> None:
    """Patch ``diffusers.hooks.tensor_parallel._SUPPORTED_TP_DEVICES``.

    ``apply_tensor_parallel`` (reached from ``ModelMixin.enable_parallelism(
    config=TensorParallelConfig(...))`` and ``from_pretrained(...,
    parallel_config=TensorParallelConfig(...))``) checks the mesh's device type
    against the hard-coded tuple ``("cuda", "neuron", "tpu", "xpu")`` and raised
    "Tensor parallelism is not supported on device type 'axon'" for an axon
    mesh, although everything after the check (``parallelize_module`` with the
    ``"default"`` backend, or the streaming load's ``DTensor.from_local``) is
    device-generic.  The patch adds ``"axon"`` to the tuple; the function reads
    the module global at call time, so nothing else changes.  It is a no-op
    when ``"axon"`` is already listed or the list is gone.  The generic
    upstream fix: accept any device type whose torch.distributed backend
    supports the collectives (``torch.distributed.Backend.
    default_device_backend_map`` has an entry for it), keeping a list only of
    device types with a dedicated code path (``neuron``).
    """
    devices = getattr(tensor_parallel, "_SUPPORTED_TP_DEVICES", None)
    if devices is None or "axon" in devices:
        return
    # (tuple upstream; a list or set would keep its type)
    tensor_parallel._SUPPORTED_TP_DEVICES = type(devices)((*devices, "axon"))
    tensor_parallel._axon_patch = True
