"""Graphs (torch.axon.AxonGraph, torch.axon.graph, make_graphed_callables):
capture and replay give what the same ops give eagerly on the CPU, replay
sees new values of static inputs, random ops draw new numbers per replay,
and illegal calls during a capture raise as CUDA's do."""

import pytest
import torch
import torch.nn.functional as F
import torch_axon

DEV = "axon"


def _chain(x, w):
    return F.silu(x @ w).mul(2).add_(x.sum(-1, keepdim=True)).softmax(-1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("layout", ["contiguous", "transposed", "empty"])
def test_replay_matches_cpu(dtype, layout):
    rows = 0 if layout == "empty" else 24
    x_cpu = torch.randn(rows, 32, dtype=dtype)
    w_cpu = torch.randn(32, 32, dtype=dtype)
    if layout == "transposed":
        w_cpu = w_cpu.t()  # a non-contiguous static input
    x = x_cpu.to(DEV)
    w = w_cpu.to(DEV) if layout != "transposed" else w_cpu.t().contiguous().to(DEV).t()
    _chain(x, w)  # warm up: first launches run their checks at the call
    torch.axon.synchronize()
    g = torch.axon.AxonGraph()
    with torch.axon.graph(g):
        out = _chain(x, w)
    tol = {torch.float32: 1e-5, torch.bfloat16: 2e-2, torch.float16: 2e-3}[dtype]
    for _ in range(3):
        x_new = torch.randn(rows, 32, dtype=dtype)
        x.copy_(x_new)  # static input, new values
        g.replay()
        expected = _chain(x_new, w_cpu)  # the same computation on the CPU, in dtype
        torch.testing.assert_close(out.cpu().float(), expected.float(), atol=tol, rtol=tol)
        # and what the same ops give eagerly on axon, bit for bit
        torch.testing.assert_close(out.cpu(), _chain(x, w).cpu(), atol=0, rtol=0)


def test_replay_equals_eager_bitwise_and_runs_nothing_at_capture():
    x = torch.randn(64, 64, device=DEV)
    y = torch.empty_like(x)
    y.copy_(x * 3)
    torch.axon.synchronize()
    g = torch.axon.AxonGraph()
    with torch.axon.graph(g):
        y.add_(1)  # in place on a tensor from outside the pool
    torch.axon.synchronize()
    torch.testing.assert_close(y.cpu(), (x * 3).cpu(), atol=0, rtol=0)  # nothing ran
    g.replay()
    g.replay()
    torch.testing.assert_close(y.cpu(), (x * 3).cpu().add_(1).add_(1), atol=0, rtol=0)


def test_replay_on_default_stream_and_shared_pool():
    x = torch.randn(128, device=DEV)
    torch.axon.synchronize()
    g1, g2 = torch.axon.AxonGraph(), torch.axon.AxonGraph()
    with torch.axon.graph(g1):
        a = x * 2
    with torch.axon.graph(g2, pool=g1.pool()):
        b = a + 1
    assert g2.pool() == g1.pool()
    x.copy_(torch.arange(128.0))
    g1.replay()  # on the default stream
    g2.replay()
    torch.testing.assert_close(b.cpu(), torch.arange(128.0) * 2 + 1, atol=0, rtol=0)


def test_graph_memory_is_private():
    x = torch.randn(1 << 16, device=DEV)
    torch.axon.synchronize()
    g = torch.axon.AxonGraph()
    with torch.axon.graph(g):
        tmp = x * 2
        out = tmp + 1
        del tmp  # freed inside the capture: reusable only inside the graph
    g.replay()
    expected = out.cpu()
    # Eager work allocating and freeing as much must not land in the graph's memory.
    junk = [torch.full((1 << 16,), 7.0, device=DEV) for _ in range(8)]
    del junk
    g.replay()
    torch.testing.assert_close(out.cpu(), expected, atol=0, rtol=0)
    g.reset()
    with pytest.raises(RuntimeError, match="without a preceding successful capture"):
        g.replay()


def test_random_ops_draw_new_numbers_each_replay_as_eager():
    x = torch.ones(4096, device=DEV)
    drop = torch.nn.Dropout(0.5)
    g = torch.axon.AxonGraph()
    coin = torch.empty(512, device=DEV)
    with torch.axon.graph(g):
        out = drop(x)
        noise = torch.rand(64, device=DEV)
        coin.bernoulli_(0.5)
    torch.axon.manual_seed(11)
    g.replay()
    first = (out.cpu(), noise.cpu(), coin.cpu())
    g.replay()
    second = (out.cpu(), noise.cpu(), coin.cpu())
    offset_after = torch.axon.get_rng_state()
    torch.axon.manual_seed(11)
    eager = [(drop(x).cpu(), torch.rand(64, device=DEV).cpu(), coin.bernoulli_(0.5).cpu())
             for _ in range(2)]
    for got, want in zip((first, second), eager):
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b, atol=0, rtol=0)
    assert all(not torch.equal(a, b) for a, b in zip(first, second))
    assert torch.equal(offset_after, torch.axon.get_rng_state())  # the same counter used


