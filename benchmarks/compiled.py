"""torch.compile on axon: compiled vs eager generate and training, axon vs cpu, and compile time.

    .venv/bin/python benchmarks/compiled.py [--repeats 3] [--batch-sizes 1,8] [--new-tokens 128]
    .venv/bin/python benchmarks/compiled.py --only generate|train|compile-time
    .venv/bin/python benchmarks/compiled.py --quick          # tiny model, few tokens: a smoke run

The model of generate.py and train_step.py (LlamaForCausalLM from a LlamaConfig, random
init, 56.4M parameters; --quick: the tiny one), the same weights on cpu and axon.

generate: for each batch size, random prompts of --prompt-len tokens,
model.generate(do_sample=False, min_new_tokens=max_new_tokens=--new-tokens,
cache_implementation="static"), four variants: axon compiled (compile_config=
CompileConfig(backend="axon", fullgraph=False, dynamic=False); Transformers compiles the
decoding step itself on axon), axon eager (disable_compile=True, same model), cpu eager
(disable_compile=True) and cpu compiled (CompileConfig(backend="inductor", ...) with the
private flag _compile_all_devices=True, without which Transformers does not compile on
cpu). The prefill (the prompt's forward) runs eagerly in every variant. One untimed
warmup generate per variant (for a compiled one the first call compiles, by default into
an empty Inductor cache (--warm-cache: the usual one): its time is reported as "first
call incl. compile"), then --repeats timed generates per variant,
alternating cpu, axon, cpu, axon, ...; each timed from a drained device to
torch.axon.synchronize() after generate returns. tokens/s = batch x new tokens / seconds
(prefill included, as in generate.py). A logits processor drains the device when the
first token's logits arrive (one synchronize per generate) to split the time into the
first token (prefill) and the decode steps: decode ms/token = (total - first token) /
(new tokens - 1). Greedy tokens are compared: axon compiled vs axon eager (must be
identical) and every variant vs cpu eager. Dynamo's counters check that the timed runs
compile nothing (no recompiles) and count graph breaks.

train: the step of train_step.py (loss = model(input_ids, labels=input_ids).loss;
backward; AdamW(lr=1e-3, weight_decay=0.01), torch's default implementation; zero_grad)
on --train-batch x --train-seq random tokens, four variants from the same init on the
same batches: torch.compile(model) (Inductor, the default backend; the optimizer step
stays eager) and the eager model, on axon and on cpu. One untimed warmup step per
variant (compiled: incl. compile), then --repeats timed steps per variant, interleaved.
Losses of all steps are compared.

compile-time: this script run twice as a child process (sys.executable), compiling the
decode step of the axon model (one compiled generate of a few tokens, batch 1) with a
fresh TORCHINDUCTOR_CACHE_DIR (cold: an empty temporary directory) and then the same
directory again (warm: Inductor's FX-graph and AOTAutograd caches hit; Dynamo still
traces). Each child reports the time of its first compiled generate, of a second one,
and torch._dynamo.utils.counters' cache hits/misses.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import copy
import json
import os
import subprocess
import sys
import shlex
import shutil
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as C  # noqa: E402
from generate import compare  # noqa: E402
from train_step import make_optimizer, train_step  # noqa: E402

CHILD_TAG = "COMPILED_CHILD_RESULT "


# ---------------------------------------------------------------- dynamo counters


def counters_snapshot() -> dict[str, dict[str, int]]:
    from torch._dynamo.utils import counters
    return {k: dict(v) for k, v in counters.items()}


def counters_delta(before: dict, after: dict) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for cat, vals in after.items():
        prev = before.get(cat, {})
        d = {k: v - prev.get(k, 0) for k, v in vals.items() if v - prev.get(k, 0)}
        if d:
            out[cat] = d
    return out


def compile_summary(delta: dict) -> str:
    """Frames compiled, graphs, graph breaks, Inductor/AOTAutograd cache hits from a counters delta."""
    if not delta:
        return "nothing compiled"
    fr, st = delta.get("frames", {}), delta.get("stats", {})
    ind, aot = delta.get("inductor", {}), delta.get("aot_autograd", {})
    gb = delta.get("graph_break", {})
    parts = [f"{fr.get('total', 0)} frame(s) compiled ({fr.get('ok', 0)} ok)",
             f"{st.get('unique_graphs', 0)} graph(s)",
             f"{sum(gb.values())} graph break(s)",
             f"fx-graph cache {ind.get('fxgraph_cache_hit', 0)} hit/{ind.get('fxgraph_cache_miss', 0)} miss",
             f"aot-autograd cache {aot.get('autograd_cache_hit', 0)} hit/{aot.get('autograd_cache_miss', 0)} miss"]
    return ", ".join(parts)


def graph_break_reasons(delta: dict, limit: int = 5) -> list[str]:
    gb = delta.get("graph_break", {})
    items = sorted(gb.items(), key=lambda kv: -kv[1])
    return [f"x{n}: {' '.join(str(r).split())[:300]}" for r, n in items[:limit]]


def prime_inductor() -> float:
    """Compile a tiny function on cpu and axon: Inductor's one-time import/initialisation
    would otherwise land in whichever variant compiles first."""
    t = time.perf_counter()
    for d in C.DEVICES:
        f = torch.compile(lambda x: (x * 2 + 1).sum(), dynamic=False)
        f(torch.ones(8, device=d))
        C.sync(d)
    return time.perf_counter() - t


def ensure_recompile_limit(entries: int) -> str:
    """Every variant's compiled forward is one cache entry of the same code object
    (LlamaForCausalLM.forward's wrapper); Dynamo gives up compiling beyond recompile_limit."""
    cfg = torch._dynamo.config
    if entries + 2 > cfg.recompile_limit:
        old = cfg.recompile_limit
        cfg.recompile_limit = entries + 2
        return f"torch._dynamo.config.recompile_limit raised {old} -> {cfg.recompile_limit}"
    return ""


# ---------------------------------------------------------------- generate


def compile_config(backend: str, mode: str | None, all_devices: bool):
    from transformers.generation.configuration_utils import CompileConfig
    kw = {} if mode is None else {"mode": mode}
    cfg = CompileConfig(backend=backend, fullgraph=False, dynamic=False, **kw)
    if all_devices:
        cfg._compile_all_devices = True
    return cfg


def first_token_clock(device: str):
    """A logits processor that records when the first token's logits are ready (device drained)."""
    from transformers.generation.logits_process import LogitsProcessor

    class FirstTokenClock(LogitsProcessor):
        def __init__(self) -> None:
            self.t: float | None = None

        def __call__(self, input_ids, scores):
            if self.t is None:
                C.sync(device)
                self.t = time.perf_counter()
            return scores
    return FirstTokenClock()


def run_generate(model, prompts: torch.Tensor, device: str, new_tokens: int, gen_kwargs: dict):
    """(new tokens on cpu, seconds, seconds to the first token)."""
    from transformers.generation.logits_process import LogitsProcessorList
    ids = prompts.to(device)
    mask = torch.ones_like(ids)
    clock = first_token_clock(device)
    C.sync(device)
    t = time.perf_counter()
    out = model.generate(input_ids=ids, attention_mask=mask, do_sample=False,
                         max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                         pad_token_id=0, eos_token_id=2, cache_implementation="static",
                         logits_processor=LogitsProcessorList([clock]), **gen_kwargs)
    C.sync(device)
    end = time.perf_counter()
    first = (clock.t if clock.t is not None else end) - t
    return out[:, prompts.shape[1]:].cpu(), end - t, first


GEN_VARIANTS = ("cpu eager", "axon eager", "cpu compiled", "axon compiled")  # cpu/axon alternating


def gen_variant_kwargs(a) -> dict[str, dict]:
    return {"axon compiled": {"compile_config": compile_config("axon", a.mode, all_devices=False)},
            "axon eager": {"disable_compile": True},
            "cpu eager": {"disable_compile": True},
            "cpu compiled": {"compile_config": compile_config("inductor", a.mode, all_devices=True)}}


def bench_generate(a, dims, dtype) -> None:
    from transformers.generation.configuration_utils import CompileConfig
    batch_sizes = [int(b) for b in str(a.batch_sizes).split(",")]
    note = ensure_recompile_limit(2 * len(batch_sizes))
    models = C.build_models(dims, dtype, a.seed, max_positions=max(2048, a.prompt_len + a.new_tokens))
    for m in models.values():
        m.eval()
    n_params = sum(p.numel() for p in models["cpu"].parameters())
    mode = a.mode if a.mode is not None else CompileConfig().mode
    print(f"## generate\n\nmodel: {C.describe_dims(dims)}: {n_params / 1e6:.1f}M parameters, "
          f"{C.dtype_name(dtype)}, attention {models['cpu'].config._attn_implementation}; prompt "
          f"{a.prompt_len} tokens, {a.new_tokens} new tokens, greedy, static cache; compiled: "
          f"CompileConfig(backend='axon' | 'inductor', fullgraph=False, dynamic=False, mode={mode!r}) "
          f"('reduce-overhead' replays axon graphs on axon; the CPU has none)" + (f"; {note}" if note else ""))
    prime = prime_inductor()
    print(f"Inductor primed with a tiny compiled function on cpu and axon first: {prime:.1f} s\n", flush=True)

    kwargs = gen_variant_kwargs(a)
    dev_of = {v: v.split()[0] for v in GEN_VARIANTS}
    g = torch.Generator().manual_seed(a.seed)
    rows, ratio_rows, findings = [], [], []
    for batch in batch_sizes:
        prompts = torch.randint(3, dims["vocab"], (batch, a.prompt_len), generator=g)
        outs = {v: [] for v in GEN_VARIANTS}
        times = {v: [] for v in GEN_VARIANTS}
        firsts = {v: [] for v in GEN_VARIANTS}
        warm, warm_compile = {}, {}
        for v in GEN_VARIANTS:  # warmup: compiles the compiled variants; tokens checked too
            before = counters_snapshot()
            out, sec, _ = run_generate(models[dev_of[v]], prompts, dev_of[v], a.new_tokens, kwargs[v])
            warm_compile[v] = counters_delta(before, counters_snapshot())
            warm[v] = sec
            outs[v].append(out)
            print(f"  batch {batch}: {v} first call {sec:.2f}s", file=sys.stderr, flush=True)
        fallbacks = {v: C.FallbackCounter() for v in GEN_VARIANTS if dev_of[v] == "axon"}
        before = counters_snapshot()
        for r in range(a.repeats):
            for v in GEN_VARIANTS:
                d = dev_of[v]
                with fallbacks.get(v, contextlib.nullcontext()):  # axon variants count fallbacks
                    out, sec, first = run_generate(models[d], prompts, d, a.new_tokens, kwargs[v])
                outs[v].append(out)
                times[v].append(sec)
                firsts[v].append(first)
            print(f"  batch {batch} repeat {r + 1}/{a.repeats}: "
                  + ", ".join(f"{v} {times[v][-1]:.2f}s" for v in GEN_VARIANTS), file=sys.stderr, flush=True)
        timed_compile = counters_delta(before, counters_snapshot())

        tok = batch * a.new_tokens
        med = {v: C.median(times[v]) for v in GEN_VARIANTS}
        decode = {v: C.median([(t - f) / (a.new_tokens - 1) for t, f in zip(times[v], firsts[v])])
                  if a.new_tokens > 1 else float("nan") for v in GEN_VARIANTS}
        ref = outs["cpu eager"][0]
        for v in ("axon compiled", "axon eager", "cpu compiled", "cpu eager"):
            eqs = [compare(o, ref) for o in outs[v]]
            same = all(e[0] == e[1] for e in eqs)
            worst = min(eqs, key=lambda e: e[0])
            rows.append([batch, v, C.fmt_time(warm[v]), C.fmt_time(med[v]), f"{tok / med[v]:,.0f}",
                         f"{C.median(firsts[v]) * 1e3:.1f}", f"{decode[v] * 1e3:.2f}",
                         "yes" if same else f"NO ({worst[0]}/{worst[1]}, first diff at {worst[2]})"])
        # axon compiled vs axon eager: every compiled run against every eager run's first
        eager_ref = outs["axon eager"][0]
        ce = [compare(o, eager_ref) for o in outs["axon compiled"]]
        ce_same = all(e[0] == e[1] for e in ce)
        w = min(ce, key=lambda e: e[0])
        findings.append(f"batch {batch}: greedy tokens axon compiled vs axon eager: "
                        + ("identical in all runs" if ce_same else
                           f"DIFFERENT (worst run {w[0]}/{w[1]} equal, first difference at new token {w[2]})")
                        + f" ({len(ce)} runs)")
        x = "axon compiled"
        ratio_rows.append([batch,
                           f"{med['axon eager'] / med[x]:.2f}x", f"{med['cpu compiled'] / med[x]:.2f}x",
                           f"{med['cpu eager'] / med[x]:.2f}x",
                           f"{decode['axon eager'] / decode[x]:.2f}x", f"{decode['cpu compiled'] / decode[x]:.2f}x",
                           f"{decode['cpu eager'] / decode[x]:.2f}x",
                           f"{med['cpu eager'] / med['cpu compiled']:.2f}x"])
        for v in GEN_VARIANTS:
            if "compiled" in v:
                findings.append(f"batch {batch}: {v} first call: {compile_summary(warm_compile[v])}")
                findings += [f"    graph break {s}" for s in graph_break_reasons(warm_compile[v])]
        findings.append(f"batch {batch}: during the timed runs (all variants): "
                        + ("nothing compiled (no recompiles)" if not timed_compile.get("frames") else
                           "RECOMPILED: " + compile_summary(timed_compile)))
        for v, fb in fallbacks.items():
            findings.append(f"batch {batch}: {v} fallback ops per generated token step: "
                            f"{fb.summary(per=a.repeats * a.new_tokens, limit=12)}")

    print()
    C.print_table(["batch", "variant", "first call incl. compile", "median time", "tokens/s",
                   "first token ms", "decode ms/token", "tokens = cpu eager"],
                  rows, align=["r", "l"] + ["r"] * 5 + ["l"])
    print(f"median of {a.repeats} timed generates per variant after one warmup (the first call); "
          f"tokens/s = batch x new tokens / seconds (prefill included); first token = prefill until "
          f"the first logits; decode ms/token = (time - first token) / (new tokens - 1).\n")
    print("ratios of axon compiled (tokens/s ratio = other variant's time / axon compiled's; > 1: axon "
          "compiled faster):")
    C.print_table(["batch", "vs axon eager", "vs cpu compiled", "vs cpu eager",
                   "decode vs axon eager", "decode vs cpu compiled", "decode vs cpu eager",
                   "cpu compiled vs cpu eager"], ratio_rows)
    for f in findings:
        print(f)
    print(flush=True)


# ---------------------------------------------------------------- train


TRAIN_VARIANTS = ("cpu eager", "axon eager", "cpu compiled", "axon compiled")


def bench_train(a, dims, dtype) -> None:
    torch._dynamo.reset()  # the generate section's compiled code is of no use here
    torch.manual_seed(a.seed)
    base = C.build_models(dims, dtype, a.seed, max_positions=max(2048, a.train_seq))
    models = {"cpu eager": base["cpu"], "axon eager": base["axon"],
              "cpu compiled": copy.deepcopy(base["cpu"]),
              "axon compiled": copy.deepcopy(base["cpu"]).to("axon")}
    opts, calls = {}, {}
    for v, m in models.items():
        m.train()
        opts[v] = make_optimizer(m, "default", a.lr)
        calls[v] = torch.compile(m) if "compiled" in v else m
    dev_of = {v: v.split()[0] for v in TRAIN_VARIANTS}
    n_params = sum(p.numel() for p in base["cpu"].parameters())
    print(f"## train step\n\nmodel: {C.describe_dims(dims)}: {n_params / 1e6:.1f}M parameters, "
          f"{C.dtype_name(dtype)}; batch {a.train_batch} x {a.train_seq} tokens; AdamW torch default "
          f"(cpu: for-loop, axon: foreach), eager in every variant; compiled: torch.compile(model) "
          f"(Inductor, default options)\n", flush=True)

    g = torch.Generator().manual_seed(a.seed)
    batches = [torch.randint(3, dims["vocab"], (a.train_batch, a.train_seq), generator=g)
               for _ in range(1 + a.repeats)]
    losses = {v: [] for v in TRAIN_VARIANTS}
    times = {v: [] for v in TRAIN_VARIANTS}
    warm, warm_compile = {}, {}
    for v in TRAIN_VARIANTS:  # warmup step (compiled: incl. compile); part of the training run
        d = dev_of[v]
        ids = batches[0].to(d)
        before = counters_snapshot()
        sec = C.timed(lambda: losses[v].append(train_step(calls[v], opts[v], ids)), d)
        warm_compile[v] = counters_delta(before, counters_snapshot())
        warm[v] = sec
        print(f"  train: {v} first step {sec:.2f}s", file=sys.stderr, flush=True)
    fallbacks = {v: C.FallbackCounter() for v in TRAIN_VARIANTS if dev_of[v] == "axon"}
    before = counters_snapshot()
    for r in range(a.repeats):
        for v in TRAIN_VARIANTS:
            d = dev_of[v]
            ids = batches[1 + r].to(d)

            def step():
                losses[v].append(train_step(calls[v], opts[v], ids))
            with fallbacks.get(v, contextlib.nullcontext()):  # axon variants count fallbacks
                times[v].append(C.timed(step, d))
        print(f"  train repeat {r + 1}/{a.repeats}: "
              + ", ".join(f"{v} {times[v][-1] * 1e3:.0f} ms" for v in TRAIN_VARIANTS),
              file=sys.stderr, flush=True)
    timed_compile = counters_delta(before, counters_snapshot())

    tokens = a.train_batch * a.train_seq
    med = {v: C.median(times[v]) for v in TRAIN_VARIANTS}
    lv = {v: [float(x) for x in losses[v]] for v in TRAIN_VARIANTS}
    ref = lv["cpu eager"]
    rows = []
    for v in ("axon compiled", "axon eager", "cpu compiled", "cpu eager"):
        diff = max(abs(x - y) for x, y in zip(lv[v], ref))
        rows.append([v, C.fmt_time(warm[v]), f"{med[v] * 1e3:,.0f}", f"{tokens / med[v]:,.0f}",
                     f"{lv[v][-1]:.6f}", f"{diff:.2e}"])
    print()
    C.print_table(["variant", "first step incl. compile", "median ms/step", "tokens/s", "last loss",
                   "max |loss - cpu eager|"], rows, align=["l"] + ["r"] * 5)
    print(f"median of {a.repeats} timed steps per variant after one warmup step; all variants from the "
          f"same init on the same {len(batches)} batches.\n")
    C.print_table(["ratio (time of the other / time of the compiled; > 1: compiled faster)", "value"],
                  [["axon compiled vs axon eager", f"{med['axon eager'] / med['axon compiled']:.2f}x"],
                   ["cpu compiled vs cpu eager", f"{med['cpu eager'] / med['cpu compiled']:.2f}x"],
                   ["axon compiled vs cpu compiled", f"{med['cpu compiled'] / med['axon compiled']:.2f}x"],
                   ["axon eager vs cpu eager", f"{med['cpu eager'] / med['axon eager']:.2f}x"]])
    for dev in C.DEVICES:
        c, e = lv[f"{dev} compiled"], lv[f"{dev} eager"]
        d = [abs(x - y) for x, y in zip(c, e)]
        print(f"losses {dev} compiled vs {dev} eager: largest |diff| {max(d):.2e} (step {d.index(max(d)) + 1} "
              f"of {len(d)}), relative {max(d) / abs(e[d.index(max(d))]):.1e}")
    for v in TRAIN_VARIANTS:
        print(f"losses per step, {v + ':':14} " + " ".join(f"{x:.4f}" for x in lv[v]))
    for v in TRAIN_VARIANTS:
        if "compiled" in v:
            print(f"{v} first step: {compile_summary(warm_compile[v])}")
            for s in graph_break_reasons(warm_compile[v]):
                print(f"    graph break {s}")
    print("during the timed steps (all variants): "
          + ("nothing compiled (no recompiles)" if not timed_compile.get("frames") else
             "RECOMPILED: " + compile_summary(timed_compile)))
    for v, fb in fallbacks.items():
        print(f"{v} fallback ops per step: {fb.summary(per=a.repeats, limit=12)}")
    print(flush=True)


# ---------------------------------------------------------------- compile time


def compile_child(a, dims, dtype) -> None:
    """In the child process: the first compiled generate on axon, timed; results as one JSON line."""
    t_start = time.perf_counter()
    models = C.build_models(dims, dtype, a.seed, max_positions=max(2048, a.prompt_len + a.new_tokens))
    model = models["axon"].eval()
    del models["cpu"]
    t_built = time.perf_counter()
    prompts = torch.randint(3, dims["vocab"], (1, a.prompt_len), generator=torch.Generator().manual_seed(a.seed))
    kw = gen_variant_kwargs(a)["axon compiled"]
    before = counters_snapshot()
    _, first, _ = run_generate(model, prompts, "axon", a.new_tokens, kw)
    delta = counters_delta(before, counters_snapshot())
    _, second, _ = run_generate(model, prompts, "axon", a.new_tokens, kw)
    print(CHILD_TAG + json.dumps({"first": first, "second": second, "build": t_built - t_start,
                                  "counters": delta, "summary": compile_summary(delta),
                                  "cache_dir": os.environ.get("TORCHINDUCTOR_CACHE_DIR")}), flush=True)


def bench_compile_time(a) -> None:
    tokens = min(a.new_tokens, 8)
    args = [sys.executable, os.path.abspath(__file__), "--compile-child", "--new-tokens", str(tokens),
            "--prompt-len", str(a.prompt_len), "--dtype", a.dtype, "--seed", str(a.seed)]
    if a.mode is not None:
        args += ["--mode", a.mode]
    if a.quick:
        args.append("--quick")
    for k in ("hidden", "layers", "heads", "kv_heads", "intermediate", "vocab"):
        if getattr(a, k) is not None:
            args += [f"--{k.replace('_', '-')}", str(getattr(a, k))]
    print(f"## compile time (first compiled generate on axon in a fresh process)\n\n"
          f"child: python {shlex.join([os.path.relpath(args[1]), *args[2:]])}"
          f" (batch 1, {tokens} new tokens), TORCHINDUCTOR_CACHE_DIR = a new temporary directory, then the same "
          f"one again\n", flush=True)
    rows = []
    with tempfile.TemporaryDirectory(prefix="axon_compile_cache_") as cache:
        env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache}
        env.pop("TORCHINDUCTOR_FORCE_DISABLE_CACHES", None)
        for label in ("cold", "warm"):
            t = time.perf_counter()
            proc = subprocess.run(args, env=env, capture_output=True, text=True)
            wall = time.perf_counter() - t
            res = next((json.loads(line[len(CHILD_TAG):]) for line in proc.stdout.splitlines()
                        if line.startswith(CHILD_TAG)), None)
            if proc.returncode != 0 or res is None:
                print(f"{label} child FAILED (exit {proc.returncode}); its stderr, last lines:")
                print("\n".join(proc.stderr.splitlines()[-30:]))
                return
            print(f"  compile-time: {label} first call {res['first']:.2f}s", file=sys.stderr, flush=True)
            ind = res["counters"].get("inductor", {})
            aot = res["counters"].get("aot_autograd", {})
            rows.append([label, f"{res['first']:.2f}", f"{res['second'] * 1e3:.1f} ms",
                         f"{res['first'] - res['second']:.2f}", f"{wall:.1f}",
                         f"{ind.get('fxgraph_cache_hit', 0)} / {ind.get('fxgraph_cache_miss', 0)}",
                         f"{aot.get('autograd_cache_hit', 0)} / {aot.get('autograd_cache_miss', 0)}",
                         res["counters"].get("frames", {}).get("total", 0)])
    C.print_table(["cache", "first compiled generate s", "second generate", "compile overhead s",
                   "child process s", "fx-graph cache hit / miss", "aot-autograd cache hit / miss",
                   "frames compiled"], rows, align=["l"] + ["r"] * 7)
    if len(rows) == 2:
        cold, warmv = float(rows[0][1]), float(rows[1][1])
        print(f"first compiled generate: cold {cold:.2f} s, warm {warmv:.2f} s ({cold / warmv:.1f}x faster "
              f"warm); both include Dynamo's tracing and Inductor's one-time initialisation in a fresh process; "
              f"compile overhead = first - second generate; child process s includes python start, imports "
              f"and model construction.")
    print(flush=True)


