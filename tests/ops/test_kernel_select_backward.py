"""Kernel selection (csrc/aten/KernelSelect.h) of fused attention forward and backward
and of layer_norm's backward: whichever side runs (forced own or library, or chosen by
measurement in auto), the results are the CPU's within the op's tolerances, and the forced
side is the one that ran (the table's own/library launch counts).

Attention is selected against ATen's CPU flash attention only where it computes the same
thing (no dropout, no grouped-query heads, one head size, additive masks of float32 or the
query's dtype, no empty dimension); elsewhere our kernel runs whatever the mode and the
table has no row for the launch.  rms_norm's backward has no ATen CPU kernel: ours always.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from conftest import FLOAT_DTYPES, assert_same, make
from op_util import compare_fwd_bwd, leaf, select_runs
from test_attention import sdpa_inputs

import torch_axon  # noqa: F401
from torch_axon import _C

MODES = ["own", "library", "auto"]
FUSED_SDPA = "ScaledDotProductFusedAttentionOverrideableBackward0"
OWN_RUNS, LIBRARY_RUNS = 11, 12  # indices in a _kernel_select_table() row


@pytest.fixture
def isolated(kernel_select_isolated):
    return kernel_select_isolated


runs = select_runs


def check_side(op: str, mode: str, before: tuple[int, int]) -> None:
    own, lib = runs(op)
    if mode == "own":
        assert own > before[0] and lib == before[1], (op, mode, before, (own, lib))
    elif mode == "library":
        assert lib > before[1] and own == before[0], (op, mode, before, (own, lib))
    else:
        assert own + lib > sum(before), (op, mode, before, (own, lib))


# ---------------------------------------------------------------- attention

# test_attention.SDPA_CASES the selection applies to: plain, causal (q shorter or longer
# than kv), additive masks of the query's dtype and float32 (broadcast 2-d and [B, 1, 1, S]),
# boolean masks (SDPA makes them additive: -inf; a fully masked row), HF's [B, L, H, D]
# transposed layout, a KV cache slice, heads expanded with stride 0, every other element
# of the head dimension, decoding (q_len 1) over a static cache.
SELECTED_CASES = ["plain", "causal", "q_longer_causal", "additive_mask_2d", "float32_mask",
                  "bool_mask_full_row", "noncontig", "kv_cache_slice", "expanded_kv",
                  "strided_head_dim", "static_cache_decode_add"]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("case", SELECTED_CASES)
def test_attention(mode, dtype, case, isolated, no_fallback):
    torch.ops.axon._set_kernel_select(mode)
    fn, inputs = sdpa_inputs(case, dtype)
    assert compare_fwd_bwd(fn, inputs, dtype, n_grad=3) == FUSED_SDPA
    check_side("attention", mode, (0, 0))
    check_side("attention_backward", mode, (0, 0))


@pytest.mark.parametrize("mode", ["own", "library"])
def test_attention_key(mode, isolated):
    """The key: batch * q heads, q_len, kv_len, head dim; causal and mask flags."""
    torch.ops.axon._set_kernel_select(mode)
    q, k, v = (make((2, 3, 5, 16), torch.float32, seed=s).axon() for s in (1, 2, 3))
    mask = torch.zeros(5, 5, device="axon")
    F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=False)
    F.scaled_dot_product_attention(q, k, v, is_causal=True)
    torch.axon.synchronize()
    rows = {r[3]: r for r in _C._kernel_select_table() if r[0] == "attention"}
    assert sorted(rows) == ["causal", "mask"]
    for r in rows.values():
        assert r[1:3] == ("float32", "bh<=8 q<=8 kv<=8 d<=16")
        assert (r[OWN_RUNS], r[LIBRARY_RUNS]) == ((1, 0) if mode == "own" else (0, 1))


def test_attention_mask_with_strided_rows(isolated, no_fallback):
    """An additive mask whose rows are not unit-strided (a transposed [S, L] tensor)."""
    torch.ops.axon._set_kernel_select("library")
    q = make((2, 2, 4, 8), torch.float32, -1, 1, seed=1)
    k, v = (make((2, 2, 6, 8), torch.float32, -1, 1, seed=s) for s in (2, 3))
    mask = make((6, 4), torch.float32, -2, 2, seed=4).t()
    fn = lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m)
    compare_fwd_bwd(fn, [q, k, v, mask], torch.float32, n_grad=3)
    check_side("attention", "library", (0, 0))
    check_side("attention_backward", "library", (0, 0))


@pytest.mark.parametrize("forward_mode,backward_mode", [("own", "library"), ("library", "own")])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_attention_backward_takes_either_sides_logsumexp(forward_mode, backward_mode, dtype,
                                                         isolated, no_fallback):
    """The forward of one side and the backward of the other (what auto may pair): a fully
    masked row's logsumexp is -inf from ours and 0 from ATen's; either backward takes both."""
    fn, inputs = sdpa_inputs("bool_mask_full_row", dtype)
    xs_c = [leaf(t, "cpu", i < 3) for i, t in enumerate(inputs)]
    out_c = fn(*xs_c)
    grad = make(out_c.shape, dtype, -1, 1, seed=9)
    out_c.backward(grad)
    xs = [leaf(t, "axon", i < 3) for i, t in enumerate(inputs)]
    torch.ops.axon._set_kernel_select(forward_mode)
    out = fn(*xs)
    torch.axon.synchronize()
    torch.ops.axon._set_kernel_select(backward_mode)
    out.backward(grad.axon())
    assert_same(out.detach(), out_c.detach(), dtype=dtype, accum=True)
    for x, x_c in zip(xs[:3], xs_c[:3]):
        assert_same(x.grad, x_c.grad, dtype=dtype, accum=True)
    assert runs("attention") == ((1, 0) if forward_mode == "own" else (0, 1))
    assert runs("attention_backward") == ((1, 0) if backward_mode == "own" else (0, 1))


@pytest.mark.parametrize("mode", ["own", "library"])
def test_attention_logsumexp(mode, isolated):
    """The op's logsumexp (float32 [B, H, L]) is the same whichever side ran."""
    torch.ops.axon._set_kernel_select(mode)
    q, k, v = (make((2, 3, 6, 16), torch.float32, -1, 1, seed=s) for s in (1, 2, 3))
    mask = make((6, 6), torch.float32, -2, 2, seed=4)
    out, lse = torch.ops.aten._scaled_dot_product_fused_attention_overrideable(
        q.axon(), k.axon(), v.axon(), mask.axon(), 0.0, False)[:2]
    scores = q @ k.transpose(-2, -1) / 4.0 + mask
    assert lse.dtype == torch.float32 and lse.shape == (2, 3, 6)
    assert_same(lse, scores.logsumexp(-1), accum=True)
    assert_same(out, scores.softmax(-1) @ v, accum=True)
    assert runs("attention") == ((1, 0) if mode == "own" else (0, 1))


