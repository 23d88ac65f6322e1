"""Adaptive eager (csrc/aten/Fusion.h): chains of elementwise ops and last-dim sums/means
queued on a stream run fused, tile by tile, with results bitwise equal to op by op.

Each test runs the same program twice on axon, fused and op by op, with the stream held
by a sleeping task while the program launches (so its ops are queued together, which is
when the stream fuses them), and compares every result bit for bit. Tests that expect
fusion also check fusion_stats(), so that they fail if nothing fused. Results are also
compared with the CPU at conftest's tolerances."""

import random

import pytest
import torch

from conftest import AXON, bits, make, run_python

HOLD_MS = 30  # the stream sleeps while the program queues its ops


@pytest.fixture(autouse=True, params=["l2_tiles", "small_tiles", "team_blocks"])
def _worker_threads(request):
    """Elementwise kernels on the stream worker without thread trials (a launch the
    thread policy is still timing is never fused; on the team, see
    test_team_launches_fuse_only_as_own_ops); every test three
    times: with tiles sized for L2 (often one tile here), with 16 KiB tiles (many tiles,
    so that tile boundaries fall inside the tensors), and with L2 tiles whose runs of
    own ops are spread over the compute team block by block (as the thread policy does
    for large runs). Fusion back to the environment's setting after."""
    torch.axon.synchronize()
    torch.ops.axon._set_kernel_threads("worker")
    torch.axon._C._test_fusion_tile_bytes(16384 if request.param == "small_tiles" else 0)
    torch.axon._C._test_fusion_own_threads(2 if request.param == "team_blocks" else 1)
    yield
    torch.axon.synchronize()
    torch.axon._C._set_adaptive_eager(-1)
    torch.axon._C._test_fusion_fail("")
    torch.axon._C._test_fusion_tile_bytes(0)
    torch.axon._C._test_fusion_own_threads(0)
    torch.ops.axon._set_kernel_threads("")


def run(program, inputs, fused: bool):
    """program(*inputs) on axon with fusion on or off; (outputs on the CPU, stats)."""
    torch.axon.synchronize()
    torch.axon._C._set_adaptive_eager(1 if fused else 0)
    torch.axon.reset_fusion_stats()
    torch.axon._C._test_sleep_on_stream(torch.axon.current_device(), HOLD_MS)
    out = program(*inputs)
    outs = out if isinstance(out, (tuple, list)) else (out,)
    cpu = [o.cpu() for o in outs]
    torch.axon.synchronize()
    stats = torch.axon.fusion_stats()
    torch.axon._C._set_adaptive_eager(-1)
    return cpu, stats


