"""Where each op runs on axon: the op table.

Every axon kernel registration in ``csrc/aten`` goes through one registrar
(``csrc/aten/Registry.h``), which records the op, its path, its family and its
source file; ``torch_axon._C._op_table()`` returns those records.  This module
adds what the registrar does not see (PyTorch's own PrivateUse1 kernels for the
c10d collectives, and the ops that reach the boxed fallback) and prints the
table::

    python -m torch_axon.ops                       # every op: op, path, family, file
    python -m torch_axon.ops --path fallback       # only the ops that run in the fallback
    python -m torch_axon.ops --family indexing
    python -m torch_axon.ops --markdown docs/OPS.md

Paths (docs/ARCHITECTURE.md, "csrc/aten: where an op runs"):

* ``structural``: tier 1, allocation, views, resizing, copies;
* ``native stream kernel``: an unboxed kernel for the op, whose host side
  checks the arguments and enqueues ATen's CPU kernel as stream work;
* ``synchronous kernel``: an unboxed kernel that waits for the stream and runs
  ATen's CPU kernel on the host (result shapes that depend on device data);
* ``generic stream kernel``: the boxed kernel driven by the op's Meta kernel;
* ``fused kernel``: our kernels from ``kernels/`` (or a composition of axon ops);
* ``collective``: PyTorch's c10d kernels, which call the axon process group;
* ``torch kernel``: kernels other PyTorch libraries register for PrivateUse1
  when imported (FSDP's ``fsdp::`` copy ops): absent from a fresh ``import torch``;
* ``fallback``: ops with a CPU kernel and no axon or composite kernel, which
  run synchronously on the CPU over host views of the device memory.
"""

from __future__ import annotations

import argparse
import sys
from typing import NamedTuple

PATHS = ("structural", "native stream kernel", "synchronous kernel", "generic stream kernel",
         "fused kernel", "collective", "torch kernel", "fallback")

_FALLBACK_FILE = "csrc/aten/Fallback.cpp"
_COLLECTIVE_FILE = "csrc/distributed/ (torch's c10d kernels)"
# Kernels that serve every backend, so an op with one never reaches the fallback.
_COMPOSITE_KEYS = ("CompositeExplicitAutograd", "CompositeExplicitAutogradNonFunctional",
                   "CompositeImplicitAutograd")


class OpRow(NamedTuple):
    op: str       # "aten::add.Tensor"; "aten::rms_norm[AutogradPrivateUse1]" for other keys
    path: str
    family: str
    file: str


def _registrations(key: str) -> list[str]:
    import torch

    return list(torch._C._dispatch_get_registrations_for_dispatch_key(key))


def _load():
    import torch  # noqa: F401

    import torch_axon

    torch_axon._autoload()
    from torch_axon import _C

    return _C


def op_table() -> list[OpRow]:
    """Every op with an axon kernel, and every op that reaches the fallback, sorted by op."""
    _C = _load()
    rows: list[OpRow] = []
    ours: set[str] = set()
    for op, key, path, family, file in _C._op_table():
        name = op if "::" in op else f"aten::{op}"  # aten's ops are recorded unqualified
        if key == "PrivateUse1":
            ours.add(name)
        else:
            name = f"{name}[{key}]"
        rows.append(OpRow(name, path, family, file))
    registered = set(_registrations("PrivateUse1"))
    for name in sorted(registered - ours):
        if name.startswith("c10d::"):
            rows.append(OpRow(name, "collective", "distributed", _COLLECTIVE_FILE))
        elif not name.startswith("aten::"):
            namespace = name.split("::")[0]
            rows.append(OpRow(name, "torch kernel", namespace, f"(torch's {namespace} library)"))
        else:  # a PrivateUse1 kernel the registrar did not record: shown, and the test fails
            rows.append(OpRow(name, "unrecorded", "?", "?"))
    served = set(registered)
    for key in _COMPOSITE_KEYS:
        served.update(_registrations(key))
    for name in sorted(set(_registrations("CPU")) - served):
        rows.append(OpRow(name, "fallback", "-", _FALLBACK_FILE))
    return sorted(rows, key=lambda r: r.op)


def _select(rows: list[OpRow], path: str | None, family: str | None) -> list[OpRow]:
    if path is not None:
        wanted = path.lower()
        matches = [p for p in PATHS if p == wanted or p.split()[0] == wanted]
        if not matches:
            raise SystemExit(f"unknown path {path!r}; one of: {', '.join(PATHS)}")
        rows = [r for r in rows if r.path == matches[0]]
    if family is not None:
        rows = [r for r in rows if r.family == family]
    return rows