@pytest.mark.parametrize("call", ["item", "cpu", "synchronize", "nonzero"])
def test_synchronising_calls_raise_and_invalidate(call):
    x = torch.randn(16, device=DEV)
    torch.axon.synchronize()
    g = torch.axon.AxonGraph()
    with pytest.raises(RuntimeError, match="operation not permitted when stream is capturing"):
        with torch.axon.graph(g):
            y = x + 1
            if call == "item":
                y.sum().item()
            elif call == "cpu":
                y.cpu()
            elif call == "synchronize":
                torch.axon.synchronize()
            else:
                torch.nonzero(y)
    assert not torch.axon.is_current_stream_capturing()
    # The device and the stream go on working.
    torch.testing.assert_close((x + 1).cpu(), x.cpu() + 1)
    g2 = torch.axon.AxonGraph()
    with torch.axon.graph(g2):
        z = x * 2
    g2.replay()
    torch.testing.assert_close(z.cpu(), x.cpu() * 2)


def test_capture_misuse_errors():
    g = torch.axon.AxonGraph()
    with pytest.raises(RuntimeError, match="non-default stream"):
        g.capture_begin()
    with pytest.raises(RuntimeError, match="without a preceding successful capture"):
        g.replay()
    with pytest.raises(RuntimeError, match="capture_end\\(\\) called without"):
        g.capture_end()
    with pytest.raises(ValueError, match="capture_error_mode"):
        g.capture_begin(capture_error_mode="bogus")
    x = torch.randn(4, device=DEV)
    with torch.axon.graph(g):
        x.mul_(2)
    with pytest.raises(RuntimeError, match="already owns a captured graph"):
        with torch.axon.graph(g):
            x.mul_(2)


def test_body_exception_abandons_capture():
    g = torch.axon.AxonGraph()
    with pytest.raises(KeyError):
        with torch.axon.graph(g):
            torch.ones(3, device=DEV).add_(1)
            raise KeyError("body")
    assert not torch.axon.is_current_stream_capturing()
    assert torch.ones(3, device=DEV).sum().item() == 3


def test_async_error_in_replay_names_the_op():
    table = torch.randn(10, 4, device=DEV)
    idx = torch.tensor([1, 2], device=DEV)
    torch.axon.synchronize()
    g = torch.axon.AxonGraph()
    with torch.axon.graph(g):
        out = table.index_select(0, idx)  # noqa: F841
    idx.copy_(torch.tensor([1, 99]))
    with pytest.raises(RuntimeError, match="index_select"):
        g.replay()  # raises here with AXON_LAUNCH_BLOCKING=1
        torch.axon.synchronize()
    torch.axon.synchronize()  # reported once


def test_unjoined_side_stream_fails_capture():
    x = torch.randn(8, device=DEV)
    g = torch.axon.AxonGraph()
    side = torch.axon.Stream()
    with pytest.raises(RuntimeError, match="capture was not joined"):
        with torch.axon.graph(g):
            side.wait_stream(torch.axon.current_stream())
            with torch.axon.stream(side):
                x.add_(1)
    assert not torch.axon.is_current_stream_capturing()


