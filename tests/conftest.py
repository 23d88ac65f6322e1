"""Shared helpers and fixtures for the axon test suite.

Every numerical test runs the same computation on the CPU and on axon and
compares the two with torch.testing.assert_close at the tolerances below.

Layout: tests/<layer>/test_<subject>.py (ops/, runtime/, distributed/,
compile/, integrations/, tools/), no __init__.py. pytest imports each test
file under its basename with its folder on sys.path, and this file as
``conftest`` with tests/ on sys.path, so ``from conftest import ...``,
``from dist_util import ...`` (tests/) and, within tests/ops/,
``from op_util import ...`` work from any test file, and the processes that
torch.multiprocessing spawns (which inherit sys.path) import them alike.  Two
rules follow: test file basenames are unique across folders (pytest says
"import file mismatch" otherwise), and this is the only conftest.py (a second
one would replace the module ``conftest`` that the test files import).
"""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import textwrap

import pytest

# Kernel selection (csrc/aten/KernelSelect.h) measures in every test process,
# as a user's first run does, but keeps its table in memory: the suite neither
# reads a table an earlier run left in ~/.cache nor leaves one behind.
os.environ.setdefault("AXON_KERNEL_SELECT_CACHE", "0")

import torch  # noqa: E402

# The helper modules' asserts get pytest's detailed messages, as the tests' own do.
pytest.register_assert_rewrite("dist_util", "op_util")

# `import torch` alone must load the backend (entry point); fail loudly if not.
assert hasattr(torch, "axon"), "torch_axon was not autoloaded by `import torch`"

AXON = torch.device("axon")
TESTS_DIR = os.path.dirname(os.path.abspath(__file__))  # holds conftest.py and dist_util.py
REPO_ROOT = os.path.dirname(TESTS_DIR)
FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
INT_DTYPES = (torch.int32, torch.int64)

# Tolerances per dtype for "same computation on axon and on the CPU".  Axon
# may use different kernels from the CPU; these are the usual PyTorch
# precision tolerances (torch.testing defaults for float32 are tighter).
TOL = {
    torch.float32: dict(rtol=1e-5, atol=1e-5),
    torch.float64: dict(rtol=1e-7, atol=1e-7),
    torch.bfloat16: dict(rtol=1.6e-2, atol=1e-2),
    torch.float16: dict(rtol=1e-3, atol=1e-3),
    torch.complex64: dict(rtol=1e-5, atol=1e-5),
    torch.complex128: dict(rtol=1e-7, atol=1e-7),
}
# Reductions and matmuls accumulate: low-precision results may differ by one
# or two units in the last place after a different summation order.
TOL_ACCUM = {
    torch.float32: dict(rtol=1e-4, atol=1e-4),
    torch.float64: dict(rtol=1e-7, atol=1e-7),
    torch.bfloat16: dict(rtol=3e-2, atol=3e-2),
    torch.float16: dict(rtol=5e-3, atol=5e-3),
    torch.complex64: dict(rtol=1e-4, atol=1e-4),  # as their float parts
    torch.complex128: dict(rtol=1e-7, atol=1e-7),
}


def tol(dtype: torch.dtype, accum: bool = False) -> dict:
    """assert_close tolerances for results of dtype (exact for ints/bools)."""
    table = TOL_ACCUM if accum else TOL
    if dtype in table:
        return table[dtype]
    return dict(rtol=0, atol=0)


def to_cpu(x):
    """Moves (nested) axon results to the CPU for comparison."""
    if isinstance(x, torch.Tensor):
        return x.cpu()
    if isinstance(x, (list, tuple)):
        return type(x)(to_cpu(e) for e in x) if not hasattr(x, "_fields") else \
            type(x)(*(to_cpu(e) for e in x))
    return x


def assert_on_axon(x, index: int | None = None):
    """Every tensor in (nested) x lives on axon (on axon:index if given)."""
    if isinstance(x, torch.Tensor):
        assert x.device.type == "axon", f"result on {x.device}, expected axon"
        if index is not None:
            assert x.device.index == index
    elif isinstance(x, (list, tuple)):
        for e in x:
            assert_on_axon(e, index)


def assert_same(actual_axon, expected_cpu, dtype=None, accum=False, **kw):
    """actual (on axon) matches expected (computed on the CPU): device, dtype,
    shape and values within the tolerance of the dtype."""
    assert_on_axon(actual_axon)
    actual = to_cpu(actual_axon)
    if isinstance(expected_cpu, torch.Tensor):
        t = tol(dtype or expected_cpu.dtype, accum)
        t.update(kw)
        torch.testing.assert_close(actual, expected_cpu, equal_nan=True, **t)
    else:
        assert type(actual) is type(expected_cpu) or isinstance(actual, (list, tuple))
        assert len(actual) == len(expected_cpu)
        for a, e in zip(actual, expected_cpu):
            if isinstance(e, torch.Tensor):
                t = tol(dtype or e.dtype, accum)
                t.update(kw)
                torch.testing.assert_close(a, e, equal_nan=True, **t)
            else:
                assert a == e


