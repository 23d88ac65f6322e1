"""The Hugging Face ``kernels`` library (0.17): device "axon".

``kernels`` loads device kernels from kernel repositories (the Hub's
``build/<variant>/<package>/`` layout, or a local directory) and swaps the
forward of layers marked with ``use_kernel_forward_from_hub`` /
``replace_kernel_forward_from_hub`` (``kernelize``).  Everything it does is
device-generic except three hard-coded device or backend lists:

- ``kernels.backends._backend`` (and ``parse_backend``): the backend whose
  build variants are loaded is picked from a fixed chain (TPU, Neuron, CUDA,
  ROCm, Metal, XPU, the PrivateUse1 backend only if it is "npu", else CPU);
  a backend name in a variant directory must be one of a fixed set.
- ``kernels.layer.kernelize._validate_device_type``: ``kernelize(device=...)``
  accepts only ``{"cpu", "cuda", "mps", "neuron", "npu", "rocm", "tpu", "xpu"}``
  ("Unsupported device type 'axon'").
- ``kernels.layer.repos.DeviceRepos.create_repo``: a kernel mapping's device
  key must be one of the same list ("Unknown device type: axon").

The patches add the backend ``Axon`` (name and variant string ``"axon"``): an
axon kernel repository ships the noarch variant ``build/torch-axon/`` (its
Python package JIT-builds its C++ sources with ``torch_axon.kernel.load``), or
an arch variant ``build/torch<XY>-cxx11-axon-<cpu>-<os>/``.  While
``kernelize`` loads the kernel of one layer, the backend follows the device it
kernelizes for (a model kernelized for "cpu" gets the CPU variant even when
axon is loaded).  Not patchable from Python: ``metadata.json``'s
``backend.type`` is parsed by the Rust extension (``kernels._rust.Metadata``)
into a closed enum, so an axon variant declares ``{"type": "cpu"}`` there (the
field only selects the CUDA/ROCm architecture check).  Each patch leaves
upstream's answer alone wherever upstream already has one, so it becomes a
no-op once upstream accepts PrivateUse1 devices.  Listed in docs/UPSTREAM.md.
"""

from __future__ import annotations

import contextvars
import functools
import sys
from dataclasses import dataclass

from ._hooks import on_import
from ._tools import replace_function

# The device type ``kernelize`` is loading a layer for (None outside kernelize).
_kernelize_device: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "_axon_kernelize_device", default=None)


def _privateuse1_name() -> str | None:
    import torch

    get = getattr(torch._C, "_get_privateuse1_backend_name", None)
    return get() if get is not None else None


@dataclass(unsafe_hash=True)
class Axon:
    """The axon backend of ``kernels.backends`` (the ``Backend`` protocol)."""

    @property
    def name(self) -> str:
        return "axon"

    @property
    def variant_str(self) -> str:
        return "axon"

    @staticmethod
    def parse(s: str) -> "Axon":
        if s != "axon":
            raise ValueError(f"Invalid Axon variant string: {s!r}")
        return Axon()


@on_import("kernels.backends")
def backends_axon(backends) -> None:
    """Patch ``kernels.backends._backend`` and ``kernels.backends.parse_backend``.

    ``_backend()`` picks the backend from a fixed chain of device checks
    (TPU, Neuron, CUDA, ROCm, Metal, XPU, PrivateUse1 only when named "npu")
    and answers ``CPU()`` for a CPU build of torch with axon loaded, so
    ``get_kernel``/``get_local_kernel`` resolved only ``torch-cpu`` variants
    and ``torch-axon`` was rejected ("backend (axon) does not match system
    backend (cpu)").  The patched function returns ``Axon()`` where upstream
    returns ``CPU()`` and the PrivateUse1 backend is "axon" (inside
    ``kernelize`` for device "cpu" it keeps ``CPU()``); every other answer is
    upstream's.  ``parse_backend`` (variant directory names) raised "Unknown
    backend variant string: 'axon'" for arch variants; it now parses "axon".
    Both are rebound in the modules that imported them (``kernels.validate``,
    ``kernels.python_deps``, ``kernels.variants``).  The generic upstream fix:
    a PrivateUse1 backend is a backend named after
    ``torch._C._get_privateuse1_backend_name()`` (as "npu" is already), and
    ``parse_backend`` accepts that name.
    """
    if getattr(backends, "_axon_patch", False):
        return
    upstream_backend = backends._backend
    upstream_parse = backends.parse_backend

    @functools.wraps(upstream_backend)
    def _backend():
        backend = upstream_backend()
        if type(backend).__name__ != "CPU" or _privateuse1_name() != "axon":
            return backend
        if _kernelize_device.get() not in (None, "axon"):
            return backend
        return Axon()

    @functools.wraps(upstream_parse)
    def parse_backend(s: str):
        if s == "axon":
            return Axon()
        return upstream_parse(s)

    backends.Axon = Axon
    replace_function(backends, "_backend", _backend)
    replace_function(backends, "parse_backend", parse_backend)
    backends._axon_patch = True


