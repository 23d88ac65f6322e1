"""``torch.axon.nvtx``: torch.cuda.nvtx's range API as profiler ranges.

CUDA's NVTX ranges annotate a timeline for Nsight.  Here the same calls record
``torch.profiler`` ranges (as ``torch.profiler.record_function`` does), so a
script instrumented for CUDA runs unchanged and its ranges appear in a
``torch.profiler`` trace; without a profiler running they cost a little host
time and record nothing.
"""

from __future__ import annotations

import contextlib
import itertools
import threading

import torch

__all__ = ["range_push", "range_pop", "range_start", "range_end", "mark", "range"]

_local = threading.local()  # push/pop nest per thread, as NVTX's
_open: dict[int, object] = {}  # range_start ids (may end on another thread)
_ids = itertools.count(1)
_lock = threading.Lock()


def _enter(msg: str):
    return torch.ops.profiler._record_function_enter_new(str(msg), None)


def _exit(handle) -> None:
    torch.ops.profiler._record_function_exit._RecordFunction(handle)


def _stack() -> list:
    stack = getattr(_local, "stack", None)
    if stack is None:
        stack = _local.stack = []
    return stack


def range_push(msg: str) -> int:
    """Push a range onto this thread's stack of nested ranges; returns its zero-based depth."""
    stack = _stack()
    stack.append(_enter(msg))
    return len(stack) - 1


def range_pop() -> int:
    """Pop this thread's innermost range; returns the zero-based depth of the range that
    ended, or -1 when none was open (as NVTX)."""
    stack = _stack()
    if not stack:
        return -1
    _exit(stack.pop())
    return len(stack)


def range_start(msg: str) -> int:
    """Start a range that need not nest and may end on another thread; returns its id."""
    handle = _enter(msg)
    with _lock:
        range_id = next(_ids)
        _open[range_id] = handle
    return range_id


def range_end(range_id: int) -> None:
    """End the range ``range_start`` returned ``range_id`` for."""
    with _lock:
        handle = _open.pop(range_id, None)
    if handle is None:
        raise ValueError(f"torch.axon.nvtx.range_end: no open range with id {range_id}")
    _exit(handle)


def mark(msg: str) -> None:
    """An instantaneous event (a range of no length)."""
    _exit(_enter(msg))


@contextlib.contextmanager
def range(msg: str, *args, **kwargs):  # noqa: A001 - torch.cuda.nvtx's name
    """Context manager / decorator: a range over its scope; extra arguments format ``msg``."""
    range_push(msg.format(*args, **kwargs))
    try:
        yield
    finally:
        range_pop()