# (case of test_attention.SDPA_CASES, why ATen's kernel does not apply)
NOT_SELECTED = ["gqa",               # grouped-query heads
                "decode_one_query",  # decoding with grouped-query heads
                "dv_differs",        # value head size other than the query's
                "zero_kv_len",       # no keys
                "zero_batch"]        # nothing to compute


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("case", NOT_SELECTED)
def test_attention_not_selected(case, dtype, isolated, no_fallback):
    torch.ops.axon._set_kernel_select("library")
    fn, inputs = sdpa_inputs(case, dtype)
    compare_fwd_bwd(fn, inputs, dtype, n_grad=3)
    assert runs("attention") == runs("attention_backward") == (0, 0)


def test_attention_mask_dtypes_not_selected(isolated, no_fallback):
    """A boolean mask given to the op itself, an additive mask of a third dtype: ours."""
    torch.ops.axon._set_kernel_select("library")
    q, k, v = (make((1, 2, 4, 8), torch.float32, -1, 1, seed=s) for s in (1, 2, 3))
    keep = make((4, 4), torch.bool, seed=4)
    keep[:, 0] = True
    out = torch.ops.aten._scaled_dot_product_fused_attention_overrideable(
        q.axon(), k.axon(), v.axon(), keep.axon(), 0.0, False)[0]
    assert_same(out, F.scaled_dot_product_attention(q, k, v, attn_mask=keep), accum=True)
    add = make((4, 4), torch.bfloat16, -2, 2, seed=5)
    out = torch.ops.aten._scaled_dot_product_fused_attention_overrideable(
        q.axon(), k.axon(), v.axon(), add.axon(), 0.0, False)[0]
    assert_same(out, F.scaled_dot_product_attention(q, k, v, attn_mask=add.float()), accum=True)
    assert runs("attention") == (0, 0)


