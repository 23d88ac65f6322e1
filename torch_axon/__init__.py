"""torch-axon: the axon accelerator as a PyTorch device.

Installing the package is enough: PyTorch imports it through the
``torch.backends`` entry point (``_autoload``), after which ``torch.device("axon")``,
``tensor.to("axon")``, ``torch.axon`` and ``torch.accelerator`` work.
Set ``TORCH_DEVICE_BACKEND_AUTOLOAD=0`` to keep PyTorch from loading it.
"""

from __future__ import annotations

import sys

__version__ = "0.1.0"

_loaded = False


def _autoload() -> None:
    """Entry point of the ``torch.backends`` group: register the axon device."""
    global _loaded
    if _loaded:
        return
    _loaded = True
    import torch

    from . import _C  # noqa: F401  (registers guard, allocator, hooks, kernels)

    torch.utils.rename_privateuse1_backend("axon")
    from . import axon as device_module

    torch._register_device_module("axon", device_module)
    sys.modules["torch.axon"] = device_module
    # `import torch.axon.memory` (as `import torch.cuda.memory`) finds the loaded
    # submodule instead of running its file again as a new module.
    import importlib
    import pkgutil

    for info in pkgutil.iter_modules(device_module.__path__):
        sub = importlib.import_module(f"{device_module.__name__}.{info.name}")
        sys.modules[f"torch.axon.{info.name}"] = sub
    torch.utils.generate_methods_for_privateuse1_backend(
        for_tensor=True, for_module=True, for_packed_sequence=True, for_storage=True)

    from . import distributed, integrations

    distributed.install()
    integrations.install()

    import atexit

    from .axon._exit import release_autograd_graph_tasks

    atexit.register(release_autograd_graph_tasks)


_autoload()

from .axon import fallback_stats, reset_fallback_stats  # noqa: E402,F401


def __getattr__(name: str):
    # Submodules loaded on first use: torch_axon.kernel (the Axon Kernel Interface).
    if name == "kernel":
        import importlib

        return importlib.import_module(".kernel", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