def format_text(rows: list[OpRow]) -> str:
    """One line per op, columns aligned, no header: grep-able."""
    if not rows:
        return ""
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    return "".join(
        f"{r.op:<{widths[0]}}  {r.path:<{widths[1]}}  {r.family:<{widths[2]}}  {r.file}\n"
        for r in rows)


def format_markdown(rows: list[OpRow]) -> str:
    """docs/OPS.md."""
    counts = {p: sum(1 for r in rows if r.path == p) for p in PATHS}
    families = sorted({r.family for r in rows if r.file.startswith("csrc/aten/ops/")})
    lines = [
        "# Where each op runs on axon",
        "",
        "Generated by `python -m torch_axon.ops --markdown docs/OPS.md` from the kernel",
        "registrations (`csrc/aten/Registry.h`); `tests/ops/test_op_table.py` fails when it is",
        "out of date. `python -m torch_axon.ops --path fallback` (or `--family indexing`) prints",
        "the same table as plain text. Paths (docs/ARCHITECTURE.md, \"csrc/aten: where an op",
        "runs\"):",
        "",
        "- **structural**: tier 1, allocation, views, resizing, copies.",
        "- **native stream kernel**: an unboxed kernel for the op: the host checks the arguments",
        "  (the op's structured meta function, or checks written out) and enqueues ATen's CPU",
        "  kernel as stream work.",
        "- **synchronous kernel**: an unboxed kernel that waits for the stream and runs ATen's",
        "  CPU kernel on the host: ops whose result shape depends on device data.",
        "- **generic stream kernel**: the boxed kernel driven by the op's Meta kernel",
        "  (`csrc/aten/GenericKernel.cpp`), also stream work.",
        "- **fused kernel**: our kernels from `kernels/` (ATen's CPU kernel, as stream work, for",
        "  inputs they do not take), or a composition of axon ops (the RNN cells).",
        "- **collective**: PyTorch's c10d kernels, which call the axon process group.",
        "- **torch kernel**: kernels other PyTorch libraries register for PrivateUse1 when",
        "  they are imported (FSDP's `fsdp::` copy ops); none after a plain `import torch`,",
        "  which is what this file lists.",
        "- **fallback**: ops with a CPU kernel and no axon or composite kernel: they run",
        "  synchronously on the CPU over host views of device memory (`csrc/aten/Fallback.cpp`),",
        "  counted by `torch.axon.fallback_stats()`. Ops with only a composite kernel (most",
        "  functional and in-place forms, decompositions) are not listed: they run as the axon",
        "  ops they call. Those whose result would be a quantized or sparse tensor",
        "  (`quantize_per_tensor`, `_to_sparse`, ...) raise `NotImplementedError`: axon has",
        "  neither (nor any op on a sparse axon tensor: `SparsePrivateUse1` has only that error;",
        "  nor on a nested tensor of the strided layout: `NestedTensorPrivateUse1` has only such an",
        "  error, naming the jagged layout, which works).",
        "",
        "Ops registered for another dispatch key than PrivateUse1 carry it in brackets.",
        "Autocast's op policies (`AutocastPrivateUse1`, `csrc/aten/Autocast.cpp`) cast and",
        "redispatch, so they are not a path.",
        "",
        "| path | ops |",
        "| --- | --- |",
    ]
    lines += [f"| {p} | {counts[p]} |" for p in PATHS]
    lines += ["", "Families (one file each under `csrc/aten/ops/`): " +
              ", ".join(f"`{f}`" for f in families) + ".", ""]
    lines += ["| op | path | family | file |", "| --- | --- | --- | --- |"]
    lines += [f"| `{r.op}` | {r.path} | {r.family} | `{r.file}` |" for r in rows]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m torch_axon.ops",
        description="Where each op runs on axon: op, path, family, source file.")
    parser.add_argument("--path", help=f"only this path ({', '.join(PATHS)}; or its first word)")
    parser.add_argument("--family", help="only this family (elementwise, reduction, ...)")
    parser.add_argument("--markdown", metavar="FILE",
                        help="write the whole table as Markdown to FILE ('-': stdout)")
    args = parser.parse_args(argv)
    rows = op_table()
    if args.markdown is not None:
        if args.path is not None or args.family is not None:
            parser.error("--markdown writes the whole table; it takes no filters")
        text = format_markdown(rows)
        if args.markdown == "-":
            sys.stdout.write(text)
        else:
            with open(args.markdown, "w", encoding="utf-8") as f:
                f.write(text)
        return 0
    sys.stdout.write(format_text(_select(rows, args.path, args.family)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
