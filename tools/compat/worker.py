"""The worker process that runs the architectures, so that a hang inside C++
(which SIGALRM cannot interrupt) or a crash costs one architecture, not the
run. Described in tools/compat/README.md ("Isolation")."""
from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import logging
import os
import sys
import time

import torch

from .checks import ArchResult, run_architecture
from .report import _md, dtype_name


# A hang inside C++ (a wait that never returns) cannot be interrupted by SIGALRM.
# cli.main() therefore runs the architectures in a worker process: it sends model
# types on the worker's stdin and reads "@@STAGE <stage>" and "@@RESULT <json>"
# lines back; a worker that does not answer within the time limit (plus a grace
# period) or dies is killed, the architecture is reported as hung/crashed at the
# stage it had reached, and a fresh worker continues with the next one.

HANG_GRACE = 30.0
# The directory that holds the top-level package (tools/): the repository root.
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _emit(line: str) -> None:
    os.write(1, ("\n" + line + "\n").encode())  # fd 1: not affected by redirect_stdout


def worker(dtype: torch.dtype, timeout: float, device: str, compiled: bool = False,
           compiled_only: bool = False) -> int:
    """The worker loop: one model type per stdin line, one result per model."""
    logging.getLogger("transformers").setLevel(logging.ERROR)
    import transformers  # noqa: F401  (imports outside the per-architecture limit)
    from transformers import AutoModelForCausalLM, GenerationMixin  # noqa: F401
    from transformers.generation import utils as _generation  # noqa: F401

    for line in sys.stdin:
        name = line.strip()
        if not name:
            continue
        with _capture_output():
            r = run_architecture(
                name, dtype=dtype, timeout=timeout, device=device,
                progress=lambda st: _emit(f"@@STAGE {st}"), compiled=compiled,
                compiled_only=compiled_only,
                partial=lambda res: _emit("@@PARTIAL " + json.dumps(dataclasses.asdict(res))))
        _emit("@@RESULT " + json.dumps(dataclasses.asdict(r)))
    return 0


class _Worker:
    def __init__(self, dtype: torch.dtype, timeout: float, device: str, compiled: bool = False,
                 compiled_only: bool = False):
        import subprocess
        import tempfile

        self.stderr = tempfile.TemporaryFile()
        # The worker runs this package with -m from anywhere: the directory that
        # holds it goes first on the worker's path.
        path = [ROOT, *filter(None, [os.environ.get("PYTHONPATH")])]
        env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONPATH=os.pathsep.join(path))
        flags = ["--compiled-only"] if compiled_only else ["--compiled"] if compiled else []
        self.proc = subprocess.Popen(
            [sys.executable, "-m", __package__, "--worker", "--no-write", "--dtype",
             dtype_name(dtype), "--timeout", str(timeout), "--device", device, *flags],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.stderr, env=env)
        self.buf = b""
        self.partial: ArchResult | None = None  # the current architecture's results so far

    def _readline(self, deadline: float) -> str | None:
        import select

        fd = self.proc.stdout.fileno()
        while b"\n" not in self.buf:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            ready, _, _ = select.select([fd], [], [], remaining)
            if not ready:
                return None
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                return None  # the worker exited
            self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        return line.decode(errors="replace")

    def run(self, name: str, limit: float) -> tuple[ArchResult | None, str, str]:
        """(result or None, last stage, why None: "hung" or "crashed: ...")."""
        stage = "cpu:start"
        self.partial = None
        try:
            self.proc.stdin.write((name + "\n").encode())
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            return None, stage, self._crash()
        deadline = time.monotonic() + limit
        while True:
            line = self._readline(deadline)
            if line is None:
                if self.proc.poll() is not None or (not self.buf and self._eof()):
                    return None, stage, self._crash()
                return None, stage, "hung"
            if line.startswith("@@STAGE "):
                stage = line[len("@@STAGE "):].strip()
            elif line.startswith("@@PARTIAL "):
                self.partial = ArchResult(**json.loads(line[len("@@PARTIAL "):]))
            elif line.startswith("@@RESULT "):
                data = json.loads(line[len("@@RESULT "):])
                return ArchResult(**data), stage, ""

    def _eof(self) -> bool:
        try:
            self.proc.wait(timeout=0.5)
            return True
        except Exception:  # noqa: BLE001
            return False

    def _crash(self) -> str:
        self.proc.wait()
        self.stderr.seek(0)
        text = self.stderr.read().decode(errors="replace")
        lines = [ln for ln in text.splitlines() if ln.strip()]
        tail = lines[-1].strip() if lines else ""
        return f"crashed (exit code {self.proc.returncode})" + (f": {tail[:120]}" if tail else "")

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.stderr.close()


def _lost_result(name: str, stage: str, why: str, limit: float,
                 partial: ArchResult | None = None, compiled: bool = False) -> ArchResult:
    """The result of an architecture whose worker hung or died at stage; partial:
    what it had reported before the compiled column."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    where, _, st = stage.partition(":")
    msg = (f"error({st}): hung, worker killed after {limit:.0f}s" if why == "hung"
           else f"error({st}): worker {_md(why)}")
    if where == "compiled" and partial is not None:
        r = partial
        r.compiled, r.seconds = msg, limit
        return r
    r = ArchResult(name, MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(name, "?"), seconds=limit)
    if compiled:
        r.compiled = "skipped"
    if where == "cpu":
        r.cpu, r.axon = msg, "skipped"
    elif where == "compiled":
        r.compiled = msg
    else:
        r.cpu, r.axon = "ok", msg
    return r


@contextlib.contextmanager
def _capture_output():
    """Swallows what models print to stdout/stderr while they run."""
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):
        yield buf
