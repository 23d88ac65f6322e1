"""FlexAttention (torch.nn.attention.flex_attention) on axon, eager and compiled.

* Eager: the op's dense implementation runs as axon kernels; forward (output
  and log-sum-exp) and backward (q, k, v and a captured score_mod parameter)
  with score_mods (relative position bias, soft-capping) and block masks made
  with ``create_block_mask(..., device="axon")`` (causal, sliding window,
  document), GQA, non-contiguous inputs.
* Compiled (Inductor): inference goes through Inductor's C++ FlexAttention
  template (checked with its counter); training and ``return_lse`` through the
  decomposition to the dense implementation (torch_axon/compiler/flex_attention.py).
* Transformers' Llama with ``attn_implementation="flex_attention"`` (which
  compiles flex_attention and its block mask itself) trains one step.

Reference: the same call on the CPU.  The CPU refuses FlexAttention backward
in its front end (``_validate_device``: its compiled kernels are forward-only),
so the backward reference is the CPU's eager dense implementation with that
check lifted; an independent float64 computation (plain softmax attention)
checks the float32 results too.  Tolerances (conftest): float32 TOL_ACCUM
(rtol=atol=1e-4: matmuls and Inductor's fused kernels sum in another order);
bfloat16 against the CPU TOL (rtol=1.6e-2, atol=1e-2) for the output and the
log-sum-exp, TOL_ACCUM (rtol=atol=3e-2) for gradients (bfloat16 matmuls; both
devices compute scores and probabilities in float32 and round at the same
points); the captured slope's gradient, a sum of about a thousand
bfloat16-rounded terms with cancellation, within 1% of its largest component
(compiled under autocast, Inductor rounds at other points than eager mode).
"""

from __future__ import annotations

import copy
import importlib
import math

import pytest
import torch
import torch.nn.attention.flex_attention as flex_module
from torch._dynamo.utils import counters
from torch.nn.attention.flex_attention import AuxRequest, create_block_mask, flex_attention

from conftest import AXON, tol

B, HQ, HKV, L, E = 2, 4, 2, 32, 16
BLOCK = 16  # two blocks per row and column: block sparsity is exercised
WINDOW = 10
BF16_OUT = tol(torch.bfloat16)  # rtol=1.6e-2, atol=1e-2
BF16_GRAD = tol(torch.bfloat16, accum=True)  # rtol=atol=3e-2

pytestmark = pytest.mark.filterwarnings(
    "ignore:flex_attention called without torch.compile",
    "ignore:return_lse is deprecated")


@pytest.fixture(scope="module", autouse=True)
def _no_graph_caches(no_graph_caches):
    """Compiles run the whole pipeline (the axon post-grad pass, the template)."""


@pytest.fixture
def cpu_backward(monkeypatch):
    """Lift the CPU's front-end refusal of backward, for the reference only."""
    original = flex_module._validate_device

    def validate(query, key, value):
        if query.device.type != "cpu":
            original(query, key, value)

    monkeypatch.setattr(flex_module, "_validate_device", validate)


# ------------------------------------------------------ mods and masks
# Written with tensor ops only, so that the independent reference can call
# them on broadcast index grids.  ``extra`` holds the captured tensors of the
# device: a per-head slope (a parameter: its gradient is checked) and the
# document id of every position.

def no_score_mod(extra):
    return None


def relative_bias(extra):
    slope = extra["slope"]

    def score_mod(score, b, h, q_idx, kv_idx):
        return score + slope[h] * (q_idx - kv_idx)
    return score_mod


def soft_cap(extra):
    def score_mod(score, b, h, q_idx, kv_idx):
        return 5.0 * torch.tanh(score / 5.0)
    return score_mod


def causal(extra):
    def mask_mod(b, h, q_idx, kv_idx):
        return q_idx >= kv_idx
    return mask_mod


def sliding_window(extra):
    def mask_mod(b, h, q_idx, kv_idx):
        return (q_idx >= kv_idx) & (q_idx - kv_idx < WINDOW)
    return mask_mod


def document(extra):
    doc = extra["doc"]

    def mask_mod(b, h, q_idx, kv_idx):
        return (doc[b, q_idx] == doc[b, kv_idx]) & (q_idx >= kv_idx)
    return mask_mod


def no_mask(extra):
    return None


