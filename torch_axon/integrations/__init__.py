"""Patches for libraries that pick devices from fixed lists.

Each patch is a function in this package, registered with ``_hooks.on_import``
for the module it patches, with a docstring naming the upstream function and
the hard-coded device list it works around (all listed in docs/UPSTREAM.md).
Patches apply when their target module has finished importing (nothing is
imported eagerly: loading torch must stay cheap) and turn themselves into
no-ops once upstream accepts generic devices.

``_hooks``: when patches run.  ``_tools``: what patches share.  The other
modules: the patches, one module per upstream library or torch subsystem.
"""

from __future__ import annotations

from . import _hooks

__all__ = ["install"]


def install() -> None:
    """Register every patch, then start watching imports (idempotent)."""
    from . import (hf_accelerate, hf_accelerate_cli, hf_diffusers, hf_distributed,  # noqa: F401
                   hf_kernels, hf_peft, hf_transformers, safetensors_device, torch_autocast, torch_compile,
                   torch_data_parallel, torch_dlpack, torch_dtensor, torch_flex_attention, torch_meta,
                   torch_multiprocessing, torch_nested, torch_transformer)
    _hooks.install()
