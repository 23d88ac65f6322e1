"""safetensors with a renamed PrivateUse1 device: ``load_file``/``safe_open``
with ``device="axon"``/``"axon:1"`` (``integrations/safetensors_device.py``)
for every dtype, other devices unchanged, and what Transformers
(``from_pretrained(device_map=...)``) and Accelerate pass to it.
"""

from __future__ import annotations

import pytest
import torch

from conftest import bits, make, run_python


SAFETENSORS_DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.int8,
                      torch.int16, torch.int32, torch.int64, torch.uint8, torch.uint16,
                      torch.uint32, torch.uint64, torch.bool, torch.complex64,
                      torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e8m0fnu,
                      torch.float8_e4m3fnuz, torch.float8_e5m2fnuz, torch.float4_e2m1fn_x2)


def _state() -> dict[str, torch.Tensor]:
    state = {}
    for dtype in SAFETENSORS_DTYPES:
        name = str(dtype).removeprefix("torch.")
        base = make((3, 5), torch.float32, seed=len(state))
        if dtype.is_complex:
            t = torch.complex(base, base.flip(0))
        elif dtype in (torch.uint16, torch.uint32, torch.uint64):
            t = (base.abs() * 10).to(torch.int64).to(dtype)
        elif dtype == torch.float4_e2m1fn_x2:  # packed pairs: raw bytes
            t = make((3, 5), torch.uint8, low=0, high=255, seed=len(state)).view(dtype)
        elif dtype == torch.bool or not dtype.is_floating_point:
            t = make((3, 5), dtype, seed=len(state))
        else:
            t = base.to(dtype)
        state[name] = t
    state["zero_size"] = torch.empty(0, 4)
    state["scalar"] = torch.tensor(2.5)
    return state


@pytest.fixture(scope="module")
def st_file(tmp_path_factory):
    from safetensors.torch import save_file

    state = _state()
    path = tmp_path_factory.mktemp("st") / "w.safetensors"
    save_file(state, str(path), metadata={"format": "pt"})
    return str(path), state


def _check_loaded(loaded, state, index):
    assert set(loaded) == set(state)
    for k, want in state.items():
        got = loaded[k]
        assert got.device == torch.device("axon", index), (k, got.device)
        assert got.dtype == want.dtype and got.shape == want.shape, k
        assert torch.equal(bits(got), bits(want)), k


@pytest.mark.parametrize("device,index", [("axon", 0), ("axon:0", 0), ("axon:1", 1),
                                          (torch.device("axon", 1), 1),
                                          (torch.device("axon"), 0)],
                         ids=["axon", "axon:0", "axon:1", "device(axon,1)", "device(axon)"])
def test_safetensors_load_file_on_axon_every_dtype(st_file, device, index):
    from safetensors.torch import load_file

    path, state = st_file
    _check_loaded(load_file(path, device=device), state, index)


def test_safetensors_axon_without_index_is_the_current_device(st_file):
    """"axon" means the current device, as in tensor.to("axon")."""
    from safetensors.torch import load_file

    path, state = st_file
    with torch.axon.device(1):
        _check_loaded(load_file(path, device="axon"), state, 1)


@pytest.mark.parametrize("backend", ["mmap", "pread"])
def test_safetensors_safe_open_on_axon(st_file, backend):
    import safetensors

    path, state = st_file
    with safetensors.safe_open(path, framework="pt", device="axon:1", backend=backend) as f:
        assert isinstance(f, safetensors.safe_open)
        assert sorted(f.keys()) == sorted(state) and f.metadata() == {"format": "pt"}
        t = f.get_tensor("float32")
        assert t.device == torch.device("axon", 1) and torch.equal(t.cpu(), state["float32"])
        sl = f.get_slice("bfloat16")
        part = sl[1:, ::2]
        assert sl.get_shape() == [3, 5] and sl.get_dtype() == "BF16"
        assert part.device == torch.device("axon", 1)
        assert torch.equal(part.cpu(), state["bfloat16"][1:, ::2])
        # safetensors 0.8.0's pread path mis-shapes packed float4 (on the CPU too).
        skip = {"float4_e2m1fn_x2"} if backend == "pread" else set()
        want = {k: v for k, v in state.items() if k not in skip}
        got = {k: f.get_tensor(k) for k in want} if skip else f.get_tensors()
        _check_loaded(got, want, 1)


