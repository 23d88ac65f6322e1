"""Every op of PyTorch's own op database (``op_db``, the OpInfo entries PyTorch
tests its devices with) on axon against the CPU: the first sample inputs of
each op, forward in float32, bfloat16, float16, int64 and complex64, backward in
float32, and the out= and in-place variants in float32 and bfloat16. Inputs are moved to axon with their layout (a view of a base tensor
stays such a view), so non-contiguous, expanded and zero-size samples are
covered as op_db makes them.

Found on 2026-11-30 when it was written: ``_batch_norm_no_update`` raising on
axon, complex ``linalg.lu_solve(left=False)`` returning the conjugate of the
answer, and ~120 ops going through the synchronous CPU fallback.

bfloat16 and float16 results may differ from the CPU's by more than their tolerance
where both round differently (log_softmax of large values, losses summed in
another order): such a result passes if it is at most twice as far from a
float64 computation as the CPU's.
"""

import pytest
import torch
from torch.utils._pytree import tree_leaves, tree_map

from op_util import SKIP_PREFIX, on_device, tensors, to_device

pytestmark = pytest.mark.usefixtures("quick_op_samples")  # conftest: the samples, faster

pytest.importorskip("expecttest", reason="op_db needs expecttest (requirements.txt pins it)")

# Ops whose results are random (axon has its own generator, as CUDA does) or
# uninitialised, and so cannot equal the CPU's.
RANDOM = ("rand", "normal", "bernoulli", "dropout", "multinomial", "cauchy", "exponential",
          "geometric", "uniform", "rrelu", "fractional_max_pool", "svd_lowrank", "pca_lowrank",
          "empty", "multi_head_attention_forward")
# Statistics in float32 for 16-bit inputs, as CUDA and the Meta kernel give them
# (the CPU gives the input's dtype).
STATS_DTYPE_AS_CUDA = {"native_layer_norm"}
SAMPLES = 6


@pytest.fixture(scope="module")
def op_db():
    from torch.testing._internal.common_methods_invocations import op_db as db
    return [op for op in db if not op.name.startswith(SKIP_PREFIX)
            and not any(r in op.name for r in RANDOM)]


def sample_args(op, sample, device):
    args = on_device(to_device(sample.args, device), device)
    if op.name == "tensor_split":  # its index tensor must be on the CPU, on CUDA too
        args = sample.args
    return (to_device(sample.input, device), args,
            on_device(to_device(sample.kwargs, device), device))


def far_from_float64(op, sample, got, want):
    """For low-precision results that differ from the CPU's: is axon's farther
    than twice the CPU's distance from the float64 result?"""
    def up(t):
        return t.double() if isinstance(t, torch.Tensor) and t.is_floating_point() else t
    try:
        ref = op(tree_map(up, sample.input), *tree_map(up, sample.args),
                 **tree_map(up, sample.kwargs))
    except Exception:  # no float64 form of this call: the CPU comparison stands
        return True
    for g, w, r in zip(tensors(got), tensors(want), tensors(ref)):
        if not w.is_floating_point():
            continue
        ea = (g.cpu().double() - r).abs().nan_to_num(0).max().item() if r.numel() else 0.0
        ec = (w.double() - r).abs().nan_to_num(0).max().item() if r.numel() else 0.0
        if ea > 2 * ec + 1e-3:
            return True
    return False


def names_a_device(sample):
    """Whether the call has a tensor or a device argument (a factory function
    called without one, ``arange(2)``, makes a CPU tensor on both runs)."""
    leaves = tree_leaves((sample.input, sample.args, sample.kwargs))
    return any(isinstance(v, (torch.Tensor, torch.device)) or v == "cpu" for v in leaves)


def compare(op, sample, got, want, dtype):
    tol = {torch.float32: 1e-4, torch.complex64: 1e-4}.get(dtype, 2e-2)
    wl, gl = tree_leaves(want), tree_leaves(got)
    assert len(wl) == len(gl)
    for w, g in zip(wl, gl):
        if not isinstance(w, torch.Tensor):
            assert w == g or (w != w and g != g), (w, g)
            continue
        assert isinstance(g, torch.Tensor)
        assert g.device.type == ("axon" if names_a_device(sample) else "cpu"), g.device
        if op.name in STATS_DTYPE_AS_CUDA:
            g = g.to(w.dtype)
        assert (g.shape, g.dtype) == (w.shape, w.dtype), ((g.shape, g.dtype), (w.shape, w.dtype))
        try:
            torch.testing.assert_close(g.cpu(), w, rtol=tol, atol=tol, equal_nan=True)
        except AssertionError:
            if dtype in (torch.float32, torch.complex64, torch.int64) or \
                    far_from_float64(op, sample, got, want):
                raise


