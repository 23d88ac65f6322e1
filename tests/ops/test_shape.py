"""Shape ops and more on axon against the CPU, on every layout: cat/stack/
split/chunk, flip/roll/rot90/repeat, reshape/flatten, tril/triu/diag, unique,
clamp and addcdiv with tensor bounds, histc; float, integer and bool.
Sorting (sort, topk, searchsorted...): test_sorting.py.
"""

from __future__ import annotations

import torch

from op_util import shape_ops_int_bool_test, shape_ops_test


# name: function of one (4, 6) tensor in any layout
SHAPE = {
    "cat0": lambda x: torch.cat([x, x * 2], 0),
    "cat1": lambda x: torch.cat([x, x[:, :2]], 1),
    "cat_empty": lambda x: torch.cat([x, x[:0]], 0),
    "stack": lambda x: torch.stack([x, -x], 1),
    "hstack": lambda x: torch.hstack([x, x]),
    "vstack": lambda x: torch.vstack([x, x]),
    "split": lambda x: torch.split(x, 4, 1),
    "split_sizes": lambda x: x.split([1, 5], 1),
    "chunk": lambda x: x.chunk(3, 1),
    "unbind": lambda x: x.unbind(1),
    "tensor_split": lambda x: torch.tensor_split(x, [1, 4], 1),
    "flip": lambda x: x.flip(0, 1),
    "roll": lambda x: x.roll(2, 1),
    "rot90": lambda x: x.rot90(),
    "repeat": lambda x: x.repeat(2, 1, 3),
    "tile": lambda x: x.tile(2),
    "repeat_interleave": lambda x: x.repeat_interleave(2, 0),
    "contiguous": lambda x: x.contiguous(),
    "clone": lambda x: x.clone(),
    "reshape": lambda x: x.reshape(-1, 3),
    "flatten": lambda x: x.flatten(),
    "permute_contig": lambda x: x.unsqueeze(0).permute(2, 0, 1).contiguous(),
    "tril": lambda x: x.tril(),
    "tril_k": lambda x: torch.tril(x, -1),
    "triu": lambda x: x.triu(1),
    "triu_neg": lambda x: x.triu(-2),
    "diag": lambda x: torch.diag(x[:, 0]),
    "diag_embed": lambda x: torch.diag_embed(x[:2]),
    "trace": lambda x: x[:, :4].trace(),
    "unique": lambda x: torch.unique(x.round(), return_counts=True),
    "unique_inverse": lambda x: torch.unique(x.round(), sorted=True, return_inverse=True),
    "clamp_tensor": lambda x: x.clamp(x[:1], x[:1] + 1),
    "addcdiv": lambda x: torch.addcdiv(x, x, x.abs() + 1, value=0.5),
    "histc": lambda x: torch.histc(x.float(), bins=5, min=-3, max=3),
}


test_shape_ops = shape_ops_test(SHAPE)
test_shape_ops_int_bool = shape_ops_int_bool_test(
    SHAPE, ["cat0", "stack", "split", "flip", "tril", "triu", "unique", "repeat", "roll"])
