"""Transformers: train on axon without device settings."""

from __future__ import annotations

import functools
import os

import torch

from ._hooks import on_import
from ._tools import axon_available, axon_is_the_accelerator


@on_import("transformers.training_args")
def training_args_setup_devices(training_args) -> None:
    """Patch ``transformers.training_args.TrainingArguments._setup_devices``.

    For a single process it tries mps, xpu, mlu, musa, npu, hpu, neuron, tpu,
    then ``"cuda:0" if torch.cuda.is_available() else
    os.environ.get("ACCELERATE_TORCH_DEVICE", "cpu")`` - a PrivateUse1 device
    only through an environment variable.  The wrapper replaces that CPU answer
    (unless ``use_cpu`` asked for it) with the device Accelerate chose, which
    ``hf_accelerate.partial_state_default_device`` makes axon.
    """
    cls = training_args.TrainingArguments
    original = cls.__dict__["_setup_devices"]
    if getattr(original.func, "_axon_patch", False):
        return

    @functools.wraps(original.func)
    def _setup_devices(self) -> torch.device:
        device = original.func(self)
        if device.type == "cpu" and not self.use_cpu and axon_available():
            state_device = getattr(self.distributed_state, "device", None)
            if state_device is not None and state_device.type == "axon":
                self._n_gpu = 1
                return state_device
        return device

    _setup_devices._axon_patch = True
    patched = functools.cached_property(_setup_devices)
    patched.__set_name__(cls, "_setup_devices")
    cls._setup_devices = patched


@on_import("transformers.training_args")
def training_args_bf16_available(training_args) -> None:
    """Patch ``transformers.training_args.is_torch_bf16_gpu_available``.

    ``TrainingArguments(bf16=True)`` refuses to start ("Your setup doesn't
    support bf16/gpu") unless that function says yes; it asks supa, cuda, xpu,
    hpu, npu, mps, musa, mlu, neuron and tpu, and otherwise returns False, as if
    only the CPU were left.  The wrapper answers ``torch.axon.is_bf16_supported()``
    where upstream says False (Accelerate then autocasts with device_type="axon");
    once upstream says True for axon it changes nothing.
    """
    original = training_args.is_torch_bf16_gpu_available
    if getattr(original, "_axon_patch", False):
        return

    @functools.wraps(original)
    def is_torch_bf16_gpu_available() -> bool:
        if original():
            return True
        return axon_available() and torch.axon.is_bf16_supported()

    is_torch_bf16_gpu_available._axon_patch = True
    training_args.is_torch_bf16_gpu_available = is_torch_bf16_gpu_available


@on_import("transformers.generation.utils")
def generation_auto_compile(generation_utils) -> None:
    """Patch ``GenerationMixin._valid_auto_compile_criteria``.

    ``generate`` compiles the decoding step by itself (when the cache is a
    compilable one such as ``cache_implementation="static"``) only if the model
    is on ``["cuda", "xpu", "neuron", "tpu"]``, or if ``compile_config`` carries
    the private ``_compile_all_devices`` flag.  For a model on axon the wrapper
    sets that flag for the duration of the check (with the default
    ``CompileConfig()`` where none was given), so axon compiles exactly where
    CUDA would; every other condition of the check (cache type,
    ``disable_compile``, quantizers, offloading) is upstream's.
    """
    cls = generation_utils.GenerationMixin
    original = cls._valid_auto_compile_criteria
    if getattr(original, "_axon_patch", False):
        return

    @functools.wraps(original)
    def _valid_auto_compile_criteria(self, model_kwargs, generation_config) -> bool:
        device = getattr(self, "device", None)
        if device is None or device.type != "axon":
            return original(self, model_kwargs, generation_config)
        given = generation_config.compile_config
        if given is None:
            from transformers.generation.configuration_utils import CompileConfig

            config = CompileConfig()
        else:
            config = given
        had_flag = "_compile_all_devices" in config.__dict__
        flag = config.__dict__.get("_compile_all_devices")
        generation_config.compile_config = config
        config._compile_all_devices = True
        # Upstream warns "You have set `compile_config`, but we are unable to
        # meet the criteria" when a config is set and the cache cannot be
        # compiled (the default dynamic cache): with no config of the user's,
        # that warning is about ours, so it is silenced for this call.
        logger = getattr(generation_utils, "logger", None)
        silence = given is None and logger is not None
        if silence:
            logger.warning_once = lambda *args, **kwargs: None
        try:
            return original(self, model_kwargs, generation_config)
        finally:
            if silence:
                del logger.warning_once
            if had_flag:
                config._compile_all_devices = flag
            else:
                del config._compile_all_devices
            generation_config.compile_config = given

    _valid_auto_compile_criteria._axon_patch = True
    cls._valid_auto_compile_criteria = _valid_auto_compile_criteria


@on_import("transformers.integrations.sdpa_attention")
def sdpa_gqa_when_compiling(sdpa_attention) -> None:
    """Patch ``transformers.integrations.sdpa_attention.use_gqa_in_sdpa``.

    It lets ``scaled_dot_product_attention`` handle grouped-query attention
    (``enable_gqa=True``) only on xpu and mps, or on CUDA without a mask.
    Otherwise eager decoding packs the query heads onto the key/value heads
    (``pack_gqa``), but under torch.compile Transformers falls back to
    ``repeat_kv``, which copies the whole static KV cache n_rep times per layer
    and decoding step.  axon's attention kernel takes grouped key/value heads
    with or without a mask, so while compiling for axon the wrapper answers
    True; eager code keeps upstream's choice.
    """
    original = sdpa_attention.use_gqa_in_sdpa
    if getattr(original, "_axon_patch", False):
        return

    @functools.wraps(original)
    def use_gqa_in_sdpa(attention_mask, key, value) -> bool:
        if key.device.type == "axon" and key.shape[-1] == value.shape[-1] and \
                torch.compiler.is_compiling():
            return True
        return original(attention_mask, key, value)

    use_gqa_in_sdpa._axon_patch = True
    sdpa_attention.use_gqa_in_sdpa = use_gqa_in_sdpa