def test_accelerator_graph_and_debug_dump(tmp_path):
    x = torch.randn(32, device=DEV)
    g = torch.accelerator.Graph()
    g.enable_debug_mode()
    with torch.axon.stream(torch.axon.Stream()):
        with g:
            y = torch.relu(x) * 3
    g.replay()
    torch.testing.assert_close(y.cpu(), torch.relu(x.cpu()) * 3)
    path = tmp_path / "graph.txt"
    g.debug_dump(str(path))
    text = path.read_text()
    assert "relu" in text and "mul" in text, text


def _mlp():
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4))


def test_make_graphed_callables_trains_like_eager():
    torch.manual_seed(0)
    eager = _mlp().to(DEV)
    graphed = _mlp().to(DEV)
    graphed.load_state_dict(eager.state_dict())
    sample = torch.randn(8, 16, device=DEV, requires_grad=True)
    graphed = torch.axon.make_graphed_callables(graphed, (sample,))
    opt_e = torch.optim.SGD(eager.parameters(), lr=0.1)
    opt_g = torch.optim.SGD(graphed.parameters(), lr=0.1)
    for step in range(3):
        x = torch.randn(8, 16, device=DEV, requires_grad=True)
        losses = []
        for model, opt in ((eager, opt_e), (graphed, opt_g)):
            opt.zero_grad(set_to_none=True)  # as CUDA's: grads alias the graph's buffers
            xi = x.detach().clone().requires_grad_()
            loss = model(xi).square().mean()
            loss.backward()
            opt.step()
            losses.append((loss.item(), xi.grad.cpu()))
        assert losses[0][0] == pytest.approx(losses[1][0], rel=1e-5, abs=1e-6), step
        torch.testing.assert_close(losses[1][1], losses[0][1], atol=1e-5, rtol=1e-5)
    for pe, pg in zip(eager.parameters(), graphed.parameters()):
        torch.testing.assert_close(pg.cpu(), pe.cpu(), atol=1e-5, rtol=1e-5)
    graphed.eval()  # eval mode runs the original forward
    with torch.no_grad():
        torch.testing.assert_close(graphed(x).cpu(), eager.eval()(x).cpu(), atol=1e-5, rtol=1e-5)


def test_make_graphed_callables_functions_and_errors():
    w = torch.randn(8, 8, device=DEV, requires_grad=True)

    def fn(a):
        return (a @ w).tanh()

    sample = torch.randn(4, 8, device=DEV, requires_grad=True)
    g = torch.axon.make_graphed_callables(fn, (sample,))
    a = torch.randn(4, 8, device=DEV, requires_grad=True)
    out = g(a)
    torch.testing.assert_close(out.cpu(), fn(a).cpu(), atol=1e-6, rtol=1e-6)
    (ga,) = torch.autograd.grad(out.sum(), a)
    (want,) = torch.autograd.grad(fn(a).sum(), a)
    torch.testing.assert_close(ga.cpu(), want.cpu(), atol=1e-6, rtol=1e-6)
    with pytest.raises(AssertionError, match="only Tensors"):
        torch.axon.make_graphed_callables(fn, (3,))
    m = _mlp().to(DEV)
    m.register_forward_hook(lambda *a: None)
    with pytest.raises(AssertionError, match="hooks"):
        torch.axon.make_graphed_callables(m, (torch.randn(2, 16, device=DEV),))


def test_hf_llama_decode_step_graph_equals_eager():
    transformers = pytest.importorskip("transformers", reason="Hugging Face tests need transformers")
    config = transformers.LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128,
                                      num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, max_position_embeddings=128)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).to(DEV).eval()
    prompt = torch.randint(3, 256, (2, 8), device=DEV)
    ids = torch.randint(3, 256, (2, 1), device=DEV)
    pos = torch.tensor([8], device=DEV)

    def run(cache, position):
        return model(input_ids=ids, cache_position=position, past_key_values=cache,
                     use_cache=True).logits

    with torch.no_grad():
        # Eager, captured, warm-up (Llama derives positions from what the cache holds).
        caches = [transformers.StaticCache(config=config, max_cache_len=32) for _ in range(3)]
        for c in caches:
            model(input_ids=prompt, cache_position=torch.arange(8, device=DEV),
                  past_key_values=c, use_cache=True)
        run(caches[2], pos)  # warm up: first launches run their checks at the call
        torch.axon.synchronize()
        g = torch.axon.AxonGraph()
        with torch.axon.graph(g):
            static_logits = run(caches[1], pos)
        for step in range(3):
            ids.copy_(torch.randint(3, 256, (2, 1)))
            pos.fill_(8 + step)
            want = run(caches[0], pos).cpu()
            g.replay()
            torch.testing.assert_close(static_logits.cpu(), want, atol=0, rtol=0)


