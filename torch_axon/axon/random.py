"""Random number generation: one counter-based generator per axon device."""

from __future__ import annotations

import torch

from .. import _C
from .device import _get_device_index, current_device, device_count

__all__ = ["default_generators", "manual_seed", "manual_seed_all", "seed", "seed_all",
           "initial_seed", "get_rng_state", "set_rng_state", "get_rng_state_all",
           "set_rng_state_all"]

#: The default torch.Generator of each axon device.
default_generators: tuple[torch.Generator, ...] = _C._default_generators()


def _generator(device=None) -> torch.Generator:
    index = _get_device_index(device, optional=True)
    _C._check_device(index)
    return default_generators[index]


def manual_seed(seed: int) -> None:
    """Seed the current axon device's generator.  Without an axon device it does
    nothing, as ``torch.cuda.manual_seed`` without CUDA (seeding helpers call it
    unconditionally)."""
    seed = int(seed)
    if default_generators:
        _generator().manual_seed(seed)


def manual_seed_all(seed: int) -> None:
    """Seed every axon device's generator (torch.manual_seed calls this)."""
    for g in default_generators:
        g.manual_seed(int(seed))


def seed() -> None:
    """Seed the current device's generator with a random number (nothing without an
    axon device, as ``torch.cuda.seed``)."""
    if default_generators:
        _generator().seed()


def seed_all() -> None:
    if not default_generators:
        return
    s = _generator().seed()
    for g in default_generators:
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


del current_device
