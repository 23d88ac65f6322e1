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
    """Load the patch modules and start watching imports."""
    global _installed
    if _installed:
        return
    _installed = True
    from . import (hf_accelerate, hf_accelerate_cli, hf_diffusers, hf_distributed,  # noqa: F401  (register patches)
                   hf_transformers, safetensors_device, torch_autocast, torch_compile,
                   torch_dlpack, torch_flex_attention, torch_multiprocessing)

    sys.meta_path.insert(0, _PatchingFinder())
    for name in list(_patches):
        if name in sys.modules:
            _apply_when_imported(sys.modules[name], name)


# ------------------------------------------------------------ tools for patches


def replace_function(module, name: str, new) -> None:
    """Set ``module.name = new``, and rebind the copies other modules made.

    ``from .modeling import f`` copies a function into the importing module
    (``accelerate.utils`` re-exports, ``accelerate.accelerator`` imports): a
    module that imported the upstream function before the patch keeps it, so
    every loaded module whose attribute ``name`` is the old function gets the
    new one too.
    """
    old = getattr(module, name)
    setattr(module, name, new)
    for other in list(sys.modules.values()):
        if other is not None and other is not module and getattr(other, "__dict__", {}).get(name) is old:
            setattr(other, name, new)


def add_enum_member(enum_cls, name: str, value) -> None:
    """Add ``name = value`` to a closed upstream enum (no-op if it exists).

    Upstream converts names with ``EnumClass(value)``; a member added after
    class creation must be in the enum's member and value maps for that.
    """
    if name in enum_cls.__members__:
        return
    base = enum_cls._member_type_
    member = object.__new__(enum_cls) if base is object else base.__new__(enum_cls, value)
    member._name_ = name
    member._value_ = value
    member.__objclass__ = enum_cls
    type.__setattr__(enum_cls, name, member)
    enum_cls._member_map_[name] = member
    enum_cls._value2member_map_[value] = member
    enum_cls._member_names_.append(name)


def extend_inline_tuple(function, members: tuple[str, ...], item: str) -> bool:
    """Add ``item`` to the tuple constants of ``function`` that hold all of ``members``.

    For allow-lists written inline (``if device.type not in ("xpu", "cuda",
    ...)``), which Python stores as a constant of the function's code object.
    Returns whether a tuple was found (False once upstream drops the list).
    """
    code = function.__code__
    consts = tuple(
        c + (item,) if isinstance(c, tuple) and set(members) <= set(c) and item not in c else c
        for c in code.co_consts)
    if consts == code.co_consts:
        return any(isinstance(c, tuple) and item in c and set(members) <= set(c)
                   for c in code.co_consts)
    function.__code__ = code.replace(co_consts=consts)
    return True
