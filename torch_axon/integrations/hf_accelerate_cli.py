"""Accelerate's command line (config default, launch, env, test) on an axon machine.

Each command picks devices from a fixed chain (mlu, sdaa, musa, hpu, cuda, xpu,
npu, neuron) and ends at the CPU, so on an axon machine ``accelerate config
default`` wrote a CPU config, ``accelerate launch --num_processes=2`` ran one
process, ``accelerate env`` said "PyTorch accelerator: N/A" and ``accelerate
test`` failed.  The wrappers below answer for axon exactly where upstream would
have fallen through to the CPU (or to CUDA's zero devices), and only when axon
is torch's current accelerator.
"""

from __future__ import annotations

import contextlib
import functools
import io
import json
import logging
import os
import tempfile

import torch

from ._hooks import on_import
from ._tools import axon_is_the_accelerator, replace_function

logger = logging.getLogger(__name__)


@on_import("accelerate.commands.config.default")
def default_config_axon(default) -> None:
    """Patch ``accelerate.commands.config.default.write_basic_config``.

    ``accelerate config default`` (and ``accelerate.utils.write_basic_config``)
    counts the devices of mlu, sdaa, musa, hpu, cuda, xpu, npu or neuron and
    otherwise writes ``use_cpu: true``.  Where upstream wrote that CPU config
    on an axon machine, the wrapper rewrites it as upstream does for CUDA: one
    process per axon device, ``MULTI_GPU`` (which ``accelerate launch`` runs
    with torchrun; see ``hf_distributed`` for what MULTI_GPU means on axon)
    when there is more than one device, ``use_cpu: false``.
    """
    original = default.write_basic_config
    if getattr(original, "_axon_patch", False):
        return

    @functools.wraps(original)
    def write_basic_config(mixed_precision="no", save_location: str = default.default_json_config_file):
        path = original(mixed_precision, save_location)
        if not path or not axon_is_the_accelerator():
            return path
        with open(path) as f:
            config = json.load(f)
        if config.get("use_cpu"):
            count = torch.axon.device_count()
            config.update(use_cpu=False, num_processes=count,
                          distributed_type="MULTI_GPU" if count > 1 else "NO")
            with open(path, "w") as f:
                json.dump(config, f, indent=2, sort_keys=True)
        return path

    write_basic_config._axon_patch = True
    replace_function(default, "write_basic_config", write_basic_config)


@on_import("accelerate.commands.launch")
def launch_process_count(launch) -> None:
    """Patch ``accelerate.commands.launch._validate_launch_command``.

    With no config file, ``--num_processes`` defaults to the device count of
    xpu, mlu, sdaa, musa, npu, hpu or neuron, otherwise ``torch.cuda.device_count()``
    (0 on an axon machine), and more than one process turns on ``--multi_gpu``
    only when one of those kinds (cuda, xpu, npu, ...) has several devices; so
    ``accelerate launch --num_processes=2 script.py`` silently ran a single
    process.  Where axon is torch's accelerator, the wrapper defaults the count
    to the axon devices and launches more than one process with torchrun
    (``--multi_gpu``), each on its own axon device.  A config file, ``--cpu``
    and the other launchers (DeepSpeed, FSDP, TPU, Megatron) are upstream's.
    """
    original = launch._validate_launch_command
    if getattr(original, "_axon_patch", False):
        return

    @functools.wraps(original)
    def _validate_launch_command(args):
        uses_config = args.config_file is not None or (
            os.path.isfile(launch.default_config_file) and not args.cpu)
        ours = not uses_config and not args.cpu and axon_is_the_accelerator()
        count_later = ours and args.num_processes is None and args.multi_gpu
        if ours and args.num_processes is None and not args.multi_gpu:
            args.num_processes = torch.axon.device_count()
            logger.warning("`--num_processes` was set to %d, the number of axon devices",
                           args.num_processes)
        result = original(args)
        args = result[0]
        if count_later:  # after upstream's "--multi_gpu needs 2 processes" check, as for CUDA
            args.num_processes = torch.axon.device_count()
        others = (args.tpu, args.use_deepspeed, args.use_fsdp, args.use_megatron_lm)
        if ours and not args.multi_gpu and not any(others) and args.num_processes > 1:
            args.multi_gpu = True
        return result

    _validate_launch_command._axon_patch = True
    launch._validate_launch_command = _validate_launch_command


