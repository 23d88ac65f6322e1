"""torch.axon: the axon device's counterpart of torch.cuda.

Registered as ``torch.axon`` when torch_axon loads (automatically, through the
``torch.backends`` entry point).
"""

from .. import _C
from .device import *  # noqa: F401,F403
from .device import _get_device_index, _is_in_bad_fork, _lazy_init  # noqa: F401
from .ipc import *  # noqa: F401,F403
from .sync_debug import *  # noqa: F401,F403
from .cuda_compat import *  # noqa: F401,F403
from .memory import *  # noqa: F401,F403
from .random import *  # noqa: F401,F403
from .streams import *  # noqa: F401,F403
from .graphs import *  # noqa: F401,F403
from .legacy_storage import *  # noqa: F401,F403
from . import amp  # noqa: F401,E402  (the deprecated torch.cuda.amp names)
from . import nvtx  # noqa: F401,E402  (torch.cuda.nvtx's ranges, as profiler ranges)

# Set as torch.cuda's is once initialised; torch.utils.checkpoint reads it to
# decide whether to save and restore the device's RNG state.
_initialized = True


def fallback_stats() -> dict[str, int]:
    """{op name: calls} of the ops that ran through the CPU fallback."""
    return dict(_C._fallback_stats())


def reset_fallback_stats() -> None:
    """Zero the counts fallback_stats() reports."""
    _C._reset_fallback_stats()


def fusion_stats() -> dict[str, int]:
    """Adaptive eager's counts since the last reset: runs of fusible ops the
    streams offered (``chains_seen``), how many ran fused (``fused_kernels``),
    the ops in them (``ops_fused``), the tiles they ran in, the bytes of
    intermediates not written, and kernels compiled (the engine compiles none).
    ``AXON_ADAPTIVE_EAGER=0`` turns fusion off."""
    return dict(_C._fusion_stats())


def reset_fusion_stats() -> None:
    """Zero the counts fusion_stats() reports."""
    _C._reset_fusion_stats()


def __getattr__(name: str):
    # torch.axon.default_generators: made at first use (random.py), so that the
    # devices are counted then, not at import.
    if name == "default_generators":
        from .random import _generators

        return _generators()
    # Inductor looks up the device's code generation here (see
    # torch_axon.integrations.torch_compile.inductor_scheduling); the lookup
    # registers it with Inductor directly.
    if name == "Scheduling":
        from ..integrations.torch_compile import inductor_scheduling

        inductor_scheduling()
    raise AttributeError(f"module 'torch.axon' has no attribute '{name}'")
