"""torch.axon against torch.cuda, name by name.

Every public name of ``dir(torch.cuda)`` (plus the private memory tools issue
19 asks for) is in exactly one list: PRESENT (torch.axon has it, of the same
kind and, for functions, with the same parameters), RENAMED (torch.axon has it
under another name), INTENTIONALLY_ABSENT (makes no sense for the simulated
device, or is not API: an import of torch/cuda/__init__.py), or NOT_YET (still
missing, with why).  A new torch that adds a name fails
test_every_cuda_name_is_listed; a NOT_YET name that lands fails
test_not_yet_names_are_missing (move it to PRESENT).
"""

from __future__ import annotations

import inspect

import pytest
import torch

PRIVATE = ["memory._record_memory_history", "memory._snapshot", "memory._dump_snapshot",
           "memory._set_allocator_settings"]

PRESENT = [
    # legacy typed-storage classes (tensor.storage_type())
    "BFloat16Storage", "BoolStorage", "ByteStorage", "CharStorage", "ComplexDoubleStorage",
    "ComplexFloatStorage", "DoubleStorage", "FloatStorage", "HalfStorage", "IntStorage",
    "LongStorage", "ShortStorage",
    # devices
    "is_available", "is_initialized", "init", "device_count", "current_device", "set_device",
    "device", "device_of", "synchronize", "get_device_name", "get_device_properties",
    "get_device_capability", "is_bf16_supported", "can_device_access_peer",
    # streams and events
    "Stream", "Event", "StreamContext", "stream", "streams", "current_stream", "default_stream",
    "set_stream",
    # random
    "random", "default_generators", "get_rng_state", "get_rng_state_all", "set_rng_state",
    "set_rng_state_all", "manual_seed", "manual_seed_all", "seed", "seed_all", "initial_seed",
    # memory
    "memory", "empty_cache", "memory_stats", "memory_stats_as_nested_dict", "memory_summary",
    "memory_snapshot", "memory_allocated", "max_memory_allocated", "memory_reserved",
    "max_memory_reserved", "reset_peak_memory_stats", "reset_max_memory_allocated",
    "reset_accumulated_memory_stats", "mem_get_info", "memory_cached", "max_memory_cached",
    "reset_max_memory_cached", "caching_allocator_alloc", "caching_allocator_delete",
    "get_allocator_backend", "device_memory_used", "list_gpu_processes",
    "set_per_process_memory_fraction", "get_per_process_memory_fraction", "OutOfMemoryError", "AcceleratorError",
    "caching_allocator_enable", "caching_allocator_disabled",
    "MemPool", "use_mem_pool", "host_memory_stats", "host_memory_stats_as_nested_dict",
    "reset_accumulated_host_memory_stats", "reset_peak_host_memory_stats",
    *PRIVATE,
    # NVTX ranges (as torch.profiler ranges)
    "nvtx",
    # graphs
    "graphs", "graph", "make_graphed_callables", "graph_pool_handle",
    "is_current_stream_capturing",
    # tools
    "ipc_collect", "set_sync_debug_mode", "get_sync_debug_mode", "utilization",
    "is_tf32_supported", "has_half", "has_magma",
    # the deprecated torch.cuda.amp (autocast, GradScaler, custom_fwd/bwd: warn, as CUDA's)
    "amp",
]

RENAMED = {"CUDAGraph": "AxonGraph"}

_IMPORT = "an import of torch/cuda/__init__.py, not API"
_LEGACY_TYPE = ("a legacy per-dtype tensor type (torch.cuda.FloatTensor); PrivateUse1 has "
                "none: use torch.tensor(..., dtype=..., device='axon')")