def bits(t: torch.Tensor) -> torch.Tensor:
    """The bytes of t on the CPU (bitwise comparison for every dtype)."""
    return t.cpu().contiguous().reshape(-1).view(torch.uint8)


def make(shape, dtype, low=-3.0, high=3.0, seed=0):
    """A deterministic CPU tensor of shape/dtype with values in [low, high)."""
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    if not dtype.is_floating_point and not dtype.is_complex:
        return torch.randint(int(low), int(high) + 1, shape, generator=g).to(dtype)
    x = torch.rand(shape, generator=g, dtype=torch.float64) * (high - low) + low
    return x.to(dtype)


# Layouts: how a (4, 6) operand is obtained.  The same view op is applied on
# both devices, so the axon operand really is non-contiguous.
LAYOUTS = ("contiguous", "transposed", "sliced", "expanded", "zero_size")


def layout_pair(layout: str, dtype, rows=4, cols=6, low=-3.0, high=3.0, seed=0):
    """(cpu, axon) operands of the same values in the given memory layout."""
    if layout == "contiguous":
        base = make((rows, cols), dtype, low, high, seed)
        view = lambda t: t  # noqa: E731
    elif layout == "transposed":
        base = make((cols, rows), dtype, low, high, seed)
        view = lambda t: t.t()  # noqa: E731
    elif layout == "sliced":
        base = make((rows + 1, 2 * cols + 1), dtype, low, high, seed)
        view = lambda t: t[1:, 1::2]  # noqa: E731
    elif layout == "expanded":
        base = make((1, cols), dtype, low, high, seed)
        view = lambda t: t.expand(rows, cols)  # noqa: E731
    elif layout == "zero_size":
        base = make((0, cols), dtype, low, high, seed)
        view = lambda t: t  # noqa: E731
    else:
        raise ValueError(layout)
    cpu, ax = view(base), view(base.to(AXON))
    assert cpu.shape == ax.shape and cpu.stride() == ax.stride()
    if layout in ("transposed", "sliced", "expanded"):
        assert not ax.is_contiguous()
    return cpu, ax


def run_python(code: str, env: dict | None = None, timeout: float = 120):
    """Runs code in a fresh interpreter (for per-process settings such as
    AXON_DEVICE_MEMORY); returns the CompletedProcess."""
    full_env = dict(os.environ)
    for k in [k for k in full_env if k.startswith("AXON_")]:
        del full_env[k]
    full_env.update(env or {})
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=full_env,
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture(autouse=True)
def _axon_state_guard():
    """Each test starts and ends on axon:0 with default streams, no pending work
    or pending asynchronous errors."""
    torch.axon.set_device(0)
    yield
    torch.axon.set_device(0)
    for i in range(torch.axon.device_count()):
        torch.axon.set_stream(torch.axon.default_stream(i))
    for i in range(torch.axon.device_count()):
        torch.axon.synchronize(i)  # raises if a test leaked an async error


@pytest.fixture
def no_fallback():
    """The test runs without any op going to the synchronous CPU fallback."""
    torch.axon.synchronize()
    torch.axon.reset_fallback_stats()
    yield
    assert torch.axon.fallback_stats() == {}


@pytest.fixture
def kernel_select_isolated(monkeypatch, tmp_path):
    """Kernel selection (csrc/aten/KernelSelect.h) with empty in-memory tables and a
    private, unused table file (AXON_KERNEL_SELECT_CACHE=0; a test may turn it on); the
    kernel and thread modes back to the environment's after."""
    monkeypatch.setenv("AXON_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("AXON_KERNEL_SELECT_CACHE", "0")
    torch.axon.synchronize()
    torch.ops.axon._kernel_select_reset()
    yield tmp_path
    torch.axon.synchronize()
    torch.ops.axon._set_kernel_select("")
    torch.ops.axon._set_kernel_threads("")
    torch.ops.axon._kernel_select_reset()


@pytest.fixture
def fresh_memory():
    """Collects garbage so allocator statistics only count the test's tensors."""
    gc.collect()
    yield


# Tiny configurations of Transformers causal LMs (random init, no downloads).
TINY_LM_VOCAB = 128
_TINY_LM_SMALL = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, vocab_size=TINY_LM_VOCAB,
                      max_position_embeddings=128)
