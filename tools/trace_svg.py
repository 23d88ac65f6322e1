"""Renders a torch.profiler Chrome trace (export_chrome_trace) as an SVG timeline.

    python tools/trace_svg.py trace.json out.svg [--title TEXT]

Rows: each host thread's ops (nested ops stacked below their parent), then each axon
device's streams (kernels, copies, collectives); thin lines are the launch flows
(axonLaunchKernel on the host to the activity on the device).  No dependencies: for a
picture in docs/ where Perfetto (https://ui.perfetto.dev) is not at hand.
"""

from __future__ import annotations

import argparse
import html
import json

ROW = 18
LABEL = 170
WIDTH = 1400
COLORS = {"cpu_op": "#7aa6d8", "user_annotation": "#b9b9b9", "kernel": "#e39b4a",
          "gpu_memcpy": "#6cbf6c", "privateuse1_runtime": "#555555"}


def load(path):
    events = json.load(open(path))["traceEvents"]
    names = {}
    for e in events:
        if e.get("ph") == "M" and e.get("name") in ("process_name", "thread_name"):
            names[(e["name"], e["pid"], e.get("tid"))] = e["args"]["name"]
    slices = [e for e in events if e.get("ph") == "X" and e.get("cat") in COLORS]
    flows = {}
    for e in events:
        if e.get("ph") in ("s", "f") and e.get("cat") == "ac2g":
            flows.setdefault(e["id"], {})[e["ph"]] = e
    return slices, names, flows


def lanes(slices):
    """Host slices stacked by nesting depth per thread; device slices one lane per stream."""
    rows = {}  # (group, depth) -> list of slices
    for e in sorted(slices, key=lambda e: (e["ts"], -e["dur"])):
        device = e["cat"] in ("kernel", "gpu_memcpy")
        key = ("dev" if device else "host", e["pid"], e["tid"])
        if device:
            rows.setdefault((key, 0), []).append(e)
            continue
        depth = 0
        while any(o["ts"] <= e["ts"] < o["ts"] + o["dur"] and e is not o
                  for o in rows.get((key, depth), [])):
            depth += 1
        rows.setdefault((key, depth), []).append(e)
    order = sorted(rows, key=lambda k: (k[0][0] == "dev", str(k[0][1]), str(k[0][2]), k[1]))
    return order, rows


def render(path, out, title=""):
    slices, names, flows = load(path)
    if not slices:
        raise SystemExit(f"{path}: no op or device activity to draw")
    t0 = min(e["ts"] for e in slices)
    t1 = max(e["ts"] + e["dur"] for e in slices)
    scale = (WIDTH - LABEL - 10) / max(t1 - t0, 1e-3)
    x = lambda ts: LABEL + (ts - t0) * scale  # noqa: E731
    order, rows = lanes(slices)
    y_of = {k: 30 + i * ROW for i, k in enumerate(order)}
    height = 30 + len(order) * ROW + 30
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" '
             f'font-family="sans-serif" font-size="10">',
             '<rect width="100%" height="100%" fill="white"/>',
             f'<text x="4" y="16" font-size="12">{html.escape(title)} '
             f'({t1 - t0:.0f} us)</text>']
    for k in order:
        (kind, pid, tid), depth = k
        y = y_of[k]
        if depth == 0:
            label = (f"{names.get(('process_name', pid, 0), pid)} "
                     f"{names.get(('thread_name', pid, tid), tid)}" if kind == "dev"
                     else f"host thread {tid}")
            parts.append(f'<text x="4" y="{y + 12}">{html.escape(str(label))}</text>')
            parts.append(f'<line x1="0" x2="{WIDTH}" y1="{y}" y2="{y}" stroke="#ddd"/>')
        for e in rows[k]:
            w = max(e["dur"] * scale, 0.5)
            name = html.escape(e["name"])
            parts.append(f'<rect x="{x(e["ts"]):.1f}" y="{y + 1}" width="{w:.1f}" '
                         f'height="{ROW - 3}" fill="{COLORS[e["cat"]]}" stroke="white" '
                         f'stroke-width="0.3"><title>{name} ({e["dur"]:.1f} us)</title></rect>')
            if w > 6 * len(e["name"]):
                parts.append(f'<text x="{x(e["ts"]) + 2:.1f}" y="{y + 12}">{name}</text>')
    # A flow runs from its launch (the runtime slice at the flow start) to the
    # device activity it ends at.
    lane_of = {(e["pid"], e["tid"], e["ts"]): y_of[k] for k in order for e in rows[k]}
    for flow in flows.values():
        if "s" in flow and "f" in flow:
            s, f = flow["s"], flow["f"]
            ys = lane_of.get((s["pid"], s["tid"], s["ts"]))
            yf = lane_of.get((f["pid"], f["tid"], f["ts"]))
            if ys is not None and yf is not None:
                parts.append(f'<line x1="{x(s["ts"]):.1f}" y1="{ys + ROW / 2}" '
                             f'x2="{x(f["ts"]):.1f}" y2="{yf + ROW / 2}" '
                             f'stroke="#c03030" stroke-width="0.5" opacity="0.6"/>')
    parts.append("</svg>")
    with open(out, "w") as fh:
        fh.write("\n".join(parts))


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("trace")
    p.add_argument("out")
    p.add_argument("--title", default="")
    a = p.parse_args()
    render(a.trace, a.out, a.title)


if __name__ == "__main__":
    main()