def test_uncached_allocator_and_capture():
    """caching_allocator_disabled: memory comes from the device and goes back at
    once (the cache does not grow), results are right, and a capture refuses."""
    x = torch.randn(1 << 14, device=DEV)
    torch.axon.synchronize()
    before = torch.axon.memory_reserved()
    with torch.axon.caching_allocator_disabled():
        y = (x * 2).sin()
        z = y + 1
        torch.testing.assert_close(z.cpu(), (x.cpu() * 2).sin() + 1)
        assert torch.axon.memory_reserved() == before
        del y, z
        g = torch.axon.AxonGraph()
        with pytest.raises(RuntimeError, match="needs the caching allocator"):
            with torch.axon.graph(g):
                x.add_(1)
    assert torch_axon._C._caching_allocator_is_enabled()
    torch.testing.assert_close((x + 1).cpu(), x.cpu() + 1)


def _pool_of(t):
    ptr = t.untyped_storage().data_ptr()
    for seg in torch.axon.memory_snapshot():
        if seg["address"] <= ptr < seg["address"] + seg["total_size"]:
            return tuple(seg["segment_pool_id"])
    return None


def test_fork_join_across_streams_in_the_graph_pool():
    """A side stream joins the capture (fork) and rejoins it; its work replays
    in order, and its allocations come from the graph's pool too."""
    x = torch.randn(4096, device=DEV)
    torch.axon.synchronize()
    g = torch.axon.AxonGraph()
    side = torch.axon.Stream()
    with torch.axon.graph(g):
        a = x * 2
        side.wait_stream(torch.axon.current_stream())
        with torch.axon.stream(side):
            b = a + 1  # allocated on a stream that joined the capture
        torch.axon.current_stream().wait_stream(side)
        c = b * 3
    assert _pool_of(a) == _pool_of(b) == _pool_of(c) == tuple(g.pool())
    x.copy_(torch.arange(4096.0))
    g.replay()
    ref = torch.arange(4096.0) * 2
    torch.testing.assert_close(c.cpu(), (ref + 1) * 3, atol=0, rtol=0)


def test_reset_waits_for_queued_replays():
    big = torch.randn(512, 512, device=DEV)
    torch.axon.synchronize()
    g = torch.axon.AxonGraph()
    with torch.axon.graph(g):
        out = (big @ big).relu()
    want = (big @ big).relu().cpu()
    s = torch.axon.Stream()
    with torch.axon.stream(s):
        for _ in range(3):
            g.replay()  # queued on another stream than the capture's
    result = out  # keeps the output alive; the graph and its other memory go
    g.reset()
    torch.axon.synchronize()
    torch.testing.assert_close(result.cpu(), want)
    del result, out
    junk = [torch.ones(512, 512, device=DEV) for _ in range(4)]
    assert all(float(j.sum()) == 512 * 512 for j in junk)


@pytest.mark.parametrize("mode,other_thread_may_sync", [("thread_local", True), ("global", False)])
def test_capture_error_mode_decides_who_may_synchronize(mode, other_thread_may_sync):
    import threading

    x = torch.randn(16, device=DEV)
    torch.axon.synchronize()
    g = torch.axon.AxonGraph()
    errors = []

    def other():
        try:
            torch.axon.synchronize()
        except RuntimeError as e:
            errors.append(str(e))

    s = torch.axon.Stream()
    with torch.axon.stream(s):
        g.capture_begin(capture_error_mode=mode)
        x.mul_(2)
        t = threading.Thread(target=other)
        t.start()
        t.join()
        if other_thread_may_sync:
            g.capture_end()
        else:
            with pytest.raises(RuntimeError, match="previous error during capture"):
                g.capture_end()
    assert (not errors) == other_thread_may_sync, errors
    if other_thread_may_sync:
        before = x.cpu()
        g.replay()
        torch.testing.assert_close(x.cpu(), before * 2)


