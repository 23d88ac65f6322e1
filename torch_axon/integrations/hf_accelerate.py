"""Accelerate: choose axon where Accelerate's device chain ends at the CPU."""

from __future__ import annotations

import functools

import torch

from ._hooks import on_import
from ._tools import (add_enum_member, axon_available, axon_is_the_accelerator, extend_inline_tuple,
                     replace_function)


@on_import("accelerate.state")
def partial_state_default_device(state) -> None:
    """Patch ``accelerate.state.PartialState.default_device``.

    Upstream walks a fixed chain (mps, mlu, sdaa, musa, npu, hpu, cuda, xpu,
    neuron) and otherwise returns the CPU, so an Accelerator (and the
    Transformers Trainer built on it) never picks a PrivateUse1 device.  The
    wrapper keeps every answer but that final CPU, which becomes the current
    axon device; once upstream returns axon itself the wrapper changes nothing.
    """
    cls = state.PartialState
    original = cls.default_device
    if getattr(original.fget, "_axon_patch", False):
        return

    def default_device(self) -> torch.device:
        device = original.fget(self)
        if device.type == "cpu" and axon_available():
            return torch.device("axon", torch.axon.current_device())
        return device

    default_device._axon_patch = True
    default_device.__doc__ = original.__doc__
    cls.default_device = property(default_device)


@on_import("accelerate.utils.dataclasses")
def dynamo_backend_axon(dataclasses) -> None:
    """Add ``AXON`` to ``accelerate.utils.dataclasses.DynamoBackend``.

    ``TorchDynamoPlugin`` (which ``TrainingArguments(torch_compile_backend=...)``
    and ``accelerate launch --dynamo_backend`` reach) converts the backend name
    with ``DynamoBackend(name.upper())``, a closed enum of the backends
    Accelerate knows (inductor, neuron, ...), so ``"axon"`` raised
    ``ValueError: 'AXON' is not a valid DynamoBackend``.  The member added here
    has the value ``"AXON"``; the plugin passes ``backend="axon"`` (its
    lower-cased value) to ``torch.compile``, which finds torch_axon's backend.
    """
    add_enum_member(dataclasses.DynamoBackend, "AXON", "AXON")


@on_import("accelerate.accelerator")
def accelerator_fp16_devices(accelerator) -> None:
    """Patch the fp16 allow-list inline in ``accelerate.accelerator.Accelerator.__init__``.

    ``Accelerator(mixed_precision="fp16")`` (and so ``TrainingArguments(fp16=True)``)
    raises "fp16 mixed precision requires a device in ('xpu', 'cuda', 'npu',
    'xla', 'mlu', 'musa', 'hpu', 'sdaa', 'mps')" for any other device.  The list
    is a tuple constant of the function's code; "axon" is appended to it, and
    the rest of ``__init__`` (autocast, ``get_grad_scaler``) is upstream's.
    """
    if not extend_inline_tuple(accelerator.Accelerator.__init__, ("xpu", "cuda", "npu", "mps"), "axon"):
        import warnings

        warnings.warn("torch_axon: Accelerator.__init__ has no fp16 device list to extend; "
                      "fp16 on axon is up to upstream", RuntimeWarning, stacklevel=2)


@on_import("accelerate.utils.modeling")
def grad_scaler_device(modeling) -> None:
    """Patch ``accelerate.utils.modeling.get_grad_scaler``.

    It returns the GradScaler of the first device it knows (xla, mlu, sdaa,
    musa, npu, hpu, xpu, mps) and otherwise ``torch.amp.GradScaler("cuda")``,
    which on an axon machine unscales nothing (a disabled CUDA scaler) or
    fails; FSDP's ``ShardedGradScaler`` defaults to device "cuda" too.  Where
    axon is torch's accelerator the wrapper returns ``GradScaler("axon")``
    (``ShardedGradScaler(device="axon")`` under FSDP) instead of the CUDA one.
    """
    original = modeling.get_grad_scaler
    if getattr(original, "_axon_patch", False):
        return

    @functools.wraps(original)
    def get_grad_scaler(distributed_type=None, **kwargs):
        if not axon_is_the_accelerator():
            return original(distributed_type, **kwargs)
        if distributed_type == modeling.DistributedType.FSDP:
            kwargs.setdefault("device", "axon")
            return original(distributed_type, **kwargs)
        return torch.amp.GradScaler("axon", **kwargs)

    get_grad_scaler._axon_patch = True
    replace_function(modeling, "get_grad_scaler", get_grad_scaler)


