"""The axon device as PyTorch sees it: import, device objects, torch.axon's
device API (mirroring torch.cuda), torch.accelerator, multiple devices."""

import pytest
import torch

from conftest import FLOAT_DTYPES, assert_same, make, run_python


def test_import_torch_alone_registers_axon():
    # A fresh interpreter that only imports torch: the entry point must do the rest.
    r = run_python("""
        import sys, torch
        assert "torch_axon" in sys.modules, "torch_axon was not autoloaded"
        d = torch.device("axon")
        assert d.type == "axon"
        x = torch.arange(6.0).reshape(2, 3)
        a, b = x.to("axon"), x.axon()
        assert a.is_axon and b.is_axon and not x.is_axon
        assert a.device == torch.device("axon:0") == b.device
        assert torch.equal(a.cpu(), x) and torch.equal(b.cpu(), x)
        m = torch.nn.Linear(3, 2).axon()
        assert all(p.device.type == "axon" for p in m.parameters())
        assert torch.axon.is_available() and torch.accelerator.current_accelerator().type == "axon"
        s = torch.arange(4.0).untyped_storage().axon()
        assert s.device.type == "axon"
        print("OK", torch.axon.device_count())
    """, env={"AXON_NUM_DEVICES": "3"})
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["OK", "3"]


def test_without_devices_seeding_is_a_no_op_and_tensors_raise():
    """AXON_NUM_DEVICES=0 (the package on a machine without the device): seeding does
    nothing, as torch.cuda's without CUDA (seeding helpers call it unconditionally);
    making a tensor raises PyTorch's error."""
    r = run_python("""
        import torch, transformers
        assert not torch.axon.is_available() and torch.axon.device_count() == 0
        torch.manual_seed(1)
        torch.axon.manual_seed(1)
        torch.axon.manual_seed_all(1)
        torch.axon.seed()
        torch.axon.seed_all()
        transformers.set_seed(1)
        try:
            torch.ones(1, device="axon")
        except RuntimeError as e:
            print("RAISED", str(e).splitlines()[0])
    """, env={"AXON_NUM_DEVICES": "0"})
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("RAISED ") and "no axon device is available" in r.stdout, r.stdout


def test_autoload_can_be_disabled():
    r = run_python("""
        import sys, torch
        print("torch_axon" in sys.modules, hasattr(torch, "axon"))
    """, env={"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"})
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["False", "False"]


@pytest.mark.parametrize("dtype", FLOAT_DTYPES + (torch.int64, torch.bool))
def test_to_axon_round_trip(dtype):
    x = make((3, 5), dtype)
    for a in (x.to("axon"), x.axon(), x.to(torch.device("axon", 0)), x.to(device="axon:0")):
        assert a.is_axon and a.device == torch.device("axon:0")
        assert a.dtype == dtype and a.shape == x.shape
        assert_same(a, x)


def test_axon_with_index_and_module_axon_index():
    x = make((2, 3), torch.float32)
    a = x.axon(2)
    assert a.device == torch.device("axon:2")
    assert_same(a, x)
    m = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 1))
    ref = m(x)
    m.axon(1)
    assert all(p.device == torch.device("axon:1") for p in m.parameters())
    out = m(x.axon(1))
    assert out.device == torch.device("axon:1")
    assert_same(out, ref, accum=True)
    m.cpu()
    assert all(p.device.type == "cpu" for p in m.parameters())


def test_is_axon_property():
    assert torch.ones(1, device="axon").is_axon
    assert not torch.ones(1).is_axon
    assert torch.ones(1, device="axon:3").is_axon


def test_factory_functions_on_axon():
    for dev in ("axon", "axon:1", torch.device("axon", 2)):
        z = torch.zeros(2, 3, device=dev)
        assert z.is_axon
        assert_same(z, torch.zeros(2, 3))
    assert torch.zeros(2, device="axon").device == torch.device("axon:0")


# ---------------------------------------------------------------- torch.axon