# ---------------------------------------------------------------- main


def main() -> None:
    p = C.make_parser(__doc__, quick="tiny model, few tokens: a smoke run")
    p.add_argument("--only", choices=["generate", "train", "compile-time"], action="append",
                   help="run only this part (repeatable; default: all three)")
    p.add_argument("--repeats", type=int, default=None,
                   help="timed generates / train steps per variant (3; quick 1)")
    p.add_argument("--batch-sizes", default=None, help="generate: comma-separated (1,8; quick 1,2)")
    p.add_argument("--new-tokens", type=int, default=None, help="generate: new tokens (128; quick 8)")
    p.add_argument("--prompt-len", type=int, default=None, help="generate: prompt tokens (32; quick 8)")
    p.add_argument("--train-batch", type=int, default=None, help="train: sequences per step (8; quick 2)")
    p.add_argument("--train-seq", type=int, default=None, help="train: tokens per sequence (256; quick 32)")
    p.add_argument("--mode", default=None,
                   help="generate: CompileConfig mode (default: Transformers' default, 'reduce-overhead')")
    p.add_argument("--dtype", default="float32", help="float32 or bfloat16")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--warm-cache", action="store_true",
                   help="compile with Inductor's usual cache directory (TORCHINDUCTOR_CACHE_DIR or "
                        "/tmp/torchinductor_$USER), so first calls may reuse earlier compiles; default: "
                        "a new empty one, removed at exit (the compile-time part always uses its own)")
    p.add_argument("--compile-child", action="store_true", help=argparse.SUPPRESS)
    C.add_model_args(p)
    C.add_common_args(p)
    a = p.parse_args()
    C.resolve_defaults(a, dict(repeats=(1, 3), batch_sizes=("1,2", "1,8"), new_tokens=(8, 128),
                               prompt_len=(8, 32), train_batch=(2, 8), train_seq=(32, 256)))
    dtype = C.parse_dtype(a.dtype)
    dims = C.model_dims(a)
    if a.compile_child:
        compile_child(a, dims, dtype)
        return
    C.apply_malloc_reuse(a)
    parts = a.only or ["generate", "train", "compile-time"]
    if not a.warm_cache:
        fresh = tempfile.mkdtemp(prefix="axon_bench_inductor_")
        atexit.register(shutil.rmtree, fresh, ignore_errors=True)
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = fresh
    torch.manual_seed(a.seed)
    C.print_header("compiled: torch.compile vs eager on axon and cpu (generate, train step, compile time)", a)
    if "generate" in parts or "train" in parts:
        print("inductor cache: " + (f"{os.environ.get('TORCHINDUCTOR_CACHE_DIR', 'default')} (--warm-cache: "
                                    f"first calls may reuse earlier compiles)" if a.warm_cache else
                                    "a new empty TORCHINDUCTOR_CACHE_DIR: every first call compiles cold")
              + "\n", flush=True)
    t = time.perf_counter()
    if "generate" in parts:
        bench_generate(a, dims, dtype)
    if "train" in parts:
        bench_train(a, dims, dtype)
    if "compile-time" in parts:
        bench_compile_time(a)
    print(f"total {time.perf_counter() - t:.0f} s; command: {C.command_line()}")


if __name__ == "__main__":
    main()
