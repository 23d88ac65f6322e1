"""PyTorch's own distributed test harnesses (torch.testing._internal) on axon.

The tests below are written on the wheel's ``DTensorTestBase`` and ``FSDPTest``
(one spawned process per rank, per test, as in PyTorch's own suite) with
``torch_axon.testing`` imported first (see its docstring).  Every result is
compared with the same computation on the CPU in the rank process.  The
``torch.testing._internal`` package ships bases only (no test classes), so the
PyTorch-side code exercised is the harness itself, its helper models (``MLP``,
``NestedWrappedModule``) and checks (``check_sharded_parity``,
``FSDPTest._test_fsdp_parity``: FSDP against DDP).

Run time: about 50-70 s on 2 cores (3 spawned tests, one of them 4 ranks).
"""

import torch_axon.testing  # noqa: F401,I001  (first: patches the harness before it is imported)

import copy
import os
import sys
import textwrap

import pytest
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor
from torch.testing._internal import common_fsdp
from torch.testing._internal.common_distributed import skip_if_lt_x_gpu
from torch.testing._internal.common_fsdp import (MLP, DEVICEInitMode, FSDPInitMode, FSDPTest,
                                                 NestedWrappedModule, check_sharded_parity)
from torch.testing._internal.distributed._tensor.common_dtensor import (DTensorTestBase,
                                                                         with_comms)

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/
from conftest import run_python, tol  # noqa: E402


def _restore_environment() -> None:
    before = torch_axon.testing.ENV_BEFORE_IMPORT
    if before is None:
        os.environ.pop(torch_axon.testing.ENV_VAR, None)
    else:
        os.environ[torch_axon.testing.ENV_VAR] = before


# torch_axon.testing sets AXON_TEST_HARNESS=1 for the ranks it spawns.  Importing it
# happens when pytest collects this file, before any test of any file runs: the
# variable is put back at once and set only while this file's tests run, so other
# files' subprocesses do not inherit it.
_restore_environment()


@pytest.fixture(autouse=True, scope="module")
def _harness_environment():
    os.environ[torch_axon.testing.ENV_VAR] = "1"
    yield
    _restore_environment()


# ------------------------------------------------------------------ helpers (rank side)


def _full(shape, dtype, seed):
    """The same CPU tensor on every rank."""
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(shape, generator=g, dtype=torch.float64) * 6 - 3
    return x.to(dtype)


def _chunk(t, n, dim, i):
    """Shard i of t over n ranks as DTensor's Shard(dim) cuts it (torch.chunk,
    empty shards at the end)."""
    parts = t.chunk(n, dim)
    if i < len(parts):
        return parts[i]
    return t.narrow(dim, t.size(dim), 0)


def _check_redistributions(test, mesh, dtypes=(torch.float32, torch.bfloat16)):
    """Shard <-> Replicate <-> Partial on a 1-D mesh against the CPU tensor."""
    ws, r = mesh.size(), mesh.get_local_rank()
    for dtype in dtypes:
        full = _full((6, 10), dtype, seed=1)  # 6 rows: uneven over 4 ranks
        dt = distribute_tensor(full.to("axon"), mesh, [Shard(0)])
        test.assertEqual(dt.to_local().device.type, "axon")
        torch.testing.assert_close(dt.to_local().cpu(), _chunk(full, ws, 0, r), rtol=0, atol=0)
        rep = dt.redistribute(mesh, [Replicate()])
        torch.testing.assert_close(rep.to_local().cpu(), full, rtol=0, atol=0)
        s1 = rep.redistribute(mesh, [Shard(1)])
        torch.testing.assert_close(s1.to_local().cpu(), _chunk(full, ws, 1, r), rtol=0, atol=0)
        s0 = s1.redistribute(mesh, [Shard(0)])  # shard-to-shard (all_to_all)
        torch.testing.assert_close(s0.full_tensor().cpu(), full, rtol=0, atol=0)
        # Partial -> Replicate (all_reduce) and Partial -> Shard (reduce_scatter)
        part = DTensor.from_local((full * (r + 1)).to("axon"), mesh, [Partial()])
        expected = (full.double() * sum(range(1, ws + 1))).to(dtype)
        torch.testing.assert_close(part.redistribute(mesh, [Replicate()]).to_local().cpu(),
                                   expected, **tol(dtype, accum=True))
        torch.testing.assert_close(part.redistribute(mesh, [Shard(1)]).to_local().cpu(),
                                   _chunk(expected, ws, 1, r), **tol(dtype, accum=True))
        # a non-contiguous source tensor
        t = _full((10, 8), dtype, seed=2).t()
        dtt = distribute_tensor(t.to("axon"), mesh, [Shard(1)])
        torch.testing.assert_close(dtt.full_tensor().cpu(), t, rtol=0, atol=0)
        # an op on sharded inputs
        a, b = _full((8, 6), dtype, seed=3), _full((6, 4), dtype, seed=4)
        da = distribute_tensor(a.to("axon"), mesh, [Shard(0)])
        db = distribute_tensor(b.to("axon"), mesh, [Replicate()])
        torch.testing.assert_close((da @ db).full_tensor().cpu(), a @ b, **tol(dtype, accum=True))


