"""Transformers and Accelerate under torchrun: device axon:LOCAL_RANK, backend "axon".

Both libraries map device types to torch.distributed backend names with fixed
tables.  The patches below fill the axon rows from torch's own registry,
``torch.distributed.Backend.default_device_backend_map`` (where
``torch_axon.distributed`` registers the c10d backend "axon" for device
"axon"), read at call time, so they follow whatever backend is registered for
axon.  Each one leaves upstream's answer alone whenever upstream has one.
"""

from __future__ import annotations

import functools
import os
import types

import torch

from ._hooks import on_import
from ._tools import axon_available


def _axon_backend() -> str | None:
    """The c10d backend torch uses for device "axon", or None if none is registered."""
    if not torch.distributed.is_available():
        return None
    return torch.distributed.Backend.default_device_backend_map.get("axon")


@on_import("transformers.distributed.utils")
def transformers_distributed_backend(utils) -> None:
    """Patch ``transformers.distributed.utils.get_distributed_backend``.

    ``from_pretrained(tp_plan="auto")`` and ``from_pretrained(distributed_config=
    DistributedConfig(...))`` reach ``initialize_distributed_mesh``, which takes
    the device type from ``torch._C._get_accelerator()`` (axon) and, unless a
    process group exists, initialises one with the backend named by
    ``DISTRIBUTED_BACKEND_MAP`` (cuda, cpu, xpu, hpu, neuron, tpu); for axon it
    raised "No distributed backend found for device type 'axon'" (re-raised as
    "We tried to initialize torch.distributed for you, but it failed").  The
    wrapper answers torch's registered backend for axon where upstream has none;
    binding the device (``torch.accelerator.set_device_index(LOCAL_RANK)``) and
    the mesh (``init_device_mesh("axon", ...)``) are upstream's generic code.
    """
    original = utils.get_distributed_backend
    if getattr(original, "_axon_patch", False):
        return

    @functools.wraps(original)
    def get_distributed_backend(device_type: str) -> str | None:
        try:
            return original(device_type)
        except ValueError:
            if device_type == "axon" and (backend := _axon_backend()) is not None:
                return backend
            raise

    get_distributed_backend._axon_patch = True
    utils.get_distributed_backend = get_distributed_backend


def _is_torchrun_axon(cpu: bool) -> bool:
    return (not cpu and int(os.environ.get("LOCAL_RANK", -1)) != -1 and axon_available()
            and not torch.cuda.is_available())


@on_import("accelerate.state")
def partial_state_prepare_backend(state) -> None:
    """Patch ``accelerate.state.PartialState._prepare_backend``.

    Under torchrun (``LOCAL_RANK`` set) it walks mlu, sdaa, musa, npu, hpu, cuda,
    xpu, neuron, each with its backend name (cncl, tccl, ..., nccl, xccl) and
    ``DistributedType.MULTI_<DEVICE>``; any other device ends as
    ``DistributedType.NO`` with no backend, so every rank silently trained alone
    (an Accelerator saw ``num_processes == 1``).  Where upstream answers NO for
    an axon machine under torchrun, the wrapper answers the backend passed in
    (``TrainingArguments(ddp_backend=...)``) or torch's registered backend for
    axon, and ``DistributedType.MULTI_GPU``: Accelerate, Transformers and TRL
    treat MULTI_GPU as "one accelerator per process, DDP" (it is in every list
    of multi-device types: DDP wrapping, barriers, gather/reduce, RNG
    synchronisation, autocast), and the only CUDA-specific use of it,
    ``set_device``, is patched below.  (A new member would be missing from those
    lists, which are written inline in the functions.)  ``PartialState.__init__``
    then calls ``init_process_group(backend=...)`` itself.
    """
    cls = state.PartialState
    original = cls._prepare_backend
    if getattr(original, "_axon_patch", False):
        return
    DistributedType = state.DistributedType

    @functools.wraps(original)
    def _prepare_backend(self, cpu: bool = False, sagemaker_dp=False, backend: str | None = None):
        chosen, distributed_type = original(self, cpu, sagemaker_dp, backend)
        if distributed_type == DistributedType.NO and _is_torchrun_axon(cpu):
            axon_backend = backend if backend is not None else _axon_backend()
            if axon_backend is not None:
                return axon_backend, DistributedType.MULTI_GPU
        return chosen, distributed_type

    _prepare_backend._axon_patch = True
    cls._prepare_backend = _prepare_backend


@on_import("accelerate.state")
def partial_state_set_device(state) -> None:
    """Patch ``accelerate.state.PartialState.set_device``.

    For a distributed state it derives the device module from the distributed
    type (``MULTI_GPU`` -> ``torch.cuda``) after an allow-list check (cpu, gpu,
    mlu, musa, npu, xpu, xla, hpu, sdaa, neuron), so the MULTI_GPU state that
    ``partial_state_prepare_backend`` gives an axon machine would have asked
    ``torch.cuda.device_count()`` (0) for its device.  Where the state is
    MULTI_GPU without CUDA on an axon machine, the wrapper sets
    ``axon:(local_process_index % device_count)`` as upstream does for each
    device it knows, and makes it current; ``ACCELERATE_TORCH_DEVICE`` still
    takes precedence (upstream returns early when a device is already set).
    """
    cls = state.PartialState
    original = cls.set_device
    if getattr(original, "_axon_patch", False):
        return
    DistributedType = state.DistributedType

    @functools.wraps(original)
    def set_device(self):
        if (self.device is None and self.distributed_type == DistributedType.MULTI_GPU
                and _is_torchrun_axon(self._cpu)):
            index = self.local_process_index % torch.axon.device_count()
            self.device = torch.device("axon", index)
            torch.axon.set_device(self.device)
            return
        return original(self)

    set_device._axon_patch = True
    cls.set_device = set_device


@on_import("transformers.training_args")
def training_args_ddp_backend_choices(training_args) -> None:
    """Patch the ``choices`` of ``TrainingArguments.ddp_backend``.

    ``HfArgumentParser`` turns the field's metadata ``choices`` (nccl, gloo,
    mpi, xccl, hccl, cncl, mccl) into an argparse choice list, so
    ``--ddp_backend axon`` on a training script's command line was rejected.
    The backend registered for axon is appended (it is the default under
    torchrun anyway, through ``partial_state_prepare_backend``); a
    ``TrainingArguments(ddp_backend=...)`` built in Python was never checked.
    """
    field = training_args.TrainingArguments.__dataclass_fields__.get("ddp_backend")
    if field is None or "choices" not in field.metadata:
        return
    backend = _axon_backend() or "axon"
    choices = list(field.metadata["choices"])
    if backend in choices:
        return
    field.metadata = types.MappingProxyType({**field.metadata, "choices": choices + [backend]})
