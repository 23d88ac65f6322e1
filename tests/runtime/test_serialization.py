"""torch.save / torch.load of axon tensors and modules."""

import copy
import io

import pytest
import torch

from conftest import FLOAT_DTYPES, assert_same, make


def save_load(obj, **load_kw):
    buf = io.BytesIO()
    torch.save(obj, buf)
    buf.seek(0)
    return torch.load(buf, **load_kw)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES + (torch.int64, torch.bool))
def test_tensor_round_trip_stays_on_axon(dtype):
    x = make((3, 5), dtype, seed=1)
    loaded = save_load(x.axon())
    assert loaded.device == torch.device("axon:0") and loaded.dtype == dtype
    assert_same(loaded, x)


def test_device_index_is_kept_and_remappable(tmp_path):
    x = make((4,), torch.float32)
    path = tmp_path / "t.pt"
    torch.save({"a": x.to("axon:2"), "b": x.to("axon:0")}, path)
    d = torch.load(path)
    assert d["a"].device == torch.device("axon:2") and d["b"].device == torch.device("axon:0")
    d = torch.load(path, map_location={"axon:2": "axon:1"})
    assert d["a"].device == torch.device("axon:1") and d["b"].device == torch.device("axon:0")
    d = torch.load(path, map_location=torch.device("axon:3"))
    assert d["a"].device == torch.device("axon:3") == d["b"].device
    assert_same(d["a"], x)


def test_map_location_cpu():
    x = make((3, 3), torch.bfloat16)
    loaded = save_load({"t": x.axon(), "n": 5}, map_location="cpu")
    assert loaded["t"].device.type == "cpu" and loaded["n"] == 5
    torch.testing.assert_close(loaded["t"], x, rtol=0, atol=0)
    loaded = save_load(x.axon(), map_location=lambda storage, loc: storage)
    assert loaded.device.type == "cpu"


def test_cpu_checkpoint_onto_axon():
    x = make((2, 6), torch.float16)
    for loc in ("axon", "axon:1", torch.device("axon", 1)):
        loaded = save_load(x, map_location=loc)
        assert loaded.device.type == "axon"
        assert_same(loaded, x)


def test_views_keep_sharing_storage():
    base = make((4, 6), torch.float32).axon()
    obj = {"base": base, "view": base.t()[1:3], "row": base[2]}
    loaded = save_load(obj)
    assert loaded["view"].untyped_storage().data_ptr() == loaded["base"].untyped_storage().data_ptr()
    assert loaded["view"].stride() == obj["view"].stride()
    loaded["base"].fill_(0.5)
    assert_same(loaded["view"], torch.full((2, 4), 0.5))
    assert_same(loaded["row"], torch.full((6,), 0.5))


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.ReLU(),
                               torch.nn.Linear(8, 2))


def test_module_state_dict_round_trip(tmp_path):
    model = _model().axon()
    model(torch.randn(5, 4, device="axon"))  # updates BatchNorm buffers
    path = tmp_path / "model.pt"
    torch.save(model.state_dict(), path)
    sd = torch.load(path)
    assert all(v.device.type == "axon" for v in sd.values())
    for k, v in model.state_dict().items():
        assert_same(sd[k], v.cpu())
    # into a fresh model on axon and on the CPU: same outputs
    x = make((3, 4), torch.float32, seed=2)
    fresh = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.ReLU(),
                                torch.nn.Linear(8, 2)).axon().eval()
    fresh.load_state_dict(sd)
    cpu_model = copy.deepcopy(fresh).cpu()
    cpu_model.load_state_dict(torch.load(path, map_location="cpu"))
    assert_same(fresh(x.axon()), cpu_model(x), accum=True)
    model.eval()
    assert_same(model(x.axon()), cpu_model(x), accum=True)


def test_cpu_state_dict_loads_into_axon_model():
    cpu_model = _model().eval()
    sd = save_load(cpu_model.state_dict(), map_location="axon")
    assert all(v.device.type == "axon" for v in sd.values())
    model = _model().axon().eval()
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
    model.load_state_dict(sd)
    x = make((3, 4), torch.float32, seed=3)
    assert_same(model(x.axon()), cpu_model(x), accum=True)
    # and a plain CPU state dict (load_state_dict copies across devices)
    model2 = _model().axon().eval()
    model2.load_state_dict(cpu_model.state_dict())
    assert next(model2.parameters()).device.type == "axon"
    assert_same(model2(x.axon()), cpu_model(x), accum=True)


def test_whole_module_and_optimizer_state():
    model = _model().axon()
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    model(torch.randn(4, 4, device="axon")).sum().backward()
    opt.step()
    ckpt = save_load({"model": model, "opt": opt.state_dict()}, weights_only=False)
    m2 = ckpt["model"]
    assert next(m2.parameters()).device.type == "axon"
    for p, q in zip(model.parameters(), m2.parameters()):
        assert_same(q, p.detach().cpu())
    exp_avg = ckpt["opt"]["state"][0]["exp_avg"]
    assert exp_avg.device.type == "axon"
    assert_same(exp_avg, opt.state_dict()["state"][0]["exp_avg"].cpu())


def test_parameter_with_grad_flag():
    p = torch.nn.Parameter(make((3,), torch.float32).axon())
    q = save_load(p)
    assert isinstance(q, torch.nn.Parameter) and q.requires_grad and q.device.type == "axon"
    assert_same(q.detach(), p.detach().cpu())


def test_deepcopy_keeps_device_and_sharing():
    base = make((3, 4), torch.float16).axon()
    d = copy.deepcopy({"base": base, "view": base.t()})
    assert d["base"].device == torch.device("axon:0")
    assert d["base"].untyped_storage().data_ptr() != base.untyped_storage().data_ptr()
    assert d["view"].untyped_storage().data_ptr() == d["base"].untyped_storage().data_ptr()
    assert_same(d["view"], base.t().cpu())