@on_import("accelerate.utils.launch")
def launch_gpu_ids(launch) -> None:
    """Patch ``accelerate.utils.launch``'s ``prepare_simple_launcher_cmd_env``,
    ``prepare_multi_gpu_env`` and ``prepare_deepspeed_cmd_env``.

    ``accelerate launch --gpu_ids=1,3`` restricts the launched processes to those
    devices by setting the first matching kind's variable (``ZE_AFFINITY_MASK``,
    ..., else ``CUDA_VISIBLE_DEVICES``), which an axon process ignores: every
    rank saw every device.  Where axon is torch's accelerator, the wrappers also
    set ``AXON_VISIBLE_DEVICES`` to the ids in the launched processes' environment.
    """
    def visible(args, env: dict) -> None:
        gpu_ids = getattr(args, "gpu_ids", "all")
        if gpu_ids not in (None, "all") and axon_is_the_accelerator():
            env["AXON_VISIBLE_DEVICES"] = str(gpu_ids)

    for name, returns_cmd in (("prepare_simple_launcher_cmd_env", True),
                              ("prepare_multi_gpu_env", False),
                              ("prepare_deepspeed_cmd_env", True)):
        original = getattr(launch, name, None)
        if original is None or getattr(original, "_axon_patch", False):
            continue

        def wrapper(args, *rest, _original=original, _returns_cmd=returns_cmd, **kwargs):
            result = _original(args, *rest, **kwargs)
            visible(args, result[1] if _returns_cmd else result)
            return result

        functools.update_wrapper(wrapper, original)
        wrapper._axon_patch = True
        replace_function(launch, name, wrapper)


@on_import("accelerate.commands.env")
def env_reports_axon(env) -> None:
    """Patch ``accelerate.commands.env.env_command``.

    ``accelerate env`` names the accelerator from a fixed chain (cuda, xpu, mlu,
    sdaa, musa, npu, neuron, mps) and says "PyTorch accelerator: N/A" for any
    other.  Where it said N/A and axon is torch's accelerator, the wrapper
    reports AXON, with the device name and count, in the printed report and in
    the returned dictionary.
    """
    original = env.env_command
    if getattr(original, "_axon_patch", False):
        return

    @functools.wraps(original)
    def env_command(args):
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            info = original(args)
        text = printed.getvalue()
        if info.get("PyTorch accelerator") == "N/A" and axon_is_the_accelerator():
            axon_type = f"{torch.axon.get_device_name()} x {torch.axon.device_count()}"
            info["PyTorch accelerator"] = "AXON"
            text = text.replace("- PyTorch accelerator: N/A",
                                f"- PyTorch accelerator: AXON\n- AXON type: {axon_type}", 1)
            configs = info.pop("`Accelerate` configs", None)
            info["AXON type"] = axon_type
            if configs is not None:
                info["`Accelerate` configs"] = configs
        print(text, end="")
        return info

    env_command._axon_patch = True
    env.env_command = env_command


def device_generic_test_script(source: str) -> str:
    """Accelerate's test script with its CUDA calls made device-generic.

    The script reads ``DistributedType.MULTI_GPU`` as CUDA in two places
    (``torch.cuda.get_rng_state()`` after synchronising the device RNG, and
    ``torch.cuda.device_count()`` for the processes per node); on any other
    accelerator that MULTI_GPU covers they are the current accelerator's
    module, which ``torch.get_device_module()`` returns (torch.cuda on CUDA).
    """
    return source.replace("torch.cuda.", "torch.get_device_module().")


@on_import("accelerate.commands.test")
def test_command_axon(test) -> None:
    """Patch ``accelerate.commands.test.test_command``.

    ``accelerate test`` launches ``test_utils/scripts/test_script.py``, which
    calls ``torch.cuda`` directly under ``DistributedType.MULTI_GPU`` (and
    ``torch.xpu`` under MULTI_XPU, with no branch for npu or any other; see
    ``device_generic_test_script``), the type Accelerate, Transformers and TRL
    give an axon machine under torchrun.  Where axon is torch's accelerator the
    wrapper launches, as upstream does, a copy of the script with those calls
    made device-generic (the change to propose upstream); its checks are
    unchanged.
    """
    original = test.test_command
    if getattr(original, "_axon_patch", False):
        return

    @functools.wraps(original)
    def test_command(args):
        if not axon_is_the_accelerator():
            return original(args)
        script = test.path_in_accelerate_package("test_utils", "scripts", "test_script.py")
        with open(script) as f:
            source = device_generic_test_script(f.read())
        with tempfile.TemporaryDirectory() as tmp:
            generic = os.path.join(tmp, "test_script.py")
            with open(generic, "w") as f:
                f.write(source)
            config = [] if args.config_file is None else [f"--config_file={args.config_file}"]
            result = test.execute_subprocess_async(["accelerate-launch", *config, generic])
        if result.returncode == 0:
            print("Test is a success! You are ready for your distributed training!")

    test_command._axon_patch = True
    test.test_command = test_command