@on_import("accelerate.utils.modeling")
def max_memory_axon(modeling) -> None:
    """Patch ``accelerate.utils.modeling.get_max_memory``.

    ``from_pretrained(device_map="auto")`` (through ``infer_auto_device_map``)
    asks it for each device's free memory; it probes npu, mlu, sdaa, musa, xpu
    and hpu, otherwise ``torch.cuda``, so on an axon machine it found no device
    (the model silently loaded on the CPU) and a ``max_memory={0: ...}`` from
    the user logged "Device 0 is not available".  Where axon is torch's
    accelerator the wrapper answers for the axon devices: integer keys are
    axon device indices, as ``torch.device(0)`` is ``axon:0`` there, and each
    free size is ``torch.axon.mem_get_info`` (a given ``max_memory`` is
    converted and ordered as upstream does).  As the devices' memory is host
    memory, the "cpu" budget is the available host memory they leave.
    """
    original = modeling.get_max_memory
    if getattr(original, "_axon_patch", False):
        return

    @functools.wraps(original)
    def get_max_memory(max_memory=None):
        if not axon_is_the_accelerator():
            return original(max_memory)
        import psutil

        count = torch.axon.device_count()
        if max_memory is None:
            budget = {i: torch.axon.mem_get_info(i)[0] for i in range(count)}
            # Axon memory is host memory (like an integrated GPU's, for which
            # upstream lists no "cpu" budget): the CPU gets what the devices leave.
            budget["cpu"] = max(0, psutil.virtual_memory().available - sum(budget.values()))
            return budget
        # As upstream, sizes given as strings ("1GB") are converted in the
        # caller's dict too: Transformers compares its values afterwards.
        for k, v in list(max_memory.items()):
            if isinstance(v, str):
                max_memory[k] = modeling.convert_file_size_to_int(v)
        budget = dict(max_memory)
        devices = sorted(k for k in budget if isinstance(k, int))
        for device in devices:
            if not 0 <= device < count:
                modeling.logger.warning(f"Device {device} is not available, available devices are "
                                        f"{list(range(count))}")
        order = devices + [k for k in ("mps", "cpu", "disk") if k in budget]
        for k in budget:
            if k not in order:
                raise ValueError(f"Device {k} is not recognized, available devices are integers(for "
                                 "GPU/XPU/axon), 'mps', 'cpu' and 'disk'")
        return {k: budget[k] for k in order}

    get_max_memory._axon_patch = True
    replace_function(modeling, "get_max_memory", get_max_memory)


@on_import("accelerate.utils.dataclasses")
def rng_type_axon(dataclasses) -> None:
    """Add ``AXON`` to ``accelerate.utils.dataclasses.RNGType``.

    ``synchronize_rng_states(["axon"])`` and ``Accelerator(rng_types=["axon"])``
    convert names with ``RNGType(name)``, a closed enum of the devices
    Accelerate knows (cuda, mlu, sdaa, musa, npu, xla, xpu, hpu, neuron);
    ``accelerate_rng_sync`` below synchronises it.
    """
    add_enum_member(dataclasses.RNGType, "AXON", "axon")


