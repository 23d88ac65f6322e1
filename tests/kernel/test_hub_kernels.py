"""The Hugging Face kernels library on axon (torch_axon.integrations.hf_kernels)
and the shipped repositories applied to Transformers models (torch_axon.hub_kernels).

Kernelized models are compared with the same model unkernelized on axon (same
weights) at conftest.TOL_ACCUM for float32 (the kernels sum in another order).
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import torch.nn as nn

from conftest import AXON, REPO_ROOT, tol

kernels = pytest.importorskip("kernels", reason="the kernels library is not installed")
from kernels import (Device, LayerRepository, LocalLayerRepository, Mode, kernelize,  # noqa: E402
                     use_kernel_forward_from_hub, use_kernel_mapping)

import torch_axon.hub_kernels as hub_kernels  # noqa: E402

REPOS = Path(REPO_ROOT) / "examples" / "kernels"


def close(a, b, accum=True):
    torch.testing.assert_close(a.detach().cpu(), b.detach().cpu(), **tol(torch.float32, accum))


# ---- the patched sites --------------------------------------------------------------------

def test_backend_is_axon():
    from kernels import backends, python_deps, validate, variants

    assert backends._backend().name == "axon" and backends._backend().variant_str == "axon"
    assert set(backends._supported_backends()) == {"cpu", "axon"}
    assert backends._select_backend("cpu").name == "cpu"
    # the copies other modules imported are the patched function
    assert validate._backend is backends._backend is python_deps._backend
    assert variants.parse_backend("axon").name == "axon"
    v = variants.parse_variant("torch213-cxx11-axon-x86_64-linux")
    assert v.arch.backend.name == "axon"
    with pytest.raises(ValueError, match="Unknown backend variant string: 'axom'"):
        backends.parse_backend("axom")
    with pytest.raises(ValueError, match="Invalid Axon variant string: 'axon2'"):
        backends.Axon.parse("axon2")
    repos = kernels.layer.repos.DeviceRepos.create_repo(Device(type="axon"))
    with pytest.raises(ValueError, match="Device type must be 'axon', got cpu"):
        repos.insert(Device(type="cpu"), {})


def test_variant_resolution():
    from kernels.variants import get_variants_local, resolve_variant

    variants = get_variants_local(REPOS / "axon-activation" / "build")
    assert [v.variant_str for v in variants] == ["torch-axon"]
    chosen, _ = resolve_variant(variants)
    assert chosen.variant_str == "torch-axon"
    chosen, trace = resolve_variant(variants, backend="cpu")
    assert chosen is None
    assert "backend (axon) does not match system backend (cpu)" in trace[0].reason


def _make_repo(root: Path, variants: dict[str, str]) -> Path:
    """A kernel repository whose build variants each define layers.Tag returning a constant."""
    for variant, tag in variants.items():
        pkg = root / "build" / variant / "tag_kernel"
        pkg.mkdir(parents=True)
        (root / "build" / variant / "metadata.json").write_text(json.dumps({
            "id": f"_tag_kernel_{variant.replace('-', '_')}_{abs(hash(str(root)))}",
            "name": "tag-kernel", "version": 1, "license": "MIT", "python-depends": [],
            "backend": {"type": "cpu"}}))
        (pkg / "__init__.py").write_text(textwrap.dedent(f"""
            import torch.nn as nn
            TAG = {tag!r}
            class layers:
                class Tag(nn.Module):
                    def forward(self, x):
                        return x * 0 + {len(tag)}
            """))
    return root


def test_local_kernel_variants(tmp_path):
    only_cpu = _make_repo(tmp_path / "cpu_only", {"torch-cpu": "cpu"})
    with pytest.raises(FileNotFoundError, match=r"(?s)Cannot find a build variant for this system.*"
                                                r"backend \(cpu\) does not match system backend \(axon\)"):
        kernels.get_local_kernel(only_cpu)
    assert kernels.get_local_kernel(only_cpu, backend="cpu").TAG == "cpu"
    both = _make_repo(tmp_path / "both", {"torch-cpu": "cpu", "torch-axon": "axon!"})
    assert kernels.get_local_kernel(both).TAG == "axon!"


def test_kernelize_picks_the_variant_of_its_device(tmp_path):
    """kernelize(device="cpu") loads the CPU build, device="axon" the axon build."""
    both = _make_repo(tmp_path / "both", {"torch-cpu": "cpu", "torch-axon": "axon!"})

    @use_kernel_forward_from_hub("Tag")
    class Tag(nn.Module):
        def forward(self, x):
            return x

    mapping = {"Tag": {dev: LocalLayerRepository(repo_path=both, layer_name="Tag")
                       for dev in ("cpu", "axon")}}
    with use_kernel_mapping(mapping):
        m_cpu = kernelize(Tag(), device="cpu", mode=Mode.INFERENCE)
    assert m_cpu(torch.zeros(1)).item() == 3
    with use_kernel_mapping(mapping):  # the same repository: a layer cache per device
        m_axon = kernelize(Tag(), device="axon", mode=Mode.INFERENCE)
    assert m_axon(torch.zeros(1, device=AXON)).item() == 5


def test_mapping_and_device_checks():
    @use_kernel_forward_from_hub("SiluAndMul")
    class SiluAndMul(nn.Module):
        def forward(self, x):
            d = x.shape[-1] // 2
            return nn.functional.silu(x[..., :d]) * x[..., d:]

    repo = LocalLayerRepository(repo_path=REPOS / "axon-activation", layer_name="SiluAndMul")
    x = torch.randn(3, 10, device=AXON)
    expect = SiluAndMul()(x)
    for key in ("axon", Device(type="axon")):
        with use_kernel_mapping({"SiluAndMul": {key: {Mode.INFERENCE: repo}}}):
            m = kernelize(SiluAndMul(), device="axon", mode=Mode.INFERENCE)
            m2 = kernelize(SiluAndMul(), device=torch.device("axon"), mode=Mode.INFERENCE)
        assert m.forward.__func__.__qualname__ == "SiluAndMul.forward"
        assert m.forward.__func__.__module__.endswith("layers")
        close(m(x), expect)
        close(m2(x), expect)
    # upstream's own errors are unchanged
    with pytest.raises(ValueError, match="Unsupported device type 'axom'"):
        kernelize(SiluAndMul(), device="axom", mode=Mode.INFERENCE)
    with pytest.raises(ValueError, match="Unknown device type: axom"):
        kernels.register_kernel_mapping({"X": {"axom": repo}})
    with pytest.raises(ValueError, match="CUDAProperties is only supported for 'cuda' devices"):
        Device(type="axon", properties=kernels.CUDAProperties(min_capability=75, max_capability=90))
    # no axon entry: the original forward (KernelizeFallback.NO_DEVICE)
    with use_kernel_mapping({"SiluAndMul": {"cuda": LayerRepository("a/b", layer_name="SiluAndMul",
                                                                     version=1)}}):
        m = kernelize(SiluAndMul(), device="axon", mode=Mode.INFERENCE)
    assert m.forward.__func__ is SiluAndMul.forward


def test_get_kernel_from_local_overrides(monkeypatch):
    """get_kernel(repo_id) with LOCAL_KERNELS resolves to the local directory (no network)."""
    monkeypatch.setenv("LOCAL_KERNELS", f"kernels-community/activation={REPOS / 'axon-activation'}")
    act = kernels.get_kernel("kernels-community/activation", version=1)
    x = torch.randn(4, 16, device=AXON)
    out = torch.empty(4, 8, device=AXON)
    act.gelu_tanh_and_mul(out, x)
    close(out, nn.functional.gelu(x[:, :8], approximate="tanh") * x[:, 8:], accum=False)


def test_patch_applies_when_kernels_is_imported_first():
    code = textwrap.dedent("""
        import kernels
        from kernels.layer.kernelize import _validate_device_type
        import torch
        from kernels.backends import _backend
        _validate_device_type("axon")
        print(_backend().name)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "axon"