def test_torch_axon_mirrors_torch_cuda_names():
    names = ["is_available", "device_count", "current_device", "set_device", "device",
             "synchronize", "Stream", "Event", "current_stream", "stream",
             "get_device_name", "get_device_properties", "memory_allocated",
             "max_memory_allocated", "memory_reserved", "max_memory_reserved",
             "memory_stats", "reset_peak_memory_stats", "mem_get_info", "empty_cache",
             "manual_seed", "manual_seed_all", "seed", "initial_seed", "get_rng_state",
             "set_rng_state", "default_stream", "device_of", "is_bf16_supported"]
    missing = [n for n in names if not hasattr(torch.axon, n)]
    assert not missing, missing
    # Each of these is also what torch.cuda calls it.
    assert all(hasattr(torch.cuda, n) for n in names)


def test_is_available_and_device_count():
    assert torch.axon.is_available() is True
    assert torch.axon.device_count() == 8  # AXON_NUM_DEVICES default
    assert torch.axon.is_initialized()


def test_device_count_follows_environment():
    r = run_python("""
        import torch
        p = torch.axon.get_device_properties(0)
        print(torch.axon.device_count(), torch.accelerator.device_count(), p.total_memory,
              p.multi_processor_count)
    """, env={"AXON_NUM_DEVICES": "4", "AXON_LOGICAL_CORE_CONFIG": "2",
              "AXON_DEVICE_MEMORY": "64MiB"})
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["2", "2", str(2 * 64 * 2**20), "2"]


def test_visible_devices_choose_and_order_the_devices():
    """AXON_VISIBLE_DEVICES, as CUDA_VISIBLE_DEVICES: "3,1" of 4 devices makes
    device 3 axon:0 and device 1 axon:1; a device keeps its uuid (and pci_device_id)
    whatever its index; others are invalid indices; work runs as on any device."""
    script = """
        import torch
        x = torch.randn(5, 7, dtype=torch.bfloat16)
        y = (x.to("axon:1") * 3 + 1).sum(0).cpu()
        assert torch.equal(y, (x * 3 + 1).sum(0)), "axon:1 differs from the CPU"
        print(torch.axon.device_count(), torch.accelerator.device_count())
        for i in range(torch.axon.device_count()):
            p = torch.axon.get_device_properties(i)
            print(p.pci_device_id, p.uuid)
        try:
            torch.empty(1, device=f"axon:{torch.axon.device_count()}")
        except RuntimeError as e:
            print("RAISED", str(e).splitlines()[0])
    """
    shown = run_python(script, env={"AXON_NUM_DEVICES": "4", "AXON_VISIBLE_DEVICES": "3,1"})
    every = run_python(script, env={"AXON_NUM_DEVICES": "4"})
    assert shown.returncode == 0 and every.returncode == 0, shown.stderr + every.stderr
    assert shown.stderr == "", shown.stderr
    lines, all_lines = shown.stdout.splitlines(), every.stdout.splitlines()
    assert lines[0] == "2 2" and all_lines[0] == "4 4"
    by_id = dict(line.split() for line in all_lines[1:5])
    assert [line.split() for line in lines[1:3]] == [["3", by_id["3"]], ["1", by_id["1"]]]
    assert lines[3] == ("RAISED Invalid device index: axon:2; the device count is 2 "
                        "(valid indices are 0..1)"), lines[3]


def test_devices_initialise_lazily_so_variables_set_after_import_apply():
    """As CUDA's lazy initialisation (test_cuda's test_lazy_init): importing torch
    does not count the devices; AXON_VISIBLE_DEVICES / AXON_NUM_DEVICES set after
    the import and before the first device call apply, and torch.manual_seed
    before it seeds the devices then made."""
    r = run_python("""
        import os, torch
        print(torch.axon.is_initialized())
        torch.manual_seed(3)  # before the devices exist: applied when they do
        os.environ["AXON_NUM_DEVICES"] = "4"
        os.environ["AXON_VISIBLE_DEVICES"] = "2,0"
        a = torch.rand(4, device="axon").cpu()
        print(torch.axon.is_initialized(), torch.axon.device_count(),
              torch.axon.get_device_properties(0).pci_device_id,
              len(torch.axon.default_generators))
        torch.manual_seed(3)
        print(torch.equal(a, torch.rand(4, device="axon").cpu()))
    """)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["False", "True", "2", "2", "2", "True"], r.stdout


