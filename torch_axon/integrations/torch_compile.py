"""torch.compile: let Dynamo and Inductor find the axon device.

Loading Dynamo or Inductor costs more than a second, so nothing here imports
them: the hooks below run when PyTorch itself loads them.
"""

from __future__ import annotations

import functools

from ._hooks import on_import


@on_import("torch._dynamo.device_interface")
def dynamo_device_interface(device_interface) -> None:
    """Register axon's ``DeviceInterface`` with Dynamo.

    ``torch._dynamo.device_interface`` registers only the devices it knows
    (cuda, xpu, mtia, mps, cpu) and has no PrivateUse1 hook; Dynamo's stream
    and event support is built from the interfaces registered when it loads.
    """
    from ..compiler.device_interface import AxonInterface

    device_interface.register_interface_for_device("axon", AxonInterface)


def inductor_scheduling() -> None:
    """Called through ``torch.axon.Scheduling``: register axon's Inductor backend.

    Inductor's ``init_backend_registration`` (run before every compilation)
    looks up ``Scheduling``, ``PythonWrapperCodegen`` and ``CppWrapperCodegen``
    on the PrivateUse1 device module.  Looking up the first one registers the
    backend in full (with its cache-key pass, which that lookup path cannot
    pass on) and Inductor's own registration then finds it done.
    """
    from ..compiler import register

    register()


@on_import("torch._dynamo.trace_rules")
def dynamo_skip_rng_state(trace_rules) -> None:
    """Have Dynamo call torch.axon's RNG functions instead of tracing them.

    ``torch._dynamo.trace_rules`` marks ``torch.cuda.random``'s
    ``get_rng_state``/``set_rng_state``/``manual_seed``... as functions to run,
    not trace.  torch.axon's are Python that Dynamo would otherwise step into,
    and fail on (``torch.testing``'s ``freeze_rng_state``, used around compiled
    code, calls them under ``no_dispatch()``).  ``trace_rules.add`` puts the
    module in Dynamo's skip list: calls into it run eagerly, as a graph break.
    """
    trace_rules.add("torch_axon.axon.random")


@on_import("torch._decomp.decompositions")
def batch_norm_statistics_like_cpu(decompositions) -> None:
    """Patch ``torch._decomp.decompositions.native_batch_norm_helper``.

    The batch-norm decompositions (and so the fake/meta results torch.compile
    traces with) give the saved statistics CUDA's shapes on every device but
    "cpu": in eval mode ``save_mean``/``save_rstd`` are the running statistics
    rather than empty tensors.  axon's batch norm is the CPU kernel, which
    returns empty tensors in eval mode and statistics in the input's dtype (the
    parameters' when they differ); the wrapper makes the decomposition say the
    same for axon inputs.
    """
    original = decompositions.native_batch_norm_helper
    if getattr(original, "_axon_patch", False):
        return

    @functools.wraps(original)
    def native_batch_norm_helper(input, weight, bias, running_mean, running_var, training,
                                 momentum, eps, functional):
        out = original(input, weight, bias, running_mean, running_var, training, momentum,
                       eps, functional)
        if input.device.type != "axon":
            return out
        output, save_mean, save_rstd, new_mean, new_var = out
        # The CPU kernel's dtype: the parameters' when they differ from the
        # input's (float32 parameters of 16-bit activations), else the input's.
        dtype = next((t.dtype for t in (weight, bias, running_mean, running_var)
                      if t is not None and t.dtype != input.dtype), input.dtype)
        if not training:
            save_mean, save_rstd = input.new_zeros((0,)), input.new_zeros((0,))
        return (output, save_mean.to(dtype=dtype), save_rstd.to(dtype=dtype), new_mean, new_var)

    native_batch_norm_helper._axon_patch = True
    decompositions.native_batch_norm_helper = native_batch_norm_helper
