"""Train a small Llama on axon with the Transformers Trainer, fully offline.

The task: two-digit addition at a fixed width ("07+45=052"), six problems per
sequence, loss on the answers.  The model is built from a config (random
weights), the character-level tokenizer is built in code, and nothing about
devices is given to the Trainer: torch_axon's integrations make it pick axon.

The checkpoint is then saved, reloaded on the CPU and on axon
(``device_map="axon"``), and greedy generation must give the same tokens on
both.  Exits non-zero if the loss did not drop clearly, training left axon, or
generations differ.

Run: ``make demo`` (or ``python examples/demo.py``; AXON_DEMO_STEPS=n to change
the number of training steps).
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
from transformers import (AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM,
                          PreTrainedTokenizerFast, Trainer, TrainerCallback, TrainingArguments,
                          default_data_collator)
from transformers.trainer_callback import ProgressCallback
from transformers.utils import logging as hf_logging

OUT = Path(__file__).resolve().parent.parent / "demo_output"
STEPS = int(os.environ.get("AXON_DEMO_STEPS", "1000"))
BATCH = 16
PROBLEMS_PER_SEQ = 6  # 1 BOS + 6 * len("07+45=052\n") = 61 tokens per sequence
SEED = 0


def make_tokenizer() -> PreTrainedTokenizerFast:
    """One token per character of the task's alphabet."""
    vocab = {t: i for i, t in enumerate(["<pad>", "<s>", "</s>", *"0123456789+=\n"])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), "isolated")
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                                   pad_token="<pad>")


def problem(rng: random.Random) -> tuple[str, str]:
    a, b = rng.randrange(100), rng.randrange(100)
    return f"{a:02d}+{b:02d}=", f"{a + b:03d}\n"


def make_dataset(tokenizer, n: int, rng: random.Random) -> list[dict]:
    """Rows of PROBLEMS_PER_SEQ problems; the labels keep the answers only."""
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
    """Trainer's progress bar, without a printed dict under it at every log."""

    def on_log(self, args, state, control, logs=None, **kwargs):
        pass


class WhereIsTraining(TrainerCallback):
    """Collects the device types of parameters, gradients and AdamW state."""

    def __init__(self):
        self.devices: set[str] = set()

    def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
        for p in model.parameters():
            self.devices.update({p.device.type, p.grad.device.type})

    def on_optimizer_step(self, args, state, control, optimizer=None, **kwargs):
        for st in optimizer.state.values():
            self.devices.update({st["exp_avg"].device.type, st["exp_avg_sq"].device.type})


def greedy(model, prompts: torch.Tensor, new_tokens: int) -> tuple[torch.Tensor, float]:
    """The new tokens of greedy generation (on the CPU), and the seconds it took."""
    device = model.device
    start = time.perf_counter()
    with torch.no_grad():
        out = model.generate(prompts.to(device), attention_mask=torch.ones_like(prompts).to(device),
                             max_new_tokens=new_tokens, do_sample=False, pad_token_id=0)
    out = out[:, prompts.shape[1]:].cpu()
    return out, time.perf_counter() - start


