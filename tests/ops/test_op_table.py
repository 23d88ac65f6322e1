"""The op table (torch_axon.ops, docs/OPS.md): every axon registration, one path each.

Source: csrc/aten/Registry.h (the registrar every family file under csrc/aten/ops/
registers through) and torch_axon/ops.py (the table and its command line).
"""

from __future__ import annotations

import collections
import os
import subprocess
import sys

import pytest
import torch

from conftest import REPO_ROOT
from torch_axon import _C, ops

PATHS = {"structural", "native stream kernel", "synchronous kernel", "generic stream kernel",
         "fused kernel", "collective", "torch kernel", "fallback"}


@pytest.fixture(scope="module")
def table():
    return ops.op_table()


def test_every_privateuse1_registration_has_one_path(table):
    registered = set(torch._C._dispatch_get_registrations_for_dispatch_key("PrivateUse1"))
    rows = collections.defaultdict(list)
    for r in table:
        rows[r.op].append(r)
    for op in sorted(registered):
        assert len(rows[op]) == 1, f"{op}: {rows[op]}"
        assert rows[op][0].path in PATHS - {"fallback"}, rows[op]
    # Every registration of ours is recorded (none left to "unrecorded"), with a
    # family and a source file that exists.
    assert not [r for r in table if r.path not in PATHS]
    for r in table:
        if r.path in ("fallback", "collective", "torch kernel"):
            continue
        assert r.family and r.family != "-", r
        assert os.path.isfile(os.path.join(REPO_ROOT, r.file)), r


def test_table_names_only_registered_ops(table):
    registered = {
        key: set(torch._C._dispatch_get_registrations_for_dispatch_key(key))
        for key in ("PrivateUse1", "AutogradPrivateUse1")
    }
    for r in table:
        if r.path == "fallback":
            assert r.op not in registered["PrivateUse1"], r
            assert torch._C._dispatch_has_kernel_for_dispatch_key(r.op, "CPU"), r
            continue
        if r.op.endswith("]"):
            name, key = r.op[:-1].split("[")
            assert name in registered[key], r
        else:
            assert r.op in registered["PrivateUse1"], r


def test_registry_records_each_op_once():
    # The registrar aborts the import on a second registration of (op, key);
    # this checks its records, which the table is made of.
    records = [(op, key) for op, key, *_ in _C._op_table()]
    duplicates = [k for k, n in collections.Counter(records).items() if n > 1]
    assert not duplicates
    assert len(records) > 400


def test_paths_and_families_of_known_ops(table):
    by_op = {r.op: r for r in table}
    assert by_op["aten::empty.memory_format"][1:3] == ("structural", "copy_view_factory")
    assert by_op["aten::add.Tensor"][1:3] == ("native stream kernel", "elementwise")
    assert by_op["aten::convolution"][1:3] == ("generic stream kernel", "convolution")
    assert by_op["aten::native_layer_norm"][1:3] == ("fused kernel", "normalization")
    assert by_op["aten::rms_norm[AutogradPrivateUse1]"][1:3] == ("fused kernel", "normalization")
    assert by_op["aten::_fused_adam_"].file == "csrc/aten/ops/optimizer.cpp"
    assert by_op["aten::take"][1:] == ("fallback", "-", "csrc/aten/Fallback.cpp")


def test_docs_ops_md_is_current():
    # Generated in a fresh interpreter: the table depends on what is imported
    # (FSDP registers kernels, other libraries add CPU kernels to the fallback),
    # and docs/OPS.md describes a plain `import torch`.
    path = os.path.join(REPO_ROOT, "docs", "OPS.md")
    with open(path, encoding="utf-8") as f:
        doc = f.read()
    fresh = subprocess.run([sys.executable, "-m", "torch_axon.ops", "--markdown", "-"],
                           capture_output=True, text=True, check=True, cwd=REPO_ROOT).stdout
    assert doc == fresh, (
        "docs/OPS.md is out of date: python -m torch_axon.ops --markdown docs/OPS.md")


