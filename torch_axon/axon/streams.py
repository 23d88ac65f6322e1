"""Streams and events: torch.Stream / torch.Event bound to axon."""

from __future__ import annotations

import torch

from .. import _C
from .device import _get_device_index, current_device

__all__ = ["Stream", "Event", "current_stream", "default_stream", "set_stream",
           "stream", "StreamContext"]


class Stream(torch.Stream):
    """An in-order queue of work on one axon device (like torch.cuda.Stream).

    priority < 0 asks for a high-priority stream.
    """

    def __new__(cls, device=None, priority: int = 0, **kwargs):
        if "stream_id" in kwargs:
            return super().__new__(cls, **kwargs)
        index = _get_device_index(device, optional=True)
        return super().__new__(cls, device=torch.device("axon", index), priority=priority)

    @property
    def priority(self) -> int:
        """0 for normal, -1 for high priority."""
        return _C._stream_priority(self.device_index, self.stream_id)

    def wait_stream(self, stream: torch.Stream) -> None:
        self.wait_event(stream.record_event())

    def __repr__(self) -> str:
        return f"<torch.axon.Stream device=axon:{self.device_index} stream_id={self.stream_id}>"


def _wrap(s: torch.Stream) -> Stream:
    return Stream(stream_id=s.stream_id, device_index=s.device_index,
                  device_type=s.device_type)


class _EventType(type):
    # torch.Event's C methods accept only exact torch.Event objects, so Event()
    # returns one; isinstance(e, torch.axon.Event) holds for any axon event.
    def __instancecheck__(cls, obj) -> bool:
        return isinstance(obj, torch.Event) and obj.device.type == "axon"


class Event(metaclass=_EventType):
    """A marker in an axon stream: record, wait, query, time (like torch.cuda.Event).

    Instances are ``torch.Event`` objects on the current axon device.
    """

    def __new__(cls, enable_timing: bool = False, blocking: bool = False,
                interprocess: bool = False, external: bool = False):
        if interprocess:
            raise NotImplementedError("axon events cannot be shared between processes")
        if external:
            raise NotImplementedError(
                "axon events cannot be external (recorded into a graph capture as an event "
                "node, as CUDA's external=True); record them outside the capture")
        return torch.Event(device=torch.device("axon", current_device()),
                           enable_timing=enable_timing, blocking=blocking)


def current_stream(device=None) -> Stream:
    """The calling thread's current stream on an axon device."""
    return _wrap(torch.accelerator.current_stream(
        torch.device("axon", _get_device_index(device, optional=True))))


def default_stream(device=None) -> Stream:
    """The default stream (id 0) of an axon device."""
    index = _get_device_index(device, optional=True)
    return Stream(stream_id=0, device_index=index, device_type=current_stream(index).device_type)


def _check_axon_stream(stream: torch.Stream) -> None:
    if stream.device.type != "axon":
        raise ValueError(f"Expected an axon device, but got: {stream.device}")


def set_stream(stream: torch.Stream) -> None:
    """Make `stream` the current stream of its device."""
    if stream is None:
        return
    _check_axon_stream(stream)
    torch.accelerator.set_stream(stream)


class StreamContext:
    """Context manager that makes a stream current, on its device, for its scope."""

    def __init__(self, stream: torch.Stream | None):
        if stream is not None:
            _check_axon_stream(stream)
        self.stream = stream
        self.prev_stream = None
        self.prev_device = None

    def __enter__(self):
        if self.stream is None:
            return
        self.prev_device = current_device()
        if self.stream.device_index != self.prev_device:
            torch.accelerator.set_device_index(self.stream.device_index)
        self.prev_stream = current_stream(self.stream.device_index)
        set_stream(self.stream)

    def __exit__(self, *exc):
        if self.stream is None:
            return False
        set_stream(self.prev_stream)
        if self.stream.device_index != self.prev_device:
            torch.accelerator.set_device_index(self.prev_device)
        return False


def stream(stream: torch.Stream | None) -> StreamContext:
    """Run the enclosed code on `stream` (like torch.cuda.stream)."""
    return StreamContext(stream)
