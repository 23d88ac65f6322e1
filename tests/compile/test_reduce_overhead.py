"""torch.compile(mode="reduce-overhead") on axon: Inductor's graphs as axon graphs
(torch_axon/integrations/torch_compile.py, AxonGraphPolicy).

Each compiled function's first call runs the compiled code (warm-up), the
second records an AxonGraph and replays it, later calls replay.  Results are
compared with the same function run eagerly on axon and on the CPU at
conftest's tolerances (tol(dtype, accum=True): Inductor fuses, eager rounds
after every op).  That the graph is really used is observed by counting
``torch.axon.AxonGraph.replay`` calls.
"""

from __future__ import annotations

import logging

import gc

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch._dynamo.utils import counters

from conftest import tol

DEV = "axon"
pytestmark = pytest.mark.usefixtures("fresh_dynamo")  # conftest: empty Dynamo caches and counters


@pytest.fixture
def replays(monkeypatch):
    """A list whose length is the number of AxonGraph replays since the test began."""
    calls = []
    original = torch.axon.AxonGraph.replay

    def replay(self):
        calls.append(self)
        return original(self)

    monkeypatch.setattr(torch.axon.AxonGraph, "replay", replay)
    return calls


@pytest.fixture
def skip_messages():
    """The messages of Inductor's cudagraph log (its "skipping cudagraphs due to ...")."""
    from torch._inductor.cudagraph_utils import cudagraphs_log

    messages = []

    class Handler(logging.Handler):
        def emit(self, record):
            messages.append(record.getMessage())

    handler = Handler(logging.WARNING)
    cudagraphs_log.addHandler(handler)
    yield messages
    cudagraphs_log.removeHandler(handler)


def _fn(x, w):
    return F.silu(x @ w).mul(2) + x.sum(-1, keepdim=True)


@pytest.mark.parametrize("backend", ["inductor", "axon"])
def test_function_replays_and_matches_eager(backend, replays):
    w_cpu = torch.randn(16, 16)
    w = w_cpu.to(DEV)
    compiled = torch.compile(_fn, backend=backend, mode="reduce-overhead", fullgraph=True)
    outs = []
    for i in range(5):
        x_cpu = torch.randn(8, 16)
        x = x_cpu.to(DEV)
        out = compiled(x, w)
        assert len(replays) == max(0, i)  # call 0 warms up; call 1 records and replays
        torch.testing.assert_close(out.cpu(), _fn(x, w).cpu(), **tol(torch.float32, accum=True))
        torch.testing.assert_close(out.cpu(), _fn(x_cpu, w_cpu), **tol(torch.float32, accum=True))
        outs.append(out)
    # Outputs of replays are the graph's memory: the next replay overwrites them, and
    # reading an earlier one raises (as cudagraph trees do) instead of giving the
    # later run's values.
    for old in outs[1:4]:
        with pytest.raises(RuntimeError, match="overwritten by a subsequent run"):
            old.cpu()
    assert outs[3] is not outs[4]  # new tensor objects for each call
    torch.testing.assert_close(outs[4].cpu(), _fn(x_cpu, w_cpu), **tol(torch.float32, accum=True))
    assert torch.axon.AxonGraph in {type(g) for g in replays}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_module_inference(dtype, replays):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.LayerNorm(32), nn.Linear(32, 8))
    model = model.to(DEV, dtype).eval()
    ref_cpu = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.LayerNorm(32), nn.Linear(32, 8))
    ref_cpu.load_state_dict({k: v.cpu() for k, v in model.state_dict().items()})
    ref_cpu = ref_cpu.to(dtype).eval()
    compiled = torch.compile(model, mode="reduce-overhead")
    with torch.no_grad():
        for i in range(4):
            x = torch.randn(4, 16, dtype=dtype)
            out = compiled(x.to(DEV))
            torch.testing.assert_close(out.cpu(), model(x.to(DEV)).cpu(), **tol(dtype, accum=True))
            torch.testing.assert_close(out.cpu(), ref_cpu(x), **tol(dtype, accum=True))
    assert len(replays) == 3
    assert counters["inductor"]["cudagraph_skips"] == 0


def _mlp():
    return nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 4))


