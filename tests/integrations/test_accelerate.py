"""Accelerate treats axon as a first-class device: its CLI, fp16, RNG, memory and checkpoints.

The command-line tests run Accelerate's own commands in fresh processes with
``HF_HOME`` in a temporary directory (no config file of the machine's is read).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from conftest import TOL_ACCUM

accelerate = pytest.importorskip("accelerate")

from accelerate import Accelerator  # noqa: E402
from accelerate.state import AcceleratorState  # noqa: E402

from torch_axon.integrations import hf_accelerate_cli  # noqa: E402

BIN = Path(sys.executable).parent


pytestmark = pytest.mark.usefixtures("fresh_accelerate")


def _cli(args, tmp_path, timeout=240, **env):
    full = {k: v for k, v in os.environ.items()
            if not k.startswith("ACCELERATE_") and k not in ("LOCAL_RANK", "WORLD_SIZE", "RANK")}
    full.update(HF_HOME=str(tmp_path / "hf"), PATH=f"{BIN}:{os.environ['PATH']}", **env)
    return subprocess.run(args, env=full, cwd=tmp_path, capture_output=True, text=True,
                          timeout=timeout)


# ------------------------------------------------------------ command line


@pytest.mark.parametrize("devices,kind", [(3, "MULTI_GPU"), (1, "NO")])
def test_config_default_uses_axon(tmp_path, devices, kind):
    out = _cli([str(BIN / "accelerate"), "config", "default"], tmp_path,
               AXON_NUM_DEVICES=str(devices))
    assert out.returncode == 0, out.stderr
    config = json.loads((tmp_path / "hf" / "accelerate" / "default_config.yaml").read_text())
    assert config["use_cpu"] is False
    assert config["num_processes"] == devices
    assert config["distributed_type"] == kind


RANK_SCRIPT = """
import torch
import torch.distributed as dist
from accelerate import Accelerator
a = Accelerator()
x = torch.full((3,), float(a.process_index + 1), device=a.device)
if a.num_processes > 1:
    dist.all_reduce(x)
with open(f"rank{a.process_index}.txt", "w") as f:  # ranks' stdout lines can interleave
    f.write(f"{a.process_index} {a.num_processes} {a.device} {a.distributed_type.value} {x.sum().item()}")
"""


def _ranks(tmp_path):
    return sorted(p.read_text().split() for p in tmp_path.glob("rank*.txt"))


@pytest.mark.parametrize("argv,devices,processes", [
    (["--num_processes=2"], 8, 2),   # the count asked for
    ([], 2, 2),                      # no arguments: every axon device
    (["--num_processes=1"], 2, 1),
    (["--multi_gpu"], 2, 2),         # every axon device
])
def test_launch_starts_one_process_per_axon_device(tmp_path, argv, devices, processes):
    (tmp_path / "script.py").write_text(RANK_SCRIPT)
    out = _cli([str(BIN / "accelerate"), "launch", *argv, "script.py"], tmp_path,
               AXON_NUM_DEVICES=str(devices))
    assert out.returncode == 0, out.stderr[-3000:]
    lines = _ranks(tmp_path)
    kind = "MULTI_GPU" if processes > 1 else "NO"
    total = 3.0 * sum(range(1, processes + 1))
    assert lines == [[str(r), str(processes), f"axon:{r}", kind, str(total)]
                     for r in range(processes)]


@pytest.mark.parametrize("argv,processes", [(["--num_processes=2", "--gpu_ids=3,1"], 2),
                                             (["--num_processes=1", "--gpu_ids=2"], 1)])
def test_launch_gpu_ids_choose_the_axon_devices(tmp_path, argv, processes):
    """`--gpu_ids` makes only those devices visible to the launched processes
    (AXON_VISIBLE_DEVICES), as CUDA_VISIBLE_DEVICES does on CUDA: rank r runs on
    axon:r, which is the r-th listed device."""
    (tmp_path / "script.py").write_text(RANK_SCRIPT + textwrap.dedent("""
        import os
        with open(f"visible{a.process_index}.txt", "w") as f:
            f.write(f"{os.environ['AXON_VISIBLE_DEVICES']} {torch.axon.device_count()} "
                    f"{torch.axon.get_device_properties(a.device).pci_device_id}")
    """))
    out = _cli([str(BIN / "accelerate"), "launch", *argv, "script.py"], tmp_path,
               AXON_NUM_DEVICES="4")
    assert out.returncode == 0, out.stderr[-3000:]
    ids = argv[1].split("=")[1]
    total = 3.0 * sum(range(1, processes + 1))
    kind = "MULTI_GPU" if processes > 1 else "NO"
    assert _ranks(tmp_path) == [[str(r), str(processes), f"axon:{r}", kind, str(total)]
                                for r in range(processes)]
    seen = [(tmp_path / f"visible{r}.txt").read_text().split() for r in range(processes)]
    listed = [int(i) for i in ids.split(",")]
    assert seen == [[ids, str(len(listed)), str(listed[r])] for r in range(processes)]


def test_launch_with_the_default_config(tmp_path):
    """`accelerate config default`, then `accelerate launch script.py` reads that config."""
    (tmp_path / "script.py").write_text(RANK_SCRIPT)
    assert _cli([str(BIN / "accelerate"), "config", "default"], tmp_path,
                AXON_NUM_DEVICES="2").returncode == 0
    out = _cli([str(BIN / "accelerate"), "launch", "script.py"], tmp_path, AXON_NUM_DEVICES="2")
    assert out.returncode == 0, out.stderr[-3000:]
    assert _ranks(tmp_path) == [["0", "2", "axon:0", "MULTI_GPU", "9.0"],
                                ["1", "2", "axon:1", "MULTI_GPU", "9.0"]]


def test_launch_keeps_cpu_request(tmp_path):
    (tmp_path / "script.py").write_text(RANK_SCRIPT)
    out = _cli([str(BIN / "accelerate"), "launch", "--cpu", "script.py"], tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert [r[2] for r in _ranks(tmp_path)] == ["cpu"]


def test_env_reports_axon(tmp_path):
    out = _cli([str(BIN / "accelerate"), "env"], tmp_path, AXON_NUM_DEVICES="2")
    assert out.returncode == 0, out.stderr
    assert "- PyTorch accelerator: AXON\n" in out.stdout
    assert f"- AXON type: {torch.axon.get_device_name()} x 2" in out.stdout


def test_accelerate_test_command_passes_on_axon(tmp_path):
    """`accelerate test`: Accelerate's functional test script, 2 processes on 2 axon devices."""
    out = _cli([str(BIN / "accelerate"), "test"], tmp_path, timeout=400, AXON_NUM_DEVICES="2")
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-4000:]
    assert "Test is a success!" in out.stdout
    for section in ("Test random number generator synchronization", "Training integration test",
                    "Test process execution", "Test split between processes as a tensor"):
        assert f"**{section}**" in out.stdout


