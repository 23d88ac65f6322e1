"""torch.compile for axon.

Graphs on axon tensors compile with Inductor, the default backend; the same
compiler is also registered under the name ``"axon"`` (``torch.compile(model,
backend="axon")``).  Kernels are Inductor's C++ kernels, run as stream work on
the current axon stream; matmuls, attention and the other extern calls go to
axon's own kernels.  Nothing here is imported until something compiles:
Inductor's registration reaches it through ``torch.axon.Scheduling`` and
Dynamo's through an import hook (torch_axon.integrations.torch_compile).
"""

from __future__ import annotations

from typing import Any

__all__ = ["axon_backend", "register"]


def register() -> None:
    """Register axon's Inductor backend and Dynamo device interface (idempotent)."""
    from .codegen import register as _register

    _register()


def axon_backend(gm, example_inputs, mode: str | None = None,
                 options: dict[str, Any] | None = None):
    """The ``"axon"`` torch.compile backend: Inductor with axon's code generation.

    ``mode`` and ``options`` mean what they mean for Inductor
    (``torch._inductor.list_mode_options``); "reduce-overhead" (Transformers'
    default mode) records and replays axon graphs, as with the default backend
    (integrations/torch_compile.py, ``AxonGraphPolicy``).
    """
    register()
    from torch._inductor import list_mode_options
    from torch._inductor.compile_fx import compile_fx

    patches = {**(list_mode_options(mode) if mode else {}), **(options or {})}
    return compile_fx(gm, example_inputs, config_patches=patches)