def check_forward(op, dtype):
    try:
        samples = list(op.sample_inputs("cpu", dtype))[:SAMPLES]
    except Exception:  # no samples for this dtype on this build
        return
    for sample in samples:
        if sample.kwargs.get("dropout_p", 0) > 0:  # random
            continue
        try:
            want = op(sample.input, *sample.args, **sample.kwargs)
        except Exception as e:  # the CPU refuses the call: axon must too
            inp, args, kw = sample_args(op, sample, "axon")
            with pytest.raises(type(e)):
                op(inp, *args, **kw)
                torch.axon.synchronize()
            continue
        inp, args, kw = sample_args(op, sample, "axon")
        compare(op, sample, op(inp, *args, **kw), want, dtype)


def check_backward(op):
    if not op.supports_autograd or torch.float32 not in op.supported_backward_dtypes("cpu"):
        return
    for sample in list(op.sample_inputs("cpu", torch.float32, requires_grad=True))[:3]:
        if sample.kwargs.get("dropout_p", 0) > 0:
            continue
        try:
            out_c = op(sample.input, *sample.args, **sample.kwargs)
            leaves_c = [t for t in tensors((sample.input, sample.args, sample.kwargs))
                        if t.requires_grad]
            outs = [t for t in tensors(out_c) if t.requires_grad]
            if not outs or not leaves_c:
                continue
            want = torch.autograd.grad(sum((o.abs() ** 2).sum() for o in outs), leaves_c,
                                       allow_unused=True)
        except Exception:  # not differentiable for this sample on the CPU either
            continue
        inp, args, kw = sample_args(op, sample, "axon")
        out_a = op(inp, *args, **kw)
        leaves_a = [t for t in tensors((inp, args, kw)) if t.requires_grad]
        got = torch.autograd.grad(sum((o.abs() ** 2).sum() for o in tensors(out_a)
                                      if o.requires_grad), leaves_a, allow_unused=True)
        for g, w in zip(got, want):
            assert (g is None) == (w is None)
            if w is not None:
                torch.testing.assert_close(g.cpu(), w, rtol=1e-3, atol=1e-3, equal_nan=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.int64,
                                   torch.complex64],
                         ids=str)
def test_op_db_forward_matches_cpu(op_db, dtype):
    failures = []
    ran = 0
    for op in op_db:
        if dtype not in op.supported_dtypes("cpu"):
            continue
        ran += 1
        try:
            check_forward(op, dtype)
        except Exception as e:  # collect every op's failure, then report them all
            failures.append(f"{op.name}.{op.variant_test_name}: {type(e).__name__}: "
                            f"{str(e).splitlines()[0][:200] if str(e) else ''}")
    assert ran > 200
    assert not failures, f"{len(failures)} ops differ from the CPU:\n" + "\n".join(failures)


def test_op_db_backward_matches_cpu(op_db):
    failures = []
    for op in op_db:
        try:
            check_backward(op)
        except Exception as e:
            failures.append(f"{op.name}.{op.variant_test_name}: {type(e).__name__}: "
                            f"{str(e).splitlines()[0][:200] if str(e) else ''}")
    assert not failures, f"{len(failures)} ops' gradients differ:\n" + "\n".join(failures)


