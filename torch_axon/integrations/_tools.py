"""Tools the patch modules share: what the device is, and how to patch
upstream code that was written with fixed device lists."""

from __future__ import annotations

import sys

import torch


def axon_available() -> bool:
    return hasattr(torch, "axon") and torch.axon.is_available()


def axon_is_the_accelerator() -> bool:
    """torch's current accelerator is axon (no CUDA or other built-in device)."""
    return axon_available() and torch.accelerator.current_accelerator().type == "axon"


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