def test_training_step_matches_eager(replays):
    torch.manual_seed(0)
    model, ref = _mlp().to(DEV), _mlp().to(DEV)
    ref.load_state_dict(model.state_dict())
    compiled = torch.compile(model, mode="reduce-overhead")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    opt_ref = torch.optim.SGD(ref.parameters(), lr=0.1)
    for step in range(4):
        x = torch.randn(8, 16, device=DEV)
        losses, grads = [], []
        for m, o in ((compiled, opt), (ref, opt_ref)):
            o.zero_grad(set_to_none=True)
            xi = x.clone().requires_grad_()
            loss = m(xi).square().mean()
            loss.backward()
            o.step()
            losses.append(loss.detach().cpu())
            grads.append(xi.grad.cpu())
        torch.testing.assert_close(losses[0], losses[1], **tol(torch.float32, accum=True))
        torch.testing.assert_close(grads[0], grads[1], **tol(torch.float32, accum=True))
        # Forward and backward graphs: warm-up at step 0, then one replay each per step.
        assert len(replays) == 2 * step, step
    for p, q in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p.cpu(), q.cpu(), **tol(torch.float32, accum=True))
    opt.zero_grad(set_to_none=True)
    # Two forwards before the first backward: the second replay rewrote the
    # activations the first backward needs; autograd says so instead of
    # computing with the second input's activations.
    first = compiled(torch.randn(8, 16, device=DEV, requires_grad=True)).sum()
    second = compiled(torch.randn(8, 16, device=DEV, requires_grad=True)).sum()
    assert len(replays) == 8  # both replays of the graph the loop used
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        first.backward()
    second.backward()  # the latest forward's backward is fine


def test_new_shapes_record_new_graphs(replays):
    w = torch.randn(16, 16, device=DEV)
    compiled = torch.compile(_fn, mode="reduce-overhead")
    per_round = []
    for rows in (8, 12, 5, 12, 8):
        before = len(replays)
        for i in range(3):
            x = torch.randn(rows, 16, device=DEV)
            out = compiled(x, w)
            assert out.shape == (rows, 16)
            torch.testing.assert_close(out.cpu(), _fn(x, w).cpu(), **tol(torch.float32, accum=True))
        per_round.append(len(replays) - before)
    # A new shape recompiles (8, then a dynamic-shape graph from 12 on) or, in
    # the dynamic graph, records a graph per size: warm-up, record + replay,
    # replay.  12 comes back to its recorded graph; 8 to its static graph or
    # to a new size of the dynamic one (Dynamo picks).
    assert per_round[:4] == [2, 2, 2, 3], per_round
    assert per_round[4] in (2, 3), per_round
    assert counters["inductor"]["cudagraph_skips"] == 0


def _graphs_alive() -> int:
    """Recorded axon graphs (reduce-overhead) that are alive."""
    from torch_axon.integrations.torch_compile import _Recording

    gc.collect()
    return sum(type(o) is _Recording and o.outputs is not o.owned
               for o in gc.get_objects())


def test_static_input_at_new_address_records_a_graph_for_it(replays, skip_messages):
    """A parameter that moves gets a graph at its new address (as cudagraph trees record
    a node for it, not counted against the re-record limit); the graph of the freed one
    is released, so moving it again and again does not pile graphs up."""
    from torch._inductor import config

    torch.manual_seed(0)
    lin = nn.Linear(8, 8).to(DEV).eval()
    compiled = torch.compile(lin, mode="reduce-overhead")
    x = torch.randn(2, 8, device=DEV)
    with torch.no_grad(), config.patch({"triton.cudagraph_unexpected_rerecord_limit": 1}):
        for _ in range(3):
            compiled(x)
        assert len(replays) == 2
        base = _graphs_alive()
        for k in range(4):
            lin.weight.data = torch.randn(8, 8, device=DEV)  # the parameter moves
            for _ in range(2):
                out = compiled(x)
                torch.testing.assert_close(out.cpu(), lin(x).cpu(),
                                           **tol(torch.float32, accum=True))
            assert len(replays) == 4 + 2 * k
            # The old weight's graph is released once its last output is freed too
            # (at the next recording): at most one more alive.
            assert _graphs_alive() <= base + 1
    assert counters["inductor"]["cudagraph_skips"] == 0, skip_messages


