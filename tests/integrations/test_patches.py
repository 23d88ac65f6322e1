"""torch_axon.integrations: Accelerate and Transformers choose axon by themselves."""

from __future__ import annotations

import functools
import importlib
import os
import re
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch

from torch_axon.integrations import (_hooks, hf_accelerate, hf_accelerate_cli, hf_peft,
                                     hf_transformers,
                                     safetensors_device, torch_data_parallel, torch_dlpack,
                                     torch_nested, torch_transformer)

accelerate_state = pytest.importorskip("accelerate.state")
training_args = pytest.importorskip("transformers.training_args")

from accelerate import Accelerator  # noqa: E402
from accelerate.state import PartialState  # noqa: E402
from transformers import TrainingArguments  # noqa: E402

from conftest import REPO_ROOT  # noqa: E402

PATCHES = [hf_accelerate.partial_state_default_device, hf_transformers.training_args_setup_devices,
           hf_transformers.training_args_bf16_available, hf_transformers.trainer_rng_state_axon,
           hf_accelerate.grad_scaler_device, hf_accelerate.max_memory_axon,
           hf_accelerate.accelerate_rng_sync, hf_accelerate.clear_device_cache_axon,
           hf_accelerate.accelerator_state_rng_axon, hf_accelerate_cli.default_config_axon,
           hf_accelerate_cli.launch_process_count, hf_accelerate_cli.env_reports_axon,
           hf_accelerate_cli.test_command_axon, safetensors_device.safe_open_axon_device,
           torch_dlpack.tensor_dlpack_device, hf_transformers.pipeline_default_device,
           torch_transformer.transformer_encoder_nested_fast_path,
           torch_nested.jagged_sdpa_math_path, torch_data_parallel.data_parallel_comm,
           hf_transformers.cache_offloading_default_stream, hf_peft.infer_device_axon]


pytestmark = pytest.mark.usefixtures("fresh_accelerate")


def _args(tmp_path, **kw) -> TrainingArguments:
    return TrainingArguments(output_dir=str(tmp_path), report_to="none", **kw)


# ------------------------------------------------------------ Accelerate


def test_partial_state_device_is_axon():
    state = PartialState()
    assert state.device.type == "axon"
    assert state.device.index == torch.axon.current_device()
    assert state.default_device.type == "axon"


def test_partial_state_cpu_request_is_kept():
    assert PartialState(cpu=True).device == torch.device("cpu")


def test_accelerate_torch_device_env_is_kept(monkeypatch):
    monkeypatch.setenv("ACCELERATE_TORCH_DEVICE", "cpu")
    assert PartialState().device == torch.device("cpu")


def test_accelerator_prepares_model_on_axon():
    accelerator = Accelerator()
    assert accelerator.device.type == "axon"
    model = accelerator.prepare(torch.nn.Linear(4, 2))
    assert next(model.parameters()).device.type == "axon"


# ------------------------------------------------------------ Transformers


def test_training_args_device_is_axon(tmp_path):
    args = _args(tmp_path)
    assert args.device.type == "axon"
    assert args.n_gpu == 1
    assert args.distributed_state.device.type == "axon"


def test_training_args_use_cpu(tmp_path):
    args = _args(tmp_path, use_cpu=True)
    assert args.device == torch.device("cpu")
    assert args.n_gpu == 0


def test_training_args_accelerate_use_cpu_env(tmp_path, monkeypatch):
    monkeypatch.setenv("ACCELERATE_USE_CPU", "true")
    assert _args(tmp_path).device == torch.device("cpu")


def test_training_args_bf16_on_axon(tmp_path):
    """bf16=True is accepted (upstream only asks cuda, xpu, npu, ...) and Accelerate autocasts on axon."""
    args = _args(tmp_path, bf16=True)
    assert args.device.type == "axon"
    accelerator = Accelerator(mixed_precision="bf16")
    assert accelerator.native_amp
    with accelerator.autocast():
        y = torch.ones(2, 3, device="axon") @ torch.ones(3, 2, device="axon")
    assert y.dtype == torch.bfloat16 and y.device.type == "axon"


def test_training_args_after_use_cpu_run(tmp_path):
    """A CPU run resets Accelerate's state; the next default run is on axon again."""
    assert _args(tmp_path / "a", use_cpu=True).device.type == "cpu"
    assert _args(tmp_path / "b").device.type == "axon"


# ------------------------------------------------------------ the patches themselves


def _unwrap(obj):
    """The function behind a property, a cached_property or a plain function (or object)."""
    if isinstance(obj, property):
        return obj.fget
    if isinstance(obj, functools.cached_property):
        return obj.func
    return obj