def test_accelerate_test_script_under_torchrun_4_ranks(tmp_path):
    """4 ranks of 8 axon devices.  The script's "split between processes" checks assume 2
    processes (a tensor of 2 rows split 4 ways leaves ranks 2 and 3 empty, on CUDA too); it runs
    them only when the processes fill the node, so on 8 devices they are skipped, as on an
    8-GPU node."""
    script = Path(accelerate.__file__).parent / "test_utils" / "scripts" / "test_script.py"
    generic = tmp_path / "test_script.py"
    generic.write_text(hf_accelerate_cli.device_generic_test_script(script.read_text()))
    out = _cli([str(BIN / "torchrun"), "--nproc_per_node=4", str(generic)], tmp_path, timeout=400,
               AXON_NUM_DEVICES="8", OMP_NUM_THREADS="1")
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-4000:]
    assert "All rng are properly synched." in out.stdout
    assert "**Test reinstantiated state**" in out.stdout


def test_device_generic_test_script_changes_only_cuda_calls():
    source = "a = torch.cuda.get_rng_state()\nif is_cuda_available(): pass\nn = torch.cuda.device_count()\n"
    assert hf_accelerate_cli.device_generic_test_script(source) == (
        "a = torch.get_device_module().get_rng_state()\nif is_cuda_available(): pass\n"
        "n = torch.get_device_module().device_count()\n")


# ------------------------------------------------------------ fp16