def test_init_marks_torch_device_initialized():
    """torch.axon.init() (not only a first tensor) sets torch's own flag too:
    torch.accelerator.empty_host_cache() is a no-op before it, as for CUDA."""
    r = run_python("""
        import torch
        torch.axon.init()
        a = torch.empty(1000, pin_memory=True)
        del a
        torch.accelerator.empty_host_cache()
        print(torch.axon.is_initialized(), torch.axon.host_memory_stats()["allocations.current"])
    """)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["True", "0"], r.stdout


@pytest.mark.parametrize("value", ["", "-1"])
def test_visible_devices_blank_or_negative_hides_every_device(value):
    r = run_python("""
        import torch
        print(torch.axon.is_available(), torch.axon.device_count(),
              torch.accelerator.is_available())
    """, env={"AXON_VISIBLE_DEVICES": value})
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["False", "0", "False"]


def test_visible_devices_end_at_an_invalid_entry_with_a_warning():
    r = run_python("""
        import torch
        torch.ones(1, device="axon")
        print(torch.axon.device_count(), torch.axon.get_device_properties(0).pci_device_id)
    """, env={"AXON_NUM_DEVICES": "4", "AXON_VISIBLE_DEVICES": "2,9,1"})
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["1", "2"]
    assert r.stderr.count("AXON_VISIBLE_DEVICES") == 1, r.stderr
    assert ("axon: AXON_VISIBLE_DEVICES='2,9,1': device 9 does not exist (4 device(s) defined "
            "by AXON_NUM_DEVICES / AXON_LOGICAL_CORE_CONFIG); the list ends there "
            "(1 device(s) visible)") in r.stderr


def test_device_properties_have_torch_cuda_fields():
    """Every field of torch.cuda's device properties (torch._C._CudaDeviceProperties'
    stub, which the CPU build still ships) exists with its type; the host-derived
    ones are what the host reports."""
    import ast
    import os

    stub = os.path.join(os.path.dirname(torch.__file__), "_C", "__init__.pyi")
    tree = ast.parse(open(stub).read())
    cls = next(n for n in tree.body
               if isinstance(n, ast.ClassDef) and n.name == "_CudaDeviceProperties")
    fields = {n.target.id: n.annotation.id for n in cls.body if isinstance(n, ast.AnnAssign)}
    assert len(fields) >= 17, fields  # the stub as of torch 2.13
    p = torch.axon.get_device_properties(0)
    kinds = {"_int": int, "str": str}
    for name, kind in fields.items():
        value = getattr(p, name)
        if name == "uuid":
            value = str(value)
        assert isinstance(value, kinds[kind]), (name, value)
    for name in ("max_threads_per_block", "regs_per_multiprocessor",
                 "shared_memory_per_block_optin", "pci_bus_id", "pci_device_id", "pci_domain_id"):
        assert isinstance(getattr(p, name), int), name
    assert p.pci_device_id == 0 and torch.axon.get_device_properties(3).pci_device_id == 3
    assert p.max_threads_per_block == p.max_threads_per_multi_processor == 1
    l1 = "/sys/devices/system/cpu/cpu0/cache/index0/size"
    if os.path.exists(l1):
        assert p.shared_memory_per_block > 0 and p.shared_memory_per_block < p.L2_cache_size
    freq = "/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq"
    if os.path.exists(freq):
        assert p.clock_rate == int(open(freq).read())
    else:
        assert p.clock_rate >= 0


def test_without_devices_memory_statistics_are_empty():
    """As torch.cuda's without a device: nothing is allocated, the summary is zeros;
    device calls still raise."""
    r = run_python("""
        import torch
        print(torch.axon.memory_allocated(), torch.axon.max_memory_allocated(),
              torch.axon.memory_reserved(), torch.axon.max_memory_reserved(),
              dict(torch.axon.memory_stats()))
        assert "Allocated memory" in torch.axon.memory_summary()
        try:
            torch.axon.mem_get_info()
        except RuntimeError as e:
            print("RAISED", str(e).splitlines()[0])
    """, env={"AXON_NUM_DEVICES": "0"})
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [
        "0 0 0 0 {}", "RAISED Invalid device index: axon:0; no axon device is available"]


