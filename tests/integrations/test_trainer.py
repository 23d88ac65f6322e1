"""The Transformers Trainer on axon, with no device settings: where things live, and parity with CPU.

Parity tolerance: axon runs the same float32 CPU kernels (through the fallback),
so losses and weights are expected to agree to float32 rounding; the tests allow
rtol=1e-5, atol=1e-6 per step's loss and rtol=1e-5, atol=1e-5 on the trained
weights, and require greedy generation to give identical tokens.
"""

from __future__ import annotations

import copy

import pytest
import torch

transformers = pytest.importorskip("transformers")

from transformers import (LlamaConfig, LlamaForCausalLM, Trainer, TrainerCallback,  # noqa: E402
                          TrainingArguments, default_data_collator)

VOCAB, SEQ, N_SEQ, STEPS = 32, 16, 16, 4
LOSS_TOL = dict(rtol=1e-5, atol=1e-6)
WEIGHT_TOL = dict(rtol=1e-5, atol=1e-5)


pytestmark = pytest.mark.usefixtures("fresh_accelerate")


def tiny_config(**kw) -> LlamaConfig:
    return LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                       pad_token_id=0, bos_token_id=1, eos_token_id=2, **kw)


@pytest.fixture(scope="module")
def cpu_model() -> LlamaForCausalLM:
    """Tied input/output embeddings (as Qwen3 and Gemma have): moving to axon must keep them tied."""
    torch.manual_seed(0)
    model = LlamaForCausalLM(tiny_config(tie_word_embeddings=True)).eval()
    assert model.lm_head.weight is model.model.embed_tokens.weight
    return model


def dataset() -> list[dict]:
    """Counting sequences (3, 4, 5, ...) from random starts: learnable within a few steps."""
    starts = torch.randint(0, VOCAB - 3, (N_SEQ, 1), generator=torch.Generator().manual_seed(1))
    ids = (starts + torch.arange(SEQ)) % (VOCAB - 3) + 3
    return [{"input_ids": row, "labels": row} for row in ids]


class Where(TrainerCallback):
    """Collects the device types of parameters, gradients and optimizer state."""

    def __init__(self):
        self.params, self.grads, self.opt_state, self.steps_seen = set(), set(), set(), 0

    def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
        self.steps_seen += 1
        for p in model.parameters():
            self.params.add(p.device.type)
            assert p.grad is not None, "a parameter has no gradient before the optimizer step"
            self.grads.add(p.grad.device.type)

    def on_optimizer_step(self, args, state, control, model=None, optimizer=None, **kwargs):
        assert len(optimizer.state) == len(list(model.parameters()))
        for p in model.parameters():
            st = optimizer.state[p]
            for key in ("exp_avg", "exp_avg_sq"):
                self.opt_state.add(st[key].device.type)


class RecordingTrainer(Trainer):
    """Keeps every step's unrounded loss (log_history rounds to 4 decimals)."""

    def compute_loss(self, model, inputs, *args, **kwargs):
        out = super().compute_loss(model, inputs, *args, **kwargs)
        loss = out[0] if isinstance(out, tuple) else out
        self.step_losses.append(loss.detach().cpu().item())
        return out


def train(model, tmp_path, **args_kw):
    args = TrainingArguments(output_dir=str(tmp_path), max_steps=STEPS, per_device_train_batch_size=4,
                             learning_rate=1e-2, logging_steps=1, save_strategy="no",
                             report_to="none", seed=0, disable_tqdm=True, **args_kw)
    where = Where()
    trainer = RecordingTrainer(model=model, args=args, train_dataset=dataset(),
                               data_collator=default_data_collator, callbacks=[where])
    trainer.step_losses = []
    trainer.train()
    return trainer, where


def test_trainer_trains_on_axon(cpu_model, tmp_path):
    trainer, where = train(copy.deepcopy(cpu_model), tmp_path)
    assert trainer.args.device.type == "axon"
    assert where.steps_seen == STEPS
    assert where.params == {"axon"}
    assert where.grads == {"axon"}
    assert where.opt_state == {"axon"}
    assert next(trainer.model.parameters()).device.type == "axon"
    assert trainer.model.lm_head.weight is trainer.model.model.embed_tokens.weight


def test_trainer_loss_matches_cpu(cpu_model, tmp_path):
    on_cpu, _ = train(copy.deepcopy(cpu_model), tmp_path / "cpu", use_cpu=True)
    on_axon, _ = train(copy.deepcopy(cpu_model), tmp_path / "axon")
    assert on_cpu.args.device.type == "cpu" and on_axon.args.device.type == "axon"
    assert len(on_cpu.step_losses) == len(on_axon.step_losses) == STEPS
    assert on_cpu.step_losses[-1] < on_cpu.step_losses[0]  # it trained
    torch.testing.assert_close(torch.tensor(on_axon.step_losses), torch.tensor(on_cpu.step_losses),
                               **LOSS_TOL)
    cpu_weights = on_cpu.model.state_dict()
    for name, w in on_axon.model.state_dict().items():
        assert w.device.type == "axon", name
        torch.testing.assert_close(w.cpu(), cpu_weights[name], **WEIGHT_TOL, msg=name)


def test_trainer_bf16_autocasts_on_axon(cpu_model, tmp_path):
    """bf16=True: float32 master weights on axon, bfloat16 matmuls under axon autocast."""
    model = copy.deepcopy(cpu_model)
    dtypes = set()
    model.model.layers[0].mlp.up_proj.register_forward_hook(lambda m, i, out: dtypes.add(out.dtype))
    trainer, where = train(model, tmp_path, bf16=True)
    assert trainer.args.device.type == "axon"
    assert where.params == where.grads == where.opt_state == {"axon"}
    assert dtypes == {torch.bfloat16}
    assert all(p.dtype == torch.float32 for p in trainer.model.parameters())
    assert trainer.step_losses[-1] < trainer.step_losses[0]


def test_greedy_generate_matches_cpu(cpu_model):
    axon_model = copy.deepcopy(cpu_model).to("axon")
    prompts = torch.tensor([[1, 5, 9, 14, 3], [0, 0, 1, 7, 7]])  # second row left-padded
    mask = (prompts != 0).long()
    kw = dict(max_new_tokens=12, do_sample=False, pad_token_id=0)
    with torch.no_grad():
        expected = cpu_model.generate(prompts, attention_mask=mask, **kw)
        got = axon_model.generate(prompts.to("axon"), attention_mask=mask.to("axon"), **kw)
    assert got.device.type == "axon"
    assert torch.equal(got.cpu(), expected)


def test_to_axon_keeps_tied_weights(cpu_model):
    """Module.to() keeps Parameter objects (param.data = ...) when CPU and axon tensors are
    shallow-copy compatible; otherwise it makes new Parameters and unties shared weights."""
    model = copy.deepcopy(cpu_model)
    params = {name: id(p) for name, p in model.named_parameters()}
    model.to("axon")
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert model.lm_head.weight.device.type == "axon"
    assert {name: id(p) for name, p in model.named_parameters()} == params
    model.to("cpu")
    assert model.lm_head.weight is model.model.embed_tokens.weight