def _known_device_type(device_type: str) -> bool:
    return device_type == "axon" and _privateuse1_name() == "axon"


@on_import("kernels.layer.kernelize")
def kernelize_axon(kernelize_module) -> None:
    """Patch ``kernels.layer.kernelize._validate_device_type`` and ``kernelize_layer``.

    ``kernelize(model, device="axon", ...)`` raised "Unsupported device type
    'axon'": ``_validate_device_type`` checks against the hard-coded set
    ``{"cpu", "cuda", "mps", "neuron", "npu", "rocm", "tpu", "xpu"}``; the
    patched check also accepts the PrivateUse1 device "axon" (a model whose
    parameters are on axon already worked without ``device=``).
    ``kernelize_layer`` is wrapped to record the device type it loads a layer
    for, which the patched ``_backend`` reads (upstream's ``LayerRepository.
    load()`` does not pass the device, so a model kernelized for "cpu" on a
    CUDA build loads the CUDA variant), and to give each device type its own
    loaded-layer cache (``kernels.layer.layer._CACHED_LAYER`` is keyed by the
    repository alone: one repository mapped for "cpu" and "axon" gave the
    layer loaded first to both).  The generic upstream fixes: accept any
    device type torch knows (``torch.device(device_type)`` parses it); pass
    the kernelize device's backend to ``repo.load`` and key the cache by
    (repository, backend).
    """
    if getattr(kernelize_module, "_axon_patch", False):
        return
    upstream_validate = kernelize_module._validate_device_type
    upstream_layer = kernelize_module.kernelize_layer

    @functools.wraps(upstream_validate)
    def _validate_device_type(device_type: str) -> None:
        if _known_device_type(device_type):
            return
        upstream_validate(device_type)

    layer_module = sys.modules[upstream_layer.__module__]
    caches: dict[str, dict] = {}

    @functools.wraps(upstream_layer)
    def kernelize_layer(module, *, mode, device_type, use_fallback):
        token = _kernelize_device.set(device_type.type)
        shared = getattr(layer_module, "_CACHED_LAYER", None)
        if isinstance(shared, dict):
            layer_module._CACHED_LAYER = caches.setdefault(device_type.type, {})
        try:
            return upstream_layer(module, mode=mode, device_type=device_type,
                                  use_fallback=use_fallback)
        finally:
            if isinstance(shared, dict):
                layer_module._CACHED_LAYER = shared
            _kernelize_device.reset(token)

    replace_function(kernelize_module, "_validate_device_type", _validate_device_type)
    replace_function(kernelize_module, "kernelize_layer", kernelize_layer)
    kernelize_module._axon_patch = True


@on_import("kernels.layer.repos")
def repos_axon(repos) -> None:
    """Patch ``kernels.layer.repos.DeviceRepos.create_repo``.

    ``register_kernel_mapping`` / ``use_kernel_mapping`` with an ``"axon"``
    key (or ``Device(type="axon")``) raised "Unknown device type: axon": the
    per-device repository sets are chosen from an if-chain over
    cpu/cuda/rocm/mps/xpu/npu/neuron/tpu.  Devices without capability
    properties all use the same class (a dict mode -> repository); the patch
    returns such a set for "axon".  The generic upstream fix: one
    property-less ``DeviceRepos`` class for any other device type (CUDA and
    ROCm keep their capability interval trees).
    """
    cls = repos.DeviceRepos
    if getattr(cls, "_axon_patch", False):
        return

    class _AxonRepos(cls):
        def __init__(self):
            super().__init__()
            self._repos = {}

        @property
        def repos(self):
            return self._repos

        def insert(self, device, repos_by_mode):
            if device.type != "axon":
                raise ValueError(f"Device type must be 'axon', got {device.type}")
            self._repos = repos_by_mode

    upstream_create = cls.__dict__["create_repo"].__func__

    def create_repo(device):
        if _known_device_type(device.type):
            return _AxonRepos()
        return upstream_create(device)

    create_repo.__doc__ = upstream_create.__doc__
    cls.create_repo = staticmethod(create_repo)
    cls._axon_patch = True
    repos._AxonRepos = _AxonRepos
