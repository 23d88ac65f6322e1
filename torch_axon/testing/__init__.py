"""PyTorch's own distributed test harnesses on axon (opt-in).

PyTorch's DTensor and FSDP test bases (``torch.testing._internal``, shipped in
the wheel) only know CUDA, HPU and XPU as accelerators: ``DTensorTestBase``
rejects the ``axon`` backend, ``common_fsdp`` runs its tests as one CPU rank
on gloo, and ``skip_if_lt_x_gpu`` skips everything.  Importing this module
makes them run on axon, one rank per axon device, with the ``axon`` backend::

    import torch_axon.testing  # before the test module's other imports
    from torch.testing._internal.distributed._tensor.common_dtensor import DTensorTestBase

or, with no change to the test files, set ``AXON_TEST_HARNESS=1`` in the
environment (checked when torch loads torch-axon)::

    AXON_TEST_HARNESS=1 python -m pytest test/distributed/tensor/test_redistribute.py

Importing this module also sets ``AXON_TEST_HARNESS=1`` in ``os.environ``, so
the ranks these harnesses spawn (where the tests run) patch the harness before
they import it.  Imported after the harness modules, it patches them in place,
but names a module already took from them (``from ... import
skip_if_lt_x_gpu``) keep the upstream objects in that process; the ranks still
get the patched ones.

The number of ranks comes from the device count, as on CUDA:
``AXON_NUM_DEVICES`` (default 8) sets it; DTensor tests use min(4, devices),
FSDP tests all of them (or what a test's ``world_size`` says), so
``AXON_NUM_DEVICES=2`` runs FSDP tests on 2 ranks (one process each).
gloo groups take axon tensors too (``torch_axon/distributed/gloo.py``), so
tests that pass ``backend="gloo"`` with axon tensors run as well.

Each patch is applied once the target module has finished importing
(``integrations._hooks.on_import``, or at once if it was imported before this
module), is idempotent (``_axon_patch``) and only acts when the current
accelerator is the PrivateUse1 device (axon); on CUDA/XPU/HPU machines and
once upstream reads ``torch.accelerator`` they change nothing.  Sites:

* ``torch/testing/_internal/common_distributed.py``: ``skip_if_lt_x_gpu``,
  ``at_least_x_gpu``, ``skip_if_no_gpu`` count ``torch.cuda``/``torch.hpu``/
  ``torch.xpu`` devices only; here ``torch.accelerator.device_count()`` counts too.
* ``torch/testing/_internal/distributed/_tensor/common_dtensor.py``:
  ``DTensorTestBase.init_pg`` accepts a fixed list of backends (nccl, gloo,
  mpi, hccl, xccl, fake, cpu:gloo,<dev>:<backend>) and sets each rank's device
  only for nccl/xccl; here the accelerator's default backend (``axon``) is
  accepted too and every rank on axon uses ``axon:<rank>``.
* ``torch/testing/_internal/common_fsdp.py``: ``DEVICE_TYPE``,
  ``DISTRIBUTED_BACKEND`` and ``DEVICE_COUNT`` come from cuda/hpu/xpu only
  (else cpu, gloo, 1), and ``FSDPTest._run`` / ``FSDPTestMixin._run`` /
  ``FSDPTestContinuous._init_pg`` set the device only for CUDA/XPU; here they
  are axon, ``axon`` and ``torch.accelerator.device_count()``, and each rank
  is set to ``axon:<rank % DEVICE_COUNT>``.
"""

from __future__ import annotations

import functools
import os
import sys

import torch

from ..integrations import _hooks

ENV_VAR = "AXON_TEST_HARNESS"
# Its value before this module set it (None: unset).
ENV_BEFORE_IMPORT = os.environ.get(ENV_VAR)

COMMON_DISTRIBUTED = "torch.testing._internal.common_distributed"
COMMON_DTENSOR = "torch.testing._internal.distributed._tensor.common_dtensor"
COMMON_FSDP = "torch.testing._internal.common_fsdp"


def _device_type() -> str | None:
    """The current accelerator's type if it is the PrivateUse1 device (axon)."""
    acc = torch.accelerator.current_accelerator()
    if acc is None or acc.type != torch._C._get_privateuse1_backend_name():
        return None
    return acc.type


def _device_count() -> int:
    return torch.accelerator.device_count() if _device_type() else 0


