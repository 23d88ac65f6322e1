"""Inductor's code generation for the axon device.

axon memory is host-addressable and its compute units are host cores, so
Inductor's own C++ backend (CppScheduling: fused, vectorised loops) generates
the kernels.  What differs from the CPU is how they run: every kernel is
enqueued on the device's current stream (runtime.py), and buffers come from
the axon caching allocator on the right device.  Three classes:

* AxonScheduling: CppScheduling whose kernels get axon's stream-launching
  bindings.
* AxonWrapperCodegen (+ the subgraph flavour): the Python wrapper; calls
  kernels with their device index, allocates with ``empty_strided_axon``.
* AxonDeviceOpOverrides: the device snippets Inductor pastes into wrappers.

register() installs them, plus two adjustments in Inductor that assume only
"cpu" runs C++ kernels (see _patch_scheduler_is_cpu).
"""

from __future__ import annotations

import functools
import hashlib
import pathlib
import types
from textwrap import dedent
from typing import Any

import torch
from torch._inductor import ir as _ir
from torch._inductor import scheduler as _scheduler
from torch._inductor.codegen.common import (DeviceOpOverrides, register_backend_for_device,
                                            register_device_op_overrides)
from torch._inductor.codegen.cpp import CppScheduling
from torch._inductor.codegen.wrapper import PythonWrapperCodegen, SubgraphPythonWrapperCodegen
from torch._inductor.custom_graph_pass import CustomGraphModulePass
from torch._inductor.virtualized import V

import torch_axon

from . import flex_attention as _flex_attention

# Marks axon kernels' source: keeps a CPU kernel of the same loops (a graph
# can hold both) from being mistaken for it by the wrapper's source->name map.
_AXON_KERNEL_MARK = "// axon: enqueued on the device's current stream\n"
_BINDING = "async_compile.cpp_pybinding("
_AXON_BINDING = "axon_async_compile.cpp_pybinding("


# Inductor parallelises a C++ loop nest over OpenMP threads once each thread
# gets min_chunk_size iterations (512).  On axon a kernel runs on the stream
# worker, for which an OpenMP team costs more than decoding-sized work gains
# (and the host wants the other core): as axon's eager kernels
# (csrc/core/StreamWork.h, kSmallKernelElements), loops of fewer than 2^20
# iterations stay on one thread.
AXON_MIN_CHUNK_SIZE = 1 << 19


class AxonScheduling(CppScheduling):
    """C++ kernels (as for the CPU) that run as axon stream work."""

    def codegen_node(self, node):
        with torch._inductor.config.patch({"cpp.min_chunk_size": AXON_MIN_CHUNK_SIZE}):
            return super().codegen_node(node)

    def define_kernel(self, src_code, nodes, kernel_args=None):
        wrapper = V.graph.wrapper_code
        wrapper.axon_defining_kernel = True
        try:
            return super().define_kernel(_AXON_KERNEL_MARK + src_code, nodes, kernel_args)
        finally:
            wrapper.axon_defining_kernel = False


class _AxonWrapperMixin:
    """What the Python wrapper does differently on axon."""

    axon_defining_kernel = False

    def define_kernel(self, kernel_name: str, kernel_body: str, *args: Any, **kwargs: Any):
        if self.axon_defining_kernel and kernel_body.startswith(_BINDING):
            kernel_body = _AXON_BINDING + kernel_body[len(_BINDING):]
        return super().define_kernel(kernel_name, kernel_body, *args, **kwargs)

    def _generate_kernel_call_helper(self, kernel_name: str, call_args, *, device=None,
                                     triton: bool = True, **kwargs: Any):
        device = device or V.graph.get_current_device_or_throw()
        if device.type == "axon" and not triton:
            # The binding enqueues the kernel on the current stream of this
            # device (the wrapper emits no device guards for non-GPU devices).
            # CPU tensors among the arguments (Inductor passes 0-d CPU tensors
            # to C++ kernels by pointer) are first copied to axon memory.
            index = _index(device)
            args = [f"axon_kernel_arg({a}, {index})" if _on_cpu(a) else a for a in call_args]
            self.writeline(self.wrap_kernel_call(kernel_name, [str(index), *args]))
            return
        return super()._generate_kernel_call_helper(
            kernel_name, call_args, device=device, triton=triton, **kwargs)

    def make_allocation(self, name, device, dtype, shape, stride, allocation_shape=None,
                        is_pinned=False):
        if device.type != "axon" or torch._inductor.config.test_configs.track_memory_lifecycle:
            return super().make_allocation(name, device, dtype, shape, stride,
                                           allocation_shape, is_pinned)
        if allocation_shape is None:
            allocation_shape = shape
        shape_str = self.codegen_python_shape_tuple(shape)
        alloc_str = self.codegen_python_shape_tuple(allocation_shape)
        stride_str = self.codegen_python_shape_tuple(stride)
        out = f"{name} = empty_strided_axon({alloc_str}, {stride_str}, {dtype}, {_index(device)})"
        if shape_str != alloc_str:
            out += f".as_strided({shape_str}, {stride_str})"
        return out