def _fp16_curve(device: str, steps: int = 6, inf_step: int = 3):
    """Loss and scale per step of a small regression trained with fp16 autocast and a GradScaler.

    On axon through Accelerate (mixed_precision="fp16"); on the CPU with the same autocast and
    scaler written out.  One step gets an inf input, so its gradients are inf and the step is
    skipped (the scale halves)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 1))
    data = [(torch.randn(32, 8), torch.randn(32, 1)) for _ in range(steps)]
    data[inf_step][0][0, 0] = float("inf")
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    if device == "axon":
        accelerator = Accelerator(mixed_precision="fp16")
        model, opt = accelerator.prepare(model, opt)
        scaler = accelerator.scaler
        assert isinstance(scaler, torch.amp.GradScaler) and scaler._device == "axon"
    else:
        scaler = torch.amp.GradScaler("cpu", init_scale=65536.0, growth_interval=2000)
    losses, scales = [], []
    for x, y in data:
        opt.zero_grad()
        if device == "axon":
            with accelerator.autocast():
                out = model(x.to("axon"))
            loss = torch.nn.functional.mse_loss(out.float(), y.to("axon"))
            accelerator.backward(loss)
        else:
            with torch.autocast("cpu", dtype=torch.float16):
                out = model(x)
            loss = torch.nn.functional.mse_loss(out.float(), y)
            scaler.scale(loss).backward()
        if device == "axon":
            opt.step()
        else:
            scaler.step(opt)
            scaler.update()
        losses.append(loss.item())
        scales.append(scaler.get_scale())
    weights = [p.detach().cpu() for p in model.parameters()]
    return losses, scales, weights


def test_accelerator_fp16_matches_cpu_and_skips_inf_step():
    torch.axon.reset_fallback_stats()
    axon_losses, axon_scales, axon_weights = _fp16_curve("axon")
    assert torch.axon.fallback_stats() == {}, "GradScaler's ops ran in the fallback"
    AcceleratorState._reset_state(reset_partial_state=True)
    cpu_losses, cpu_scales, cpu_weights = _fp16_curve("cpu")
    assert axon_scales == cpu_scales
    assert axon_scales[3] == axon_scales[2] / 2, "the inf step was not skipped"
    finite = [i for i in range(len(cpu_losses)) if i != 3]
    torch.testing.assert_close([axon_losses[i] for i in finite], [cpu_losses[i] for i in finite],
                               **TOL_ACCUM[torch.float16])
    for a, c in zip(axon_weights, cpu_weights):
        torch.testing.assert_close(a, c, **TOL_ACCUM[torch.float16])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_grad_scaler_ops_match_cpu(dtype):
    """_amp_foreach_non_finite_check_and_unscale_ and _amp_update_scale_ as stream work, vs the CPU."""
    grads = [torch.randn(5, 3, dtype=dtype), torch.randn(7, dtype=dtype).t(),
             torch.randn(4, 6, dtype=dtype)[:, ::2], torch.empty(0, dtype=dtype)]
    for bad in (None, float("inf"), float("nan")):
        if bad is not None:
            grads[2][1, 1] = bad
        results = {}
        for device in ("cpu", "axon"):
            g = [t.to(device, copy=True) for t in grads]
            found = torch.zeros(1, device=device)
            torch._amp_foreach_non_finite_check_and_unscale_(g, found, torch.full((1,), 0.25, device=device))
            scale = torch.full((1,), 1024.0, device=device)
            tracker = torch.ones(1, dtype=torch.int32, device=device)
            torch._amp_update_scale_(scale, tracker, found, 2.0, 0.5, 2)
            results[device] = [t.cpu() for t in (*g, found, scale, tracker)]
        for a, c in zip(results["axon"], results["cpu"]):
            torch.testing.assert_close(a, c, equal_nan=True, rtol=0, atol=0)


def test_trainer_fp16_on_axon(tmp_path):
    from transformers import Trainer, TrainingArguments

    torch.manual_seed(0)
    model = _RegressionModel()
    data = [{"x": torch.randn(8), "labels": torch.randn(1)} for _ in range(16)]
    args = TrainingArguments(output_dir=str(tmp_path), fp16=True, max_steps=4, report_to="none",
                             per_device_train_batch_size=4, save_strategy="no", logging_steps=1)
    trainer = Trainer(model=model, args=args, train_dataset=data)
    trainer.train()
    scaler = trainer.accelerator.scaler
    assert scaler is not None and scaler._device == "axon"
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert len(losses) == 4 and all(torch.isfinite(torch.tensor(losses)))
    assert model.linear.weight.device.type == "axon"


class _RegressionModel(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(8, 1)
        self.dropout = torch.nn.Dropout(0.5)

    def forward(self, x, labels=None):
        out = self.linear(self.dropout(x))
        loss = torch.nn.functional.mse_loss(out.float(), labels) if labels is not None else None
        return {"loss": loss, "logits": out}


# ------------------------------------------------------------ RNG and checkpoints


def test_synchronize_rng_state_cuda_and_axon_types_use_axon_generator():
    from accelerate.utils import RNGType, synchronize_rng_states

    assert RNGType("axon") is RNGType.AXON
    Accelerator()
    torch.axon.manual_seed(7)
    state = torch.axon.get_rng_state()
    synchronize_rng_states(["cuda", "axon"])  # one process: the state stays
    assert torch.equal(torch.axon.get_rng_state(), state)
    # (across ranks: Accelerate's test script, test_accelerate_test_command_passes_on_axon)


def test_trainer_checkpoint_keeps_axon_rng(tmp_path):
    """The Trainer's checkpoint RNG file carries the axon generator, and resuming restores it."""
    from transformers import Trainer, TrainingArguments

    args = TrainingArguments(output_dir=str(tmp_path), report_to="none")
    trainer = Trainer(model=_RegressionModel(), args=args)
    torch.axon.manual_seed(11)
    torch.rand(3, device="axon")  # a generator that moved on from its seed
    trainer._save_rng_state(str(tmp_path / "checkpoint"))
    want = torch.rand(5, device="axon").cpu()
    states = torch.load(tmp_path / "checkpoint" / "rng_state.pth", weights_only=False)
    assert "axon" in states
    torch.axon.manual_seed(12)
    trainer._load_rng_state(str(tmp_path / "checkpoint"))
    torch.testing.assert_close(torch.rand(5, device="axon").cpu(), want, rtol=0, atol=0)


