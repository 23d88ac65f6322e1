"""Run patch functions once their target module has finished importing.

A patch must never touch a module that is still executing: autoload runs inside
whatever module first imports torch, and that can be a half-initialised
Transformers module (``from transformers import TrainingArguments`` as a
script's first line imports torch from inside ``transformers.training_args``).
So each target is patched at the moment its import completes:

- a module imported later: a meta-path finder wraps its loader, and the patches
  run right after the loader's ``exec_module`` returns;
- a module already imported when ``install()`` runs: patched at once;
- a module still being imported when ``install()`` runs (its
  ``__spec__._initializing`` is true): its spec is watched, and the patches
  run when the import machinery sets ``_initializing`` back to false, which is
  the last thing it does for a module (``importlib._bootstrap._load_unlocked``).
  A module whose import failed (gone from ``sys.modules``) is not patched.
"""

from __future__ import annotations

import importlib.abc
import sys
import warnings
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


def _apply(module, name: str) -> None:
    # By the name the module is imported under (its spec's), not module.__name__,
    # which a module may change.  A patch that fails (an upstream version it
    # does not know) must not break the user's import: it warns and leaves the
    # module as upstream wrote it.
    for fn in _patches.get(name, ()):
        try:
            fn(module)
        except Exception as e:  # noqa: BLE001
            warnings.warn(f"torch_axon: could not apply {fn.__name__} to {name}: "
                          f"{type(e).__name__}: {e}", RuntimeWarning, stacklevel=2)


def _importing(module) -> bool:
    return bool(getattr(getattr(module, "__spec__", None), "_initializing", False))


_watching_classes: dict[type, type] = {}


def _apply_when_imported(module, name: str) -> None:
    """Patch ``module`` now, or when its import, if still under way, completes.

    For a module being imported, the import machinery keeps the spec in a local
    variable and ends with ``spec._initializing = False``; the spec's class is
    swapped for a subclass whose ``__setattr__`` sees that assignment, runs the
    patches just before it (while the module still counts as being imported, so
    another thread's import of it waits on the module lock instead of taking
    the unpatched module) and swaps the class back.
    """
    if not _importing(module):
        _apply(module, name)
        return
    spec = module.__spec__
    base = type(spec)
    if getattr(base, "_axon_watching", False):
        return
    watching = _watching_classes.get(base)
    if watching is None:

        def __setattr__(self, attr, value):
            if attr == "_initializing" and not value:
                object.__setattr__(self, "__class__", base)
                done = sys.modules.get(self.name)  # None: the import failed
                try:
                    if done is not None:
                        _apply(done, self.name)
                finally:
                    base.__setattr__(self, attr, value)
                return
            base.__setattr__(self, attr, value)

        watching = type(base.__name__, (base,), {"__setattr__": __setattr__,
                                                 "_axon_watching": True,
                                                 "__module__": base.__module__})
        _watching_classes[base] = watching
    try:
        spec.__class__ = watching
    except TypeError as e:  # a spec class without __dict__ (a finder's own type)
        warnings.warn(f"torch_axon: cannot watch the import of {name} ({e}); it is patched "
                      "now, while still importing", RuntimeWarning, stacklevel=2)
        _apply(module, name)
        return
    if not _importing(module) and type(spec) is watching:  # completed before the swap
        object.__setattr__(spec, "__class__", base)
        _apply(module, name)


class _PatchingLoader(importlib.abc.Loader):
    def __init__(self, loader):
        self._loader = loader

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        _apply(module, module.__spec__.name)

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
    """Start watching imports and patch the target modules already imported.

    The patch modules register themselves with ``on_import`` when imported;
    ``torch_axon.integrations.install`` imports them, then calls this.
    """
    global _installed
    if _installed:
        return
    _installed = True
    sys.meta_path.insert(0, _PatchingFinder())
    for name in list(_patches):
        if name in sys.modules:
            _apply_when_imported(sys.modules[name], name)
