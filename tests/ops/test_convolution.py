"""Convolution and the image ops around it on axon against the CPU:
conv1d/conv2d, max/avg/adaptive/fractional pooling in 1-3 dimensions,
interpolate (nearest, linear, bilinear with antialias, trilinear), reflect
and replicate padding, grid_sample, channel_shuffle.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from conftest import assert_same, make
from op_util import nn_functional_test, stream_op_test, stream_op_zero_size_test


# name: (input shape, function of the input)
NN = {
    "conv1d": ((2, 4, 9), lambda x: F.conv1d(x, torch.linspace(-1, 1, 6 * 4 * 3, dtype=x.dtype, device=x.device).view(6, 4, 3), padding=1)),
    "conv2d": ((2, 4, 6, 6), lambda x: F.conv2d(x, torch.linspace(-1, 1, 4 * 2 * 9, dtype=x.dtype, device=x.device).view(4, 2, 3, 3), stride=2, padding=1, groups=2)),
    "max_pool2d": ((2, 3, 6, 6), lambda x: F.max_pool2d(x, 2)),
    "avg_pool2d": ((2, 3, 6, 6), lambda x: F.avg_pool2d(x, 3, stride=2, padding=1)),
    "adaptive_avg_pool2d": ((2, 3, 6, 6), lambda x: F.adaptive_avg_pool2d(x, (2, 3))),
    "interpolate_nearest": ((1, 2, 3, 4), lambda x: F.interpolate(x, scale_factor=2)),
    "interpolate_bilinear": ((1, 2, 3, 4), lambda x: F.interpolate(x, size=(5, 7), mode="bilinear", align_corners=False)),
    "pad_constant": ((2, 3, 4), lambda x: F.pad(x, (1, 2, 0, 1), value=-1.0)),
    "pad_reflect": ((2, 3, 4), lambda x: F.pad(x, (2, 1), mode="reflect")),
}

test_nn_functional = nn_functional_test(NN)


# ---------------------------------------------------------------- the generic stream kernel

# Ops the generic stream kernel runs (found by an OpInfo sweep of the fallback);
# name: (function of the inputs, input shapes, value range, differentiable)
STREAM_OPS = {
    "adaptive_avg_pool2d": (lambda a: F.adaptive_avg_pool2d(a, (3, 2)), [(2, 3, 7, 6)], None,
                            True),
    "adaptive_max_pool2d": (lambda a: F.adaptive_max_pool2d(a, (3, 2)), [(2, 3, 7, 6)], None,
                            True),
    "adaptive_avg_pool3d": (lambda a: F.adaptive_avg_pool3d(a, 2), [(1, 2, 5, 4, 6)], None,
                            True),
    "adaptive_max_pool3d": (lambda a: F.adaptive_max_pool3d(a, 2), [(1, 2, 5, 4, 6)], None,
                            True),
    "avg_pool3d": (lambda a: F.avg_pool3d(a, 2), [(1, 2, 4, 4, 6)], None, True),
    "max_pool3d": (lambda a: F.max_pool3d(a, 2), [(1, 2, 4, 4, 6)], None, True),
    "fractional_max_pool2d": (
        lambda a: F.fractional_max_pool2d(a, 2, output_size=(3, 3), _random_samples=torch.full(
            (2, 3, 2), 0.3, dtype=a.dtype, device=a.device)), [(2, 3, 7, 8)], None, True),
    "nearest1d": (lambda a: F.interpolate(a, scale_factor=2, mode="nearest"), [(2, 3, 5)],
                  None, True),
    "linear1d": (lambda a: F.interpolate(a, size=9, mode="linear"), [(2, 3, 5)], None, True),
    "nearest_exact1d": (lambda a: F.interpolate(a, size=8, mode="nearest-exact"), [(2, 3, 5)],
                        None, True),
    "nearest_exact2d": (lambda a: F.interpolate(a, size=(7, 9), mode="nearest-exact"),
                        [(2, 3, 4, 5)], None, True),
    "bilinear_aa": (lambda a: F.interpolate(a, size=(3, 4), mode="bilinear", antialias=True),
                    [(2, 3, 7, 9)], None, True),
    "bicubic_aa": (lambda a: F.interpolate(a, size=(4, 5), mode="bicubic", antialias=True),
                   [(2, 3, 7, 9)], None, True),
    "nearest3d": (lambda a: F.interpolate(a, scale_factor=2, mode="nearest"), [(1, 2, 3, 3, 4)],
                  None, True),
    "trilinear": (lambda a: F.interpolate(a, size=(4, 5, 6), mode="trilinear"),
                  [(1, 2, 3, 3, 4)], None, True),
    "reflect_pad1d": (lambda a: F.pad(a, (2, 1), mode="reflect"), [(2, 3, 5)], None, True),
    "replicate_pad1d": (lambda a: F.pad(a, (2, 1), mode="replicate"), [(2, 3, 5)], None, True),
    "reflect_pad3d": (lambda a: F.pad(a, (1, 1, 2, 1, 1, 0), mode="reflect"),
                      [(1, 2, 3, 4, 5)], None, True),
    "replicate_pad3d": (lambda a: F.pad(a, (1, 1, 2, 1, 1, 0), mode="replicate"),
                        [(1, 2, 3, 4, 5)], None, True),
    "grid_sample3d": (lambda a: F.grid_sample(a, torch.linspace(
        -0.9, 0.9, 1 * 2 * 3 * 2 * 3, dtype=a.dtype).view(1, 2, 3, 2, 3).to(a.device),
        align_corners=False), [(1, 2, 3, 4, 5)], None, True),
    "channel_shuffle": (lambda a: F.channel_shuffle(a, 2), [(2, 4, 3, 3)], None, False),
}


test_stream_op_matches_cpu = stream_op_test(STREAM_OPS)


ZERO_SIZE = {  # name: shapes of its inputs with no elements
    "adaptive_avg_pool2d": [(0, 3, 7, 6)],
    "nearest1d": [(0, 3, 5)],
    "reflect_pad3d": [(0, 2, 3, 4, 5)],
}

test_stream_op_zero_size = stream_op_zero_size_test(STREAM_OPS, ZERO_SIZE)


# ---------------------------------------------------------------- memory format

def _in_format(t, on):
    """t in channels_last (channels_last_3d for 5-D; a 3-D tensor as a
    [N, C, 1, L] one, as ATen lays out 1-D convolutions) when `on`."""
    if not on:
        return t
    if t.dim() == 3:
        return t.unsqueeze(2).to(memory_format=torch.channels_last).squeeze(2)
    return t.to(memory_format=torch.channels_last_3d if t.dim() == 5 else torch.channels_last)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
@pytest.mark.parametrize("dim", [1, 2, 3])
def test_convolution_memory_format_matches_cpu(dim, dtype):
    """convolution and its backward lay their results out as the CPU's kernels
    do (channels_last results for channels_last inputs or weights, where the
    CPU's backend follows them), with the CPU's values: over input and weight
    formats, transposed, groups, dilation and an empty batch."""
    import itertools

    failures = []
    for xf, wf, transposed, groups, dil, batch in itertools.product(
            [0, 1], [0, 1], [False, True], [1, 2], [1, 2], [2, 1, 0]):
        x = _in_format(make((batch, 4, *[5] * dim), dtype, seed=1), xf)
        w = _in_format(make((4, 4 // groups, *[3] * dim), dtype, seed=2), wf)
        b = make((4,), dtype, seed=3)
        args = ([1] * dim, [1] * dim, [dil] * dim, transposed, [0] * dim, groups)
        cpu = [t.clone().requires_grad_() for t in (x, w, b)]
        dev = [t.to("axon").requires_grad_() for t in (x, w, b)]
        assert [t.stride() for t in dev] == [t.stride() for t in cpu]
        want = torch.ops.aten.convolution(*cpu, *args)
        got = torch.ops.aten.convolution(*dev, *args)
        g = make(tuple(want.shape), dtype, seed=4)
        want_g = torch.autograd.grad(want, cpu, g)
        got_g = torch.autograd.grad(got, dev, g.to("axon"))
        case = f"x_cl={xf} w_cl={wf} transposed={transposed} groups={groups} dil={dil} batch={batch}"
        strides = [t.stride() for t in (got, *got_g)], [t.stride() for t in (want, *want_g)]
        if strides[0] != strides[1]:
            failures.append(f"{case}: strides {strides[0]} on axon, {strides[1]} on the CPU")
        assert_same(got, want.detach(), accum=True)
        for a, e in zip(got_g, want_g):
            assert_same(a, e, accum=True)
    assert not failures, "\n".join(failures)


def test_conv_module_in_channels_last_keeps_format():
    """nn.Conv2d / Conv3d / ConvTranspose2d on channels_last input give
    channels_last output on axon as on the CPU (a following view, reshape or
    flatten sees the same strides)."""
    for cls, shape, fmt in [(torch.nn.Conv2d, (2, 3, 8, 8), torch.channels_last),
                            (torch.nn.ConvTranspose2d, (2, 3, 8, 8), torch.channels_last),
                            (torch.nn.Conv3d, (2, 3, 4, 4, 4), torch.channels_last_3d)]:
        torch.manual_seed(0)
        m = cls(3, 5, 3)
        x = make(shape, torch.float32).to(memory_format=fmt)
        want = m(x)
        got = m.to("axon")(x.to("axon"))
        assert want.is_contiguous(memory_format=fmt)
        assert got.stride() == want.stride()
        assert_same(got, want.detach(), accum=True)


@pytest.mark.parametrize("mode", ["reflect", "replicate"])
@pytest.mark.parametrize("shape", [(2, 4, 6, 6), (4, 6, 6, 6), (2, 3, 4, 5, 5)])
def test_padding_keeps_channels_last_like_cpu(mode, shape):
    """reflect/replicate padding of channels_last input (2-D, 3-D batched and
    unbatched): result and input gradient in the CPU's layout, with its values
    (axon's took the Meta kernels' contiguous layout)."""
    fmt = torch.channels_last_3d if len(shape) == 5 else torch.channels_last
    pad = [1, 2] * (2 if len(shape) == 4 and shape[0] == 2 else 3)
    x = make(shape, torch.float32).contiguous(memory_format=fmt)
    xc, xa = x.clone().requires_grad_(), x.to("axon").requires_grad_()
    yc, ya = F.pad(xc, pad, mode=mode), F.pad(xa, pad, mode=mode)
    assert ya.stride() == yc.stride()
    g = make(tuple(yc.shape), torch.float32, seed=3).contiguous(memory_format=fmt)
    yc.backward(g)
    ya.backward(g.to("axon"))
    assert xa.grad.stride() == xc.grad.stride()
    assert_same(ya, yc.detach())
    assert_same(xa.grad, xc.grad)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("case", ["unbatched_channel_innermost", "unbatched", "batched_cl3d",
                                  "batched", "batch1_cl3d", "permuted", "expanded",
                                  "one_channel_cl3d", "unbatched_permuted"])
def test_max_pool3d_layout_matches_cpu(case, dtype):
    """max_pool3d with indices (and its backward) lays results out as the CPU
    does, in the input's dimension order: an unbatched [C, D, H, W] input with
    the channel innermost gave contiguous results on axon."""
    x = {"unbatched_channel_innermost": lambda: make((1, 6, 8, 8, 8), dtype).contiguous(
             memory_format=torch.channels_last_3d).squeeze(0),
         "unbatched": lambda: make((6, 8, 8, 8), dtype),
         "batched_cl3d": lambda: make((2, 6, 8, 8, 8), dtype).contiguous(
             memory_format=torch.channels_last_3d),
         "batched": lambda: make((2, 6, 8, 8, 8), dtype),
         "batch1_cl3d": lambda: make((1, 6, 8, 8, 8), dtype).contiguous(
             memory_format=torch.channels_last_3d),
         "permuted": lambda: make((2, 3, 8, 8, 8), dtype).transpose(2, 4),
         "expanded": lambda: make((1, 3, 8, 8, 8), dtype).expand(2, 3, 8, 8, 8),
         "one_channel_cl3d": lambda: make((2, 1, 8, 8, 8), dtype).contiguous(
             memory_format=torch.channels_last_3d),
         "unbatched_permuted": lambda: make((3, 8, 8, 8), dtype).transpose(1, 3)}[case]()
    xc, xa = x.clone().requires_grad_(), x.to("axon").requires_grad_()
    oc, ic = F.max_pool3d(xc, 2, return_indices=True)
    oa, ia = F.max_pool3d(xa, 2, return_indices=True)
    assert (oa.stride(), ia.stride()) == (oc.stride(), ic.stride())
    g = make(tuple(oc.shape), dtype, seed=4)
    oc.backward(g)
    oa.backward(g.to("axon"))
    assert xa.grad.stride() == xc.grad.stride()
    assert_same(oa, oc.detach())
    assert_same(ia, ic)
    assert_same(xa.grad, xc.grad)


@pytest.mark.parametrize("batch", [4, 0])
def test_conv1d_of_a_transposed_input_matches_cpu(batch):
    """conv1d of a [N, L, C] tensor transposed to [N, C, L] (audio and sequence
    models): the CPU's values and layout, forward and backward."""
    x = make((batch, 50, 16), torch.float32).transpose(1, 2)
    w = make((8, 16, 3), torch.float32, seed=2)
    xc, xa = x.detach().clone().requires_grad_(), x.detach().to("axon").requires_grad_()
    yc, ya = F.conv1d(xc, w), F.conv1d(xa, w.to("axon"))
    assert ya.stride() == yc.stride()
    assert_same(ya, yc.detach(), accum=True)
    if batch:
        g = make(tuple(yc.shape), torch.float32, seed=3)
        yc.backward(g)
        ya.backward(g.to("axon"))
        assert xa.grad.stride() == xc.grad.stride()
        assert_same(xa.grad, xc.grad, accum=True)