def _resolve(dotted: str):
    """(module name, object) for ``package.module.Class.attribute``, looked up in class dicts."""
    parts = dotted.split(".")
    for i in range(len(parts) - 1, 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for name in parts[i:]:
            obj = obj.__dict__[name]
        return ".".join(parts[:i]), obj
    raise LookupError(dotted)


def test_patches_are_installed():
    assert PartialState.default_device.fget._axon_patch
    assert TrainingArguments.__dict__["_setup_devices"].func._axon_patch
    assert training_args.is_torch_bf16_gpu_available._axon_patch


def test_patches_are_idempotent(tmp_path):
    default_device = PartialState.__dict__["default_device"]
    setup_devices = TrainingArguments.__dict__["_setup_devices"]
    bf16_available = training_args.is_torch_bf16_gpu_available
    for _ in range(2):
        hf_accelerate.partial_state_default_device(accelerate_state)
        hf_transformers.training_args_setup_devices(training_args)
        hf_transformers.training_args_bf16_available(training_args)
        _hooks._apply(accelerate_state, accelerate_state.__name__)
        _hooks._apply(training_args, training_args.__name__)
        _hooks.install()
    assert PartialState.__dict__["default_device"] is default_device
    assert TrainingArguments.__dict__["_setup_devices"] is setup_devices
    assert training_args.is_torch_bf16_gpu_available is bf16_available
    assert PartialState().device.type == "axon"
    assert _args(tmp_path).device.type == "axon"


@pytest.mark.parametrize("patch", PATCHES, ids=lambda p: p.__name__)
def test_patch_docstring_names_upstream_function(patch):
    """The docstring's first line names the patched upstream function, which exists, is the one
    this patch replaced, and lives in the module the patch is registered for."""
    doc = patch.__doc__ or ""
    match = re.match(r"Patch ``((?:\w+\.)+\w+)``", doc)
    assert match, f"{patch.__name__}: the docstring does not start with Patch ``upstream.name``"
    module_name, target = _resolve(match.group(1))
    assert patch in _hooks._patches[module_name]
    assert _unwrap(target)._axon_patch
    assert re.search(r"\b(cuda|mps|xpu|npu)\b.*\b(cuda|mps|xpu|npu)\b", doc, re.S), \
        "the docstring should name the hard-coded device list"


def _fake_accelerate(device: str) -> types.ModuleType:
    module = types.ModuleType("fake_accelerate_state")

    class PartialState:
        @property
        def default_device(self):
            return torch.device(device)

    module.PartialState = PartialState
    return module


def _fake_transformers(device: str) -> types.ModuleType:
    module = types.ModuleType("fake_training_args")

    class TrainingArguments:
        use_cpu = False
        distributed_state = types.SimpleNamespace(device=torch.device("axon", 0))

        @functools.cached_property
        def _setup_devices(self):
            return torch.device(device)

    module.TrainingArguments = TrainingArguments
    return module


def _fake_bf16(answer: bool) -> types.ModuleType:
    module = types.ModuleType("fake_training_args")
    module.is_torch_bf16_gpu_available = lambda: answer
    return module


@pytest.mark.parametrize("device", ["axon:0", "cuda:0", "mps"])
def test_patches_keep_non_cpu_upstream_answers(device):
    """Once upstream returns axon (or any device but the CPU), the wrappers change nothing."""
    fake = _fake_accelerate(device)
    hf_accelerate.partial_state_default_device(fake)
    assert fake.PartialState.default_device.fget._axon_patch
    assert fake.PartialState().default_device == torch.device(device)

    fake = _fake_transformers(device)
    hf_transformers.training_args_setup_devices(fake)
    assert fake.TrainingArguments.__dict__["_setup_devices"].func._axon_patch
    assert fake.TrainingArguments()._setup_devices == torch.device(device)


def test_bf16_patch_keeps_upstream_yes(monkeypatch):
    fake = _fake_bf16(True)
    hf_transformers.training_args_bf16_available(fake)
    assert fake.is_torch_bf16_gpu_available._axon_patch
    monkeypatch.setattr(torch.axon, "is_bf16_supported", lambda *a, **k: False)
    assert fake.is_torch_bf16_gpu_available() is True

    fake = _fake_bf16(False)
    hf_transformers.training_args_bf16_available(fake)
    assert fake.is_torch_bf16_gpu_available() is False  # axon's answer, monkeypatched
    monkeypatch.undo()
    assert fake.is_torch_bf16_gpu_available() is True


def test_patches_replace_only_the_final_cpu():
    fake = _fake_accelerate("cpu")
    hf_accelerate.partial_state_default_device(fake)
    assert fake.PartialState().default_device.type == "axon"

    fake = _fake_transformers("cpu")
    hf_transformers.training_args_setup_devices(fake)
    assert fake.TrainingArguments()._setup_devices.type == "axon"
    args = fake.TrainingArguments()
    args.use_cpu = True
    assert args._setup_devices.type == "cpu"


def test_modules_imported_before_torch_axon_get_patched(tmp_path):
    """With autoload off, Accelerate and Transformers imported first are patched by install()."""
    code = (
        "import accelerate.state, transformers.training_args\n"
        "from transformers import TrainingArguments\n"
        "assert not getattr(accelerate.state.PartialState.default_device.fget, '_axon_patch', False)\n"
        "import torch_axon\n"
        "print(TrainingArguments(output_dir='unused', report_to='none').device)\n"
    )
    env = {k: v for k, v in os.environ.items()
           if k not in ("ACCELERATE_TORCH_DEVICE", "ACCELERATE_USE_CPU")}
    env["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=tmp_path, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "axon:0"


def test_every_patch_is_listed_in_upstream_md():
    """docs/UPSTREAM.md names every patch registered with the import hooks (module.function)."""
    text = (Path(REPO_ROOT) / "docs" / "UPSTREAM.md").read_text()
    patches = [fn for fns in _hooks._patches.values() for fn in fns]
    assert len(patches) > 20
    missing = [f"{fn.__module__}.{fn.__name__}" for fn in patches
               if f"{fn.__module__.rsplit('.', 1)[-1]}.{fn.__name__}" not in text]
    assert not missing, f"not in docs/UPSTREAM.md: {missing}"


def _char_tokenizer():
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    chars = list("abcdefghijklmnopqrstuvwxyz .,!?0123456789")
    vocab = {t: i for i, t in enumerate(["<pad>", "<s>", "</s>", *chars])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), "isolated")
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                                   pad_token="<pad>")


