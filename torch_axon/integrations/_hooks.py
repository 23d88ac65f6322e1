"""Run patch functions when their target module is first imported.

A meta-path finder wraps the loader of each target module so that, right
after the module executes, its registered patches run.  Targets already
imported are patched at install() time.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
from collections.abc import Callable

Patch = Callable[[object], None]

_patches: dict[str, list[Patch]] = {}
_installed = False


def on_import(module_name: str):
    """Decorator: run the function with the module once it is imported."""

    def register(fn: Patch) -> Patch:
        _patches.setdefault(module_name, []).append(fn)
        return fn

    return register


def _apply(module) -> None:
    for fn in _patches.get(module.__name__, ()):
        fn(module)


class _PatchingLoader(importlib.abc.Loader):
    def __init__(self, loader):
        self._loader = loader

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        _apply(module)

    def __getattr__(self, name):  # get_code, get_source, is_package, ...
        return getattr(self._loader, name)


class _PatchingFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):
        if fullname not in _patches:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _PatchingLoader(spec.loader)
                return spec
        return None


def install() -> None:
    """Load the patch modules and start watching imports."""
    global _installed
    if _installed:
        return
    _installed = True
    from . import hf_accelerate, hf_distributed, hf_transformers, torch_compile  # noqa: F401  (register patches)

    sys.meta_path.insert(0, _PatchingFinder())
    for name in list(_patches):
        if name in sys.modules:
            _apply(sys.modules[name])