TINY_LM_ARCHS = {
    "llama": _TINY_LM_SMALL,
    "qwen3": dict(_TINY_LM_SMALL, head_dim=16),
    "mistral": _TINY_LM_SMALL,
    "gemma": dict(_TINY_LM_SMALL, head_dim=16),
    "phi3": dict(_TINY_LM_SMALL, pad_token_id=0),
    "gpt2": dict(n_embd=64, n_layer=2, n_head=4, vocab_size=TINY_LM_VOCAB, n_positions=128),
    "gpt_neox": dict(_TINY_LM_SMALL),
    "opt": dict(hidden_size=64, ffn_dim=128, num_hidden_layers=2, num_attention_heads=4,
                vocab_size=TINY_LM_VOCAB, max_position_embeddings=128, word_embed_proj_dim=64),
    "falcon": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                   vocab_size=TINY_LM_VOCAB),
    "mixtral": dict(_TINY_LM_SMALL, num_local_experts=4, num_experts_per_tok=2),
}


def tiny_causal_lm(arch: str):
    """A tiny random-init causal LM of a Transformers architecture (CPU, eval, sdpa)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.for_model(arch, **TINY_LM_ARCHS[arch])
    for name in ("pad_token_id", "bos_token_id", "eos_token_id"):
        value = getattr(cfg, name, None)
        if isinstance(value, int) and value >= TINY_LM_VOCAB:
            setattr(cfg, name, 0)
    # No dropout, so that training steps compare with the CPU's (dropout draws
    # from each device's own generator); the test switches it on separately.
    for name, value in cfg.to_dict().items():
        if isinstance(value, float) and ("dropout" in name or "pdrop" in name):
            setattr(cfg, name, 0.0)
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa").eval()


@pytest.fixture(scope="module")
def no_graph_caches():
    """Compiles in the module run the whole pipeline (no FX-graph / AOT autograd cache hits)."""
    import torch._functorch.config
    import torch._inductor.config

    with torch._inductor.config.patch(fx_graph_cache=False), \
            torch._functorch.config.patch(enable_autograd_cache=False):
        yield
    torch._dynamo.reset()


@pytest.fixture(scope="module")
def quick_op_samples():
    """PyTorch's OpInfo sample iterators without two costs of its test harness that do not
    change the samples (they were ~2/3 of test_opinfo.py's time): before each sample
    ``TrackedInputIter`` calls ``set_rng_seed``, whose ``torch.manual_seed`` queues a
    lazy CUDA, XPU and MTIA seeding with ``traceback.format_stack()`` on a CPU build
    (~2 ms); here it seeds the generators that exist (the CPU's, axon's, ``random``'s,
    NumPy's) with the same seed.  And ``extract_test_fn`` walks ``inspect.stack()``,
    which reads every frame's source (~60 ms a call); here the same search walks the
    frames alone."""
    import random
    import sys
    import unittest

    import numpy as np
    from torch.testing._internal import common_utils
    from torch.testing._internal.opinfo import core

    def set_rng_seed(seed=None):
        seed = common_utils.SEED if seed is None else seed
        torch.random.default_generator.manual_seed(seed)
        torch.axon.manual_seed_all(seed)
        random.seed(seed)
        np.random.seed(seed)

    def extract_test_fn():
        frame = sys._getframe(1)
        while frame is not None:
            self_val = frame.f_locals.get("self")
            if isinstance(self_val, unittest.TestCase):
                *_, cls_name, test_name = self_val.id().rsplit(".", 2)
                if cls_name == type(self_val).__name__ and test_name.startswith("test"):
                    return getattr(self_val, test_name).__func__
            frame = frame.f_back
        return None

    saved = (common_utils.set_rng_seed, common_utils.extract_test_fn, core.extract_test_fn)
    common_utils.set_rng_seed = set_rng_seed
    common_utils.extract_test_fn = core.extract_test_fn = extract_test_fn
    yield
    common_utils.set_rng_seed, common_utils.extract_test_fn, core.extract_test_fn = saved


@pytest.fixture
def fresh_dynamo():
    """The test starts with empty Dynamo caches and counters (so recompile
    limits and counts never carry over between tests)."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    yield
    torch._dynamo.reset()


@pytest.fixture
def fresh_accelerate(monkeypatch):
    """No device or launcher settings in the environment, and no Accelerate
    state left over from another test."""
    from accelerate.state import AcceleratorState

    for var in ("ACCELERATE_TORCH_DEVICE", "ACCELERATE_USE_CPU", "ACCELERATE_MIXED_PRECISION",
                "ACCELERATE_DYNAMO_BACKEND", "LOCAL_RANK", "WORLD_SIZE"):
        monkeypatch.delenv(var, raising=False)
    AcceleratorState._reset_state(reset_partial_state=True)
    yield
    AcceleratorState._reset_state(reset_partial_state=True)
