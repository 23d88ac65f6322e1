"""Import order never matters: a script's first line may be any library import.

Autoload runs inside whatever module first imports torch, which can be a
half-initialised Transformers, Accelerate, Diffusers, PEFT or TRL module.  Each
case is a fresh interpreter whose first line is a typical first import of a
script, with ``import torch`` after it or before it, followed by a tiny step on
axon that uses what the line imported and checks the result against the CPU.
The interpreters run two at a time (the machine has two cores), started when
the first test of this file asks for its result.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from concurrent.futures import ThreadPoolExecutor

import pytest

LLAMA = """
from transformers import LlamaConfig, LlamaForCausalLM
def tiny_llama():
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(
        vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=32))
"""

# Each step uses the names its first line imported; every one ends by printing OK.
STEPS = {
    "trainer": LLAMA + """
import tempfile
model = tiny_llama()
rows = torch.randint(0, 32, (4, 8), generator=torch.Generator().manual_seed(0))
data = [{"input_ids": r, "labels": r} for r in rows]
args = TrainingArguments(output_dir=tempfile.mkdtemp(), max_steps=1, per_device_train_batch_size=2,
                         report_to="none", save_strategy="no", logging_strategy="no")
assert args.device.type == "axon", args.device
before = model.lm_head.weight.detach().clone()
Trainer(model=model, args=args, train_dataset=data).train()
assert model.lm_head.weight.device.type == "axon"
assert not torch.equal(model.lm_head.weight.detach().cpu(), before), "the step changed nothing"
""",
    "generate": LLAMA + """
model = tiny_llama().eval()
ids = torch.tensor([[1, 5, 7, 3]])
want = model.generate(ids, max_new_tokens=4, do_sample=False, pad_token_id=0)
got = model.to("axon").generate(ids.to("axon"), max_new_tokens=4, do_sample=False, pad_token_id=0)
assert isinstance(model, GenerationMixin)
assert got.device.type == "axon" and torch.equal(got.cpu(), want), (got, want)
""",
    "accelerate": """
accelerator = Accelerator()
assert accelerator.device.type == "axon", accelerator.device
assert PartialState().device.type == "axon"
torch.manual_seed(0)
cpu_model = torch.nn.Linear(8, 4)
x = torch.randn(16, 8)
model = torch.nn.Linear(8, 4)
model.load_state_dict(cpu_model.state_dict())
model, opt = accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
assert model.weight.device.type == "axon"
accelerator.backward(model(x.to(accelerator.device)).square().mean())
opt.step()
cpu_opt = torch.optim.SGD(cpu_model.parameters(), lr=0.1)
cpu_model(x).square().mean().backward()
cpu_opt.step()
torch.testing.assert_close(model.weight.detach().cpu(), cpu_model.weight.detach(), rtol=1e-5, atol=1e-5)
""",
    "diffusers": """
torch.manual_seed(0)
unet = UNet2DModel(sample_size=8, in_channels=3, out_channels=3, layers_per_block=1,
                   block_out_channels=(8, 16), norm_num_groups=4,
                   down_block_types=("DownBlock2D", "DownBlock2D"),
                   up_block_types=("UpBlock2D", "UpBlock2D")).eval()
scheduler = DDPMScheduler(num_train_timesteps=10)
x = torch.randn(1, 3, 8, 8)
noisy = scheduler.add_noise(x, torch.randn(1, 3, 8, 8), torch.tensor([5]))
with torch.no_grad():
    want = unet(noisy, 5).sample
    got = unet.to("axon")(noisy.to("axon"), 5).sample
torch.testing.assert_close(got.cpu(), want, rtol=1e-4, atol=1e-4)
""",
    "peft": LLAMA + """
