"""Train a small Llama on axon with the Transformers Trainer, fully offline.

The task: two-digit addition written at a fixed width ("07+45=052"), six
problems per sequence.  The model is built from a config (random weights), the
character-level tokenizer is built in code, and nothing about devices is passed
to the Trainer: torch_axon's integrations make it choose axon by itself.

Then the checkpoint is saved, reloaded on the CPU and on axon
(``device_map="axon"``), and greedy generation must give the same tokens on
both.  Exits non-zero if the loss did not drop clearly or generations differ.

Run: ``make demo`` (or ``python examples/demo.py``).
"""

from __future__ import annotations

import os
import random
import sys
import time
import warnings
from pathlib import Path

import torch  # loads torch_axon through the torch.backends entry point

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import (AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM,
                          PreTrainedTokenizerFast, Trainer, TrainerCallback,
                          TrainingArguments, default_data_collator)
from transformers.trainer_callback import ProgressCallback
from transformers.utils import logging as hf_logging

OUT = Path(__file__).resolve().parent.parent / "demo_output"
STEPS = int(os.environ.get("AXON_DEMO_STEPS", "600"))
BATCH = 16
PROBLEMS_PER_SEQ = 6  # 1 BOS + 6 * len("07+45=052\n") = 61 tokens per sequence
SEED = 0


def make_tokenizer() -> PreTrainedTokenizerFast:
    """One token per character over the task's alphabet."""
    vocab = {t: i for i, t in enumerate(["<pad>", "<s>", "</s>", *"0123456789+=\n"])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), "isolated")
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>",
                                   eos_token="</s>", pad_token="<pad>")


def problem(rng: random.Random) -> tuple[str, str]:
    a, b = rng.randrange(100), rng.randrange(100)
    return f"{a:02d}+{b:02d}=", f"{a + b:03d}\n"


def make_dataset(tokenizer, n: int, rng: random.Random) -> list[dict]:
    """Rows of PROBLEMS_PER_SEQ problems; the loss is on the answers only."""
    rows = []
    for _ in range(n):
        ids, labels = [tokenizer.bos_token_id], [-100]
        for _ in range(PROBLEMS_PER_SEQ):
            question, answer = (tokenizer(s).input_ids for s in problem(rng))
            ids += question + answer
            labels += [-100] * len(question) + answer
        rows.append({"input_ids": ids, "labels": labels})
    return rows


class QuietProgress(ProgressCallback):
    """Trainer's progress bar, without printing every log dict under it."""

    def on_log(self, args, state, control, logs=None, **kwargs):
        pass


class WhereIsTraining(TrainerCallback):
    """Records the devices of parameters and gradients during training."""

    def __init__(self):
        self.devices: set[str] = set()

    def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
        for p in model.parameters():
            self.devices.add(p.device.type)
            if p.grad is not None:
                self.devices.add(p.grad.device.type)


def greedy(model, prompt_ids: torch.Tensor, new_tokens: int) -> tuple[torch.Tensor, float]:
    device = next(model.parameters()).device
    start = time.perf_counter()
    with torch.no_grad():
        out = model.generate(prompt_ids.to(device), attention_mask=torch.ones_like(prompt_ids).to(device),
                             max_new_tokens=new_tokens, do_sample=False, pad_token_id=0)
    return out[:, prompt_ids.shape[1]:].cpu(), time.perf_counter() - start


