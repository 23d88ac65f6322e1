"""Patches for Hugging Face libraries that pick devices from fixed lists.

Each patch is a function in this package with a docstring naming the upstream
function and the hard-coded device list it works around.  Patches apply when
their target module is first imported (nothing is imported eagerly: loading
torch must stay cheap) and turn themselves into no-ops once upstream accepts
generic devices.
"""

from __future__ import annotations

from ._hooks import install

__all__ = ["install"]