INTENTIONALLY_ABSENT = {
    **{n: _IMPORT for n in (
        "Any", "Callable", "NewType", "Optional", "TYPE_CHECKING", "cast", "importlib",
        "lru_cache", "os", "platform", "threading", "torch", "traceback", "warnings",
        "classproperty", "Device")},
    **{f"{t}{kind}": _LEGACY_TYPE
       for t in ("BFloat16", "Bool", "Byte", "Char", "Double", "Float", "Half", "Int", "Long",
                 "Short")
       for kind in ("Tensor",)},
    "jiterator": "runtime-compiled CUDA C++ elementwise kernels (NVRTC)",
    "nccl": "NCCL bindings; axon's collectives are the 'axon' process-group backend",
    "cudart": "the CUDA runtime library handle",
    "cudaStatus": "CUDA runtime status codes",
    "CudaError": "CUDA runtime error codes (axon raises RuntimeError/torch.OutOfMemoryError)",
    "check_error": "checks a CUDA runtime error code",
    "gds": "GPUDirect Storage (cuFile): no storage-to-device DMA; device memory is host memory",
    "green_contexts": "CUDA green contexts (partitions of a GPU's SMs)",
    "GreenContext": "CUDA green contexts (partitions of a GPU's SMs)",
    "tunable": "TunableOp: picks among cuBLAS/hipBLASLt GEMM solutions (axon's kernel "
               "selection is automatic: python -m torch_axon.tune)",
    "profiler": "cudaProfilerStart/Stop for nvprof/Nsight; use torch.profiler",
    "current_blas_handle": "the cuBLAS handle",
    "current_solver_handle": "the cuSOLVER handle",
    "sparse": "legacy sparse CUDA tensor types",
    "ExternalStream": "wraps a cudaStream_t made by another library; axon streams have no "
                      "raw handle another library could make",
    "get_stream_from_external": "wraps a cudaStream_t made by another library",
    "CUDAPluggableAllocator": "loads a cudaMalloc/cudaFree replacement from a .so",
    "change_current_allocator": "installs a CUDAPluggableAllocator",
    "get_arch_list": "the CUDA architectures (sm_XX) of the build; axon kernels are host code",
    "get_gencode_flags": "nvcc -gencode flags of the build",
    "DEVICE_REQUIREMENT": "CUDA driver/compute-capability compatibility table",
    "PYTORCH_RELEASES_CODE_CC": "CUDA compute capabilities of PyTorch's release builds",
    "DeferredCudaCallError": "CUDA's lazy initialisation; axon initialises when torch_axon loads",
    "temperature": "a GPU sensor (NVML); the simulated device has none",
    "power_draw": "a GPU sensor (NVML); the simulated device has none",
    "clock_rate": "the SM clock (NVML); the simulated device runs on host cores",
    "memory_usage": "NVML's memory-controller busy percentage; no such counter",
}

NOT_YET: dict[str, str] = {}

# PRESENT functions whose parameters differ from CUDA's, and why.
SIGNATURE_DIFFERS: dict[str, str] = {}

LISTS = {"PRESENT": set(PRESENT), "RENAMED": set(RENAMED),
         "INTENTIONALLY_ABSENT": set(INTENTIONALLY_ABSENT), "NOT_YET": set(NOT_YET)}


def _cuda_names() -> list[str]:
    return sorted({n for n in dir(torch.cuda) if not n.startswith("_")} | set(PRIVATE))


def _lookup(module, dotted: str):
    obj = module
    for part in dotted.split("."):
        obj = getattr(obj, part)
    return obj


def _has(module, dotted: str) -> bool:
    try:
        _lookup(module, dotted)
        return True
    except AttributeError:
        return False


def _kind(obj) -> str:
    if inspect.ismodule(obj):
        return "module"
    if inspect.isclass(obj):
        return "class"
    if callable(obj):
        return "function"
    return type(obj).__name__


def test_every_cuda_name_is_listed():
    unlisted = [n for n in _cuda_names() if not any(n in names for names in LISTS.values())]
    assert not unlisted, (
        f"torch.cuda names in none of the lists of {__file__}: {unlisted}; add each to PRESENT "
        "(and to torch.axon), INTENTIONALLY_ABSENT or NOT_YET with a reason")