# ------------------------------------------------------------------ DTensorTestBase


class DTensorAxonTest(DTensorTestBase):
    @property
    def world_size(self) -> int:
        return 2

    @with_comms
    def test_redistribute_mesh_1d_2_axon_and_gloo(self):
        # the harness chose axon, its backend, and one device per rank
        self.assertEqual(self.device_type, "axon")
        self.assertEqual(self.backend, "axon")
        self.assertEqual(dist.get_backend(), "axon")
        self.assertEqual(torch.axon.current_device(), self.rank)
        mesh = self.build_device_mesh()
        self.assertEqual(mesh.device_type, "axon")
        _check_redistributions(self, mesh)
        # an axon mesh over a gloo group: DTensor's collectives on axon
        # tensors run through gloo (torch_axon/distributed/gloo.py)
        gloo = dist.new_group(backend="gloo")
        mesh = DeviceMesh.from_group(gloo, "axon")
        self.assertEqual(dist.get_backend(mesh.get_group()), "gloo")
        _check_redistributions(self, mesh, dtypes=(torch.float32,))


class DTensorAxon4Test(DTensorTestBase):
    @property
    def world_size(self) -> int:
        return 4

    @with_comms(eager_init=True, backend="cpu:gloo,axon:axon")
    @skip_if_lt_x_gpu(4)
    def test_meshes_1d_4_and_2d_2x2(self):
        self.assertEqual(torch.axon.current_device(), self.rank)
        self.assertEqual(dist.group.WORLD.bound_device_id, torch.device("axon", self.rank))
        _check_redistributions(self, init_device_mesh("axon", (4,)), dtypes=(torch.float32,))
        mesh = init_device_mesh("axon", (2, 2), mesh_dim_names=("dp", "tp"))
        i, j = mesh.get_coordinate()
        full = _full((8, 12), torch.float32, seed=5)
        dt = distribute_tensor(full.to("axon"), mesh, [Shard(0), Shard(1)])
        torch.testing.assert_close(dt.to_local().cpu(), full.chunk(2, 0)[i].chunk(2, 1)[j],
                                   rtol=0, atol=0)
        rep = dt.redistribute(mesh, [Replicate(), Shard(1)])
        torch.testing.assert_close(rep.to_local().cpu(), full.chunk(2, 1)[j], rtol=0, atol=0)
        torch.testing.assert_close(dt.redistribute(mesh, [Replicate(), Replicate()])
                                   .to_local().cpu(), full, rtol=0, atol=0)
        back = rep.redistribute(mesh, [Shard(1), Shard(0)])
        torch.testing.assert_close(back.to_local().cpu(), full.chunk(2, 1)[i].chunk(2, 0)[j],
                                   rtol=0, atol=0)
        part = DTensor.from_local((full * (self.rank + 1)).to("axon"), mesh,
                                  [Partial(), Replicate()])
        # ranks of one dp group: (rank j) and (rank 2 + j), i.e. (1 + j) + (3 + j)
        expected = full * ((1 + j) + (3 + j))
        torch.testing.assert_close(part.redistribute(mesh, [Replicate(), Replicate()])
                                   .to_local().cpu(), expected, **tol(torch.float32, True))


