"""The report: the console table (``print_table``), the totals and the
markdown of docs/COMPATIBILITY.md (``render_markdown``)."""
from __future__ import annotations

import datetime
import math
import os
import platform
import sys

import torch

from .checks import NEW_TOKENS, TOLERANCE, ArchResult, _trim
from .configs import (BATCH, EXPERT_INTERMEDIATE, EXPERTS, EXPERTS_PER_TOKEN, HEAD_DIM, HEADS,
                      HIDDEN, INPUT_HOOKS, INTERMEDIATE, KV_HEADS, LAYERS, MAX_POSITIONS,
                      NOT_STANDALONE, OVERRIDES, SEQ_LEN, VOCAB, WINDOW)



def _fmt_err(x: float | None) -> str:
    if x is None:
        return ""
    if x == 0:
        return "0"
    if math.isinf(x):
        return "inf"
    return f"{x:.1e}"


def _fmt_ops(ops: dict) -> str:
    if not ops:
        return ""
    return ", ".join(sorted(op.replace("aten::", "") for op in ops))


def _yesno(v: bool | None) -> str:
    return "" if v is None else ("yes" if v else "NO")


def totals(results: list[ArchResult]) -> dict:
    cpu_ok = [r for r in results if r.cpu_ok]
    axon_ok = [r for r in cpu_ok if r.axon_ok]
    zero_fb = [r for r in axon_ok if not r.fallback_fwd_bwd]
    zero_fb_all = [r for r in axon_ok if not r.fallback_fwd_bwd and not r.fallback_generate]
    return dict(total=len(results), cpu_ok=len(cpu_ok), axon_ok=len(axon_ok),
                zero_fallback=len(zero_fb), zero_fallback_all=len(zero_fb_all))


def fallback_census(results: list[ArchResult], with_names: bool = False) -> list[tuple]:
    """[(op, architectures hitting it in forward+backward, ... in generate)],
    most architectures first (over architectures that work on the CPU); with
    with_names, a fourth element lists those architectures."""
    fb, gen, names = {}, {}, {}
    for r in results:
        if not r.cpu_ok:
            continue
        for op in r.fallback_fwd_bwd:
            fb[op] = fb.get(op, 0) + 1
        for op in r.fallback_generate:
            gen[op] = gen.get(op, 0) + 1
        for op in set(r.fallback_fwd_bwd) | set(r.fallback_generate):
            names.setdefault(op, []).append(r.model_type)
    ops = set(fb) | set(gen)
    rows = sorted(((op, fb.get(op, 0), gen.get(op, 0)) for op in ops),
                  key=lambda t: (-max(t[1], t[2]), -t[1], t[0]))
    if with_names:
        rows = [row + (names[row[0]],) for row in rows]
    return rows


def _pct(a: int, b: int) -> str:
    return f"{100.0 * a / b:.0f}%" if b else "n/a"


def totals_lines(results: list[ArchResult]) -> list[str]:
    t = totals(results)
    if results and all(r.cpu == "not run" for r in results):  # --compiled-only
        return [f"- architectures enumerated: {t['total']} (CPU and axon checks not run)",
                *compiled_lines(results)]
    return [
        f"- architectures enumerated: {t['total']}",
        f"- work on CPU: {t['cpu_ok']}",
        f"- of those, work on axon (forward, training step and generate match): "
        f"{t['axon_ok']} ({_pct(t['axon_ok'], t['cpu_ok'])})",
        f"- of those, forward + backward with zero fallback ops: {t['zero_fallback']} "
        f"({_pct(t['zero_fallback'], t['cpu_ok'])} of the CPU-working ones)",
        f"- of those, also generate with zero fallback ops: {t['zero_fallback_all']}",
    ] + compiled_lines(results)


def compiled_totals(results: list[ArchResult]) -> dict:
    """Counts of the compiled column (over the architectures it ran for)."""
    ran = [r for r in results if r.compiled != "not run"]
    applies = [r for r in ran if r.compiled_applies]
    ok = [r for r in applies if r.compiled == "ok"]
    return dict(ran=len(ran), applies=len(applies), ok=len(ok),
                no_breaks=sum(1 for r in ok if r.compiled_breaks == 0),
                recompile_limit=sum(1 for r in applies if r.compiled_recompile_limit),
                na=sum(1 for r in ran if r.compiled.startswith("n/a")),
                skipped=sum(1 for r in ran if r.compiled == "skipped"),
                mismatch=sum(1 for r in applies if r.compiled == "mismatch"),
                error=sum(1 for r in applies if r.compiled.startswith("error(")))


