"""Convolution and the image ops around it on axon against the CPU:
conv1d/conv2d, max/avg/adaptive/fractional pooling in 1-3 dimensions,
interpolate (nearest, linear, bilinear with antialias, trilinear), reflect
and replicate padding, grid_sample, channel_shuffle.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

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