@pytest.mark.parametrize("device, start, expect", [
    (None, "axon", "axon:0"), (None, "cpu", "axon:0"), (1, "axon", "axon:1"),
    (-1, "axon", "axon:0"), ("axon:2", "cpu", "axon:2"), ("cpu", "axon", "cpu")])
def test_pipeline_default_device_is_axon(device, start, expect):
    # as on a CUDA machine (device 0 of the accelerator, the model moved there); a model on
    # axon no longer goes back to the CPU; generation matches the CPU's greedy tokens
    from transformers import LlamaConfig, LlamaForCausalLM, pipeline

    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=4, num_key_value_heads=2, bos_token_id=1,
                      eos_token_id=2, pad_token_id=0)
    torch.manual_seed(0)
    ref = LlamaForCausalLM(cfg).eval()
    model = LlamaForCausalLM(cfg).eval()
    model.load_state_dict(ref.state_dict())
    model.to(start)
    kw = {} if device is None else {"device": device}
    pipe = pipeline("text-generation", model=model, tokenizer=_char_tokenizer(), **kw)
    assert str(pipe.device) == expect and str(model.device) == expect
    gen = dict(max_new_tokens=6, do_sample=False)
    want = pipeline("text-generation", model=ref, tokenizer=_char_tokenizer(), device="cpu")
    assert pipe("hello", **gen)[0]["generated_text"] == want("hello", **gen)[0]["generated_text"]


def test_offloaded_cache_generates_like_the_cpu():
    # cache_implementation="offloaded" ordered its prefetch stream with
    # torch.cuda.default_stream(device): "Torch not compiled with CUDA enabled" on axon
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=99, hidden_size=32, num_hidden_layers=3, num_attention_heads=2,
                      num_key_value_heads=2, intermediate_size=37)
    model = LlamaForCausalLM(cfg).eval()
    ids = torch.randint(1, 99, (2, 7))
    expected = model.generate(ids, max_new_tokens=8, do_sample=False)
    model.to("axon")
    got = model.generate(ids.to("axon"), max_new_tokens=8, do_sample=False,
                         cache_implementation="offloaded")
    assert got.cpu().tolist() == expected.tolist()


def test_peft_adapter_with_modules_to_save_loads_onto_axon(tmp_path):
    # low_cpu_mem_usage=True assigned the checkpoint's tensors as loaded: PEFT mapped them to
    # infer_device(), "cpu" on axon, so a sequence-classification head stayed on the CPU
    pytest.importorskip("peft")
    from peft import LoraConfig, PeftModel, TaskType, get_peft_model
    from transformers import LlamaConfig, LlamaForSequenceClassification
    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, num_labels=3, pad_token_id=0)
    torch.manual_seed(0)
    state = LlamaForSequenceClassification(cfg).state_dict()

    def base():
        m = LlamaForSequenceClassification(cfg)
        m.load_state_dict(state)
        return m

    lora = LoraConfig(task_type=TaskType.SEQ_CLS, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    get_peft_model(base(), lora).save_pretrained(tmp_path)
    ids = torch.tensor([[5, 6, 7, 8]])
    expected = PeftModel.from_pretrained(base(), tmp_path).eval()(input_ids=ids).logits
    model = PeftModel.from_pretrained(base().to("axon"), tmp_path, low_cpu_mem_usage=True).eval()
    assert {p.device.type for p in model.parameters()} == {"axon"}
    got = model(input_ids=ids.to("axon")).logits
    torch.testing.assert_close(got.cpu(), expected.detach(), rtol=1e-4, atol=1e-5)