config = LoraConfig(r=2, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
model = get_peft_model(tiny_llama(), config)
ids = torch.tensor([[1, 5, 7, 3]])
want = model(input_ids=ids, labels=ids).loss
model.to("axon")
got = model(input_ids=ids.to("axon"), labels=ids.to("axon")).loss
got.backward()
lora = [p for n, p in model.named_parameters() if "lora_" in n]
assert lora and all(p.grad is not None and p.grad.device.type == "axon" for p in lora)
torch.testing.assert_close(got.detach().cpu(), want.detach(), rtol=1e-4, atol=1e-4)
""",
    "trl": """
import tempfile
config = SFTConfig(output_dir=tempfile.mkdtemp(), report_to="none")
assert config.device.type == "axon", config.device
import transformers
assert issubclass(SFTTrainer, transformers.Trainer)
x = torch.randn(4, 4)
torch.testing.assert_close((x.to(config.device) @ x.to(config.device)).cpu(), x @ x, rtol=1e-5, atol=1e-5)
""",
}

# (first line, step)
FIRST_LINES = [
    ("from transformers import TrainingArguments, Trainer", "trainer"),
    ("import transformers; from transformers import TrainingArguments, Trainer", "trainer"),
    ("from transformers import GenerationMixin", "generate"),
    ("from transformers import AutoModelForCausalLM, AutoConfig, GenerationMixin", "generate"),
    ("from transformers import pipeline, GenerationMixin", "generate"),
    ("from transformers.generation import GenerationMixin", "generate"),
    ("from accelerate import Accelerator, PartialState", "accelerate"),
    ("from accelerate.state import PartialState; from accelerate import Accelerator", "accelerate"),
    ("from diffusers import UNet2DModel, DDPMScheduler", "diffusers"),
    ("from peft import LoraConfig, get_peft_model", "peft"),
    ("from trl import SFTConfig, SFTTrainer", "trl"),
]

CASES = [(line, step, torch_first) for line, step in FIRST_LINES for torch_first in (False, True)]


def _script(line: str, step: str, torch_first: bool) -> str:
    head = f"import torch\n{line}\n" if torch_first else f"{line}\nimport torch\n"
    return head + textwrap.dedent(STEPS[step]) + "\nprint('OK')\n"


def _run(script: str, cwd: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items()
           if k not in ("ACCELERATE_TORCH_DEVICE", "ACCELERATE_USE_CPU", "LOCAL_RANK", "WORLD_SIZE",
                        "TORCH_DEVICE_BACKEND_AUTOLOAD")}
    env.update(HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    return subprocess.run([sys.executable, "-c", script], env=env, cwd=cwd, capture_output=True,
                          text=True, timeout=300)


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    cwd = str(tmp_path_factory.mktemp("import_order"))
    with ThreadPoolExecutor(max_workers=2) as pool:
        futures = {case: pool.submit(_run, _script(*case), cwd) for case in CASES}
        yield futures


@pytest.mark.parametrize("line,step,torch_first", CASES,
                         ids=[f"{'torch-first' if t else 'torch-after'}:{line}" for line, _, t in CASES])
def test_first_line_imports_and_runs_on_axon(results, line, step, torch_first):
    out = results[(line, step, torch_first)].result()
    assert out.returncode == 0 and out.stdout.strip().endswith("OK"), \
        f"script:\n{_script(line, step, torch_first)}\nstderr:\n{out.stderr[-4000:]}"
    assert "Failed to load the backend extension" not in out.stderr
    assert "could not apply" not in out.stderr, out.stderr


def test_module_being_imported_is_patched_when_its_import_completes(tmp_path, monkeypatch):
    """A patch registered for a module still executing runs once, after its last line."""
    from torch_axon.integrations import _hooks

    (tmp_path / "axon_half_imported.py").write_text(textwrap.dedent("""
        import sys
        from torch_axon.integrations import _hooks
        _hooks.on_import(__name__)(lambda m: setattr(m, "seen", (m.LAST, m.__dict__.get("seen"))))
        _hooks._apply_when_imported(sys.modules[__name__], __name__)
        assert not hasattr(sys.modules[__name__], "seen"), "patched while still importing"
        LAST = "the last line ran"
    """))
    (tmp_path / "axon_failed_import.py").write_text(textwrap.dedent("""
        import sys
        from torch_axon.integrations import _hooks
        _hooks.on_import(__name__)(lambda m: CALLS.append(m))
        _hooks._apply_when_imported(sys.modules[__name__], __name__)
        raise ValueError("this module fails to import")
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(_hooks, "_patches", dict(_hooks._patches))
    calls = []
    import builtins
    monkeypatch.setattr(builtins, "CALLS", calls, raising=False)
    try:
        import axon_half_imported

        assert axon_half_imported.seen == ("the last line ran", None)
        assert type(axon_half_imported.__spec__) is type(_hooks.__spec__)
        with pytest.raises(ValueError, match="fails to import"):
            import axon_failed_import  # noqa: F401
        assert calls == [], "a module whose import failed was patched"
    finally:
        sys.modules.pop("axon_half_imported", None)


def test_other_threads_get_the_module_only_once_patched(tmp_path, monkeypatch):
    """A thread importing the module while its patch runs waits for the patch to finish."""
    from torch_axon.integrations import _hooks

    (tmp_path / "axon_threaded_import.py").write_text(textwrap.dedent("""
        import importlib, sys, threading, time
        from torch_axon.integrations import _hooks
        SEEN = []
        def patch(m):
            def other():
                SEEN.append(importlib.import_module(__name__).__dict__.get("patched"))
            m.THREAD = threading.Thread(target=other)
            m.THREAD.start()
            time.sleep(0.3)
            m.patched = True
        _hooks.on_import(__name__)(patch)
        _hooks._apply_when_imported(sys.modules[__name__], __name__)
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(_hooks, "_patches", dict(_hooks._patches))
    try:
        import axon_threaded_import as m

        m.THREAD.join(10)
        assert m.SEEN == [True]
    finally:
        sys.modules.pop("axon_threaded_import", None)


def test_failing_patch_warns_and_keeps_the_module(monkeypatch):
    import types

    from torch_axon.integrations import _hooks

    def broken(module):
        raise AttributeError("no such upstream class")

    module = types.ModuleType("axon_fake_target")
    monkeypatch.setattr(_hooks, "_patches", {"axon_fake_target": [broken]})
    with pytest.warns(RuntimeWarning, match="could not apply broken to axon_fake_target: "
                                            "AttributeError: no such upstream class"):
        _hooks._apply(module, "axon_fake_target")
