"""Random number generation: one counter-based generator per axon device."""

from __future__ import annotations

import torch

from .. import _C
from .device import _get_device_index, current_device, device_count

__all__ = ["manual_seed", "manual_seed_all", "seed", "seed_all",
           "initial_seed", "get_rng_state", "set_rng_state", "get_rng_state_all",
           "set_rng_state_all"]

_default_generators: tuple[torch.Generator, ...] | None = None
# Seeds given before the devices were set up (torch.manual_seed right after
# import): applied when they are, as torch.cuda's _lazy_call queues them.
_pending_seed_all: int | None = None
_pending_seeds: dict[int, int] = {}


def _generators() -> tuple[torch.Generator, ...]:
    """The default torch.Generator of each axon device, made at first use (as
    torch.cuda's at lazy initialisation: the devices are counted then, so
    AXON_VISIBLE_DEVICES set after ``import torch`` still applies)."""
    global _default_generators, _pending_seed_all
    if _default_generators is None:
        gens = _C._default_generators()
        if _pending_seed_all is not None:
            for g in gens:
                g.manual_seed(_pending_seed_all)
        for index, s in _pending_seeds.items():
            if index < len(gens):
                gens[index].manual_seed(s)
        _pending_seed_all = None
        _pending_seeds.clear()
        _default_generators = gens
        _C._mark_torch_device_initialized()
    return _default_generators


def _initialized() -> bool:
    return _default_generators is not None or _C._devices_initialized()


def __getattr__(name):
    # default_generators: the module attribute of torch.cuda, made lazily.
    if name == "default_generators":
        return _generators()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _generator(device=None) -> torch.Generator:
    index = _get_device_index(device, optional=True)
    _C._check_device(index)
    return _generators()[index]


def manual_seed(seed: int) -> None:
    """Seed the current axon device's generator.  Without an axon device it does
    nothing, as ``torch.cuda.manual_seed`` without CUDA (seeding helpers call it
    unconditionally)."""
    seed = int(seed)
    if not _initialized():
        _pending_seeds[current_device()] = seed
        return
    if _generators():
        _generator().manual_seed(seed)


def manual_seed_all(seed: int) -> None:
    """Seed every axon device's generator (torch.manual_seed calls this); before
    the devices are set up, when they are."""
    global _pending_seed_all
    if not _initialized():
        _pending_seed_all = int(seed)
        _pending_seeds.clear()
        return
    for g in _generators():
        g.manual_seed(int(seed))


def seed() -> None:
    """Seed the current device's generator with a random number (nothing without an
    axon device, as ``torch.cuda.seed``)."""
    if _generators():
        _generator().seed()


def seed_all() -> None:
    if not _generators():
        return
    s = _generator().seed()
    for g in _generators():
        g.manual_seed(s)


def initial_seed() -> int:
    return _generator().initial_seed()


def get_rng_state(device="axon") -> torch.Tensor:
    """The generator state of a device: a 16-byte uint8 tensor (seed, offset)."""
    return _generator(device).get_state()


def set_rng_state(new_state: torch.Tensor, device="axon") -> None:
    _generator(device).set_state(new_state.clone().cpu())


def get_rng_state_all() -> list[torch.Tensor]:
    return [get_rng_state(i) for i in range(device_count())]


def set_rng_state_all(new_states) -> None:
    for i, state in enumerate(new_states):
        set_rng_state(state, i)