def test_profiler_shows_the_kernels_of_a_replay():
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    x = torch.randn(256, 256, device=DEV)
    torch.axon.synchronize()
    g = torch.axon.AxonGraph()
    with torch.axon.graph(g):
        y = torch.relu(x @ x)  # noqa: F841
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]) as prof:
        g.replay()
        torch.axon.synchronize()
    names = [e.name for e in prof.events() if e.device_type == DeviceType.PrivateUse1]
    assert any("graph replay" in n for n in names), names
    assert any("mm" in n for n in names) and any("relu" in n for n in names), names


def test_more_misuse_messages(tmp_path):
    g = torch.axon.AxonGraph()
    with pytest.raises(RuntimeError, match="pool\\(\\) without a preceding successful capture"):
        g.pool()
    with pytest.raises(RuntimeError, match="instantiate without a preceding successful capture"):
        g.instantiate()
    x = torch.randn(8, device=DEV)
    s = torch.axon.Stream()
    with torch.axon.stream(s):
        g.capture_begin()
        x.add_(1)
    with pytest.raises(RuntimeError, match="Capture must end on the same stream it began on"):
        g.capture_end()  # the current stream is the default one again
    with torch.axon.stream(s):
        g.capture_end()
    with pytest.raises(RuntimeError, match="call enable_debug_mode\\(\\) before capture"):
        g.debug_dump(str(tmp_path / "g.txt"))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_attention_dropout_draws_new_numbers_each_replay_as_eager(dtype):
    # Attention's dropout draws from raw counter ranges (not the CPU kernels'
    # generators): each replay must reserve its own range, in capture order
    # with the other random ops, and the backward must use the forward's.
    q, k, v = (torch.randn(2, 3, 16, 8, device=DEV, dtype=dtype, requires_grad=True)
               for _ in range(3))
    go = torch.randn(2, 3, 16, 8, device=DEV, dtype=dtype)

    def step():
        before = torch.rand(5, device=DEV)
        out = F.scaled_dot_product_attention(q, k, v, dropout_p=0.4, is_causal=True)
        grads = torch.autograd.grad(out, (q, k, v), go)
        after = F.dropout(torch.ones(64, device=DEV), 0.5)
        return (before, out, *grads, after)

    torch.axon.synchronize()
    g = torch.axon.AxonGraph()
    with torch.axon.graph(g):
        static = step()
    torch.axon.manual_seed(5)
    replays = []
    for _ in range(2):
        g.replay()
        replays.append([t.cpu() for t in static])
    offset_after = torch.axon.get_rng_state()
    torch.axon.manual_seed(5)
    eager = [[t.cpu() for t in step()] for _ in range(2)]
    for got, want in zip(replays, eager):
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b, atol=0, rtol=0)
    assert not torch.equal(replays[0][1], replays[1][1])  # new numbers each replay
    assert torch.equal(offset_after, torch.axon.get_rng_state())  # the same counter used
    # Dropout happened: some attention weights were zeroed, so the output
    # differs from attention without dropout.
    nodrop = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert not torch.allclose(replays[0][1], nodrop.detach().cpu())