# ------------------------------------------------------------------ FSDPTest


class FSDP2AxonTest(FSDPTest):
    @property
    def world_size(self) -> int:
        return 2

    @skip_if_lt_x_gpu(2)
    def test_fully_shard_training_parity_and_fsdp_parity_helper(self):
        from torch.distributed.fsdp import fully_shard

        self.assertEqual(common_fsdp.DEVICE_TYPE, "axon")
        self.assertEqual(dist.get_backend(), "axon")
        self.assertEqual(torch.axon.current_device(), self.rank)
        ws, dim, steps = self.world_size, 16, 4
        torch.manual_seed(0)
        cpu_model = MLP(dim)
        ref = copy.deepcopy(cpu_model).to("axon")  # replicated, grads all-reduced
        model = copy.deepcopy(cpu_model).to("axon")
        fully_shard(model.in_proj)
        fully_shard(model.out_proj)
        fully_shard(model)
        opts = [torch.optim.Adam(m.parameters(), lr=1e-2) for m in (cpu_model, ref, model)]

        def batch(step, rank):
            return _full((4, dim), torch.float32, seed=100 * step + rank)

        for step in range(steps):
            for o in opts:
                o.zero_grad()
            # the single-device CPU reference sees every rank's batch
            cpu_loss = sum(cpu_model(batch(step, r)).sum() for r in range(ws)) / ws
            cpu_loss.backward()
            x = batch(step, self.rank).to("axon")
            ref_loss = ref(x).sum()
            ref_loss.backward()
            for p in ref.parameters():
                dist.all_reduce(p.grad, op=dist.ReduceOp.AVG)
            loss = model(x).sum()
            loss.backward()
            check_sharded_parity(self, ref, model)  # PyTorch's FSDP check (axon vs axon)
            for o in opts:
                o.step()
            total = loss.detach().clone()
            dist.all_reduce(total, op=dist.ReduceOp.AVG)
            torch.testing.assert_close(total.cpu(), cpu_loss.detach(), rtol=1e-5, atol=1e-5)
        for (name, p), (_, q) in zip(cpu_model.named_parameters(), model.named_parameters()):
            torch.testing.assert_close(q.full_tensor().cpu(), p.detach(), rtol=1e-4, atol=1e-5,
                                       msg=name)

        # PyTorch's own parity check of its FSDP tests: FSDP (1) against DDP,
        # both on axon, on its NestedWrappedModule
        self._test_fsdp_parity(NestedWrappedModule, FSDPInitMode.RECURSIVE,
                               DEVICEInitMode.DEVICE_BEFORE)


# ------------------------------------------------------------------ opt-in and patches