def _rng_file(trainer, checkpoint: str) -> str:
    """The RNG file of this process in a checkpoint, named as the Trainer names it."""
    name = f"rng_state_{trainer.args.process_index}.pth" if trainer.args.world_size > 1 \
        else "rng_state.pth"
    return os.path.join(checkpoint, name)


@on_import("transformers.trainer")
def trainer_rng_state_axon(trainer_module) -> None:
    """Patch ``transformers.trainer.Trainer._save_rng_state`` and ``_load_rng_state``.

    A checkpoint keeps the generators of python, numpy, the CPU and of cuda,
    xla, npu, hpu, mlu and musa; axon's was neither saved nor restored, so a
    run resumed from a checkpoint drew other dropout masks on axon than the
    uninterrupted run.  The wrappers add the axon generators under the key
    "axon" (all devices' in a distributed run, as upstream does for cuda) and
    restore them with upstream's ``set_rng_state_for_device``.
    """
    cls = trainer_module.Trainer
    save, load = cls._save_rng_state, cls._load_rng_state
    if getattr(save, "_axon_patch", False):
        return
    ParallelMode = trainer_module.ParallelMode

    @functools.wraps(save)
    def _save_rng_state(self, output_dir: str) -> None:
        save(self, output_dir)
        if torch.cuda.is_available() or not axon_available():
            return
        path = _rng_file(self, output_dir)
        with trainer_module.safe_globals():
            states = torch.load(path, weights_only=True)
        distributed = self.args.parallel_mode == ParallelMode.DISTRIBUTED
        states["axon"] = torch.axon.get_rng_state_all() if distributed else torch.axon.get_rng_state()
        torch.save(states, path)

    @functools.wraps(load)
    def _load_rng_state(self, checkpoint: str | None) -> None:
        load(self, checkpoint)
        if checkpoint is None or not axon_available() or not os.path.isfile(
                path := _rng_file(self, checkpoint)):
            return
        with trainer_module.safe_globals():
            states = torch.load(path, weights_only=True)
        if "axon" in states:
            distributed = self.args.parallel_mode == ParallelMode.DISTRIBUTED
            trainer_module.set_rng_state_for_device("AXON", torch.axon, states, distributed)

    _save_rng_state._axon_patch = _load_rng_state._axon_patch = True
    cls._save_rng_state, cls._load_rng_state = _save_rng_state, _load_rng_state


@on_import("transformers.pipelines.base")
def pipeline_default_device(pipelines_base) -> None:
    """Patch ``transformers.pipelines.base.Pipeline.__init__``.

    Without ``device=`` (and without an Accelerate device map) a pipeline takes
    "device 0" of the first of mlu, musa, cuda, npu, hpu, xpu, mps that is
    available, else the CPU, and moves the model there: a model on axon went back
    to the CPU, where on CUDA it stays on ``cuda:0``.  Where axon is the machine's
    accelerator the wrapper turns that default, and an integer device (``device=1``),
    into ``axon:<n>``, as upstream does for the devices it knows.
    """
    cls = pipelines_base.Pipeline
    original = cls.__init__
    if getattr(original, "_axon_patch", False):
        return

    @functools.wraps(original)
    def __init__(self, model, *args, **kwargs):
        device = kwargs.get("device")
        if len(args) < 7 and (isinstance(device, int) or device is None) \
                and not isinstance(device, bool) \
                and getattr(model, "hf_device_map", None) is None and axon_is_the_accelerator():
            index = 0 if device is None else device
            if index >= 0:
                kwargs["device"] = torch.device("axon", index)
        original(self, model, *args, **kwargs)

    __init__._axon_patch = True
    cls.__init__ = __init__



@on_import("transformers.cache_utils")
def cache_offloading_default_stream(cache_utils) -> None:
    """Patch ``transformers.cache_utils.torch`` (the module's name for torch).

    An offloading cache (``cache_implementation="offloaded"``, ``Cache(offloading=True)``)
    prefetches layers on a ``torch.Stream`` of the current accelerator, but orders it with
    ``torch.cuda.default_stream(key_states.device)``: cuda only ("Torch not compiled with
    CUDA enabled" on axon; xpu and npu devices meet the same call).  The module gets a
    view of torch whose ``cuda.default_stream`` returns ``torch.axon.default_stream`` for
    an axon device and is torch's own for anything else; every other name is torch's.
    """
    current = cache_utils.__dict__.get("torch")
    if getattr(current, "_axon_patch", False) or current is not torch:
        return
    import types

    def default_stream(device=None):
        if device is not None and torch.device(device).type == "axon":
            return torch.axon.default_stream(device)
        return torch.cuda.default_stream(device)

    cuda = types.ModuleType("torch.cuda")
    cuda.__dict__.update(torch.cuda.__dict__)
    cuda.__getattr__ = lambda name: getattr(torch.cuda, name)
    cuda.default_stream = default_stream
    view = types.ModuleType("torch")
    view.__dict__.update(torch.__dict__)
    view.__getattr__ = lambda name: getattr(torch, name)  # names torch gains later
    view.cuda = cuda
    view._axon_patch = True
    cache_utils.torch = view