def _default_backend(device_type: str) -> str:
    import torch.distributed as dist

    return dist.get_default_backend_for_device(device_type)


# ---------------------------------------------------------------- common_distributed

@_hooks.on_import(COMMON_DISTRIBUTED)
def patch_common_distributed(mod) -> None:
    """Patch ``torch.testing._internal.common_distributed.skip_if_lt_x_gpu``
    (torch/testing/_internal/common_distributed.py), and ``at_least_x_gpu`` and
    ``skip_if_no_gpu`` beside it: they count only ``torch.cuda``, ``torch.hpu``
    (``TEST_HPU``) and ``torch.xpu`` (``TEST_XPU``) devices, so every
    multi-device test skips on axon.  The replacements also accept
    ``torch.accelerator.device_count()`` of the PrivateUse1 accelerator and
    otherwise defer to the originals.  Upstream fix: count
    ``torch.accelerator.device_count()``."""
    if getattr(mod, "_axon_patch", False):
        return
    orig_skip = mod.skip_if_lt_x_gpu
    orig_at_least = mod.at_least_x_gpu
    orig_no_gpu = mod.skip_if_no_gpu

    @functools.wraps(orig_skip)
    def skip_if_lt_x_gpu(x, *, allow_cpu=False):
        def decorator(func):
            upstream = orig_skip(x, allow_cpu=allow_cpu)(func)

            @functools.wraps(func)
            def wrapper(*args, **kwargs):
                if _device_count() >= x:
                    return func(*args, **kwargs)
                return upstream(*args, **kwargs)

            return wrapper

        return decorator

    @functools.wraps(orig_at_least)
    def at_least_x_gpu(x):
        return _device_count() >= x or orig_at_least(x)

    @functools.wraps(orig_no_gpu)
    def skip_if_no_gpu(func):
        upstream = orig_no_gpu(func)

        @functools.wraps(func)
        def wrapper(*args, **kwargs):
            if not _device_type():
                return upstream(*args, **kwargs)
            world_size = int(os.environ["WORLD_SIZE"])
            if _device_count() < world_size:
                sys.exit(mod.TEST_SKIPS[f"multi-gpu-{world_size}"].exit_code)
            return func(*args, **kwargs)

        return wrapper

    for fn in (skip_if_lt_x_gpu, at_least_x_gpu, skip_if_no_gpu):
        fn._axon_patch = True
        setattr(mod, fn.__name__, fn)
    mod._axon_patch = True


# ---------------------------------------------------------------- common_dtensor

# The backends DTensorTestBase.init_pg itself handles (torch 2.13), besides
# "cpu:gloo,<device>:<its backend>".
_UPSTREAM_DTENSOR_BACKENDS = ("nccl", "gloo", "mpi", "cpu:gloo,cuda:ncclx", "cuda:ncclx", "hccl",
                              "xccl", "fake", "cpu:gloo,xpu:xccl")


@_hooks.on_import(COMMON_DTENSOR)
def patch_common_dtensor(mod) -> None:
    """Patch ``torch.testing._internal.distributed._tensor.common_dtensor.DTensorTestBase.init_pg``
    (torch/testing/_internal/distributed/_tensor/common_dtensor.py): it raises
    "Backend axon not supported!" (its list: nccl, gloo, mpi, hccl, xccl,
    fake, cpu:gloo,<dev>:<backend>; cuda:ncclx, xpu:xccl) although its
    ``backend`` property returns ``get_default_backend_for_device("axon")``,
    and it sets each rank's device only for nccl/xccl.  On axon the
    replacement accepts the device's default backend (alone, as
    "axon:axon" or "cpu:gloo,axon:axon") and the upstream list, sets rank r
    to ``axon:r`` for every backend, binds the group to the device with
    ``eager_init`` (as for nccl), and skips when there are fewer devices than
    ranks.  Upstream fix: treat ``get_default_backend_for_device(device_type)``
    like nccl/xccl (set the device index, accept the backend) instead of a
    list of names."""
    cls = mod.DTensorTestBase
    if getattr(cls.init_pg, "_axon_patch", False):
        return
    original = cls.init_pg

    @functools.wraps(original)
    def init_pg(self, eager_init, backend=None):
        device_type = self.device_type
        if device_type != _device_type():
            return original(self, eager_init, backend)
        import torch.distributed as dist

        if backend is None:
            backend = self.backend
        own = _default_backend(device_type)
        ours = {own, f"{device_type}:{own}", f"cpu:gloo,{device_type}:{own}"}
        if backend not in ours and backend not in _UPSTREAM_DTENSOR_BACKENDS:
            raise RuntimeError(f"Backend {backend} not supported!")
        count = torch.accelerator.device_count()
        if backend in ours and count < self.world_size:
            sys.exit(mod.TEST_SKIPS[f"multi-gpu-{self.world_size}"].exit_code)
        if self.rank < count:
            torch.accelerator.set_device_index(self.rank)
        if backend not in ours:
            return original(self, eager_init, backend)
        device_id = torch.device(device_type, self.rank) if eager_init else None
        dist.init_process_group(backend=backend, world_size=self.world_size, rank=self.rank,
                                init_method=f"file://{self.file_name}", device_id=device_id)

    init_pg._axon_patch = True
    cls.init_pg = init_pg