def test_current_device_and_set_device():
    assert torch.axon.current_device() == 0
    torch.axon.set_device(3)
    assert torch.axon.current_device() == 3
    assert torch.empty(1, device="axon").device == torch.device("axon:3")
    torch.axon.set_device("axon:1")
    assert torch.axon.current_device() == 1
    torch.axon.set_device(torch.device("axon", 2))
    assert torch.axon.current_device() == 2
    torch.axon.set_device(0)
    assert torch.empty(1, device="axon").device == torch.device("axon:0")


def test_set_device_rejects_other_device_types():
    with pytest.raises(ValueError, match="Expected an axon device"):
        torch.axon.set_device("cpu")


def test_device_context_manager():
    assert torch.axon.current_device() == 0
    with torch.axon.device(2):
        assert torch.axon.current_device() == 2
        assert torch.accelerator.current_device_index() == 2
        x = torch.ones(3, device="axon")
        with torch.axon.device("axon:5"):
            assert torch.axon.current_device() == 5
            assert torch.ones(1, device="axon").device.index == 5
        assert torch.axon.current_device() == 2
    assert torch.axon.current_device() == 0
    assert x.device == torch.device("axon:2")
    # None leaves the device unchanged.
    with torch.axon.device(None):
        assert torch.axon.current_device() == 0
    # Restored even on an exception.
    with pytest.raises(KeyError):
        with torch.axon.device(4):
            raise KeyError
    assert torch.axon.current_device() == 0


def test_device_context_restores_a_device_set_inside_it():
    # as torch.cuda.device: back to the previous device on exit, also when the block
    # entered the device that was already current and then changed it
    torch.axon.set_device(0)
    with torch.axon.device(0):
        torch.axon.set_device(3)
    assert torch.axon.current_device() == 0
    with torch.axon.device_of(torch.ones(1, device="axon:0")):
        torch.axon.set_device(5)
    assert torch.axon.current_device() == 0
    with torch.axon.device(None):      # the current device, as torch.cuda.device(None)
        torch.axon.set_device(2)
    assert torch.axon.current_device() == 0


@pytest.mark.parametrize("bad", [None, "axon", torch.device("axon")])
def test_set_device_needs_an_index(bad):
    # torch.cuda.set_device(None / "cuda") raises the same ValueError
    with pytest.raises(ValueError, match="Expected a torch.device with a specified index"):
        torch.axon.set_device(bad)
    assert torch.axon.current_device() == 0


def test_submodules_import_as_torch_cuda_submodules():
    # `import torch.axon.memory` (as `import torch.cuda.memory`) is the loaded module, and
    # importing a submodule leaves torch.axon.device the context manager
    r = run_python("""
        import sys, torch
        import torch.axon.memory, torch.axon.random, torch.axon.graphs, torch.axon.streams
        import torch.axon.device
        from torch.axon.streams import Stream
        from torch.axon.memory import MemPool
        assert torch.axon.memory is sys.modules["torch_axon.axon.memory"]
        assert torch.axon.random is sys.modules["torch_axon.axon.random"]
        Stream(); MemPool()
        torch.axon.memory._record_memory_history(None)
        print(torch.axon.memory.get_per_process_memory_fraction())
        with torch.axon.device(1):
            print(torch.axon.current_device())
    """)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["1.0", "1"]


def test_device_of():
    t = torch.ones(1, device="axon:3")
    with torch.axon.device_of(t):
        assert torch.axon.current_device() == 3
    assert torch.axon.current_device() == 0
    with torch.axon.device_of(torch.ones(1)):  # CPU tensor: unchanged
        assert torch.axon.current_device() == 0