def test_safetensors_other_devices_unchanged(st_file):
    """Anything that names no axon device goes to safetensors as before."""
    import safetensors
    from safetensors.torch import load_file

    path, state = st_file
    assert load_file(path)["float32"].device.type == "cpu"
    assert load_file(path, device="cpu")["float32"].device.type == "cpu"
    assert load_file(path, device=1)["float32"].device == torch.device("axon", 1)
    with pytest.raises(safetensors.SafetensorError, match="device axonx is invalid"):
        load_file(path, device="axonx")
    with pytest.raises(RuntimeError, match=r"Invalid device index: axon:99; the device count is"):
        load_file(path, device="axon:99")


def test_safetensors_when_integers_name_another_accelerator(st_file, monkeypatch):
    """In a process whose current accelerator is not axon (integers would mean
    it), the file is opened on the CPU and each tensor is moved to axon."""
    import safetensors
    from safetensors.torch import load_file

    from torch_axon.integrations import safetensors_device

    monkeypatch.setattr(safetensors_device, "_integer_is_axon", lambda index: False)
    path, state = st_file
    _check_loaded(load_file(path, device="axon:1"), state, 1)
    with safetensors.safe_open(path, framework="pt", device="axon:1") as f:
        assert sorted(f.keys()) == sorted(state)
        part = f.get_slice("float16")[:2]
        assert part.device == torch.device("axon", 1)
        assert torch.equal(part.cpu(), state["float16"][:2])


def test_safetensors_patch_idempotent_and_first_import(tmp_path):
    """Applying the patch twice wraps once; `from safetensors.torch import
    load_file` as a script's first line (torch loads inside safetensors.torch)
    loads on axon."""
    import safetensors

    from torch_axon.integrations import safetensors_device

    before = safetensors.safe_open
    safetensors_device.safe_open_axon_device(safetensors)
    assert safetensors.safe_open is before
    import safetensors.torch as st_torch
    assert st_torch.safe_open is before and before._axon_original.__name__ == "safe_open"

    path = tmp_path / "a.safetensors"
    r = run_python(f"""
        from safetensors.torch import load_file, save_file
        import torch
        save_file({{"w": torch.arange(6.).view(2, 3)}}, {str(path)!r})
        t = load_file({str(path)!r}, device="axon:1")["w"]
        assert t.device == torch.device("axon", 1), t.device
        assert torch.equal(t.cpu(), torch.arange(6.).view(2, 3))
        print("ok")
    """)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr


def test_accelerate_load_state_dict_on_axon(st_file):
    """Accelerate's load_state_dict (load_checkpoint_in_model) hands the
    device_map's device string to safetensors' load_file: "axon" used to fail."""
    from accelerate.utils.modeling import load_state_dict

    path, state = st_file
    _check_loaded(load_state_dict(path, device_map={"": "axon"}), state, 0)
    loaded = load_state_dict(path, device_map={"float32": "axon:1", "int8": "cpu"})
    assert loaded["float32"].device == torch.device("axon", 1)
    assert loaded["int8"].device.type == "cpu" and torch.equal(loaded["int8"], state["int8"])


def test_transformers_from_pretrained_device_map_axon(tmp_path, monkeypatch):
    """from_pretrained(device_map="axon") opens the checkpoint with
    safe_open(device="cpu") (Transformers 5.24, modeling_utils; "mps" with
    backend="pread" on MPS) and moves each weight to the device_map's device:
    the weights land on axon equal to the saved ones."""
    import transformers.modeling_utils as mu
    from conftest import tiny_causal_lm
    from transformers import AutoModelForCausalLM

    model = tiny_causal_lm("llama")
    model.save_pretrained(tmp_path)
    seen = []
    real = mu.safe_open

    def spy(*args, **kwargs):
        seen.append((args[2] if len(args) > 2 else kwargs.get("device"), kwargs.get("backend")))
        return real(*args, **kwargs)

    monkeypatch.setattr(mu, "safe_open", spy)
    for device_map, index in (("axon", 0), ("axon:1", 1)):
        loaded = AutoModelForCausalLM.from_pretrained(tmp_path, device_map=device_map)
        want = model.state_dict()
        for name, p in loaded.state_dict().items():
            assert p.device == torch.device("axon", index), name
            assert torch.equal(p.cpu(), want[name]), name
    assert seen and all(s == ("cpu", "mmap") for s in seen), seen