class _Block(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.up = nn.Linear(width, 2 * width)
        self.down = nn.Linear(2 * width, width)

    def forward(self, x):
        return x + self.down(F.gelu(self.up(self.norm(x))))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_modules_sharing_compiled_code_keep_their_outputs(replays, skip_messages, dtype):
    """Regional compilation: blocks of one class compiled one by one share Inductor's
    code; each gets a graph of its own (the parameters are static inputs), so a block's
    replay leaves every earlier block's output of the step intact, and every later call
    replays."""
    torch.manual_seed(0)
    blocks = [_Block(32).to(DEV, dtype).eval() for _ in range(4)]
    ref = [_Block(32).to(dtype).eval() for _ in range(4)]
    for b, r in zip(blocks, ref):
        r.load_state_dict({k: v.cpu() for k, v in b.state_dict().items()})
        b.compile(mode="reduce-overhead")
    x_cpu = torch.randn(3, 5, 32, dtype=dtype)
    x = x_cpu.to(DEV)
    with torch.no_grad():
        for step in range(4):
            hs = [x]
            for b in blocks:
                hs.append(b(hs[-1]))
            want = [x_cpu]
            for r in ref:
                want.append(r(want[-1]))
            # Read after the whole step: no block overwrote another's output.
            for got, exp in zip(hs[1:], want[1:]):
                torch.testing.assert_close(got.cpu(), exp, **tol(dtype, accum=True))
            x = hs[-1].clone()
            x_cpu = want[-1]
    # Step 0: the first block warms the shared code up, the other three record their
    # graphs and replay them; step 1 records the first block's; every later call replays.
    assert len(replays) == 3 + 3 * len(blocks), len(replays)
    assert counters["inductor"]["cudagraph_skips"] == 0, skip_messages


def test_regional_compilation_trains(replays, skip_messages):
    """Training with blocks of one class compiled one by one: the forward and backward
    graphs of each block are its own (the backward's static inputs include the forward
    graph's saved outputs, on new storages at every replay at the same addresses), every
    call after the first steps replays without recording again, and the parameters
    follow the CPU's."""
    torch.manual_seed(0)
    model = nn.Sequential(*[_Block(32) for _ in range(3)])
    ref = nn.Sequential(*[_Block(32) for _ in range(3)])
    ref.load_state_dict(model.state_dict())
    model.to(DEV)
    for b in model:
        b.compile(mode="reduce-overhead")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    per_step, alive = [], []
    for step in range(5):
        x = torch.randn(4, 8, 32)
        before = len(replays)
        for m, o, inp in ((model, opt, x.to(DEV)), (ref, ref_opt, x)):
            o.zero_grad(set_to_none=True)
            m(inp).pow(2).mean().backward()
            o.step()
        per_step.append(len(replays) - before)
        alive.append(_graphs_alive())
        for p, q in zip(model.parameters(), ref.parameters()):
            torch.testing.assert_close(p.detach().cpu(), q.detach(),
                                       **tol(torch.float32, accum=True))
    assert per_step[2:] == [6, 6, 6], per_step  # 3 forward and 3 backward graphs a step
    assert alive[1] == alive[-1], alive  # no graph recorded again
    assert counters["inductor"]["cudagraph_skips"] == 0, skip_messages


def test_too_many_static_input_sets_skip_graphs(replays, skip_messages):
    """More modules sharing the code than the re-record limit, all alive: graphs are
    skipped with Inductor's message, and results stay right, also the outputs of the
    graphs already replayed, which the next module is reading (a chain of blocks)."""
    from torch._inductor import config

    torch.manual_seed(0)
    mods = [nn.Linear(8, 8).to(DEV).eval() for _ in range(4)]
    compiled = [torch.compile(m, mode="reduce-overhead") for m in mods]
    x = torch.randn(2, 8, device=DEV)
    with torch.no_grad(), config.patch({"triton.cudagraph_unexpected_rerecord_limit": 2}):
        for _ in range(3):
            hs = [x]
            for c in compiled:
                hs.append(c(hs[-1]))
            want = x
            for m, got in zip(mods, hs[1:]):
                want = m(want)
                torch.testing.assert_close(got.cpu(), want.cpu(),
                                           **tol(torch.float32, accum=True))
    del hs, got
    assert any("skipping cudagraphs due to more than 2 sets of static input data pointers"
               in m for m in skip_messages), skip_messages
    assert _graphs_alive() == 0


def test_cpu_tensor_input_skips_graphs_with_inductor_message(replays, skip_messages):
    def f(x, scale):
        return (x * scale).relu()

    compiled = torch.compile(f, mode="reduce-overhead")
    scale = torch.tensor(3.0)  # a CPU scalar tensor: allowed with axon tensors
    for _ in range(3):
        x = torch.randn(6, device=DEV)
        torch.testing.assert_close(compiled(x, scale).cpu(), f(x, scale).cpu())
    assert len(replays) == 0
    assert counters["inductor"]["cudagraph_skips"] >= 1
    assert any("skipping cudagraphs due to" in m and "cpu device" in m for m in skip_messages), \
        skip_messages


def test_random_ops_draw_new_numbers_per_replay(replays):
    def f(x):
        return F.dropout(x, 0.5, training=True) + torch.rand_like(x)

    compiled = torch.compile(f, mode="reduce-overhead")
    x = torch.ones(4096, device=DEV)
    outs = [compiled(x).cpu() for _ in range(4)]
    assert len(replays) == 3
    for a, b in zip(outs, outs[1:]):
        assert not torch.equal(a, b)
    for out in outs:  # dropout keeps about half, scaled by 2; rand in [0, 1)
        kept = (out >= 2).float().mean().item()
        assert 0.45 < kept < 0.55, kept
    runs = []
    for _ in range(2):
        torch.manual_seed(5)
        runs.append([compiled(x).cpu() for _ in range(2)])
    for a, b in zip(*runs):
        torch.testing.assert_close(a, b, atol=0, rtol=0)


def test_cpu_graphs_are_left_to_upstream(replays, skip_messages):
    """A CPU-only compiled graph takes upstream's path: skipped, counted, not logged."""
    from torch._inductor import config

    compiled = torch.compile(_fn, mode="reduce-overhead")
    x, w = torch.randn(4, 16), torch.randn(16, 16)
    for _ in range(3):
        torch.testing.assert_close(compiled(x, w), _fn(x, w), **tol(torch.float32, accum=True))
    assert len(replays) == 0
    assert counters["inductor"]["cudagraph_skips"] >= 1
    assert skip_messages == []
    assert config.cudagraph_policy is None


def test_capture_failure_falls_back_with_message(replays, skip_messages):
    """A compiled callable that synchronises cannot be captured: it runs without a graph."""
    from torch_axon.integrations.torch_compile import _AxonGraphed

    def model(inputs):  # a boxed callable, as Inductor's
        (x,) = inputs
        inputs.clear()
        return [x * x.sum().item()]

    graphed = _AxonGraphed(model, static_input_idxs=(), device_index=0)
    x = torch.arange(4.0, device=DEV)
    for _ in range(3):
        (out,) = graphed([x])
        torch.testing.assert_close(out.cpu(), torch.arange(4.0) * 6)
    assert len(replays) == 0
    assert graphed.skip_reason is not None
    assert any("skipping cudagraphs due to an axon graph capture failure" in m
               and "operation not permitted when stream is capturing" in m
               for m in skip_messages), skip_messages
    assert not torch.axon.is_current_stream_capturing()


def test_transformers_static_cache_generate(replays, skip_messages):
    """Static-cache greedy generation: Transformers' own compilation of the
    decoding step (CompileConfig's default mode is "reduce-overhead") and the
    documented recipe (the user compiles forward) give eager's tokens."""
    transformers = pytest.importorskip("transformers",
                                       reason="Hugging Face tests need transformers")
    config = transformers.LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64,
                                      num_hidden_layers=1, num_attention_heads=2,
                                      num_key_value_heads=1, max_position_embeddings=64)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).to(DEV).eval()
    prompt = torch.randint(3, 128, (2, 5), device=DEV)
    kw = dict(max_new_tokens=8, do_sample=False, pad_token_id=0)
    eager = model.generate(prompt, disable_compile=True, cache_implementation="static", **kw)
    assert len(replays) == 0

    # Transformers compiles the decoding step (the prefill runs eagerly, and
    # marks the cache's tensors static): 7 decoding steps, the first warms up.
    auto = model.generate(prompt, cache_implementation="static", **kw)
    assert auto.tolist() == eager.tolist()
    assert len(replays) == 6, len(replays)

    # The recipe: forward compiled by the user, so the prefill is compiled too
    # and the cache is created inside it, without static addresses.  The
    # decoding graph mutates the cache: graphs are skipped with Inductor's
    # message (as cudagraph trees do), and the tokens are still eager's.
    torch._dynamo.reset()
    replays.clear()
    model.forward = torch.compile(model.forward, mode="reduce-overhead", fullgraph=True)
    out = model.generate(prompt, disable_compile=True, cache_implementation="static", **kw)
    assert out.tolist() == eager.tolist()
    assert len(replays) == 0
    assert any("skipping cudagraphs due to mutated inputs" in m for m in skip_messages), \
        skip_messages

    # With a cache initialised before the compiled calls (static addresses),
    # the recipe replays graphs: the first generate warms the prefill and the
    # decoding step up and replays the next 6 steps; the second, with a new
    # cache, re-records both graphs and replays all 8 calls.
    torch._dynamo.reset()
    head_dim = config.hidden_size // config.num_attention_heads
    for n in range(2):
        cache = transformers.StaticCache(config=config, max_cache_len=16)
        cache.early_initialization(2, config.num_key_value_heads, head_dim, torch.float32,
                                   torch.device(DEV))
        out = model.generate(prompt, disable_compile=True, cache=cache, **kw)
        assert out.tolist() == eager.tolist()
        assert len(replays) == (6, 14)[n], (n, len(replays))