def inputs(dtype, seed=0, gqa=True, transposed=False):
    """CPU q, k, v (transposed: views of (B, L, H, E) tensors, as in HF models)."""
    g = torch.Generator().manual_seed(seed)
    hkv = HKV if gqa else HQ
    out = []
    for h in (HQ, hkv, hkv):
        if transposed:
            out.append(torch.randn(B, L, h, E, generator=g).to(dtype).transpose(1, 2))
        else:
            out.append(torch.randn(B, h, L, E, generator=g).to(dtype))
    return out


def extras(device, grad=True):
    g = torch.Generator().manual_seed(7)
    slope = (torch.rand(HQ, generator=g) * 0.2).to(device).requires_grad_(grad)
    doc = torch.tensor([[0] * 12 + [1] * 20, [0] * 20 + [1] * 5 + [2] * 7]).to(device)
    return {"slope": slope, "doc": doc}


def run(fn, q, k, v, device, score_mod, mask_mod, gqa, *, grad=True, lse=False):
    """flex_attention on ``device``; returns (out, lse or None, grads or None)."""
    extra = extras(device, grad)
    q, k, v = (t.detach().to(device).requires_grad_(grad) for t in (q, k, v))
    mask = mask_mod(extra)
    block_mask = None if mask is None else create_block_mask(
        mask, B, None, L, L, device=str(device), BLOCK_SIZE=BLOCK)
    res = fn(q, k, v, score_mod=score_mod(extra), block_mask=block_mask, enable_gqa=gqa,
             return_aux=AuxRequest(lse=True) if lse else None)
    out, aux = res if lse else (res, None)
    assert out.device.type == torch.device(device).type
    grads = None
    if grad:
        loss = (out.float() * torch.linspace(-1, 1, out.shape[-1], device=device)).sum()
        if lse:
            loss = loss + aux.lse.float().sin().sum()
        loss.backward()
        grads = [t.grad.cpu() for t in (q, k, v)]
        if score_mod is relative_bias:
            grads.append(extra["slope"].grad.cpu())
    return out.detach().cpu(), None if aux is None else aux.lse.detach().cpu(), grads