def _on_cpu(arg: Any) -> bool:
    """Whether a kernel call argument names a CPU tensor."""
    if not isinstance(arg, str):
        return False
    if V.graph.is_unspec_arg(arg):
        return True
    buf = V.graph.try_get_buffer(arg)
    device = buf.get_device() if buf is not None else None
    return device is not None and device.type == "cpu"


def _index(device: torch.device) -> int:
    return device.index if device.index is not None else torch.axon.current_device()


class AxonWrapperCodegen(_AxonWrapperMixin, PythonWrapperCodegen):
    """The Python wrapper of a graph that runs on axon."""

    @staticmethod
    def create(is_subgraph: bool, subgraph_name: str | None,
               parent_wrapper: PythonWrapperCodegen | None, partition_signatures=None):
        if is_subgraph:
            assert subgraph_name is not None and parent_wrapper is not None
            return AxonSubgraphWrapperCodegen(subgraph_name, parent_wrapper, partition_signatures)
        return AxonWrapperCodegen()

    def write_header(self) -> None:
        super().write_header()
        self.imports.writeline(
            "from torch_axon.compiler.runtime import axon_async_compile, axon_kernel_arg, "
            "empty_strided_axon")


class AxonSubgraphWrapperCodegen(_AxonWrapperMixin, SubgraphPythonWrapperCodegen):
    """Wrapper of a subgraph (cond, while_loop, invoke_subgraph) on axon."""


class AxonDeviceOpOverrides(DeviceOpOverrides):
    def import_get_raw_stream_as(self, name: str) -> str:
        return dedent(f"""
            def {name}(index):
                return torch.axon.current_stream(index).stream_id
            """)

    def set_device(self, device_idx: int) -> str:
        return f"torch.axon.set_device({device_idx})"

    def synchronize(self) -> str:
        return "torch.axon.synchronize()"

    def device_guard(self, device_idx: int) -> str:
        return f"torch.axon.device({device_idx})"

    def cpp_kernel_type(self) -> str:
        return "void*"


class AxonCachePass(CustomGraphModulePass):
    """axon's post-grad pass; also puts the axon backend's code into Inductor's cache keys.

    The one transformation: FlexAttention nodes the C++ template cannot
    compute are replaced by their dense ATen implementation
    (flex_attention.decompose).  Inductor hashes the device's custom pass
    into its FX-graph cache key, so a cached graph compiled by another
    version of this code (the compiler package and the Inductor patches in
    integrations/torch_compile.py) is not reused.
    """

    def __call__(self, gm: torch.fx.GraphModule) -> None:
        _flex_attention.decompose(gm)

    def uuid(self) -> Any:
        return _source_hash()


@functools.cache
def _source_hash() -> str:
    h = hashlib.sha256(torch_axon.__version__.encode())
    package = pathlib.Path(__file__).parent.parent
    for path in [*sorted(pathlib.Path(__file__).parent.glob("*.py")),
                 package / "integrations" / "torch_compile.py"]:  # its decomposition patch
        h.update(path.read_bytes())
    return h.hexdigest()


def _patch_scheduler_is_cpu() -> None:
    """Treat axon nodes as C++-kernel nodes where the scheduler asks is_cpu().

    BaseSchedulerNode.is_cpu() picks between the C++ backend's loop handling
    and the SIMD (Triton-style) one (loop reordering, reduction reindexing);
    axon nodes are scheduled by the C++ backend, so they take the CPU branch.
    """
    def is_cpu(self) -> bool:
        device = self.get_device()
        return device is not None and device.type in ("cpu", "axon")

    _scheduler.BaseSchedulerNode.is_cpu = is_cpu