def test_harness_patches_are_opt_in_and_apply_after_import():
    """Without opting in, the wheel's harness rejects axon (what the patches
    fix); importing torch_axon.testing after the harness modules patches them
    in place; AXON_TEST_HARNESS=1 patches them at import."""
    code = textwrap.dedent("""
        import os, sys
        os.environ.pop("AXON_TEST_HARNESS", None)
        from torch.testing._internal import common_distributed as cd, common_fsdp as cf
        from torch.testing._internal.distributed._tensor import common_dtensor as ct

        # upstream: FSDP on the CPU/gloo with one rank; skip decorators skip
        assert (cf.DEVICE_TYPE, cf.DISTRIBUTED_BACKEND, cf.DEVICE_COUNT) == ("cpu", "gloo", 1)
        assert not cd.at_least_x_gpu(2)
        try:
            cd.skip_if_lt_x_gpu(2)(lambda self: None)(object())
            raise AssertionError("upstream skip_if_lt_x_gpu ran")
        except SystemExit as e:
            assert e.code == cd.TEST_SKIPS["multi-gpu-2"].exit_code
        class T(ct.DTensorTestBase):
            def runTest(self): pass
        t = T()
        t.rank, t.file_name = 0, "/nonexistent"
        try:
            t.init_pg(False)
            raise AssertionError("upstream init_pg accepted axon")
        except RuntimeError as e:
            assert str(e) == "Backend axon not supported!", e

        import torch_axon.testing  # after the harness: patched in place
        assert os.environ["AXON_TEST_HARNESS"] == "1"
        assert (cf.DEVICE_TYPE, cf.DISTRIBUTED_BACKEND, cf.DEVICE_COUNT) == ("axon", "axon", 3)
        assert cf.FSDPTest._run.__func__.__wrapped__ is not None
        assert cd.at_least_x_gpu(3) and not cd.at_least_x_gpu(4)
        ran = []
        cd.skip_if_lt_x_gpu(3)(lambda self: ran.append(1))(object())
        assert ran == [1]
        try:
            cd.skip_if_lt_x_gpu(4)(lambda self: None)(object())
            raise AssertionError("ran with too few devices")
        except SystemExit as e:
            assert e.code == cd.TEST_SKIPS["multi-gpu-4"].exit_code
        os.environ["WORLD_SIZE"] = "3"
        assert cd.skip_if_no_gpu(lambda: 7)() == 7
        try:
            t.init_pg(False, backend="nonsense")
            raise AssertionError("accepted a bad backend")
        except RuntimeError as e:
            assert str(e) == "Backend nonsense not supported!", e
        torch_axon.testing.install()  # idempotent
        assert cd.skip_if_lt_x_gpu.__wrapped__.__module__ == cd.__name__
        print("ok")
    """)
    r = run_python(code, env={"AXON_NUM_DEVICES": "3"})
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().endswith("ok")

    code = textwrap.dedent("""
        from torch.testing._internal import common_distributed as cd, common_fsdp as cf
        from torch.testing._internal.distributed._tensor import common_dtensor as ct
        assert (cf.DEVICE_TYPE, cf.DISTRIBUTED_BACKEND, cf.DEVICE_COUNT) == ("axon", "axon", 8)
        assert ct.skip_if_lt_x_gpu is cd.skip_if_lt_x_gpu and cd._axon_patch
        assert ct.DTensorTestBase.init_pg._axon_patch
        print("ok")
    """)
    r = run_python(code, env={"AXON_TEST_HARNESS": "1", "AXON_NUM_DEVICES": "8"})
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().endswith("ok")


def test_patch_docstrings_name_their_upstream_sites():
    """As for torch_axon/integrations: each patch's docstring starts with
    Patch ``upstream.name``, which resolves to the replaced object (marked
    ``_axon_patch``) in the module the patch is registered for, and names the
    hard-coded device list."""
    import importlib
    import re

    from torch_axon.integrations import _hooks

    patches = (torch_axon.testing.patch_common_distributed,
               torch_axon.testing.patch_common_dtensor, torch_axon.testing.patch_common_fsdp)
    for patch in patches:
        doc = patch.__doc__ or ""
        match = re.match(r"Patch ``((?:\w+\.)+\w+)``", doc)
        assert match, patch.__name__
        parts = match.group(1).split(".")
        for i in range(len(parts) - 1, 0, -1):
            try:
                obj = importlib.import_module(".".join(parts[:i]))
            except ImportError:
                continue
            module_name = obj.__name__
            for name in parts[i:]:
                obj = obj.__dict__[name]
            break
        assert patch in _hooks._patches[module_name], patch.__name__
        assert obj._axon_patch, match.group(1)
        assert re.search(r"\bcuda\b.*\bxpu\b", doc, re.S), patch.__name__