def check_out_and_inplace(op, dtype):
    """op(..., out=) into a zero-filled tensor of the result's layout, and the
    in-place variant on a copy of the input, equal to the same on the CPU.
    (Zero-filled: torch.fft.ihfftn with one dim leaves out= unwritten, on the
    CPU too.)"""
    tol = 1e-4 if dtype == torch.float32 else 2e-2
    for sample in list(op.sample_inputs("cpu", dtype))[:SAMPLES]:
        if sample.kwargs.get("dropout_p", 0) > 0:
            continue
        inp, args, kw = sample_args(op, sample, "axon")
        if op.supports_out:
            try:
                want = op(sample.input, *sample.args, **sample.kwargs)
                assert isinstance(want, torch.Tensor)
                out_c = torch.zeros_like(want)
                op(sample.input, *sample.args, **sample.kwargs, out=out_c)
            except Exception:  # no out= form for this call
                pass
            else:
                out_a = torch.zeros_like(want).to("axon")
                op(inp, *args, **kw, out=out_a)
                assert out_a.stride() == out_c.stride()
                close_or_as_accurate(op, sample, out_a, out_c, dtype, tol)
        if op.inplace_variant is not None and isinstance(sample.input, torch.Tensor):
            try:
                self_c = sample.input.clone()
                op.inplace_variant(self_c, *sample.args, **sample.kwargs)
            except Exception:  # not in place for this dtype or shape
                continue
            self_a = inp.clone()
            op.inplace_variant(self_a, *args, **kw)
            close_or_as_accurate(op, sample, self_a, self_c, dtype, tol)


def close_or_as_accurate(op, sample, got, want, dtype, tol):
    try:
        torch.testing.assert_close(got.cpu(), want, rtol=tol, atol=tol, equal_nan=True)
    except AssertionError:
        if dtype == torch.float32 or far_from_float64(op, sample, got, want):
            raise


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_op_db_out_and_inplace_variants_match_cpu(op_db, dtype):
    failures = []
    for op in op_db:
        if dtype not in op.supported_dtypes("cpu"):
            continue
        try:
            check_out_and_inplace(op, dtype)
        except Exception as e:
            failures.append(f"{op.name}.{op.variant_test_name}: {type(e).__name__}: "
                            f"{str(e).splitlines()[0][:200] if str(e) else ''}")
    assert not failures, f"{len(failures)} ops differ from the CPU:\n" + "\n".join(failures)


def test_module_db_forward_backward_match_cpu():
    """PyTorch's module database (``module_db``: every nn module with sample
    constructor and forward inputs): the module copied to axon gives the CPU's
    outputs and parameter gradients, float32, training mode. (It found nn.LSTM
    and nn.GRU raising on axon.)"""
    import copy

    from torch.testing._internal.common_modules import module_db

    failures, ran = [], 0
    for info in module_db:
        try:
            samples = info.module_inputs_func(info, device="cpu", dtype=torch.float32,
                                              requires_grad=True, training=True)[:3]
        except Exception:  # no float32 samples for this module
            continue
        for sample in samples:
            ctor, fwd = sample.constructor_input, sample.forward_input
            try:
                torch.manual_seed(0)
                cpu = info.module_cls(*ctor.args, **ctor.kwargs)
                out_c = cpu(*fwd.args, **fwd.kwargs)
                loss_c = [t for t in tree_leaves(out_c)
                          if isinstance(t, torch.Tensor) and t.requires_grad]
                if loss_c:
                    sum((t.float() ** 2).sum() for t in loss_c).backward()
            except Exception:  # the CPU refuses this sample (or it is random)
                continue
            if any(isinstance(m, torch.nn.modules.dropout._DropoutNd) or "RReLU" in type(m).__name__
                   for m in cpu.modules()):
                continue  # random in training mode
            ran += 1
            try:
                ax = copy.deepcopy(cpu).to("axon")
                for p in ax.parameters():
                    p.grad = None
                out_a = ax(*to_device(fwd.args, "axon"), **to_device(fwd.kwargs, "axon"))
                for w, g in zip(tree_leaves(out_c), tree_leaves(out_a)):
                    if isinstance(w, torch.Tensor):
                        assert g.device.type == "axon"
                        torch.testing.assert_close(g.cpu(), w.detach(), rtol=1e-4, atol=1e-4,
                                                   equal_nan=True)
                loss_a = [t for t in tree_leaves(out_a)
                          if isinstance(t, torch.Tensor) and t.requires_grad]
                if loss_a:
                    sum((t.float() ** 2).sum() for t in loss_a).backward()
                for (name, pc), pa in zip(cpu.named_parameters(), ax.parameters()):
                    if pc.grad is not None:
                        torch.testing.assert_close(pa.grad.cpu(), pc.grad, rtol=1e-3, atol=1e-3,
                                                   equal_nan=True, msg=name)
            except Exception as e:
                failures.append(f"{info.module_cls.__name__}: {type(e).__name__}: "
                                f"{str(e).splitlines()[0][:200] if str(e) else ''}")
                break
    assert ran > 100
    assert not failures, f"{len(failures)} modules differ:\n" + "\n".join(failures)