def compiled_lines(results: list[ArchResult]) -> list[str]:
    """The compiled column's summary line (none if it did not run)."""
    c = compiled_totals(results)
    if not c["ran"]:
        return []
    line = (f"- compiled generate (static cache, `backend=\"axon\"`): {c['ok']}/{c['applies']} "
            f"compile with tokens equal to eager; {c['no_breaks']} with no graph breaks; "
            f"{c['recompile_limit']} reach Dynamo's recompile limit "
            f"({c['mismatch']} mismatch, {c['error']} error; {c['na']} n/a: cannot use "
            f"a static cache or not compiled by generate")
    if c["skipped"]:
        line += f"; {c['skipped']} skipped"
    return [line + ")"]


def print_table(results: list[ArchResult], out=None) -> None:
    out = out or sys.stdout
    with_compiled = any(r.compiled != "not run" for r in results)
    rows = [("architecture", "CPU", "axon", "max err")
            + (("compiled (graphs, breaks, s)",) if with_compiled else ())
            + ("fallback ops (fwd+bwd)",)]
    for r in results:
        ops = str(len(r.fallback_fwd_bwd))
        if r.fallback_fwd_bwd:
            ops += f": {_trim(_fmt_ops(r.fallback_fwd_bwd), 60)}"
        rows.append((r.model_type, _trim(r.cpu, 40), _trim(r.axon, 40),
                     _fmt_err(r.logits_err))
                    + ((_trim(_fmt_compiled(r), 60),) if with_compiled else ()) + (ops,))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    for row in rows:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths)) + "  " + row[-1], file=out)
    print(file=out)
    for line in totals_lines(results):
        print(line, file=out)
    out.flush()




def _fmt_compiled(r: ArchResult) -> str:
    """The compiled column in one cell: status (graphs, breaks, seconds); note."""
    if r.compiled == "not run":
        return ""
    text = r.compiled
    if r.compiled_graphs is not None and r.compiled_applies:
        text += (f" ({r.compiled_graphs} graph{'s' if r.compiled_graphs != 1 else ''}, "
                 f"{r.compiled_breaks} break{'s' if r.compiled_breaks != 1 else ''}, "
                 f"{r.compiled_seconds:.1f} s"
                 f"{', recompile limit' if r.compiled_recompile_limit else ''})")
    if r.compiled_note:
        text += f"; {r.compiled_note}"
    return text