def test_accelerator_save_and_load_state_keep_axon_rng(tmp_path):
    accelerator = Accelerator()
    accelerator.prepare(torch.nn.Linear(2, 2))
    torch.axon.manual_seed(3)
    accelerator.save_state(str(tmp_path))
    want = torch.rand(5, device="axon").cpu()
    torch.axon.manual_seed(4)
    accelerator.load_state(str(tmp_path))
    torch.testing.assert_close(torch.rand(5, device="axon").cpu(), want, rtol=0, atol=0)


# ------------------------------------------------------------ memory


def test_clear_device_cache_empties_axon_cache():
    from accelerate.utils.memory import clear_device_cache

    x = torch.ones(1 << 20, device="axon")
    torch.axon.synchronize()
    before = torch.axon.memory_reserved()
    del x
    clear_device_cache()
    assert torch.axon.memory_reserved() <= before - 4 * (1 << 20)


def test_get_max_memory_sees_axon_devices(caplog):
    import psutil
    from accelerate.utils import get_max_memory

    budget = get_max_memory()
    count = torch.axon.device_count()
    assert list(budget)[:count] == list(range(count)) and "cpu" in budget
    assert budget[0] == torch.axon.mem_get_info(0)[0]
    assert budget["cpu"] <= max(0, psutil.virtual_memory().available - sum(budget[i] for i in range(count)))
    given = {1: "10MiB", "cpu": "1GB", 0: 1000}
    with caplog.at_level("WARNING"):
        ordered = get_max_memory(given)
    assert list(ordered.items()) == [(0, 1000), (1, 10 << 20), ("cpu", 10**9)]
    # as upstream, the caller's strings are converted too (Transformers compares
    # the values of its max_memory with the budget's afterwards)
    assert given == {1: 10 << 20, "cpu": 10**9, 0: 1000}
    assert "not available" not in caplog.text
    with caplog.at_level("WARNING"):
        get_max_memory({count: "1GB"})
    assert f"Device {count} is not available" in caplog.text


def test_grad_scaler_helper_returns_axon_scalers():
    from accelerate.utils import DistributedType, get_grad_scaler

    assert get_grad_scaler()._device == "axon"
    assert get_grad_scaler(DistributedType.FSDP)._device == "axon"


DEVICE_MAP_SCRIPT = textwrap.dedent("""
    import sys, torch
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=4,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                         tie_word_embeddings=False)
    LlamaForCausalLM(config).save_pretrained(sys.argv[1])
    cpu = LlamaForCausalLM.from_pretrained(sys.argv[1])
    model = LlamaForCausalLM.from_pretrained(sys.argv[1], device_map="auto")
    devices = sorted({str(p.device) for p in model.parameters()})
    print("DEVICES", " ".join(devices))
    ids = torch.tensor([[1, 17, 42, 9, 300]])
    want = cpu.generate(ids, max_new_tokens=6, do_sample=False, pad_token_id=0)
    got = model.generate(ids.to(model.device), max_new_tokens=6, do_sample=False, pad_token_id=0)
    print("SAME", torch.equal(got.cpu(), want))
""")


def test_device_map_auto_splits_a_model_across_axon_devices(tmp_path):
    """A ~12 MB model on 4 MiB devices: placed across several axon devices, same tokens as the CPU."""
    (tmp_path / "load.py").write_text(DEVICE_MAP_SCRIPT)
    out = _cli([sys.executable, "load.py", str(tmp_path / "model")], tmp_path,
               AXON_NUM_DEVICES="8", AXON_DEVICE_MEMORY="4MiB")
    assert out.returncode == 0, out.stderr[-4000:]
    devices = next(line.split()[1:] for line in out.stdout.splitlines() if line.startswith("DEVICES"))
    assert len(devices) >= 3 and all(d.startswith("axon:") for d in devices), devices
    assert "SAME True" in out.stdout
