"""The command line: ``python -m tools.compat --output docs/COMPATIBILITY.md``
(options: ``--help``; what they mean: tools/compat/README.md)."""
from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import sys
import time

import torch

from .checks import COMPILE_TIMEOUT, DEFAULT_TIMEOUT, ArchResult, _trim, run_architecture
from .report import _fmt_compiled, _fmt_err, print_table, render_markdown
from .worker import HANG_GRACE, _capture_output, _lost_result, _Worker, worker


def all_model_types() -> list[str]:
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return list(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)


PROG = "python -m " + __package__  # python -m tools.compat


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog=PROG, description="Compatibility harness: every causal-LM architecture of the "
        "installed Transformers on the CPU and on axon (run from the repository root; "
        "see tools/compat/README.md).")
    ap.add_argument("--only", help="comma-separated model types")
    ap.add_argument("--limit", type=int, help="first N architectures only")
    out = ap.add_mutually_exclusive_group(required=True)
    out.add_argument("--output", metavar="PATH",
                     help="markdown report path, e.g. docs/COMPATIBILITY.md (required unless "
                          "--no-write)")
    out.add_argument("--no-write", action="store_true", help="do not write the report")
    ap.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT,
                    help="per-architecture time limit in seconds (0: none)")
    col = ap.add_mutually_exclusive_group()
    col.add_argument("--compiled", action="store_true",
                     help="also run the compiled column (static-cache generate, eager vs "
                          "torch.compile backend='axon')")
    col.add_argument("--compiled-only", action="store_true",
                     help="run only the compiled column (no CPU reference checks)")
    ap.add_argument("--compile-timeout", type=float, default=COMPILE_TIMEOUT,
                    help="seconds added to --timeout for the compiled column "
                         f"(default {COMPILE_TIMEOUT:g})")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    ap.add_argument("--device", default="axon")
    ap.add_argument("--in-process", action="store_true",
                    help="run the architectures in this process (no protection against hangs)")
    ap.add_argument("--save-results", metavar="JSON",
                    help="also write the raw per-architecture results to this file")
    ap.add_argument("--from-results", metavar="JSON",
                    help="do not run: render the report from a --save-results file")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)

    dtype = getattr(torch, args.dtype)
    if args.worker:  # --timeout is the whole limit here
        return worker(dtype, args.timeout, args.device, args.compiled, args.compiled_only)
    if args.from_results:
        return _render_saved(args)
    compiled = args.compiled or args.compiled_only
    # The limit of one architecture: the eager checks' plus compile time.
    timeout = args.timeout
    if args.compiled_only:
        timeout = args.compile_timeout if args.timeout else 0
    elif compiled and args.timeout:
        timeout = args.timeout + args.compile_timeout
    names = all_model_types()
    if args.only:
        wanted = [n.strip() for n in args.only.split(",") if n.strip()]
        unknown = [n for n in wanted if n not in names]
        if unknown:
            ap.error(f"unknown model types: {', '.join(unknown)}")
        names = wanted
    if args.limit:
        names = names[: args.limit]

    logging.getLogger("transformers").setLevel(logging.ERROR)
    start = time.perf_counter()
    results = []
    width = max(len(n) for n in names) if names else 10
    print(f"{len(names)} architectures, dtype {args.dtype}, timeout {timeout:g}s"
          f"{', compiled column' if args.compiled else ''}"
          f"{', compiled column only' if args.compiled_only else ''}"
          f"{', in process' if args.in_process else ''}", flush=True)
    pool = None
    try:
        for i, name in enumerate(names, 1):
            if args.in_process:
                with _capture_output():
                    r = run_architecture(name, dtype=dtype, timeout=timeout,
                                         device=args.device, compiled=args.compiled,
                                         compiled_only=args.compiled_only)
            else:
                if pool is None:
                    pool = _Worker(dtype, timeout, args.device, args.compiled,
                                   args.compiled_only)
                limit = (timeout or 3600) + HANG_GRACE
                t0 = time.perf_counter()
                r, stage, why = pool.run(name, limit)
                if r is None:
                    partial = pool.partial
                    pool.close()
                    pool = None
                    r = _lost_result(name, stage, why, time.perf_counter() - t0, partial,
                                     compiled)
            results.append(r)
            fb = len(r.fallback_fwd_bwd)
            line = f"[{i:3d}/{len(names)}] {name:<{width}} "
            if not args.compiled_only:
                line += (f"cpu={_trim(r.cpu, 70)} axon={_trim(r.axon, 70)} "
                         f"err={_fmt_err(r.logits_err)} fallback_ops={fb} ")
            if compiled:
                line += f"compiled={_trim(_fmt_compiled(r), 90)} "
            print(line + f"{r.seconds:.1f}s", flush=True)
    finally:
        if pool is not None:
            pool.close()
    seconds = time.perf_counter() - start
    print()
    print_table(results)
    print(f"\n{seconds:.0f} s in total")
    given = argv if argv is not None else sys.argv[1:]
    command = " ".join([PROG, *given])
    if args.save_results:
        with open(args.save_results, "w") as f:
            json.dump(dict(command=command, seconds=seconds, dtype=args.dtype,
                           timeout=args.timeout,
                           compile_timeout=args.compile_timeout if compiled else None,
                           compiled_only=args.compiled_only,
                           results=[dataclasses.asdict(r) for r in results]), f, indent=1)
    if not args.no_write:
        text = render_markdown(results, command=command, seconds=seconds,
                               dtype=dtype, timeout=args.timeout,
                               compile_timeout=args.compile_timeout if compiled else None,
                               compiled_only=args.compiled_only)
        os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
        with open(args.output, "w") as f:
            f.write(text)
        print(f"wrote {args.output}")
    return 0


def _render_saved(args) -> int:
    """--from-results: the report of a saved run (same command line, date of now)."""
    with open(args.from_results) as f:
        saved = json.load(f)
    results = [ArchResult(**d) for d in saved["results"]]
    print_table(results)
    if not args.no_write:
        text = render_markdown(results, command=saved["command"], seconds=saved["seconds"],
                               dtype=getattr(torch, saved["dtype"]), timeout=saved["timeout"],
                               compile_timeout=saved["compile_timeout"],
                               compiled_only=saved["compiled_only"])
        with open(args.output, "w") as f:
            f.write(text)
        print(f"wrote {args.output}")
    return 0