# ---- Transformers models ------------------------------------------------------------------

def tiny_llama(seed=0):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    return LlamaForCausalLM(cfg).to(AXON)


def test_llama_prepare_marks_the_hub_layers():
    model = tiny_llama()
    assert hub_kernels.prepare(model) == ["LlamaDecoderLayer", "LlamaMLP", "RMSNorm", "rotary_pos_emb"]
    attn = model.model.layers[0].self_attn
    assert attn._kernel_funcs["apply_rotary_pos_emb"].kernel_layer_name == "rotary_pos_emb"


@contextlib.contextmanager
def unkernelized_functions():
    """The function layers (Transformers' module-level apply_rotary_pos_emb, shared by every
    model of the family) run their original function inside the block."""
    saved = {}
    for layer in hub_kernels._func_modules.values():
        if "forward" in layer.__dict__:  # kernelize sets the kernel's forward on the instance
            saved[layer] = layer.__dict__.pop("forward")
    try:
        yield
    finally:
        for layer, forward in saved.items():
            layer.forward = forward


def _rotary_layer():
    """What LlamaAttention.forward calls (the function layer once a Llama was prepared)."""
    from transformers.models.llama import modeling_llama

    return modeling_llama.apply_rotary_pos_emb


@pytest.mark.parametrize("mode", ["inference", "training"])
def test_kernelize_llama(mode):
    """The kernelized model against the same model unkernelized (the reference runs with the
    shared rotary function layer restored to Transformers' function)."""
    ref = tiny_llama()
    model = tiny_llama()
    ids = torch.randint(0, 128, (2, 11), device=AXON)
    if mode == "inference":
        ref.eval(), model.eval()
        hub_kernels.kernelize(model, device="axon")
        layer = model.model.layers[0]
        for sub in (layer, layer.input_layernorm, layer.post_attention_layernorm, layer.mlp,
                    model.model.norm, _rotary_layer()):
            assert sub.forward.__func__.__module__.startswith("_axon_"), sub
        kw = dict(max_new_tokens=4, do_sample=False, pad_token_id=0)
        with torch.no_grad():
            with unkernelized_functions():
                assert not _rotary_layer().forward.__func__.__module__.startswith("_axon_")
                expect = ref(ids).logits
                expect_ids = ref.generate(ids, **kw).cpu()
            close(model(ids).logits, expect)
            # decoding with the KV cache goes through the kernelized decoder layers too
            assert torch.equal(model.generate(ids, **kw).cpu(), expect_ids)
    else:
        ref.train(), model.train()
        hub_kernels.kernelize(model, mode=Mode.TRAINING)
        assert _rotary_layer().forward.__func__.__module__.startswith("_axon_")
        with unkernelized_functions():
            loss_ref = ref(ids, labels=ids).loss
        loss = model(ids, labels=ids).loss
        close(loss, loss_ref)
        loss_ref.backward()
        loss.backward()
        for (name, p), q in zip(model.named_parameters(), ref.parameters()):
            # atol relative to the gradient's scale: q_proj/k_proj gradients are ~1e-3, so
            # the absolute 1e-4 of TOL_ACCUM would hide a rotary kernel that is 10 % off
            scale = q.grad.abs().max().item()
            torch.testing.assert_close(p.grad.cpu(), q.grad.cpu(), rtol=1e-4, atol=1e-4 * scale,
                                       msg=lambda m, name=name: f"{name}: {m}")