def test_attention_dropout_not_selected(isolated, no_fallback):
    """Dropout draws from axon's generator: our kernel, reproducible by seed."""
    torch.ops.axon._set_kernel_select("library")
    q, k, v = (make((1, 2, 8, 8), torch.float32, -1, 1, seed=s).axon() for s in (1, 2, 3))
    outs = []
    for _ in range(2):
        torch.manual_seed(0)
        outs.append(F.scaled_dot_product_attention(q, k, v, dropout_p=0.5).cpu())
    torch.testing.assert_close(outs[0], outs[1], rtol=0, atol=0)
    assert runs("attention") == (0, 0)
    no_dropout = F.scaled_dot_product_attention(q, k, v).cpu()  # selected: ATen's
    assert not torch.allclose(outs[0], no_dropout)
    assert runs("attention") == (0, 1)


# ---------------------------------------------------------------- norms

@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("affine", ["none", "weight_bias", "weight", "float32_params"])
def test_layer_norm_backward(mode, dtype, affine, isolated, no_fallback):
    torch.ops.axon._set_kernel_select(mode)
    pdtype = torch.float32 if affine == "float32_params" else dtype
    w, b = make((40,), pdtype, seed=7), make((40,), pdtype, seed=8)
    if affine == "none":
        fn, params = (lambda t: F.layer_norm(t, (40,))), []
    elif affine == "weight":
        fn, params = (lambda t, w: F.layer_norm(t, (40,), w)), [w]
    else:
        fn, params = (lambda t, w, b: F.layer_norm(t, (40,), w, b)), [w, b]
    for x in [make((3, 5, 40), dtype, seed=6),
              make((40, 6), dtype, seed=9).t(),  # non-contiguous (we read a contiguous copy)
              make((0, 40), dtype)]:  # zero-size: no kernel to select
        compare_fwd_bwd(fn, [x] + params, dtype)
    check_side("layer_norm_backward", mode, (0, 0))


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_layer_norm_backward_input_grad_only(dtype, isolated, no_fallback):
    """Parameters that need no gradient: dx alone, from either side."""
    for mode in ("library", "own"):
        torch.ops.axon._set_kernel_select(mode)
        x = make((7, 24), dtype, seed=1)
        w, b = make((24,), dtype, seed=2), make((24,), dtype, seed=3)
        compare_fwd_bwd(lambda t: F.layer_norm(t, (24,), w.to(t.device), b.to(t.device)), [x],
                        dtype)
    assert runs("layer_norm_backward") == (1, 1)


@pytest.mark.parametrize("mode", ["own", "library"])
def test_rms_norm_backward_is_ours(mode, isolated, no_fallback):
    """ATen has no CPU kernel of _fused_rms_norm_backward: ours whatever the mode."""
    torch.ops.axon._set_kernel_select(mode)
    x, w = make((3, 5, 40), torch.float32, seed=1), make((40,), torch.float32, seed=2)
    compare_fwd_bwd(lambda t, w: F.rms_norm(t, (40,), w, 1e-5), [x, w], torch.float32)
    assert runs("rms_norm_backward") == (0, 0)
    check_side("rms_norm", mode, (0, 0))  # the forward is selected