def test_lists_are_disjoint_and_name_cuda_names():
    seen: dict[str, str] = {}
    for list_name, names in LISTS.items():
        for n in names:
            assert n not in seen, f"{n} is in {seen.get(n)} and {list_name}"
            seen[n] = list_name
    cuda = set(_cuda_names())
    stale = sorted(n for n in seen if n not in cuda)
    assert not stale, f"not (any more) in torch.cuda: {stale}"
    assert len(PRESENT) == len(set(PRESENT))


@pytest.mark.parametrize("sub", ["memory", "random", "streams", "graphs", "amp"])
def test_submodules_have_the_names_of_cudas(sub):
    # torch.axon.memory.list_gpu_processes as torch.cuda.memory.list_gpu_processes: every
    # name of torch.cuda.<sub>.__all__ is in torch.axon.<sub> unless listed as absent
    import importlib

    cuda = importlib.import_module(f"torch.cuda.{sub}")
    ours = importlib.import_module(f"torch.axon.{sub}")
    assert ours is getattr(torch.axon, sub)
    absent = set(INTENTIONALLY_ABSENT) | set(NOT_YET)
    missing = [n for n in getattr(cuda, "__all__", [n for n in dir(cuda) if n[0].isupper()])
               if n not in absent and not hasattr(ours, RENAMED.get(n, n))]
    assert not missing, f"torch.axon.{sub} lacks {missing}"


@pytest.mark.parametrize("name", PRESENT)
def test_present_names_match_cuda(name):
    assert _has(torch.axon, name), f"torch.axon.{name} is missing"
    ours, theirs = _lookup(torch.axon, name), _lookup(torch.cuda, name)
    assert _kind(ours) == _kind(theirs), (name, _kind(ours), _kind(theirs))
    if _kind(ours) == "function":
        ours_params = list(inspect.signature(ours).parameters)
        theirs_params = list(inspect.signature(theirs).parameters)
        if name in SIGNATURE_DIFFERS:
            assert ours_params != theirs_params, \
                f"{name} matches now: drop it from SIGNATURE_DIFFERS"
        else:
            assert ours_params == theirs_params, (name, ours_params, theirs_params)
    elif isinstance(theirs, bool):
        assert ours == theirs, (name, ours, theirs)  # has_half / has_magma


@pytest.mark.parametrize("cuda_name", sorted(RENAMED))
def test_renamed_names_exist(cuda_name):
    assert not _has(torch.axon, cuda_name)
    ours = _lookup(torch.axon, RENAMED[cuda_name])
    assert _kind(ours) == _kind(_lookup(torch.cuda, cuda_name))


def test_intentionally_absent_names_are_absent():
    present = [n for n in INTENTIONALLY_ABSENT if _has(torch.axon, n)]
    assert not present, f"listed as intentionally absent but present (move to PRESENT): {present}"
    assert all(reason for reason in INTENTIONALLY_ABSENT.values())


def test_not_yet_names_are_missing():
    print("\ntorch.cuda names torch.axon does not have yet:")
    for name, reason in sorted(NOT_YET.items()):
        print(f"  {name}: {reason}")
    landed = [n for n in NOT_YET if _has(torch.axon, n)]
    assert not landed, f"these landed: move them from NOT_YET to PRESENT: {landed}"
    assert all(reason for reason in NOT_YET.values())


# ------------------------------------------------ the small names filled in here


