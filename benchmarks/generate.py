"""Greedy generation tokens/s of a ~56M-parameter Llama: axon vs cpu, same weights, side by side.

    .venv/bin/python benchmarks/generate.py [--repeats 3] [--dtype bfloat16] [--batch-sizes 1,8]
    .venv/bin/python benchmarks/generate.py --quick          # tiny model, seconds
    .venv/bin/python benchmarks/generate.py --select auto,own,library,auto/worker  # axon's modes side by side

The model is a LlamaForCausalLM built from a LlamaConfig with random init (hidden 512,
8 layers, 8 heads, 4 kv heads, intermediate 1408, vocab 32000, untied embeddings), copied
to axon with the same weights. For each batch size: random prompts of --prompt-len tokens,
model.generate(do_sample=False, min_new_tokens=max_new_tokens=--new-tokens), dynamic cache
(the default). One untimed warmup generate per device, then --repeats timed ones,
alternating cpu, axon, cpu, axon, ...; each timed from a drained device to
torch.axon.synchronize() after generate returns (prefill included). tokens/s counts
generated tokens: batch x new tokens / seconds. The greedy tokens of every run are
compared between the devices. --select times axon once per kernel-selection mode (a row
each; see benchmarks/_common.py SELECT_HELP).
"""

from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as C  # noqa: E402


def generate(model, prompts: torch.Tensor, device: str, new_tokens: int) -> tuple[torch.Tensor, float]:
    """(the new tokens on cpu, seconds from a drained device to the device drained after generate)."""
    ids = prompts.to(device)
    mask = torch.ones_like(ids)
    out = []
    seconds = C.timed(lambda: out.append(model.generate(
        input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=new_tokens,
        min_new_tokens=new_tokens, pad_token_id=0, eos_token_id=2)), device)
    return out[0][:, prompts.shape[1]:].cpu(), seconds


def compare(a: torch.Tensor, b: torch.Tensor) -> tuple[int, int, int | None]:
    """(equal tokens, total tokens, first differing position or None)."""
    if a.shape != b.shape:
        return 0, max(a.numel(), b.numel()), 0
    eq = a == b
    bad = (~eq).any(0).nonzero()
    return int(eq.sum()), a.numel(), (int(bad[0]) if len(bad) else None)