def test_cli_filters_by_path_and_family():
    out = subprocess.run([sys.executable, "-m", "torch_axon.ops", "--path", "fallback"],
                         capture_output=True, text=True, check=True, cwd=REPO_ROOT).stdout
    lines = out.splitlines()
    assert lines and all(line.split()[1] == "fallback" for line in lines)
    assert any(line.split()[0] == "aten::take" for line in lines)
    out = subprocess.run(
        [sys.executable, "-m", "torch_axon.ops", "--path", "generic", "--family", "loss"],
        capture_output=True, text=True, check=True, cwd=REPO_ROOT).stdout
    assert "aten::mse_loss " in out
    assert all("generic stream kernel" in line and " loss " in line for line in out.splitlines())


def test_cli_rejects_an_unknown_path():
    proc = subprocess.run([sys.executable, "-m", "torch_axon.ops", "--path", "nowhere"],
                          capture_output=True, text=True, cwd=REPO_ROOT)
    assert proc.returncode != 0
    assert "unknown path 'nowhere'" in proc.stderr


# Ops ATen registers only for other backends (no CPU kernel for the fallback, no
# composite): the ones axon leaves out, by what ties them to that backend.  A new op
# of this kind (a torch upgrade) fails the test below until it has an axon kernel or
# a reason here; nn.SyncBatchNorm's ops and the out_dtype matmuls were such ops.
_BACKEND_TIED = ("cudnn", "miopen", "mps", "mkldnn", "sparse", "_nested", "quantized", "q_",
                 "_flash_attention", "_efficient_attention", "_cslt", "_triton",
                 "_fill_mem_eff_dropout_mask_", "_scaled_grouped_mm", "_weight_int4pack_mm",
                 "_convert_weight_to_int4pack", "_mixed_dtypes_linear")
_LEFT_OUT = {
    # sparse COO/CSR internals (sparse layouts are refused on axon)
    "_coalesce", "_coalesced_", "_dimI", "_dimV", "_indices", "_values", "_nnz", "_to_dense",
    "_spsolve", "hspmm", "hspmm.out", "copy_sparse_to_sparse_", "resize_as_sparse_",
    # quantized tensors (refused on axon)
    "int_repr", "dequantize.tensors", "empty_quantized", "qscheme",
    # nested strided tensors (refused on axon)
    "to_padded_tensor",
    # CUDA's convolution/pooling algorithms, reached only through CUDA's dispatch
    "_conv_depthwise2d", "_conv_depthwise2d.out", "conv_depthwise3d", "max_pool2d_backward",
    # legacy CUDA dropout (F.dropout calls native_dropout), norms no Python API calls
    "_fused_dropout", "_masked_scale", "native_norm", "native_norm.ScalarOpt_dim_dtype",
    # backward helpers with no kernel on any backend here
    "linear_backward", "matmul_backward", "_resize_output_",
    # torch.func._random's experimental stateless Philox keys (CUDA only upstream)
    "_philox_key_split", "_philox_key_fold_in", "_philox_uniform_", "_philox_normal_",
}


def test_ops_only_other_backends_have_are_on_axon_or_tied_to_them():
    keys = ("CPU", "CompositeImplicitAutograd", "CompositeExplicitAutograd",
            "CompositeExplicitAutogradNonFunctional", "PrivateUse1")
    missing = []
    for name in torch._C._dispatch_get_all_op_names():
        if not name.startswith("aten::"):
            continue
        if any(torch._C._dispatch_has_kernel_for_dispatch_key(name, k) for k in keys):
            continue
        op = name[len("aten::"):]
        if op in _LEFT_OUT or any(tag in op for tag in _BACKEND_TIED):
            continue
        missing.append(op)
    assert not missing, f"ops with a kernel for another backend only, none on axon: {missing}"
    # the list is not stale: its ops still exist
    all_ops = {n[len("aten::"):] for n in torch._C._dispatch_get_all_op_names()}
    assert not _LEFT_OUT - all_ops, _LEFT_OUT - all_ops