def test_get_device_capability_consistent_with_accelerator():
    """torch.axon.get_device_capability (CUDA's (major, minor)) and
    torch.accelerator.get_device_capability (the dtypes) resolve devices alike:
    None is the current device, and the same bad devices fail the same way."""
    with torch.axon.device(1):
        assert torch.accelerator.current_device_index() == torch.axon.current_device() == 1
        props = torch.axon.get_device_properties(None)
        assert torch.axon.get_device_capability() == (props.major, props.minor)
        assert torch.accelerator.get_device_capability() == \
            torch.accelerator.get_device_capability(1)
    for bad in (torch.axon.device_count(), -1, "axon:99"):
        errors = []
        for fn in (torch.axon.get_device_capability, torch.accelerator.get_device_capability):
            with pytest.raises(RuntimeError) as e:
                fn(bad)
            errors.append(str(e.value))
        assert errors[0] == errors[1] and "Invalid device index" in errors[0], errors
    for fn in (torch.axon.get_device_capability, torch.accelerator.get_device_capability):
        with pytest.raises(ValueError, match="cpu"):
            fn("cpu")


def test_caching_allocator_alloc_and_delete():
    before = torch.axon.memory_allocated(1)
    side = torch.axon.Stream(device=1)
    ptr = torch.axon.caching_allocator_alloc(1000, device=1, stream=side)
    assert isinstance(ptr, int) and ptr != 0
    assert torch.axon.memory_allocated(1) >= before + 1000
    torch.axon.caching_allocator_delete(ptr)
    assert torch.axon.memory_allocated(1) == before
    with pytest.raises(RuntimeError, match="invalid device pointer: 0x[0-9a-f]+ \\(not returned by "
                                           "torch.axon.caching_allocator_alloc\\)"):
        torch.axon.caching_allocator_delete(ptr)
    with pytest.raises(TypeError, match="Invalid type for stream argument"):
        torch.axon.caching_allocator_alloc(10, stream=12345)


def test_memory_use_and_processes():
    import os

    assert torch.axon.get_allocator_backend() == "native"
    x = torch.ones(1 << 16, device="axon:2")
    free, total = torch.axon.mem_get_info(2)
    assert torch.axon.device_memory_used(2) == total - free >= torch.axon.memory_reserved(2) > 0
    report = torch.axon.list_gpu_processes(2).splitlines()
    assert report[0] == "GPU:2"
    assert report[1].split()[:2] == ["process", str(os.getpid())]
    assert report[1].endswith("MB GPU memory")
    del x
    torch.axon.empty_cache()
    assert torch.axon.list_gpu_processes("axon:2").splitlines() == \
        ["GPU:2", "no processes are running"]


def test_deprecated_aliases():
    with pytest.warns(FutureWarning, match="renamed to `torch.axon.memory_reserved`"):
        assert torch.axon.memory_cached(0) == torch.axon.memory_reserved(0)
    with pytest.warns(FutureWarning, match="renamed to `torch.axon.max_memory_reserved`"):
        assert torch.axon.max_memory_cached(0) == torch.axon.max_memory_reserved(0)
    with pytest.warns(FutureWarning, match="reset_peak_memory_stats"):
        torch.axon.reset_max_memory_cached(0)
    assert torch.axon.is_tf32_supported() is False


@pytest.mark.filterwarnings("ignore:TypedStorage is deprecated")
def test_legacy_storage_types_like_cuda():
    """tensor.storage_type() of an axon tensor is torch.axon's legacy class for
    its dtype (torch.cuda.FloatStorage for CUDA; it was None), isinstance works
    as for CUDA's, and the class makes typed storages on axon."""
    for dtype, name in [(torch.float32, "FloatStorage"), (torch.bfloat16, "BFloat16Storage"),
                        (torch.int64, "LongStorage"), (torch.bool, "BoolStorage"),
                        (torch.complex64, "ComplexFloatStorage")]:
        x = torch.zeros(3, dtype=dtype, device="axon")
        cls = getattr(torch.axon, name)
        assert x.storage_type() is cls
        assert isinstance(x.storage(), cls)
        assert not isinstance(torch.zeros(3, dtype=dtype).storage(), cls)
        s = cls(5)
        assert s.device.type == "axon" and s.dtype == dtype and s.size() == 5
        assert torch.is_storage(s)