def test_make_graphed_transformer_layer_with_dropout_trains_like_eager():
    torch.manual_seed(0)
    eager = torch.nn.TransformerEncoderLayer(32, 4, 64, dropout=0.2, batch_first=True).to(DEV)
    graphed = torch.nn.TransformerEncoderLayer(32, 4, 64, dropout=0.2, batch_first=True).to(DEV)
    graphed.load_state_dict(eager.state_dict())
    sample = torch.randn(2, 8, 32, device=DEV, requires_grad=True)
    graphed = torch.axon.make_graphed_callables(graphed, (sample,))
    for step in range(2):
        x = torch.randn(2, 8, 32, device=DEV)
        results = []
        for model in (eager, graphed):
            model.zero_grad(set_to_none=True)  # as CUDA's: grads alias the graph's buffers
            torch.axon.manual_seed(100 + step)
            xi = x.clone().requires_grad_()
            out = model(xi)
            out.square().mean().backward()
            results.append([out.detach().cpu(), xi.grad.cpu()] +
                           [p.grad.cpu() for p in model.parameters()])
        for got, want in zip(results[1], results[0]):
            torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_replays_on_two_streams_run_one_after_another():
    """Replays of one graph share its memory and its random-number state: a replay on
    another stream waits for the previous one (as launches of one CUDA graph exec are
    ordered); run at once, the two would write each other's intermediates and draw
    from generators the other reseeded."""
    x = torch.ones(1 << 20, device=DEV)

    def chain():
        y = F.dropout(x, 0.5)
        for _ in range(24):
            y = y * 1.001 + 0.5
        return y

    g = torch.axon.AxonGraph()
    with torch.axon.graph(g):
        out = chain()
    torch.axon.manual_seed(21)
    for s in (torch.axon.Stream(), torch.axon.Stream()):
        with torch.axon.stream(s):
            g.replay()
    torch.axon.synchronize()
    torch.axon.manual_seed(21)
    chain()
    torch.testing.assert_close(out.cpu(), chain().cpu(), atol=0, rtol=0)  # the second's


def test_check_input_liveness_names_a_freed_input():
    """torch.axon.graph(check_input_liveness=True), as torch.cuda's: the graph reads its
    inputs by address and does not keep them alive; a replay after an input from outside
    the capture was freed raises, naming where it was freed.  Inputs alive and tensors
    made inside the capture replay as before; enable_annotations is CUDA's and refused."""
    import gc

    x_cpu, w_cpu = torch.randn(64), torch.randn(64)
    x, w = x_cpu.to(DEV), w_cpu.to(DEV)
    (x * 2 + w).sum()  # warm up
    torch.axon.synchronize()
    g = torch.axon.AxonGraph()
    with torch.axon.graph(g, check_input_liveness=True):
        h = x * 2  # made inside the capture: not an external input
        y = h + w
    g.replay()
    torch.axon.synchronize()
    torch.testing.assert_close(y.cpu(), x_cpu * 2 + w_cpu)
    del x
    gc.collect()
    with pytest.raises(RuntimeError, match=r"axon graph replay detected 1 dead tensor") as e:
        g.replay()
    freed_at = str(e.value).split("Deletion Traceback (Python)")[1]
    assert "test_check_input_liveness_names_a_freed_input" in freed_at, str(e.value)
    g.reset()
    with pytest.raises(NotImplementedError, match="enable_annotations"):
        torch.axon.graph(torch.axon.AxonGraph(), enable_annotations=True)


def test_streams_report_capturing_through_every_api():
    """torch.Stream.is_capturing (also through torch.accelerator's current
    stream) agrees with torch.axon.is_current_stream_capturing, as on CUDA."""
    s = torch.axon.Stream()
    other = torch.axon.Stream()
    g = torch.axon.AxonGraph()
    x = torch.ones(3, device=DEV)
    assert not s.is_capturing()
    with torch.axon.stream(s):
        g.capture_begin()
        y = x + 1
        seen = (torch.axon.is_current_stream_capturing(), s.is_capturing(),
                torch.accelerator.current_stream().is_capturing(), other.is_capturing())
        g.capture_end()
    assert seen == (True, True, True, False)
    assert not s.is_capturing()
    g.replay()
    assert y.cpu().tolist() == [2.0, 2.0, 2.0]


def test_changing_the_seed_during_a_capture_raises():
    """As CUDA's generator: the same seed is a no-op, a new one raises (the
    replays would not see it)."""
    torch.axon.manual_seed(7)
    g = torch.axon.AxonGraph()
    x = torch.empty(4, device=DEV)
    with torch.axon.graph(g):
        torch.axon.manual_seed(7)
        x.uniform_()
        with pytest.raises(RuntimeError, match="only if new seed is the same as the original"):
            torch.axon.manual_seed(8)
    assert torch.axon.initial_seed() == 7
    torch.axon.manual_seed(9)  # after the capture: allowed
    assert torch.axon.initial_seed() == 9