# ---------------------------------------------------------------- common_fsdp

def _set_rank_device(rank: int) -> None:
    count = torch.accelerator.device_count()
    if count:
        torch.accelerator.set_device_index(rank % count)


@_hooks.on_import(COMMON_FSDP)
def patch_common_fsdp(mod) -> None:
    """Patch ``torch.testing._internal.common_fsdp.FSDPTest._run``
    (torch/testing/_internal/common_fsdp.py), ``FSDPTestMixin._run``,
    ``FSDPTestContinuous._init_pg`` and the module constants: ``DEVICE_TYPE``/
    ``DISTRIBUTED_BACKEND``/``DEVICE_COUNT`` are chosen from ``TEST_CUDA``
    (cuda), ``TEST_HPU`` (hpu) and ``TEST_XPU`` (xpu) only (else "cpu", "gloo",
    1: FSDP tests run as one CPU rank), ``FSDPTestContinuous.world_size`` is
    ``DEVICE_COUNT`` at import, and the three methods set the rank's device
    only ``if TEST_CUDA or TEST_XPU``.  On axon the constants become
    the accelerator's type, its default backend and
    ``torch.accelerator.device_count()``, and each rank runs on
    ``axon:<rank % DEVICE_COUNT>``.  Upstream fix: derive the three from
    ``torch.accelerator`` and ``get_default_backend_for_device``, and set the
    device whenever an accelerator is present."""
    if getattr(mod, "_axon_patch", False):
        return
    device_type = _device_type()
    if device_type is None or mod.DEVICE_TYPE != "cpu":
        return
    mod.DEVICE_TYPE = device_type
    mod.DISTRIBUTED_BACKEND = _default_backend(device_type)
    mod.DEVICE_COUNT = torch.accelerator.device_count()
    if "world_size" in vars(mod.FSDPTestContinuous):
        mod.FSDPTestContinuous.world_size = mod.DEVICE_COUNT

    def wrap_run(cls):
        original = vars(cls)["_run"].__func__

        @functools.wraps(original)
        def _run(klass, rank, *args, **kwargs):
            _set_rank_device(rank)
            return original(klass, rank, *args, **kwargs)

        wrapped = classmethod(_run)
        wrapped._axon_patch = True
        cls._run = wrapped

    for cls in (mod.FSDPTestMixin, mod.FSDPTest):
        if "_run" in vars(cls):
            wrap_run(cls)
    cont = mod.FSDPTestContinuous
    if "_init_pg" in vars(cont):
        original_init = vars(cont)["_init_pg"].__func__

        @functools.wraps(original_init)
        def _init_pg(klass, rank, world_size, rdvz_file):
            _set_rank_device(rank)
            return original_init(klass, rank, world_size, rdvz_file)

        wrapped = classmethod(_init_pg)
        wrapped._axon_patch = True
        cont._init_pg = wrapped
    mod._axon_patch = True


# ---------------------------------------------------------------- install

_TARGETS = {COMMON_DISTRIBUTED: patch_common_distributed, COMMON_DTENSOR: patch_common_dtensor,
            COMMON_FSDP: patch_common_fsdp}


def install() -> None:
    """Patches the harness modules already imported (the others are patched
    when their import completes) and sets ``AXON_TEST_HARNESS=1`` for the
    processes the harnesses spawn."""
    os.environ[ENV_VAR] = "1"
    for name in _TARGETS:
        module = sys.modules.get(name)
        if module is None:
            continue
        _hooks._apply_when_imported(module, name)


install()