def assert_bitwise(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x.dtype == y.dtype and x.shape == y.shape and x.stride() == y.stride()
        assert torch.equal(bits(x), bits(y)), "fused result differs from op by op"


def fused_vs_op_by_op(program, cpu_inputs, expect_fused=True):
    def inputs():  # fresh copies: a program may write its inputs
        return [t.to(AXON) if isinstance(t, torch.Tensor) else t for t in cpu_inputs]

    ref, _ = run(program, inputs(), fused=False)
    got, stats = run(program, inputs(), fused=True)
    assert_bitwise(got, ref)
    if expect_fused:
        assert stats["fused_kernels"] >= 1 and stats["ops_fused"] >= 2, stats
    return got, stats


def hf_rms_norm(x, w, eps=1e-6):
    # transformers' LlamaRMSNorm.forward, written as Python ops
    dtype = x.dtype
    h = x.to(torch.float32)
    var = h.pow(2).mean(-1, keepdim=True)
    h = h * torch.rsqrt(var + eps)
    return w * h.to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", [(2, 300, 96), (3, 7, 33), (1, 1, 64), (513, 40)])
def test_rms_norm_chain_bitwise(dtype, shape):
    x, w = make(shape, dtype, seed=1), make(shape[-1:], dtype, seed=2)
    got, _ = fused_vs_op_by_op(hf_rms_norm, [x, w])
    torch.testing.assert_close(got[0], hf_rms_norm(x, w), atol=2e-2 if dtype != torch.float32 else 1e-5,
                               rtol=2e-2 if dtype != torch.float32 else 1e-5)


def test_own_runs_on_the_team_bitwise():
    """A run of own ops spread over the compute team block by block (the thread policy's
    choice for large runs; forced here, with L2 tiles so that a tile holds many blocks):
    the team ran it, and results are bitwise equal to op by op in every dtype."""
    torch.axon._C._test_fusion_own_threads(2)
    torch.axon._C._test_fusion_tile_bytes(0)
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        x, w = make((4, 96, 160), dtype, seed=7), make((160,), dtype, seed=8)
        # On one thread (or with the team busy) the runtime runs the loop serially.
        key = "loops" if torch.get_num_threads() > 1 else "serial_loops"
        before = torch.axon._C._team_stats()[key]
        got, _ = fused_vs_op_by_op(lambda x, w: (hf_rms_norm(x, w), swiglu(x, x * 2, x)), [x, w])
        assert torch.axon._C._team_stats()[key] > before
        torch.testing.assert_close(got[0], hf_rms_norm(x, w), atol=2e-2 if dtype != torch.float32 else 1e-5,
                                   rtol=2e-2 if dtype != torch.float32 else 1e-5)


@pytest.mark.skipif(torch.get_num_threads() < 2, reason="one thread: no team to split launches")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_team_launches_fuse_only_as_own_ops(dtype):
    """Launches the thread policy gives the team (forced here) run in parts whose bounds
    may move an element between ATen's vector loop and its scalar tail (parts of 163
    rows of 200: bounds off the vector width), so they join a run only as the engine's own exactly
    rounded ops: a chain of those fuses; chains with ATen's transcendental kernels stay
    bitwise equal to op by op on the team."""
    torch.ops.axon._set_kernel_threads("team")
    shape = (640, 200)
    x, y = make(shape, dtype, seed=21), make(shape, dtype, seed=22)
    _, stats = fused_vs_op_by_op(lambda x, y: ((x * y + x) - y).neg() * y, [x, y])
    assert stats["ops_fused"] >= 5, stats
    mixed = [
        lambda x, y: torch.tanh(x * y) + torch.exp(x.clamp(max=4)) * y - torch.sigmoid(y),
        lambda x, y: torch.nn.functional.silu(x) * y + torch.nn.functional.gelu(y, approximate="tanh"),
        lambda x, y: (x * 2.5).mean(-1, keepdim=True) + torch.cos(y) * x,
    ]
    for program in mixed:
        got, _ = fused_vs_op_by_op(program, [x, y], expect_fused=False)
        torch.testing.assert_close(got[0], program(x, y), atol=2e-2 if dtype != torch.float32 else 1e-5,
                                   rtol=2e-2 if dtype != torch.float32 else 1e-5)


def swiglu(gate, up, res):
    return torch.nn.functional.silu(gate) * up + res


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_silu_mul_residual_bitwise(dtype):
    gate, up, res = (make((5, 17, 130), dtype, seed=s) for s in (3, 4, 5))
    fused_vs_op_by_op(swiglu, [gate, up, res])


# Random chains over a pool of tensors in one frame (rows x C): full tensors, columns
# (one value per row), rows (one value per column) and scalars, with in-place ops.
UNARY = {
    "neg": torch.neg, "exp": lambda t: torch.exp(t.clamp(max=4)), "tanh": torch.tanh,
    "sigmoid": torch.sigmoid, "silu": torch.nn.functional.silu,
    "rsqrt": lambda t: torch.rsqrt(t.abs() + 1), "sqrt": lambda t: torch.sqrt(t.abs()),
    "square": lambda t: t.pow(2), "gelu": torch.nn.functional.gelu,
    "relu": torch.relu, "cos": torch.cos,
}
BINARY = {
    "add": torch.add, "sub": torch.sub, "mul": torch.mul,
    "div": lambda a, b: a / (abs(b) + 1), "max": lambda a, b: _maximum(a, b),
    "add_alpha": lambda a, b: torch.add(a, b, alpha=0.5),
}
INT_UNARY = {"neg": torch.neg, "square": lambda t: t * t, "abs_": lambda t: t.abs()}
INT_BINARY = {"add": torch.add, "sub": torch.sub, "mul": torch.mul,
              "max": lambda a, b: _maximum(a, b)}


def _maximum(a, b):
    return torch.maximum(a, b) if isinstance(b, torch.Tensor) else a.clamp(min=b)


def random_chain(seed, dtype, rows, C):
    rng = random.Random(seed)
    floating = dtype.is_floating_point
    unary = UNARY if floating else INT_UNARY
    binary = BINARY if floating else INT_BINARY
    steps = []
    for _ in range(rng.randint(3, 10)):
        r = rng.random()
        if r < 0.35:
            steps.append(("unary", rng.choice(sorted(unary)), rng.randrange(100)))
        elif r < 0.75:
            steps.append(("binary", rng.choice(sorted(binary)), rng.randrange(100),
                          rng.choice(["full", "col", "row", "scalar", "number"])))
        elif r < 0.85 and floating:
            steps.append(("reduce", rng.choice(["mean", "sum"]), rng.randrange(100)))
        elif r < 0.93:
            steps.append(("inplace", rng.choice(["add_", "mul_"]), rng.randrange(100)))
        elif floating:
            steps.append(("cast", rng.choice([torch.float32, dtype]), rng.randrange(100)))

    def program(full, col, row, scalar):
        pool = [full]
        for step in steps:
            x = pool[step[2] % len(pool)]
            if step[0] == "unary":
                y = unary[step[1]](x)
            elif step[0] == "binary":
                other = {"full": full, "col": col, "row": row, "scalar": scalar,
                         "number": 1.5 if floating else 3}[step[3]]
                y = binary[step[1]](x, other)
            elif step[0] == "reduce":
                y = getattr(x, step[1])(-1, keepdim=True) + x if x.shape[-1] == C else x
            elif step[0] == "inplace":
                y = x.clone()
                getattr(y, step[1])(full.to(y.dtype))
            else:
                y = x.to(step[1])
            pool.append(y)
        return pool[1:]

    return program


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.int32])
@pytest.mark.parametrize("seed", range(6))
def test_random_chains_bitwise(dtype, seed):
    rows, C = random.Random(seed).choice([(300, 40), (3, 257), (129, 64), (1, 10)])
    hi = 3 if dtype.is_floating_point else 20
    full = make((rows, C), dtype, -hi, hi, seed)
    col = make((rows, 1), dtype, -hi, hi, seed + 1)
    row = make((C,), dtype, -hi, hi, seed + 2)
    scalar = make((), dtype, -hi, hi, seed + 3)
    program = random_chain(seed, dtype, rows, C)
    got, _ = fused_vs_op_by_op(program, [full, col, row, scalar], expect_fused=False)
    expect = program(full, col, row, scalar)
    for g, e in zip(got, expect):
        if g.dtype.is_floating_point:
            torch.testing.assert_close(g, e, atol=5e-2, rtol=5e-2, equal_nan=True)
        else:
            assert torch.equal(g, e)