def _patch_get_current_backend() -> None:
    """Name the C++ backend ("cpp") as the code generator of axon kernels.

    ``torch._inductor.utils.get_current_backend`` answers ``config.cuda_backend``
    ("triton") for every device it does not know; its callers then pick Triton
    idioms (fp32 upcasts, dtype propagation of masked loads) for C++ code.
    """
    import torch._inductor.codegen.common as common
    import torch._inductor.kernel.mm_common as mm_common
    import torch._inductor.utils as utils

    original = utils.get_current_backend
    if getattr(original, "_axon_patch", False):
        return

    @functools.wraps(original)
    def get_current_backend(device_type: str | None = None) -> str:
        if not device_type:
            device_type = V.graph.get_current_device_or_throw().type
        if device_type == "axon":
            return torch._inductor.config.cpu_backend
        return original(device_type)

    get_current_backend._axon_patch = True
    for module in (utils, common, _scheduler, mm_common):
        if getattr(module, "get_current_backend", None) is original:
            module.get_current_backend = get_current_backend


class _CpuLikeIr(types.ModuleType):
    """``torch._inductor.ir`` as seen by code that should treat axon as "cpu".

    The same module contents, except that ``get_device_type`` answers "cpu"
    for axon nodes.
    """

    def __init__(self) -> None:
        super().__init__("torch._inductor.ir (axon as cpu)")
        self.__dict__.update({k: v for k, v in vars(_ir).items() if not k.startswith("__")})

        def get_device_type(x: Any) -> str | None:
            device_type = _ir.get_device_type(x)
            return "cpu" if device_type == "axon" else device_type

        self.get_device_type = get_device_type

    def __getattr__(self, name: str) -> Any:  # anything added to ir later
        return getattr(_ir, name)


def _patch_lowerings_device_type() -> None:
    """Where lowerings choose C++-backend code by ``ir.get_device_type(x) == "cpu"``.

    * ``lowering._make_reduction_inner``: argmax/argmin over several
      dimensions compute the logical index (C++ backend) rather than a
      position in memory order (wrong on non-contiguous inputs).
    * ``kernel.conv``: the bias stays in the convolution call (CPU) instead
      of a separate add (a cuDNN heuristic whose shape arithmetic fails for
      unbatched inputs under dynamic shapes).
    """
    import torch._inductor.kernel.conv as conv
    import torch._inductor.lowering as lowering

    for module in (lowering, conv):
        if not isinstance(module.ir, _CpuLikeIr):
            module.ir = _CpuLikeIr()


_registered = False


class _NoCppWrapper:
    """Inductor's C++ wrapper (``cpp_wrapper=True``, AOTInductor) for axon: not
    built.  Registered so that asking for it says so, instead of Inductor's
    "Device axon not supported" assertion."""

    supports_caching = False

    @classmethod
    def create(cls, *args, **kwargs):
        raise NotImplementedError(
            "axon: Inductor's C++ wrapper is not supported, so neither are "
            "torch.compile(options={'cpp_wrapper': True}) and AOTInductor "
            "(torch._inductor.aoti_compile_and_package). Use torch.compile without "
            "cpp_wrapper, or run a torch.export program with ExportedProgram.module().")


def register() -> None:
    """Make Inductor compile graphs on axon tensors (idempotent)."""
    global _registered
    if _registered:
        return
    _registered = True
    # Dynamo's device interface is normally registered when Dynamo loads.
    from torch._dynamo.device_interface import register_interface_for_device

    from .device_interface import AxonInterface
    register_interface_for_device("axon", AxonInterface)
    _patch_scheduler_is_cpu()
    _patch_get_current_backend()
    _patch_lowerings_device_type()
    _flex_attention.install_lowering()
    register_device_op_overrides("axon", AxonDeviceOpOverrides())
    register_backend_for_device("axon", AxonScheduling, AxonWrapperCodegen,
                                device_cpp_wrapper_codegen=_NoCppWrapper,
                                device_custom_pass=AxonCachePass())