def render_markdown(results: list[ArchResult], *, command: str, seconds: float,
                    dtype: torch.dtype, timeout: float, compile_timeout: float | None = None,
                    compiled_only: bool = False) -> str:
    """The report. timeout: the per-architecture limit of the eager checks;
    compile_timeout: the seconds added for the compiled column (None: it did
    not run); compiled_only: only the compiled column ran."""
    import transformers

    t = totals(results)
    with_compiled = any(r.compiled != "not run" for r in results)
    if compiled_only:
        limit = f"per-architecture limit {compile_timeout or 0:g} s, compiled column only"
    elif compile_timeout is not None:
        limit = (f"per-architecture limit {timeout:g} s + {compile_timeout:g} s for the "
                 "compiled column")
    else:
        limit = f"per-architecture limit {timeout:g} s"
    lines = [
        "# Causal-LM compatibility of axon",
        "",
        "<!-- Generated file: do not edit by hand. -->",
        f"Generated by `{command}` on {datetime.date.today().isoformat()} "
        f"(torch {torch.__version__}, transformers {transformers.__version__}, "
        f"Python {platform.python_version()}, {os.cpu_count()} cores; "
        f"{seconds / 60:.1f} min, {limit}).",
        "Regenerate with `python -m tools.compat --output docs/COMPATIBILITY.md` from the "
        "repository root (see `tools/compat/README.md`).",
        "",
        "Every causal-LM architecture registered in Transformers "
        "(`MODEL_FOR_CAUSAL_LM_MAPPING_NAMES`) is built from its config class with a "
        "tiny random-initialised config and run on the CPU and on axon with the same "
        f"weights and inputs ({dtype_name(dtype)}):",
        f"forward logits (batch {BATCH} x {SEQ_LEN}, left padding, attention mask; "
        f"tolerance {TOLERANCE.get(dtype, 1e-4):g} abs + rel), one training step "
        "(loss and every gradient, same tolerance) and greedy `generate()` of "
        f"{NEW_TOKENS} tokens (identical tokens). \"Works\" means all three pass.",
        *([("Compiled column (`--compiled`): on axon, the same greedy `generate()` with "
            "`cache_implementation=\"static\"`, eagerly (`disable_compile=True`) and with "
            "`compile_config=CompileConfig(backend=\"axon\", fullgraph=False, "
            "dynamic=False)` (Transformers compiles the decoding step); the tokens must be "
            "identical (see \"Compiled generate\" below).")] if with_compiled else []),
        "",
        "## Totals",
        "",
        *totals_lines(results),
        "",
        f"Target: every architecture that works on CPU works on axon "
        f"({t['axon_ok']}/{t['cpu_ok']}); at least 90% of them run forward and "
        f"backward with no fallback ({_pct(t['zero_fallback'], t['cpu_ok'])}).",
        "",
        "## Tiny configs",
        "",
        "From `CONFIG_MAPPING[model_type]()` defaults, recursively in sub-configs: "
        f"width {HIDDEN}, {LAYERS} layers (more for hybrid models: the first layer of each "
        f"distinct combination of per-layer types), {HEADS} heads, {KV_HEADS} key/value "
        f"heads (1 if multi-query), head size {HEAD_DIM} (multi-head latent attention: "
        f"rope 8 + nope 16), feed-forward {INTERMEDIATE}, expert feed-forward "
        f"{EXPERT_INTERMEDIATE}, {EXPERTS} experts with {EXPERTS_PER_TOKEN} per token, "
        f"at most 1 shared expert / dense prefix layer / expert group, state-space "
        f"heads x head size = expand x width, state size 16, vocabulary {VOCAB} (special "
        f"ids outside it moved to its top ids; inputs avoid special ids), "
        f"{MAX_POSITIONS} positions, windows and top-k token selections {WINDOW}, "
        "dropouts 0, rope scaling as is. The config class is called with the changed "
        "values only, so its derived fields and validation run on the new sizes. "
        "Attention: sdpa where supported, else eager (column \"attn\"). "
        "Details: `tools/compat/README.md`.",
        "",
    ]
    if OVERRIDES:
        lines += ["Per-architecture overrides (applied after the generic rules; `@layers`: "
                  "default layers kept, `@config`: sub-config used as the model config):", "",
                  "| architecture | why | override |", "| --- | --- | --- |"]
        for mt, ov in sorted(OVERRIDES.items()):
            items = ", ".join(f"`{k}={v!r}`" for k, v in ov.items() if k != "@why")
            lines.append(f"| {mt} | {_md(ov.get('@why', ''))} | {_md(items)} |")
        lines.append("")
    if INPUT_HOOKS:
        lines += ["Input changes: " + "; ".join(
            f"{mt}: {_md(' '.join((fn.__doc__ or fn.__name__).split()))}"
            for mt, fn in sorted(INPUT_HOOKS.items())) + ".", ""]
    if NOT_STANDALONE:
        lines += ["Not run (not standalone language models): " + "; ".join(
            f"{mt} ({why})" for mt, why in sorted(NOT_STANDALONE.items())) + ".", ""]
    lines += [
        "## Per architecture",
        "",
        "Fallback ops: ops that ran through the CPU fallback on axon (`aten::` "
        "omitted).",
        "",
        "| architecture | model class | attn | params | CPU | axon | max logit err | "
        "grads ok (max err) | generate tokens equal | fallback ops (forward+backward) | "
        "fallback ops (generate) | "
        + ("compiled (graphs, breaks, s) | " if with_compiled else "") + "s |",
        "| --- | --- | --- | ---: | --- | --- | ---: | --- | --- | --- | --- | "
        + ("--- | " if with_compiled else "") + "---: |",
    ]
    for r in results:
        tok = _yesno(r.tokens_equal) + (f" ({r.tokens_note})" if r.tokens_note else "")
        lines.append(
            f"| {r.model_type} | {r.model_class} | {r.attn} | {r.params:,} | "
            f"{_md(r.cpu)} | {_md(r.axon)} | {_fmt_err(r.logits_err)} | "
            f"{_yesno(r.grads_ok)}{f' ({_fmt_err(r.grad_err)})' if r.grad_err is not None else ''} | {tok} | {_fmt_ops(r.fallback_fwd_bwd)} | "
            f"{_fmt_ops(r.fallback_generate)} | "
            + (f"{_md(_fmt_compiled(r))} | " if with_compiled else "") + f"{r.seconds:.1f} |")
    census = fallback_census(results, with_names=True)
    lines += [
        "",
        "## Fallback ops across architectures",
        "",
        "Distinct ops that ran through the CPU fallback, with the number of "
        "(CPU-working) architectures that hit each: implement the top ones first. "
        "An architecture that failed on axon counts the ops it reached.",
        "",
        "| op | architectures (forward+backward) | architectures (generate) | which |",
        "| --- | ---: | ---: | --- |",
    ]
    for op, n_fb, n_gen, which in census:
        shown = ", ".join(which[:6]) + (f", ... ({len(which) - 6} more)" if len(which) > 6 else "")
        lines.append(f"| {op} | {n_fb} | {n_gen} | {shown} |")
    if not census:
        lines.append("| (none) | | | |")
    failing = [r for r in results if r.cpu_ok and not r.axon_ok]
    not_cpu = [r for r in results if not r.cpu_ok]
    lines += ["", "## Working on CPU but not on axon", "",
              "Grouped by the axon result (stage and first line of the error).", ""]
    groups: dict[str, list[str]] = {}
    for r in failing:
        groups.setdefault(r.axon, []).append(r.model_type)
    lines += [f"- {_md(status)} ({len(names)}): {', '.join(names)}"
              for status, names in sorted(groups.items(), key=lambda kv: -len(kv[1]))] \
        or ["(none)"]
    lines += ["", "## Not working on CPU (excluded from the axon totals)", ""]
    lines += [f"- {r.model_type}: {_md(r.cpu)}" for r in not_cpu] or ["(none)"]
    if with_compiled:
        lines += compiled_section(results)
    return "\n".join(lines) + "\n"