def test_device_properties_and_name():
    p = torch.axon.get_device_properties(0)
    assert p.name == "Axon simulated device" == torch.axon.get_device_name(0)
    assert torch.axon.get_device_name() == p.name
    # min(8 GiB, host memory / device count), whole MiB: never more than the host has
    host = torch.axon._C._host_memory_info()[1]
    n = torch.axon.device_count()
    assert p.total_memory == min(8 * 2**30, host // n // 2**20 * 2**20)
    assert p.multi_processor_count >= 1
    assert p.host_accessible is True
    assert torch.axon.get_device_properties("axon:1") == torch.axon.get_device_properties(1)
    assert torch.axon.get_device_capability(0) == (p.major, p.minor)
    assert "Axon simulated device" in repr(p)
    assert torch.axon.mem_get_info(0)[1] == p.total_memory
    # torch.cuda's other fields: a stable per-device uuid, the L2 of the
    # device's cores, the kernels' float32 vector lanes.
    assert p.uuid != torch.axon.get_device_properties(1).uuid
    assert str(p.uuid) == str(torch.axon.get_device_properties("axon:0").uuid)
    lanes = {"AVX512": 16, "AVX2": 8}.get(torch.backends.cpu.get_cpu_capability(), 4)
    assert p.warp_size == lanes
    assert p.L2_cache_size >= 0 and p.is_integrated == 0 and p.is_multi_gpu_board == 0


def test_synchronize_waits_for_pending_work():
    torch.axon._C._test_sleep_on_stream(0, 200)
    assert not torch.axon.current_stream().query()
    torch.axon.synchronize()
    assert torch.axon.current_stream().query()
    torch.axon.synchronize(0)
    torch.axon.synchronize("axon:1")
    torch.axon.synchronize(torch.device("axon:2"))


def test_bf16_and_amp_dtypes():
    assert torch.axon.is_bf16_supported()
    assert set(torch.axon.get_amp_supported_dtype()) == {torch.float16, torch.bfloat16, torch.float32}


# ---------------------------------------------------------------- torch.accelerator

def test_accelerator_reports_axon():
    assert torch.accelerator.is_available()
    assert torch.accelerator.current_accelerator() == torch.device("axon")
    assert torch.accelerator.device_count() == torch.axon.device_count()


def test_accelerator_set_device_index_drives_axon():
    assert torch.accelerator.current_device_index() == 0
    torch.accelerator.set_device_index(4)
    assert torch.axon.current_device() == 4
    assert torch.ones(1, device="axon").device == torch.device("axon:4")
    torch.accelerator.set_device_index(0)
    with torch.accelerator.device_index(6):
        assert torch.axon.current_device() == 6
    assert torch.axon.current_device() == 0


def test_accelerator_current_stream_and_synchronize():
    s = torch.accelerator.current_stream()
    assert s.device == torch.device("axon:0")
    assert s == torch.axon.current_stream()
    other = torch.axon.Stream()
    torch.accelerator.set_stream(other)
    assert torch.axon.current_stream() == other
    assert torch.accelerator.current_stream() == other
    torch.axon._C._test_sleep_on_stream(0, 200)  # on `other`, the current stream
    assert not other.query()
    torch.accelerator.synchronize()
    assert other.query()
    torch.accelerator.set_stream(s)
    assert torch.axon.current_stream() == s
    assert torch.accelerator.current_stream(1).device == torch.device("axon:1")


def test_accelerator_memory_apis_match_torch_axon(fresh_memory):
    x = torch.empty(1000, device="axon:6")
    assert torch.accelerator.memory_allocated(6) == torch.axon.memory_allocated(6) > 0
    assert torch.accelerator.memory_reserved(6) == torch.axon.memory_reserved(6)
    del x


# ---------------------------------------------------------------- multiple devices

@pytest.mark.parametrize("dtype", FLOAT_DTYPES + (torch.int32,))
def test_tensors_on_axon1_with_device_context(dtype):
    x, y = make((4, 5), dtype, seed=1), make((4, 5), dtype, seed=2)
    with torch.axon.device(1):
        a, b = x.to("axon"), y.to("axon")
        r = a * b + a
        assert a.device == torch.device("axon:1") and r.device == torch.device("axon:1")
    assert_same(r, x * y + x)
    assert r.device.index == 1


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("layout", ["contiguous", "transposed"])
def test_copy_between_devices(dtype, layout):
    x = make((6, 5), dtype)
    a0 = x.to("axon:0")
    if layout == "transposed":
        a0, x = a0.t(), x.t()
    a1 = a0.to("axon:1")
    assert a1.device == torch.device("axon:1")
    assert_same(a1, x)
    # copy_ into an existing axon:1 tensor; the result stays on axon:1
    dst = torch.zeros(x.shape, dtype=dtype, device="axon:1")
    dst.copy_(a0)
    assert dst.device.index == 1
    assert_same(dst, x)
    # and back, via an op on axon:1
    assert_same((a1 * 2).to("axon:0"), x * 2)


def test_ops_run_on_the_devices_of_their_tensors():
    x = make((3, 3), torch.float32)
    a = x.to("axon:5")
    # current device is 0, the op's tensors are on 5: the result stays on 5
    r = torch.mm(a, a)
    assert r.device == torch.device("axon:5")
    assert_same(r, x @ x, accum=True)
    assert torch.axon.current_device() == 0


def test_per_device_state_is_independent():
    a = torch.ones(3, device="axon:1")
    s1 = torch.axon.Stream(device=1)
    with torch.axon.stream(s1):
        assert torch.axon.current_device() == 1
        assert torch.axon.current_stream(1) == s1
        assert torch.axon.current_stream(0) == torch.axon.default_stream(0)
        torch.axon._C._test_sleep_on_stream(1, 200)
    assert torch.axon.current_device() == 0
    assert torch.axon.current_stream(1) == torch.axon.default_stream(1)
    torch.axon.synchronize(0)  # device 0 does not wait for device 1's stream
    assert not s1.query()
    torch.axon.synchronize(1)
    assert s1.query()
    assert_same(a + 1, torch.full((3,), 2.0))


def test_moving_to_the_same_device_returns_self():
    a = torch.ones(3, device="axon")
    assert a.axon() is a and a.to("axon") is a and a.to("axon:0") is a
    b = a.to("axon:1")
    assert b is not a and b.device.index == 1


def test_current_device_is_per_thread():
    import threading

    seen = []

    def other():
        seen.append(torch.axon.current_device())
        torch.axon.set_device(5)
        seen.append(torch.ones(1, device="axon").device.index)

    torch.axon.set_device(2)
    th = threading.Thread(target=other)
    th.start()
    th.join()
    assert seen == [0, 5]  # a new thread starts on axon:0
    assert torch.axon.current_device() == 2  # unaffected by the other thread
    torch.axon.set_device(0)


def test_repr_and_numpy():
    a = torch.tensor([1.5, -2.0]).axon()
    assert "device='axon:0'" in repr(a)
    with pytest.raises(TypeError, match="axon:0.*Tensor.cpu"):
        a.numpy()
    import numpy as np

    n = np.arange(6, dtype=np.float32).reshape(2, 3)
    assert_same(torch.from_numpy(n).axon(), torch.from_numpy(n))
    assert np.array_equal(a.cpu().numpy(), np.array([1.5, -2.0], dtype=np.float32))


# A script that exits right after a backward pass on axon: autograd's device
# thread may still hold the pass (and its Python objects) when Python finalises,
# which aborted 2-8 of 25 such processes before torch_axon turned the threads
# over at exit (torch_axon/axon/_exit.py).
EXIT_AFTER_BACKWARD = """
import torch, torch_axon
x = torch.randn(64, 64, device="axon", requires_grad=True)
(x * 2).relu().sum().backward()
print(x.grad.sum().item())
"""


def test_exit_right_after_backward_does_not_abort():
    # One process after another (runs side by side hit the race less often):
    # without the exit handler, 2-7 of 25 such processes aborted on the 2-core CI
    # machine, so 16 of them all passing by chance would be ~1 in 100 at most.
    runs = [run_python(EXIT_AFTER_BACKWARD) for _ in range(16)]
    failed = [r for r in runs if r.returncode != 0]
    assert not failed, (f"{len(failed)} of {len(runs)} processes failed; first: "
                        f"rc={failed[0].returncode} {failed[0].stderr[-400:]}")


def test_exit_handler_turns_over_the_used_devices():
    import weakref

    from torch_axon.axon._exit import release_autograd_graph_tasks

    x = torch.zeros(3, device="axon:1", requires_grad=True)
    grad = torch.ones(3, device="axon:1")
    seen = weakref.ref(grad)
    (x * 2).backward(grad)
    del grad
    done = release_autograd_graph_tasks()
    assert 1 in done
    assert all(torch.axon._C._num_device_allocs(d) > 0 or torch.axon.memory_reserved(d) > 0
               for d in done)
    # Device 1's thread finished the pass above, dropping its root gradient.
    assert seen() is None
    assert torch.equal(x.grad.cpu(), torch.full((3,), 2.0))