def test_compiled_kernelized_llama_equals_eager():
    model = tiny_llama().eval()
    hub_kernels.kernelize(model, mode=Mode.INFERENCE | Mode.TORCH_COMPILE)
    ids = torch.randint(0, 128, (1, 9), device=AXON)
    with torch.no_grad():
        eager = model(ids).logits
        torch._dynamo.reset()
        explain = torch._dynamo.explain(model)(ids)
        ops = {str(n.target) for g in explain.graphs for n in g.graph.nodes if n.op == "call_function"}
        assert any("axon_layernorm" in o for o in ops) and any("axon_rotary" in o for o in ops), ops
        assert explain.graph_break_count == 0, explain.break_reasons
        torch._dynamo.reset()
        compiled = torch.compile(model, backend="inductor")(ids).logits
    close(compiled, eager)


def test_kernelize_vit():
    from transformers import ViTConfig, ViTModel

    torch.manual_seed(0)
    cfg = ViTConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
                    image_size=32, patch_size=8)
    ref = ViTModel(cfg).to(AXON).eval()
    model = ViTModel(cfg).to(AXON).eval()
    model.load_state_dict(ref.state_dict())
    pixels = torch.randn(2, 3, 32, 32, device=AXON)
    assert hub_kernels.prepare(model) == ["ViTAttention", "ViTLayer"]
    hub_kernels.kernelize(model)
    with torch.no_grad():
        close(model(pixels).last_hidden_state, ref(pixels).last_hidden_state)


def test_kernelize_without_repositories(tmp_path):
    with pytest.raises(FileNotFoundError, match="hub_kernels: no kernel repositories at"):
        hub_kernels.kernelize(tiny_llama(), repo_root=tmp_path / "missing")