def test_patches_are_idempotent():
    from torch._inductor import cudagraph_utils, output_code

    from torch_axon.integrations import torch_compile

    check = cudagraph_utils.check_multiple_devices_or_any_cpu_nodes
    post_compile = output_code.CompiledFxGraph.post_compile
    init = output_code.CompiledFxGraph.__init__
    backward = output_code.maybe_handle_backward_generation
    assert all(getattr(f, "_axon_patch", False) for f in (check, post_compile, init, backward))
    for _ in range(2):
        torch_compile.device_check_accepts_axon(cudagraph_utils)
        torch_compile.graph_axon_outputs(output_code)
    assert cudagraph_utils.check_multiple_devices_or_any_cpu_nodes is check
    assert output_code.CompiledFxGraph.post_compile is post_compile
    assert output_code.CompiledFxGraph.__init__ is init
    assert output_code.maybe_handle_backward_generation is backward
    # Upstream's answers for other devices are kept.
    assert check({torch.device("cpu"): _Node("x")}).startswith("skipping cudagraphs due to cpu")
    assert check({torch.device("axon", 0): _Node("x")}) is None
    assert check({torch.device("cuda", 0): _Node("x")}) is None
    assert "multiple devices" in check({torch.device("axon", 0): _Node("x"),
                                        torch.device("axon", 1): _Node("y")})