def main() -> None:
    p = C.make_parser(__doc__, quick="tiny model, few tokens: a smoke run")
    p.add_argument("--repeats", type=int, default=None, help="timed generates per device (3; quick 1)")
    p.add_argument("--batch-sizes", default=None, help="comma-separated (1,8; quick 1,2)")
    p.add_argument("--new-tokens", type=int, default=None, help="generated tokens (128; quick 8)")
    p.add_argument("--prompt-len", type=int, default=None, help="prompt tokens (32; quick 8)")
    p.add_argument("--dtype", default="float32", help="float32 or bfloat16")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--profile", action="store_true",
                   help="torch.profiler over one axon generate per batch size: top ops by self CPU time")
    p.add_argument("--profile-rows", type=int, default=20)
    C.add_model_args(p)
    C.add_select_arg(p)
    C.add_common_args(p)
    a = p.parse_args()
    C.parse_select(p, a)
    C.apply_malloc_reuse(a)
    C.resolve_defaults(a, dict(repeats=(1, 3), batch_sizes=("1,2", "1,8"), new_tokens=(8, 128),
                               prompt_len=(8, 32)))
    batch_sizes = [int(b) for b in str(a.batch_sizes).split(",")]
    dtype = C.parse_dtype(a.dtype)
    dims = C.model_dims(a)
    torch.manual_seed(a.seed)

    C.print_header("generate: greedy decoding tokens/s, axon vs cpu", a)
    models = C.build_models(dims, dtype, a.seed, max_positions=max(2048, a.prompt_len + a.new_tokens))
    for m in models.values():
        m.eval()
    n_params = sum(p.numel() for p in models["cpu"].parameters())
    print(f"model: {C.describe_dims(dims)}: {n_params / 1e6:.1f}M parameters, {C.dtype_name(dtype)}, "
          f"attention {models['cpu'].config._attn_implementation}; prompt {a.prompt_len} tokens, "
          f"{a.new_tokens} new tokens, greedy, dynamic cache\n", flush=True)

    rows, checks, fallbacks = [], [], {}
    g = torch.Generator().manual_seed(a.seed)
    variants = C.select_variants(a)
    axon_variants = variants[1:]
    for batch in batch_sizes:
        prompts = torch.randint(3, dims["vocab"], (batch, a.prompt_len), generator=g)
        outs: dict[str, list[torch.Tensor]] = {v: [] for v in variants}
        for v in variants:  # warmup (its tokens are checked too; auto's first launches measure)
            with C.selected(v):
                outs[v].append(generate(models[C.device_of(v)], prompts, C.device_of(v),
                                        a.new_tokens)[0])

        def measure(v: str, r: int) -> float:
            with C.selected(v):
                out, sec = generate(models[C.device_of(v)], prompts, C.device_of(v), a.new_tokens)
            outs[v].append(out)
            return sec

        def progress(r: int, times: dict) -> None:
            print(f"  batch {batch}: " + ", ".join(f"{v} {times[v][-1]:.2f}s" for v in variants),
                  file=sys.stderr, flush=True)
        fallback = C.FallbackCounter()
        times = C.alternate(measure, a.repeats, devices=variants, fallback=fallback,
                            progress=progress)
        fallbacks[batch] = fallback
        tok = batch * a.new_tokens
        c = C.median(times["cpu"])
        for v in axon_variants:
            x = C.median(times[v])
            rows.append([batch, a.prompt_len, a.new_tokens, C.dtype_name(dtype),
                         v.partition(":")[2] or "auto", C.fmt_time(c), C.fmt_time(x),
                         f"{tok / c:,.0f}", f"{tok / x:,.0f}", f"{c / x:.2f}x",
                         f"{min(times['cpu']) / min(times[v]):.2f}x",
                         f"{c / a.new_tokens * 1e3:.1f}", f"{x / a.new_tokens * 1e3:.1f}"])
        # every axon run against the first cpu run; every cpu run against the first cpu run
        ref = outs["cpu"][0]
        eq_axon = [compare(o, ref) for v in axon_variants for o in outs[v]]
        eq_cpu = [compare(o, ref) for o in outs["cpu"][1:]]
        checks.append((batch, eq_axon, eq_cpu, len(ref.unique())))
        if a.profile:
            C.profile_axon(lambda: generate(models["axon"], prompts, "axon", a.new_tokens),
                           f"generate batch {batch}, {a.new_tokens} new tokens", rows=a.profile_rows, calls=1)

    print()
    C.print_table(["batch", "prompt", "new tokens", "dtype", "axon mode", "cpu time", "axon time",
                   "cpu tokens/s", "axon tokens/s", "axon/cpu tokens/s", "axon/cpu (best runs)",
                   "cpu ms/step", "axon ms/step"],
                  rows, align=["r", "r", "r", "l", "l"] + ["r"] * 8)
    print(f"median of {a.repeats} timed generates per device (and axon mode, --select) after one "
          f"warmup each; tokens/s = batch x "
          f"new tokens / seconds (prefill included); ms/step = seconds / new tokens.")
    all_same = True
    for batch, eq_axon, eq_cpu, distinct in checks:
        same = all(e[0] == e[1] for e in eq_axon)
        all_same &= same
        eq, tot, first = min(eq_axon, key=lambda e: e[0])
        detail = ("identical in all runs" if same else
                  f"DIFFERENT: worst run {eq}/{tot} tokens equal, first difference at new token {first}")
        cpu_stable = all(e[0] == e[1] for e in eq_cpu)
        print(f"greedy tokens, batch {batch}: axon vs cpu {detail} ({len(eq_axon)} axon runs; "
              f"{distinct} distinct token ids among the {eq_axon[0][1]} generated)"
              + ("" if cpu_stable else "; note: cpu runs differ among themselves"))
    print(f"greedy tokens identical on cpu and axon: {'yes' if all_same else 'NO'}")
    print("\nfallback ops during the timed axon generates (calls per generated token step):")
    for batch, fb in fallbacks.items():
        print(f"- batch {batch}: {fb.summary(per=a.repeats * a.new_tokens, limit=20)}")


if __name__ == "__main__":
    main()