def compiled_section(results: list[ArchResult]) -> list[str]:
    """The report's "Compiled generate" section: what the column means, then the
    architectures that are not "ok" grouped by status, and the graph breaks."""
    c = compiled_totals(results)
    ran = [r for r in results if r.compiled != "not run"]
    declared = [r for r in ran if r.compiled_applies and r.fullgraph_declared]
    lines = [
        "", "## Compiled generate", "",
        "Column \"compiled\": on axon, greedy `generate()` as above with "
        "`cache_implementation=\"static\"`, once eagerly (`disable_compile=True`) and once "
        "with `compile_config=CompileConfig(backend=\"axon\", fullgraph=False, "
        "dynamic=False)`: the prefill runs eagerly, the decoding step is compiled. "
        "\"ok\": identical tokens (or a tie at the first difference, as above, on the "
        "eager run's scores); graphs: graphs Dynamo compiled "
        "(`counters[\"stats\"][\"unique_graphs\"]`, Dynamo reset before each "
        "architecture); breaks: graph breaks; s: the compiled `generate()` including "
        "compilation (Inductor's on-disk caches as they were). \"n/a\": the model "
        "cannot use a static cache (the static-cache eager run fails on the CPU too) or "
        "`generate()` does not compile it (its cache is not a compilable one); those are "
        "left out of the count. \"recompile limit\": Dynamo recompiled the decoding step "
        "until `torch._dynamo.config.recompile_limit` (8) and ran the later steps eagerly "
        "(shapes or Python-int cache state that change every step). On a failure, a "
        "mismatch, graph breaks or the recompile limit the same compiled generate runs "
        "on the CPU with Inductor (`compile_config._compile_all_devices = True`) as the "
        "control: its outcome follows the status (\"CPU Inductor: ...\").",
        "",
        *compiled_lines(results),
        f"- architectures whose class declares `_can_compile_fullgraph`: "
        f"{len(declared)}/{c['applies']}; of those, with graph breaks: "
        f"{sum(1 for r in declared if r.compiled_breaks)}",
        "",
    ]
    groups: dict[str, list[str]] = {}
    for r in ran:
        if r.compiled == "ok":
            continue
        key = r.compiled + (f" [{r.compiled_note}]" if r.compiled_note else "")
        groups.setdefault(key, []).append(r.model_type)
    lines += ["Not \"ok\", grouped by status (errors: stage and first line; "
              "[the CPU Inductor control]):", ""]
    lines += [f"- {_md(status)} ({len(names)}): {', '.join(names)}"
              for status, names in sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0]))] \
        or ["(none)"]
    broken = [r for r in ran if r.compiled_applies and r.compiled_breaks]
    lines += ["", "Graph breaks (architectures that compiled with breaks; reasons; "
              "[the CPU Inductor control]):", ""]
    lines += [f"- {r.model_type} ({r.compiled_breaks} breaks, {r.compiled_graphs} graphs): "
              + _md("; ".join(f"{why} (x{n})" for why, n in r.compiled_break_reasons.items()))
              + (f" [{_md(r.compiled_note)}]" if r.compiled_note else "")
              for r in broken] or ["(none)"]
    limited: dict[str, list[str]] = {}
    for r in ran:
        if r.compiled_applies and r.compiled_recompile_limit:
            key = (f"{r.compiled_graphs} graphs, {r.compiled_breaks} breaks"
                   + (f" [{r.compiled_note}]" if r.compiled_note else ""))
            limited.setdefault(key, []).append(r.model_type)
    lines += ["", "Recompile limit reached, grouped by (graphs, breaks [the CPU Inductor "
              "control]):", ""]
    lines += [f"- {_md(key)} ({len(names)}): {', '.join(names)}"
              for key, names in sorted(limited.items(), key=lambda kv: (-len(kv[1]), kv[0]))] \
        or ["(none)"]
    return lines


def _md(s: str) -> str:
    return s.replace("|", "/").replace("\n", " ")


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")

