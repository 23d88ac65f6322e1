"""torch.compile: let Dynamo and Inductor find the axon device.

Loading Dynamo or Inductor costs more than a second, so nothing here imports
them: the hooks below run when PyTorch itself loads them.
"""

from __future__ import annotations

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