def reference(q, k, v, score_mod, mask_mod, *, lse_term=False):
    """Plain softmax attention in float64 on the CPU: (out, lse, grads)."""
    extra = extras("cpu")
    extra["slope"] = extra["slope"].detach().double().requires_grad_()
    q, k, v = (t.detach().double().requires_grad_() for t in (q, k, v))
    kk, vv = (t.repeat_interleave(HQ // t.shape[1], 1) for t in (k, v))
    scores = q @ kk.transpose(-2, -1) / math.sqrt(E)
    b, h, qi, ki = (torch.arange(n).view([-1 if d == i else 1 for d in range(4)])
                    for i, n in enumerate((B, HQ, L, L)))
    sm, mm = score_mod(extra), mask_mod(extra)
    if sm is not None:
        scores = sm(scores, b, h, qi, ki)
    if mm is not None:
        scores = scores.masked_fill(~mm(b, h, qi, ki).expand_as(scores), -math.inf)
    lse = scores.logsumexp(-1)
    out = scores.softmax(-1) @ vv
    loss = (out * torch.linspace(-1, 1, out.shape[-1], dtype=torch.float64)).sum()
    if lse_term:
        loss = loss + lse.sin().sum()
    loss.backward()
    grads = [t.grad for t in (q, k, v)]
    if score_mod is relative_bias:
        grads.append(extra["slope"].grad)
    return out.detach(), lse.detach(), grads


def check(actual, expected, dtype, fp32_tol=None, bf16_tol=None):
    if dtype == torch.float32:
        t = fp32_tol or tol(torch.float32, accum=True)
    else:
        t = bf16_tol or BF16_OUT
    torch.testing.assert_close(actual.to(expected.dtype), expected, **t)


def check_all(res, ref, dtype, lse=False):
    out, out_lse, grads = res
    r_out, r_lse, r_grads = ref
    check(out, r_out, dtype)
    if lse:
        check(out_lse, r_lse, dtype)
    if grads is not None:
        assert len(grads) == len(r_grads)
        for g, rg in zip(grads[:3], r_grads[:3]):
            check(g, rg, dtype, bf16_tol=BF16_GRAD)
        for g, rg in zip(grads[3:], r_grads[3:]):
            # The slope's gradient sums ~B*L*L/2 bfloat16-rounded terms with
            # cancellation: its error scales with its largest component.
            scaled = dict(rtol=BF16_GRAD["rtol"], atol=1e-2 * rg.abs().max().item())
            check(g, rg, dtype, bf16_tol=scaled)


CASES = {  # name: (score_mod, mask_mod, gqa, transposed, return lse)
    "plain": (no_score_mod, no_mask, False, False, False),
    "causal_relative_bias_gqa": (relative_bias, causal, True, False, False),
    "sliding_window_softcap_lse": (soft_cap, sliding_window, False, True, True),
    "document_relative_bias_gqa_lse": (relative_bias, document, True, True, True),
}


# ---------------------------------------------------------------- eager

def test_device_check_unchanged_for_the_cpu():
    q, k, v = (t.requires_grad_() for t in inputs(torch.float32, gqa=False))
    with pytest.raises(NotImplementedError, match="does not support backward on CPU"):
        flex_attention(q, k, v)


def test_patches_are_idempotent():
    from torch_axon.compiler import flex_attention as compiler_flex
    from torch_axon.integrations import torch_flex_attention

    validate = flex_module._validate_device
    assert validate._axon_patch
    torch_flex_attention.flex_attention_device(flex_module)
    assert flex_module._validate_device is validate

    hops = importlib.import_module("torch._higher_order_ops.flex_attention")  # (the package
    # attribute of that name is the op)

    key = torch._C.DispatchKey.AutocastPrivateUse1
    autocast = hops.flex_attention.py_kernels[key]
    assert autocast._axon_patch
    torch_flex_attention.flex_attention_autocast(hops)
    assert hops.flex_attention.py_kernels[key] is autocast

    from torch._inductor.lowering import lowerings

    compiler_flex.install_lowering()
    lowering = lowerings[torch.ops.higher_order.flex_attention]
    assert lowering._axon_patch
    compiler_flex.install_lowering()
    assert lowerings[torch.ops.higher_order.flex_attention] is lowering


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_eager_matches_cpu(case, dtype, cpu_backward):
    score_mod, mask_mod, gqa, transposed, lse = CASES[case]
    q, k, v = inputs(dtype, gqa=gqa, transposed=transposed)
    torch.axon.reset_fallback_stats()
    res = run(flex_attention, q, k, v, AXON, score_mod, mask_mod, gqa, lse=lse)
    assert torch.axon.fallback_stats() == {}  # axon kernels, forward and backward
    cpu = run(flex_attention, q, k, v, "cpu", score_mod, mask_mod, gqa, lse=lse)
    check_all(res, cpu, dtype, lse)
    if dtype == torch.float32:
        check_all(res, reference(q, k, v, score_mod, mask_mod, lse_term=lse), dtype, lse)


def test_block_masks_on_axon_match_the_cpu():
    for mask_mod in (causal, sliding_window, document):
        axon = create_block_mask(mask_mod(extras(AXON)), B, None, L, L, device="axon",
                                 BLOCK_SIZE=BLOCK)
        cpu = create_block_mask(mask_mod(extras("cpu")), B, None, L, L, device="cpu",
                                BLOCK_SIZE=BLOCK)
        assert axon.kv_num_blocks.device.type == "axon"
        for a, c in zip(axon.as_tuple()[:-1], cpu.as_tuple()[:-1]):
            if isinstance(c, torch.Tensor):
                assert torch.equal(a.cpu(), c), mask_mod
            else:
                assert a == c


# ------------------------------------------------------------- compiled

@pytest.fixture(scope="module")
def compiled():
    torch._dynamo.reset()
    return torch.compile(flex_attention)


def test_compiled_inference_uses_the_cpp_template(compiled):
    """Under no_grad, and with grad enabled when nothing requires grad (the
    front end then asks for the log-sum-exp, which nothing uses)."""
    score_mod, mask_mod = relative_bias, document
    for dtype, no_grad in ((torch.float32, True), (torch.bfloat16, True),
                           (torch.float32, False)):
        counters.clear()
        q, k, v = inputs(dtype, seed=1)
        with torch.set_grad_enabled(not no_grad):
            res = run(compiled, q, k, v, AXON, score_mod, mask_mod, True, grad=False)
        cpu = run(flex_attention, q, k, v, "cpu", score_mod, mask_mod, True, grad=False)
        check_all(res, cpu, dtype)
        assert counters["inductor"]["cpp_templated_kernel_counter"] == 1, (dtype, no_grad)


def test_compiled_training_matches_cpu(compiled, cpu_backward):
    """float32 (bfloat16: test_autocast)."""
    dtype = torch.float32
    counters.clear()
    score_mod, mask_mod, gqa, transposed, lse = CASES["document_relative_bias_gqa_lse"]
    q, k, v = inputs(dtype, seed=2, gqa=gqa, transposed=transposed)
    res = run(compiled, q, k, v, AXON, score_mod, mask_mod, gqa, lse=lse)
    cpu = run(flex_attention, q, k, v, "cpu", score_mod, mask_mod, gqa, lse=lse)
    check_all(res, cpu, dtype, lse)
    # Decomposed: no template kernel, the backward compiled (no eager fallback).
    assert counters["inductor"]["cpp_templated_kernel_counter"] == 0
    assert counters["aot_autograd"]["total"] >= 1
    check_all(res, reference(q, k, v, score_mod, mask_mod, lse_term=lse), dtype, lse)


def test_autocast(compiled, cpu_backward):
    """Under torch.autocast("axon") float32 q, k, v run in bfloat16, as on the
    CPU; eager and compiled, forward and backward (the bfloat16 case of
    test_compiled_training_matches_cpu)."""
    score_mod, mask_mod, gqa, transposed, lse = CASES["document_relative_bias_gqa_lse"]
    q, k, v = inputs(torch.float32, seed=3, gqa=gqa, transposed=transposed)
    results = {}
    for name, fn, device in (("cpu", flex_attention, "cpu"), ("eager", flex_attention, AXON),
                             ("compiled", compiled, AXON)):
        with torch.autocast(torch.device(device).type, dtype=torch.bfloat16):
            results[name] = run(fn, q, k, v, device, score_mod, mask_mod, gqa, lse=lse)
    for name in ("eager", "compiled"):
        assert results[name][0].dtype == torch.bfloat16, name
        check_all(results[name], results["cpu"], torch.bfloat16, lse)


# ---------------------------------------------------------- Transformers

def test_llama_flex_attention_training_step():
    transformers = pytest.importorskip("transformers")
    from transformers import LlamaConfig, LlamaForCausalLM

    torch._dynamo.reset()
    cfg = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, vocab_size=128,
                      max_position_embeddings=64, attn_implementation="sdpa")
    torch.manual_seed(0)
    cpu_model = LlamaForCausalLM(copy.deepcopy(cfg)).train()
    model = LlamaForCausalLM(copy.deepcopy(cfg)).train()
    model.load_state_dict(cpu_model.state_dict())
    model.set_attn_implementation("flex_attention")
    model.to(AXON)
    assert model.config._attn_implementation == "flex_attention"
    assert cpu_model.config._attn_implementation == "sdpa"

    ids = torch.randint(0, 128, (2, 24), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[1, :5] = 0  # left padding: a padding mask on top of the causal one

    calls = []
    original = transformers.integrations.flex_attention.compile_friendly_flex_attention

    def counting(*args, **kwargs):
        calls.append(kwargs.get("block_mask"))
        return original(*args, **kwargs)

    mp = pytest.MonkeyPatch()
    mp.setattr(transformers.integrations.flex_attention, "compile_friendly_flex_attention",
               counting)
    torch.axon.reset_fallback_stats()
    try:
        out = model(input_ids=ids.to(AXON), attention_mask=mask.to(AXON), labels=ids.to(AXON))
        out.loss.backward()
    finally:
        mp.undo()
    assert torch.axon.fallback_stats() == {}
    assert len(calls) == cfg.num_hidden_layers
    assert calls[0] is not None and calls[0].kv_num_blocks.device.type == "axon"

    ref = cpu_model(input_ids=ids, attention_mask=mask, labels=ids)
    ref.loss.backward()
    t = tol(torch.float32, accum=True)
    torch.testing.assert_close(out.loss.detach().cpu(), ref.loss.detach(), **t)
    for (name, p), (_, rp) in zip(model.named_parameters(), cpu_model.named_parameters()):
        assert p.grad is not None, name
        torch.testing.assert_close(p.grad.cpu(), rp.grad, **t, msg=name)