def main() -> int:
    warnings.filterwarnings("ignore")
    hf_logging.set_verbosity_error()
    torch.manual_seed(SEED)
    rng = random.Random(SEED)
    print(f"torch {torch.__version__} | axon available: {torch.axon.is_available()} "
          f"| devices: {torch.axon.device_count()}")

    tokenizer = make_tokenizer()
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=256, intermediate_size=512,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
                         max_position_embeddings=128, bos_token_id=1, eos_token_id=2,
                         pad_token_id=0)
    model = LlamaForCausalLM(config).to("axon")
    n_params = sum(p.numel() for p in model.parameters())
    print(f"model: Llama, {config.num_hidden_layers} layers, hidden {config.hidden_size}, "
          f"{n_params / 1e6:.2f}M parameters, on {next(model.parameters()).device}")

    train = make_dataset(tokenizer, STEPS * BATCH, rng)
    seq_len = len(train[0]["input_ids"])
    args = TrainingArguments(  # nothing device-related: the Trainer picks axon itself
        output_dir=str(OUT / "trainer"), max_steps=STEPS, per_device_train_batch_size=BATCH,
        learning_rate=1e-3, warmup_steps=STEPS // 10, lr_scheduler_type="cosine",
        weight_decay=0.0, logging_steps=10, save_strategy="no", report_to="none", seed=SEED,
        disable_tqdm=False)
    where = WhereIsTraining()
    trainer = Trainer(model=model, args=args, train_dataset=train, processing_class=tokenizer,
                      data_collator=default_data_collator, callbacks=[where])
    trainer.remove_callback(ProgressCallback)
    trainer.add_callback(QuietProgress)
    print(f"Trainer device: {trainer.args.device} (n_gpu={trainer.args.n_gpu})")
    failures = []
    if trainer.args.device.type != "axon":
        failures.append(f"Trainer chose {trainer.args.device}, not axon")

    torch.axon.reset_peak_memory_stats()
    torch.axon.reset_fallback_stats()
    start = time.perf_counter()
    result = trainer.train()
    train_seconds = time.perf_counter() - start
    train_tokens = STEPS * BATCH * seq_len
    losses = [log["loss"] for log in trainer.state.log_history if "loss" in log]
    if where.devices != {"axon"}:
        failures.append(f"parameters/gradients lived on {sorted(where.devices)} during training")
    if not losses[-1] < 0.6 * losses[0]:
        failures.append(f"loss did not drop clearly: {losses[0]:.3f} -> {losses[-1]:.3f}")

    hf_logging.disable_progress_bar()  # no bars for saving and loading
    trainer.save_model(str(OUT / "model"))  # weights, config and tokenizer
    cpu_model = AutoModelForCausalLM.from_pretrained(OUT / "model").eval()
    axon_model = AutoModelForCausalLM.from_pretrained(OUT / "model", device_map="axon").eval()
    model.eval()

    tests = [problem(rng) for _ in range(64)]
    prompts = torch.tensor([tokenizer(tokenizer.bos_token + q).input_ids for q, _ in tests])
    new = len(tests[0][1])
    cpu_out, _ = greedy(cpu_model, prompts, new)
    axon_out, gen_seconds = greedy(axon_model, prompts, new)
    trained_out, _ = greedy(model, prompts, new)
    if not torch.equal(cpu_out, axon_out) or not torch.equal(cpu_out, trained_out):
        failures.append("greedy generation differs between CPU and axon")
    answers = tokenizer.batch_decode(axon_out)
    correct = sum(ans == a for ans, (_, a) in zip(answers, tests))

    sample_prompt = tokenizer(tokenizer.bos_token + tests[0][0]).input_ids
    sample, _ = greedy(axon_model, torch.tensor([sample_prompt]), 4 * len("07+45=052\n"))
    stats = torch.axon.fallback_stats()

    print()
    print(f"loss            {losses[0]:.3f} (step {args.logging_steps}) -> {losses[-1]:.3f} "
          f"(step {STEPS}); curve: " + " ".join(f"{l:.2f}" for l in losses[::max(1, len(losses) // 8)]))
    print(f"training        {STEPS} steps x {BATCH} x {seq_len} tokens in {train_seconds:.1f}s "
          f"= {train_tokens / train_seconds:,.0f} tokens/s (Trainer: {result.metrics['train_runtime']:.1f}s)")
    print(f"generation      {prompts.shape[0]} x {new} new tokens in {gen_seconds:.2f}s "
          f"= {prompts.shape[0] * new / gen_seconds:,.0f} tokens/s (batched greedy, KV cache)")
    print(f"greedy CPU==axon {'yes' if torch.equal(cpu_out, axon_out) else 'NO'} "
          f"(trained model and reloaded checkpoint, {prompts.shape[0]} prompts); "
          f"sums right: {correct}/{len(tests)}")
    print("sample on axon  " + repr(tests[0][0] + tokenizer.decode(sample[0])))
    print(f"memory peak     {torch.axon.max_memory_allocated() / 2**20:.1f} MiB (axon)")
    top = sorted(stats.items(), key=lambda kv: -kv[1])[:3]
    print(f"CPU fallback    {sum(stats.values()):,} op calls, {len(stats)} distinct ops; most: "
          + ", ".join(f"{k.removeprefix('aten::')} {v:,}" for k, v in top))
    print(f"checkpoint      {OUT / 'model'}")
    if failures:
        print("\nFAILED: " + "; ".join(failures))
        return 1
    print("\nOK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