def test_stream_native_handle_is_stable_and_distinct():
    s, t = torch.axon.Stream(), torch.axon.Stream()
    same = torch.axon.Stream(stream_id=s.stream_id, device_index=s.device_index,
                             device_type=s.device_type)
    assert s.native_handle != 0 and same.native_handle == s.native_handle
    assert s.native_handle != t.native_handle
    assert torch.axon.current_stream().native_handle != 0


def test_rng_state_restored_inside_a_capture_replays_as_eager():
    """get_rng_state/set_rng_state inside a capture (torch.utils.checkpoint's
    preserve_rng_state): each replay draws what the same calls draw eagerly, and
    leaves the generator where eager execution leaves it."""
    def body():
        st = torch.axon.get_rng_state()
        a = torch.randn(3, device=DEV)
        torch.axon.set_rng_state(st)
        b = torch.randn(3, device=DEV)
        c = torch.rand(2, device=DEV)
        return a, b, c

    g = torch.axon.AxonGraph()
    with torch.axon.graph(g):
        outs = body()
    torch.axon.manual_seed(5)
    g.replay()
    replayed = [t.cpu().clone() for t in outs]
    after_replay = torch.axon.get_rng_state()
    torch.axon.manual_seed(5)
    eager = [t.cpu() for t in body()]
    assert torch.equal(replayed[0], replayed[1])
    for got, want in zip(replayed, eager):
        assert torch.equal(got, want)
    assert torch.equal(after_replay, torch.axon.get_rng_state())
    # a capture that ends right after moving back leaves the generator there, as eager
    def rewinds():
        st = torch.axon.get_rng_state()
        x = torch.randn(5, device=DEV)
        torch.axon.set_rng_state(st)
        return x

    g2 = torch.axon.AxonGraph()
    with torch.axon.graph(g2):
        x = rewinds()
    torch.axon.manual_seed(6)
    g2.replay()
    after, first = torch.axon.get_rng_state(), x.cpu().clone()
    torch.axon.manual_seed(6)
    assert torch.equal(rewinds().cpu(), first)
    assert torch.equal(torch.axon.get_rng_state(), after)
    # a state from outside the capture (another seed) cannot be set in it
    other = torch.Generator("axon").manual_seed(123).get_state()
    with torch.axon.graph(torch.axon.AxonGraph()):
        with pytest.raises(RuntimeError, match="only restore a state taken in the same capture"):
            torch.axon.set_rng_state(other)


def test_checkpoint_with_dropout_in_a_graph_matches_eager():
    torch.manual_seed(0)
    lin = torch.nn.Linear(16, 16).to(DEV)
    drop = torch.nn.Dropout(0.5)
    x = torch.randn(8, 16, device=DEV, requires_grad=True)

    def step():
        y = torch.utils.checkpoint.checkpoint(lambda t: drop(lin(t)).relu(), x,
                                              use_reentrant=False, preserve_rng_state=True)
        y.sum().backward()
        return y.detach()

    s = torch.axon.Stream()
    s.wait_stream(torch.axon.current_stream())
    with torch.axon.stream(s):  # warm up (autograd's streams) off the default stream
        step()
    torch.axon.current_stream().wait_stream(s)
    x.grad = None
    lin.zero_grad(set_to_none=False)
    g = torch.axon.AxonGraph()
    with torch.axon.graph(g):
        out = step()
    torch.axon.manual_seed(9)
    lin.weight.grad.zero_()
    x.grad.zero_()
    g.replay()
    got = (out.cpu().clone(), x.grad.cpu().clone(), lin.weight.grad.cpu().clone())
    torch.axon.manual_seed(9)
    x.grad.zero_()
    lin.weight.grad.zero_()
    want_out = step()
    torch.testing.assert_close(got[0], want_out.cpu(), rtol=0, atol=0)
    torch.testing.assert_close(got[1], x.grad.cpu(), rtol=0, atol=0)
    torch.testing.assert_close(got[2], lin.weight.grad.cpu(), rtol=0, atol=0)