@on_import("accelerate.utils.random")
def accelerate_rng_sync(random) -> None:
    """Patch ``accelerate.utils.random.synchronize_rng_state``.

    Accelerate (like Transformers and TRL) runs an axon machine under torchrun
    as ``DistributedType.MULTI_GPU`` (see ``hf_distributed``), and code that
    reads MULTI_GPU as CUDA synchronises ``RNGType.CUDA`` (its own test script
    does), which reads ``torch.cuda.get_rng_state()`` and fails on a machine
    without CUDA; the function has no branch for a device it does not know
    (npu, mlu, sdaa, musa, xpu, hpu, neuron).  Where axon is torch's
    accelerator and CUDA is absent, ``RNGType.CUDA`` and ``RNGType.AXON``
    synchronise the current axon device's generator: rank 0's state is
    broadcast to every rank, as upstream does for each device it knows.
    """
    original = random.synchronize_rng_state
    if getattr(original, "_axon_patch", False):
        return
    RNGType = random.RNGType

    @functools.wraps(original)
    def synchronize_rng_state(rng_type=None, generator=None):
        axon_type = getattr(RNGType, "AXON", None)
        if rng_type not in (RNGType.CUDA, axon_type) or torch.cuda.is_available() \
                or not axon_is_the_accelerator():
            return original(rng_type, generator)
        rng_state = torch.axon.get_rng_state()
        state = random.AcceleratorState()
        if state.distributed_type != random.DistributedType.NO and torch.distributed.is_initialized():
            rng_state = rng_state.to(state.device)
            torch.distributed.broadcast(rng_state, 0)
            rng_state = rng_state.cpu()
        torch.axon.set_rng_state(rng_state)

    synchronize_rng_state._axon_patch = True
    replace_function(random, "synchronize_rng_state", synchronize_rng_state)


@on_import("accelerate.utils.memory")
def clear_device_cache_axon(memory) -> None:
    """Patch ``accelerate.utils.memory.clear_device_cache``.

    It empties the cache of xpu, mlu, sdaa, musa, npu, mps, cuda or neuron, so
    ``release_memory`` and ``find_executable_batch_size`` (which retries after
    an out-of-memory error) never returned axon's cached blocks.  Where axon is
    torch's accelerator the wrapper also calls ``torch.axon.empty_cache()``.
    """
    original = memory.clear_device_cache
    if getattr(original, "_axon_patch", False):
        return

    @functools.wraps(original)
    def clear_device_cache(garbage_collection: bool = False) -> None:
        original(garbage_collection)
        if axon_is_the_accelerator():
            torch.axon.empty_cache()

    clear_device_cache._axon_patch = True
    replace_function(memory, "clear_device_cache", clear_device_cache)


@on_import("accelerate.checkpointing")
def accelerator_state_rng_axon(checkpointing) -> None:
    """Patch ``accelerate.checkpointing.save_accelerator_state`` and ``load_accelerator_state``.

    ``Accelerator.save_state`` keeps the generators of python, numpy, the CPU
    and of xpu, mlu, sdaa, musa, hpu, neuron, cuda and xla; axon's was lost,
    so ``load_state`` resumed with other random numbers on axon.  The wrappers
    store every axon device's generator as "torch_axon_manual_seed" in the
    same per-process file and restore it.
    """
    save, load = checkpointing.save_accelerator_state, checkpointing.load_accelerator_state
    if getattr(save, "_axon_patch", False):
        return
    import inspect
    from pathlib import Path

    def rng_file(function, args, kwargs, directory: str) -> Path:
        bound = inspect.signature(function).bind(*args, **kwargs)
        name = f"{checkpointing.RNG_STATE_NAME}_{bound.arguments['process_index']}.pkl"
        return Path(bound.arguments[directory]) / name

    @functools.wraps(save)
    def save_accelerator_state(*args, **kwargs):
        result = save(*args, **kwargs)
        if axon_is_the_accelerator():
            path = rng_file(save, args, kwargs, "output_dir")
            states = checkpointing.load(path)
            states["torch_axon_manual_seed"] = torch.axon.get_rng_state_all()
            torch.save(states, path)
        return result

    @functools.wraps(load)
    def load_accelerator_state(*args, **kwargs):
        result = load(*args, **kwargs)
        path = rng_file(load, args, kwargs, "input_dir")
        if axon_is_the_accelerator() and path.is_file():
            try:  # as upstream: a random state that cannot be loaded is logged
                states = checkpointing.load(path)
                if "torch_axon_manual_seed" in states:
                    torch.axon.set_rng_state_all(states["torch_axon_manual_seed"])
            except Exception:  # noqa: BLE001
                checkpointing.logger.info("Could not load the axon random states")
        return result

    save_accelerator_state._axon_patch = load_accelerator_state._axon_patch = True
    replace_function(checkpointing, "save_accelerator_state", save_accelerator_state)
    replace_function(checkpointing, "load_accelerator_state", load_accelerator_state)