@pytest.mark.parametrize("cols", [1, 7, 8, 9, 31, 64, 100, 512, 513, 2048, 4100, 70000, 2200000])
def test_row_sums_and_means_bitwise(cols, request):
    # The engine's own float32 row sums replay ATen's cascade; rows long enough for
    # every level of it (2.2M: more than 4 bits per level).
    rows = max(1, min(64, 400000 // cols))
    g = torch.Generator().manual_seed(cols)
    x = torch.randn(rows, cols, generator=g) * torch.logspace(-3, 3, cols).flip(0)

    def program(t):
        s = (t * 1.0).sum(-1, keepdim=True)
        m = (t + 0.0).mean(-1, keepdim=True)
        return s, m, (t * 2.0).mean(-1) + 1.0

    # (Rows of one element are not fused; with 16 KiB tiles, long rows end runs early.)
    l2 = request.node.callspec.params["_worker_threads"] == "l2_tiles"
    fused_vs_op_by_op(program, [x], expect_fused=cols > 1 and l2)


def test_fused_counts_are_observable():
    x = make((64, 32), torch.float32, seed=7)
    _, stats = fused_vs_op_by_op(lambda t: ((t + 1) * 2 - 3).neg(), [x])
    assert stats["ops_fused"] >= 4 and stats["tiles"] >= 1
    assert stats["kernels_compiled"] == 0
    torch.axon.reset_fusion_stats()
    assert torch.axon.fusion_stats()["ops_fused"] == 0


@pytest.mark.parametrize("layout", ["transposed", "sliced", "expanded", "zero_size", "row_sliced"])
def test_non_contiguous_and_zero_size_inputs(layout):
    base = make((40, 66), torch.float32, seed=8)
    if layout == "transposed":
        view = lambda t: t.t()  # noqa: E731
    elif layout == "sliced":
        view = lambda t: t[1:, 1::2]  # noqa: E731
    elif layout == "expanded":
        view = lambda t: t[:1].expand(40, 66)  # noqa: E731
    elif layout == "zero_size":
        view = lambda t: t[:0]  # noqa: E731
    else:  # rows of a wider tensor: the stride between rows is not the row length
        view = lambda t: t[:, :33]  # noqa: E731

    def program(b):
        x = view(b)
        y = x * 2 + 1
        return y, torch.sigmoid(y) * x, y.sum(-1, keepdim=True)

    fused_vs_op_by_op(program, [base], expect_fused=layout == "row_sliced")


def test_in_place_and_views_of_intermediates():
    def program(a, b):
        y = a * b
        y.add_(a)                 # in place on an intermediate
        v = y[:, : y.shape[1] // 2]
        v.mul_(3)                 # in place on a view of it: overlaps y with another geometry
        z = y + v.sum(-1, keepdim=True)
        z.mul_(z)                 # self and other the same tensor
        return y, z

    a, b = make((200, 48), torch.float32, seed=9), make((200, 48), torch.float32, seed=10)
    fused_vs_op_by_op(program, [a, b])


def test_aliasing_between_inputs_and_outputs():
    def program(a):
        b = a + 1
        torch.mul(b, 2, out=a)        # writes an input of an earlier op
        c = a[1:] + a[:-1]            # partial overlaps of one buffer
        a[:, :8].add_(c[:1, :8])      # reads a row that another op writes
        return a.clone(), b, c

    fused_vs_op_by_op(program, [make((150, 24), torch.float32, seed=11)], expect_fused=False)


def test_in_place_on_a_result_freed_later():
    def program(a):
        t = a * 2
        t.mul_(3)           # reads t's memory; t is freed below: the write need not land
        t.add_(t)
        u = t + 1
        del t
        return u

    _, stats = fused_vs_op_by_op(program, [make((300, 40), torch.float32, seed=16)])
    assert stats["intermediate_bytes_not_written"] > 0, stats


def test_freed_intermediate_block_reused_by_next_op():
    def program(x):
        outs = []
        for _ in range(4):
            t = x * 1.5          # freed below, its block reused by the next iteration
            x = t + x.neg()
            del t
            outs.append(x.sum(-1, keepdim=True))
        return [x] + outs

    fused_vs_op_by_op(program, [make((256, 64), torch.float32, seed=12)])


def test_chain_interleaved_with_other_streams_and_events():
    def program(x, w):
        s = torch.axon.Stream()
        y = x * w
        ev = torch.axon.Event()
        ev.record()                              # mid-chain: a marker ends the run
        z = (y + 1).neg()
        with torch.axon.stream(s):
            s.wait_event(ev)
            other = y * 2                        # another stream reads y after the event
        torch.axon.current_stream().wait_stream(s)
        out = z + other
        y.record_stream(s)
        return y, z, out

    x, w = make((300, 32), torch.float32, seed=13), make((32,), torch.float32, seed=14)
    fused_vs_op_by_op(program, [x, w])


def test_error_inside_a_fused_chain_names_the_op():
    x = make((64, 16), torch.float32, seed=15).to(AXON)
    torch.axon.synchronize()
    (x * 2 + 1).neg()                         # signatures checked once, synchronously
    torch.axon.synchronize()
    torch.axon._C._set_adaptive_eager(1)
    torch.axon._C._test_fusion_fail("aten::add.Tensor")
    torch.axon._C._test_sleep_on_stream(torch.axon.current_device(), HOLD_MS)
    y = (x * 2 + 1).neg()
    with pytest.raises(RuntimeError, match=r"asynchronous error in 'aten::add.Tensor'.*"
                                           r"injected failure of a fused op"):
        torch.axon.synchronize()
    torch.axon._C._test_fusion_fail("")
    del y
    torch.axon.synchronize()                  # reported once; the stream keeps working
    assert torch.equal((x + 1).cpu(), x.cpu() + 1)


def test_zero_dim_operand_in_a_one_row_frame():
    # A 0-dim tensor stays 0-dim in the tile views (type promotion treats it as a scalar).
    def program(x, t):
        s = x.sum(-1)
        return s * t, (x + 1) * t

    x = make((1, 64), torch.float32, seed=17)
    t = torch.tensor(0.1, dtype=torch.float64)
    got, _ = fused_vs_op_by_op(program, [x, t], expect_fused=False)
    assert got[0].dtype == torch.float32


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_nan_results(dtype):
    # NaN results stay NaN where op by op they are NaN, and other values are bitwise
    # equal; a 16-bit NaN's payload may differ (ATen's own vector and scalar paths write
    # different ones). Copies and negation of 16-bit floats move bits: NaN bits kept.
    def program(z, x):
        n = z / z                      # NaN
        return (n + x).neg(), n.neg(), n.clone(), x * 2

    z = torch.zeros(200, 40, dtype=dtype)
    z[::3] = 1
    x = make((200, 40), dtype, seed=18)
    inputs = lambda: [z.to(AXON), x.to(AXON)]  # noqa: E731
    ref, _ = run(program, inputs(), fused=False)
    got, stats = run(program, inputs(), fused=True)
    assert stats["fused_kernels"] >= 1
    for g, r in zip(got, ref):
        assert torch.equal(g.isnan(), r.isnan())
        assert torch.equal(bits(torch.where(g.isnan(), 0, g)), bits(torch.where(r.isnan(), 0, r)))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_random_ops_inside_chains_draw_the_same_numbers(dtype):
    # Random ops between fusible ops (dropout, rand_like, normal_, bernoulli_) draw the
    # numbers they draw op by op, in the same order, from the same seed.
    def program(x):
        torch.manual_seed(1234)
        y = torch.nn.functional.dropout(x * 2.0 + 1.0, p=0.3, training=True)
        z = (y + 1.0) * torch.rand_like(y)
        n = torch.empty_like(z).normal_() * 0.5 + z
        b = torch.empty_like(z).bernoulli_(0.25) * n - 1.0
        return y, z, (b * 3.0).neg()

    x = make((64, 96), dtype, seed=21)
    got, stats = fused_vs_op_by_op(program, [x], expect_fused=False)
    assert stats["ops_fused"] >= 2, stats
    # The same numbers as a second op-by-op run (the seed in the program decides them).
    again, _ = run(program, [x.to(AXON)], fused=False)
    assert_bitwise(got, again)


# float32 bit patterns at the edges of rounding to 16 bits: ties to even (down and up),
# carries into the next binade and to infinity, subnormals of all three formats, the
# float16 overflow and subnormal boundaries, infinities and NaNs (with payloads).
EDGE_BITS = [0x3F808000, 0x3F818000, 0x3F80FFFF, 0x3F7FFFFF, 0x3F7F8000, 0x7F7FFFFF,
             0x7F7F8000, 0x7F7F7FFF, 0x00000001, 0x00008000, 0x00018000, 0x007FFFFF,
             0x00800000, 0x477FE000, 0x477FF000, 0x477FEFFF, 0x38000000, 0x33800000,
             0x33000000, 0x33000001, 0x387FC000, 0x7F800000, 0x7FC00001, 0x7FA00000,
             0x7F800001, 0x3F800000, 0x40490FDB]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_16bit_rounding_of_edge_values(dtype):
    # The fused loops' float32 -> 16-bit conversions (16 lanes at a time, then a scalar
    # tail: rows of 37) round every edge value as ATen's kernels do, in copies and in
    # 16-bit binary ops reading 16-bit rows and float rows.
    import numpy as np

    pats = EDGE_BITS + [p | 0x80000000 for p in EDGE_BITS]
    flat = torch.from_numpy(np.array(pats, dtype=np.uint32).view(np.float32).copy())
    x = flat.repeat(8)[: 8 * 37].reshape(8, 37)
    x[1::2] = x[1::2].roll(5, dims=1)  # the edge values in vector lanes and in the tail
    w = torch.tensor([1.0, 2.0, -0.5, 3.0] * 10)[:37].to(dtype)

    def program(x, w):
        y = x.to(dtype)
        return y, y * w, (x * 2.0).to(dtype), y * y, (y.float() * 0.75).to(dtype)

    ref, _ = run(program, [x.to(AXON), w.to(AXON)], fused=False)
    got, stats = run(program, [x.to(AXON), w.to(AXON)], fused=True)
    assert stats["fused_kernels"] >= 1 and stats["ops_fused"] >= 5, stats
    # Bitwise equal to op by op and to the CPU, NaN payloads aside (test_nan_results).
    for g, r, c in zip(got, ref, program(x, w)):
        for other in (r, c):
            assert torch.equal(g.isnan(), other.isnan())
            assert torch.equal(bits(torch.where(g.isnan(), 0, g)),
                               bits(torch.where(other.isnan(), 0, other)))


def test_integer_division_error_leaves_other_ops_intact():
    a = torch.arange(256 * 64, dtype=torch.int32).reshape(256, 64).to(AXON)
    ones = torch.ones(256, 64, dtype=torch.int32, device=AXON)
    def program(z):
        y = a + 1
        q = torch.div(y, z, rounding_mode="floor")
        w = a * 3
        return y, q, w

    torch.axon._C._set_adaptive_eager(1)
    program(ones)                          # signatures checked at the call
    torch.axon.synchronize()
    z = ones.clone()
    z[200, 0] = 0
    torch.axon._C._test_sleep_on_stream(torch.axon.current_device(), HOLD_MS)
    y, q, w = program(z)
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        torch.axon.synchronize()
    assert torch.equal(y.cpu(), a.cpu() + 1)
    assert torch.equal(w.cpu(), a.cpu() * 3)


def test_launch_blocking_runs_op_by_op():
    r = run_python("""
        import torch
        torch.axon._C._set_adaptive_eager(1)
        torch.ops.axon._set_kernel_threads("worker")
        x = torch.randn(64, 32).axon()
        for _ in range(3):
            y = ((x + 1) * 2).neg()
        torch.axon.synchronize()
        print(torch.axon.fusion_stats()["fused_kernels"])
    """, env={"AXON_LAUNCH_BLOCKING": "1"})
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "0"


def test_environment_switch():
    code = "import torch; print(torch.axon._C._adaptive_eager())"
    assert run_python(code).stdout.strip() == "False"
    assert run_python(code, env={"AXON_ADAPTIVE_EAGER": "1"}).stdout.strip() == "True"
    r = run_python(code, env={"AXON_ADAPTIVE_EAGER": "maybe"})
    assert r.stdout.strip() == "False" and "AXON_ADAPTIVE_EAGER" in r.stderr


@pytest.mark.parametrize("arch", ["llama", "qwen3", "gemma", "gpt2", "mixtral"])
@pytest.mark.parametrize("threads", ["worker", "team"])
def test_hf_model_forward_and_training_step_bitwise(arch, threads):
    from conftest import tiny_causal_lm

    torch.ops.axon._set_kernel_threads(threads)  # team: fused only as own ops

    model = tiny_causal_lm(arch).to(AXON).train()
    ids = torch.randint(0, 128, (2, 24), generator=torch.Generator().manual_seed(0)).to(AXON)
    state = {k: v.clone() for k, v in model.state_dict().items()}

    def step():
        model.load_state_dict(state)
        model.zero_grad(set_to_none=True)
        out = model(ids, labels=ids)
        out.loss.backward()
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        return [out.logits, out.loss] + grads

    step()  # every signature checked once, synchronously
    ref, _ = run(step, [], fused=False)
    got, stats = run(step, [], fused=True)
    assert_bitwise(got, ref)
    assert stats["fused_kernels"] >= 1, stats