def main() -> int:
    warnings.filterwarnings("ignore")
    hf_logging.set_verbosity_error()
    torch.manual_seed(SEED)
    rng = random.Random(SEED)
    failures = []

    tokenizer = make_tokenizer()
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=256, intermediate_size=512,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
                         max_position_embeddings=64, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    model = LlamaForCausalLM(config).to("axon")
    print(f"model   Llama, {config.num_hidden_layers} layers, hidden {config.hidden_size}, "
          f"{model.num_parameters() / 1e6:.2f}M parameters, on {model.device}")

    train_rows = make_dataset(tokenizer, STEPS * BATCH, rng)
    seq_len = len(train_rows[0]["input_ids"])
    args = TrainingArguments(  # nothing device-related: the Trainer picks axon by itself
        output_dir=str(OUT / "trainer"), max_steps=STEPS, per_device_train_batch_size=BATCH,
        learning_rate=1e-3, warmup_steps=STEPS // 10, lr_scheduler_type="cosine",
        weight_decay=0.0, logging_steps=10, save_strategy="no", report_to="none", seed=SEED,
        disable_tqdm=False)  # the progress bar, though Transformers logs errors only
    where = WhereIsTraining()
    trainer = Trainer(model=model, args=args, train_dataset=train_rows, processing_class=tokenizer,
                      data_collator=default_data_collator, callbacks=[where])
    trainer.remove_callback(ProgressCallback)
    trainer.add_callback(QuietProgress)
    print(f"trainer picked {trainer.args.device}; {STEPS} steps of {BATCH} x {seq_len} tokens", flush=True)
    if trainer.args.device.type != "axon":
        failures.append(f"the Trainer chose {trainer.args.device}, not axon")

    torch.axon.reset_peak_memory_stats()
    torch.axon.reset_fallback_stats()
    start = time.perf_counter()
    trainer.train()
    train_seconds = time.perf_counter() - start
    sys.stderr.flush()
    losses = [log["loss"] for log in trainer.state.log_history if "loss" in log]
    if where.devices != {"axon"}:
        failures.append(f"parameters, gradients or optimizer state on {sorted(where.devices)}")
    if not losses[-1] < 0.5 * losses[0]:
        failures.append(f"the loss did not drop clearly: {losses[0]:.3f} -> {losses[-1]:.3f}")

    # Save, then reload the checkpoint (weights, config, tokenizer) on the CPU and on axon.
    hf_logging.disable_progress_bar()
    trainer.save_model(str(OUT / "model"))
    tokenizer = AutoTokenizer.from_pretrained(OUT / "model")
    cpu_model = AutoModelForCausalLM.from_pretrained(OUT / "model").eval()
    axon_model = AutoModelForCausalLM.from_pretrained(OUT / "model", device_map="axon").eval()
    model.eval()

    tests = [problem(rng) for _ in range(64)]  # new problems, mostly unseen in training
    prompts = torch.tensor([[tokenizer.bos_token_id] + tokenizer(q).input_ids for q, _ in tests])
    new = len(tests[0][1])
    cpu_out, _ = greedy(cpu_model, prompts, new)
    axon_out, _ = greedy(axon_model, prompts, new)
    trained_out, _ = greedy(model, prompts, new)
    same = torch.equal(cpu_out, axon_out) and torch.equal(cpu_out, trained_out)
    if not same:
        failures.append("greedy generation differs between the CPU and axon")
    _, batched_seconds = greedy(axon_model, prompts, new)  # timed again, warm
    start = time.perf_counter()
    for row in prompts[:16]:
        greedy(axon_model, row[None], new)
    single_seconds = time.perf_counter() - start
    answers = tokenizer.batch_decode(axon_out)
    right = [ans == a for ans, (_, a) in zip(answers, tests)]
    stats = torch.axon.fallback_stats()

    step = max(1, len(losses) // 5)
    shown = sorted({*range(0, len(losses), step), len(losses) - 1})
    print(f"loss    {losses[0]:.3f} at step {args.logging_steps} -> {losses[-1]:.3f} at step {STEPS}  "
          f"(every {step * args.logging_steps} steps: " + " ".join(f"{losses[i]:.2f}" for i in shown) + ")")
    print(f"train   {STEPS * BATCH * seq_len / train_seconds:,.0f} tokens/s ({train_seconds:.1f}s); "
          f"parameters, gradients, AdamW state on: {', '.join(sorted(where.devices))}")
    print(f"greedy  {prompts.shape[0] * new / batched_seconds:,.0f} tokens/s batched "
          f"({prompts.shape[0]} prompts), {16 * new / single_seconds:,.0f} tokens/s one prompt at a time")
    print(f"check   reloaded on CPU == reloaded on axon == trained model: "
          f"{'same tokens' if same else 'DIFFERENT tokens'} for {prompts.shape[0]} prompts")
    print(f"sample  {sum(right)}/{len(tests)} sums right on axon: "
          + "  ".join(f"{q}{a.strip()} {'ok' if r else 'wrong'}"
                      for (q, _), a, r in list(zip(tests, answers, right))[:4]))
    print(f"memory  peak {torch.axon.max_memory_allocated() / 2**20:.1f} MiB allocated on axon")
    top = sorted(stats.items(), key=lambda kv: -kv[1])[:3]
    most = ", ".join(f"{k.removeprefix('aten::')} {v:,}" for k, v in top)
    print(f"fallback {sum(stats.values()):,} op calls through the synchronous CPU fallback, "
          f"{len(stats)} distinct ops, training + generation" + (f" (most: {most})" if top else ""))
    print(f"saved   {OUT / 'model'}")
    if failures:
        print("FAILED: " + "; ".join(failures))
        return 1
    print("OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