class _Node:
    """What the device check reads from an FX node."""

    def __init__(self, name):
        self.name = name
        self.users = {}


def test_reading_an_output_a_later_replay_overwrote_raises(replays):
    """A replay rewrites the graph's output memory: an output of an earlier call (a
    Siamese encoder's first embedding) read after the next call raises, as cudagraph
    trees do, instead of silently holding the next call's values; a clone made before
    the next call, and views of the latest output, stay good."""
    w = torch.randn(16, 16, device=DEV)
    compiled = torch.compile(_fn, mode="reduce-overhead", fullgraph=True)
    for _ in range(3):  # warm up, record
        compiled(torch.randn(8, 16, device=DEV), w)
    x1, x2 = torch.randn(8, 16, device=DEV), torch.randn(8, 16, device=DEV)
    e1 = compiled(x1, w)
    row = e1[0]
    kept = e1.clone()
    e2 = compiled(x2, w)
    for stale in (e1, row):
        with pytest.raises(RuntimeError, match="overwritten by a subsequent run"):
            stale.cpu()
    torch.testing.assert_close(kept.cpu(), _fn(x1, w).cpu(), **tol(torch.float32, accum=True))
    torch.testing.assert_close(e2.cpu(), _fn(x2, w).cpu(), **tol(torch.float32, accum=True))
    torch.testing.assert_close(e2[1].cpu(), _fn(x2, w)[1].cpu(), **tol(torch.float32, accum=True))
    torch._dynamo.reset()  # the graph and its memory go: its last outputs cannot be read
    gc.collect()
    with pytest.raises(RuntimeError, match="overwritten by a subsequent run"):
        e2.cpu()
