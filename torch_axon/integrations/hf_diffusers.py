"""Diffusers: tensor parallelism over an axon DeviceMesh; a pipeline's offloading checks.

Diffusers shards a model's ``_tp_plan`` (``FluxTransformer2DModel``,
``QwenImageTransformer2DModel``, ...) with PyTorch's own
``torch.distributed.tensor.parallel.parallelize_module`` (``ColwiseParallel``,
``RowwiseParallel``, DTensor), which runs on any device with a c10d backend;
torch_axon registers the backend ``"axon"`` for axon tensors.  Only Diffusers'
device allow-list refuses the device.

``DiffusionPipeline.to`` / ``ModularPipeline.to`` check offloading only for
``["cuda", "xpu"]``: the wrappers below run the same checks for axon.
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


_SEQUENTIAL_TO_GPU = (
    "It seems like you have activated sequential model offloading by calling "
    "`enable_sequential_cpu_offload`, but are now attempting to move the pipeline to GPU. This "
    "is not compatible with offloading. Please, move your pipeline `.to('cpu')` or consider "
    "removing the move altogether if you use sequential offloading.")


def _to_device_type(args, kwargs):
    """The device type a pipeline's ``.to(*args, **kwargs)`` moves to (as upstream parses it)."""
    import torch

    device = kwargs.get("device")
    if device is None and args and args[0] is not None and not isinstance(args[0], torch.dtype):
        device = args[0]
    try:
        return torch.device(device).type if device is not None else None
    except (RuntimeError, TypeError):
        return None  # upstream's own parsing raises its error


def _offload_checks_for_axon(module, cls_name: str) -> None:
    """Wrap ``cls.to``: to axon, the offloading checks upstream runs for cuda and xpu."""
    cls = getattr(module, cls_name, None)
    original = getattr(cls, "to", None)
    if original is None or getattr(original, "_axon_patch", False):
        return
    import functools

    @functools.wraps(original)
    def to(self, *args, **kwargs):
        if _to_device_type(args, kwargs) == "axon":
            _check_offloading(self, module)
        return original(self, *args, **kwargs)

    to._axon_patch = True
    cls.to = to


def _check_offloading(pipe, module) -> None:
    try:
        from accelerate.hooks import AlignDevicesHook, CpuOffload
    except ImportError:
        return
    components = [m for m in getattr(pipe, "components", {}).values()
                  if hasattr(m, "_hf_hook")]

    def sequential(m):
        hook = m._hf_hook
        return isinstance(hook, AlignDevicesHook) or (
            bool(getattr(hook, "hooks", None)) and isinstance(hook.hooks[0], AlignDevicesHook))

    def bnb(m):
        from diffusers.pipelines.pipeline_utils import _check_bnb_status

        return any(_check_bnb_status(m))

    if any(sequential(m) for m in components) and not any(bnb(m) for m in components):
        raise ValueError(_SEQUENTIAL_TO_GPU)
    if any(isinstance(m._hf_hook, CpuOffload) for m in components):
        module.logger.warning(
            "It seems like you have activated model offloading by calling "
            "`enable_model_cpu_offload`, but are now manually moving the pipeline to GPU. It is "
            "strongly recommended against doing so as memory gains from offloading are likely to "
            f"be lost. Offloading automatically takes care of moving the individual components "
            f"{', '.join(pipe.components.keys())} to GPU when needed. To make sure offloading "
            "works as expected, you should consider moving the pipeline back to CPU: "
            "`pipeline.to('cpu')` or removing the move altogether if you use offloading.")


@on_import("diffusers.pipelines.pipeline_utils")
def pipeline_to_offload_checks(pipeline_utils) -> None:
    """Patch ``DiffusionPipeline.to``: the offloading checks for axon.

    ``DiffusionPipeline.to`` raises a clear ``ValueError`` when a sequentially
    offloaded pipeline (``enable_sequential_cpu_offload``, weights on the meta
    device behind Accelerate hooks) is moved to the accelerator, and warns when a
    model-offloaded one (``enable_model_cpu_offload``) is, but only for device
    types in the literal list ``["cuda", "xpu"]``.  Moved to axon, the first got
    PyTorch's "Cannot copy out of meta tensor" and the second lost the offloading
    silently.  The wrapper runs the same two checks, with upstream's messages,
    when the target is axon, then calls the original.  The generic upstream fix:
    ``device_type not in ("cpu", "meta")`` instead of the list.
    """
    _offload_checks_for_axon(pipeline_utils, "DiffusionPipeline")


@on_import("diffusers.modular_pipelines.modular_pipeline")
def modular_pipeline_to_offload_checks(modular_pipeline) -> None:
    """Patch ``ModularPipeline.to``: the same checks as ``DiffusionPipeline.to``'s."""
    _offload_checks_for_axon(modular_pipeline, "ModularPipeline")
