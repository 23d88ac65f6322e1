"""What the harness compares, and how one architecture runs: the three checks
(forward logits, one training step, greedy ``generate()``) on the CPU and on
the device, their tolerances (``TOLERANCE``), the opt-in compiled column, the
per-architecture time limit, and ``ArchResult``, what one architecture
reports. Described in tools/compat/README.md."""
from __future__ import annotations

import contextlib
import copy
import dataclasses
import gc
import math
import signal
import time

import torch

from .configs import NOT_STANDALONE, _quiet, _to, build_model, make_inputs, tiny_config


NEW_TOKENS = 16

TOLERANCE = {torch.float32: 1e-4, torch.bfloat16: 3e-2, torch.float16: 5e-3}
DEFAULT_TIMEOUT = 60
COMPILE_TIMEOUT = 240  # added to the limit for the compiled column (cold compiles: ~20-60 s)

# --- results ----------------------------------------------------------------


@dataclasses.dataclass
class ArchResult:
    model_type: str
    model_class: str = ""
    attn: str = ""
    params: int = 0
    cpu: str = "not run"          # "ok" or "error(stage): message"
    axon: str = "not run"         # "ok", "mismatch(...)", "error(stage): message", "skipped"
    logits_err: float | None = None
    loss_err: float | None = None
    grad_err: float | None = None
    grads_ok: bool | None = None
    tokens_equal: bool | None = None
    tokens_note: str = ""
    fallback_fwd_bwd: dict = dataclasses.field(default_factory=dict)
    fallback_generate: dict = dataclasses.field(default_factory=dict)
    seconds: float = 0.0
    # The compiled column (--compiled): "not run", "ok", "mismatch", "n/a: why",
    # "error(stage): message" or "skipped" (the axon copy was not usable).
    compiled: str = "not run"
    compiled_note: str = ""       # tie note; on failure, what CPU Inductor does
    compiled_graphs: int | None = None
    compiled_breaks: int | None = None
    compiled_seconds: float | None = None
    compiled_break_reasons: dict = dataclasses.field(default_factory=dict)  # reason -> count
    compiled_recompile_limit: bool = False  # Dynamo gave up recompiling: later steps eager
    fullgraph_declared: bool | None = None  # the model's _can_compile_fullgraph

    @property
    def cpu_ok(self) -> bool:
        return self.cpu == "ok"

    @property
    def axon_ok(self) -> bool:
        return self.axon == "ok"

    @property
    def compiled_applies(self) -> bool:
        """The compiled column ran to a verdict other than "n/a"."""
        return self.compiled == "ok" or self.compiled == "mismatch" or \
            self.compiled.startswith("error(")


class _Timeout(Exception):
    pass


def _short(exc: BaseException, limit: int = 160) -> str:
    msg = [m.strip() for m in str(exc).strip().splitlines() if m.strip()]
    text = f"{type(exc).__name__}: {msg[0] if msg else ''}"
    for m in msg[1:3]:
        if len(text) >= 60 and not text.endswith(":"):
            break
        text += " " + m
    text = text.replace("|", "/")
    return text if len(text) <= limit else text[: limit - 3] + "..."


# --- the three checks ----------------------------------------------------------


def _logits(out):
    return out.logits if hasattr(out, "logits") else out[0]


def run_forward(model, inputs):
    model.eval()
    with torch.no_grad():
        out = model(**inputs["forward"])
    return _logits(out).detach().float().cpu()


def run_train_step(model, inputs):
    model.train()
    for p in model.parameters():
        p.grad = None
    out = model(**inputs["forward"], labels=inputs["labels"])
    loss = out.loss if hasattr(out, "loss") else out[0]
    if loss is None:
        raise RuntimeError("model returned no loss")
    loss.backward()
    grads = {n: (p.grad.detach().float().cpu() if p.grad is not None else None)
             for n, p in model.named_parameters()}
    model.eval()
    for p in model.parameters():
        p.grad = None
    return loss.detach().float().cpu(), grads


def run_generate(model, inputs, with_cache: bool = False, **extra):
    """(tokens, per-step scores) of greedy generate on the CPU; with with_cache
    also the name of the cache class generate used. extra: more generate
    keyword arguments (cache_implementation, compile_config, ...)."""
    model.eval()
    kw = dict(do_sample=False, num_beams=1, max_new_tokens=NEW_TOKENS,
              min_new_tokens=NEW_TOKENS, pad_token_id=inputs["pad"],
              return_dict_in_generate=True, output_scores=True)
    kw.update(inputs.get("generate_kwargs", {}))
    kw.update(extra)
    with torch.no_grad(), _quiet():
        out = model.generate(**inputs["generate"], **kw)
    seq = out.sequences.cpu()
    scores = [s.detach().float().cpu() for s in out.scores] if out.scores else []
    if with_cache:
        cache = getattr(out, "cache", None)
        return seq, scores, type(cache).__name__ if cache is not None else "no cache"
    return seq, scores


def _max_err(a: torch.Tensor, b: torch.Tensor) -> float:
    if a.shape != b.shape:
        return math.inf
    if a.numel() == 0:
        return 0.0
    diff = (a - b).abs()
    same = (a == b) | (a.isnan() & b.isnan())  # equal infinities count as equal
    diff = torch.where(same, torch.zeros_like(diff), diff)
    return float(diff.nan_to_num(nan=math.inf).max())


def _close(actual: torch.Tensor, expected: torch.Tensor, tol: float) -> bool:
    if actual.shape != expected.shape:
        return False
    return bool(torch.allclose(actual, expected, rtol=tol, atol=tol, equal_nan=True))


def _tokens_tie(seq_cpu, seq_ax, scores_cpu, prompt_len, tol) -> str | None:
    """If the sequences first differ where the CPU's scores of both tokens are
    within tol (a tie up to rounding), describe it; else None."""
    for row in range(seq_cpu.shape[0]):
        diff = (seq_cpu[row] != seq_ax[row]).nonzero()
        if len(diff) == 0:
            continue
        pos = int(diff[0])
        step = pos - prompt_len
        if step < 0 or step >= len(scores_cpu):
            return None
        s = scores_cpu[step][row]
        a, b = float(s[seq_cpu[row, pos]]), float(s[seq_ax[row, pos]])
        if abs(a - b) <= tol * (1 + abs(a)):
            return f"tie at step {step} (row {row}: {a:.6g} vs {b:.6g})"
        return None
    return None


def _alarm_handler(signum, frame):
    raise _Timeout()


def _is_timeout(exc: BaseException) -> bool:
    """exc is, or wraps (Dynamo re-raises errors of the code it traces and of
    the backend in its own exception types), the harness's time limit."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, _Timeout):
            return True
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return False


def _compile_config(backend: str):
    from transformers.generation.configuration_utils import CompileConfig

    config = CompileConfig(backend=backend, fullgraph=False, dynamic=False)
    if backend != "axon":
        config._compile_all_devices = True  # Transformers' switch to compile off CUDA
    return config


def _dynamo_counts() -> tuple[int, int]:
    """(graphs Dynamo compiled, graph breaks) since the last counters.clear()."""
    from torch._dynamo.utils import counters

    return (int(counters["stats"]["unique_graphs"]),
            int(sum(counters["graph_break"].values())))


def _break_reasons() -> dict:
    """Graph-break reasons -> count, since counters.clear(). A reason is the
    first line of Dynamo's message plus its debug context (the op) or, failing
    that, the first source location it names."""
    import re

    from torch._dynamo.utils import counters

    out: dict[str, int] = {}
    for reason, n in counters["graph_break"].items():
        text = str(reason)
        first = next((ln.strip() for ln in text.splitlines() if ln.strip()), "?")
        ctx = re.search(r"Developer debug context: *(\S[^\n]*)", text)
        loc = re.search(r'File "[^"]*?(?:site-packages/)?([^"]+)", line (\d+), in (\w+)', text)
        if ctx:
            first += f": {ctx.group(1).strip()}"
        elif loc:
            first += f": {loc.group(1)}:{loc.group(2)} ({loc.group(3)})"
        key = _trim(first, 150)
        out[key] = out.get(key, 0) + int(n)
    return out


def _hit_recompile_limit() -> bool:
    """Dynamo stopped recompiling a frame (recompile_limit) since counters.clear()."""
    from torch._dynamo.utils import counters

    return any("recompile limit" in str(k) for k in counters["unimplemented"])


def _dynamo_reset() -> None:
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()


def _cpu_inductor_control(model_cpu, inputs_cpu, tol: float) -> str:
    """What the same compiled generate does on the CPU with Inductor (the
    control for a compiled failure on axon): a short note."""
    try:
        seq_e, scores_e = run_generate(model_cpu, inputs_cpu, cache_implementation="static",
                                       disable_compile=True)
        _dynamo_reset()
        seq_c, _ = run_generate(model_cpu, inputs_cpu, cache_implementation="static",
                                compile_config=_compile_config("inductor"))
    except Exception as e:  # noqa: BLE001
        if _is_timeout(e):
            raise _Timeout() from e
        return f"CPU Inductor: error: {_short(e, 120)}"
    finally:
        graphs, breaks = _dynamo_counts()
        limit = ", recompile limit" if _hit_recompile_limit() else ""
        _dynamo_reset()
    counts = f"({graphs} graphs, {breaks} breaks{limit})"
    if seq_c.shape == seq_e.shape and (torch.equal(seq_c, seq_e) or _tokens_tie(
            seq_e, seq_c, scores_e, inputs_cpu["generate"]["input_ids"].shape[1], tol)):
        return f"CPU Inductor: ok {counts}"
    return f"CPU Inductor: mismatch {counts}"


def run_compiled(r: ArchResult, model_dev, inputs_dev, model_cpu, inputs_cpu, *, tol: float,
                 timeout: float | None, at) -> None:
    """The compiled column (see README.md): greedy generate with a
    static cache on the device, eagerly and compiled by the "axon" backend;
    fills r.compiled*. model_cpu / inputs_cpu (same weights and inputs) serve
    the CPU controls. The time limit (the caller's SIGALRM) ends it with
    "error(stage): timeout"; at(stage, where) reports progress."""
    r.fullgraph_declared = bool(getattr(model_dev, "_can_compile_fullgraph", False))
    stage = "static-eager"
    at(stage, "compiled")
    try:
        try:
            seq_e, scores_e, cache = run_generate(model_dev, inputs_dev, with_cache=True,
                                                  cache_implementation="static",
                                                  disable_compile=True)
        except Exception as e:  # noqa: BLE001
            if _is_timeout(e):
                raise
            # Does the static cache fail on the CPU too (a model limitation)?
            stage = "static-eager-cpu"
            at(stage, "compiled")
            try:
                run_generate(model_cpu, inputs_cpu, cache_implementation="static",
                             disable_compile=True)
            except Exception as e_cpu:  # noqa: BLE001
                if _is_timeout(e_cpu):
                    raise
                r.compiled = f"n/a: static cache fails on the CPU too: {_short(e_cpu, 120)}"
                return
            r.compiled = f"error(static-eager): {_short(e)}"
            return

        stage = "compile"
        at(stage, "compiled")
        _dynamo_reset()
        t0 = time.perf_counter()
        try:
            seq_c, _ = run_generate(model_dev, inputs_dev, cache_implementation="static",
                                    compile_config=_compile_config("axon"))
            error = None
        except Exception as e:  # noqa: BLE001
            if _is_timeout(e):
                raise
            error = e
        finally:
            r.compiled_seconds = time.perf_counter() - t0
            r.compiled_graphs, r.compiled_breaks = _dynamo_counts()
            r.compiled_break_reasons = _break_reasons()
            r.compiled_recompile_limit = _hit_recompile_limit()
            _dynamo_reset()
        if error is None and r.compiled_graphs == 0:
            # generate ran the decoding step eagerly: nothing was compiled.
            if not model_dev._supports_default_dynamic_cache():
                why = f"the model keeps its own cache ({cache}); cache_implementation is ignored"
            elif cache == "no cache" and False in (
                    getattr(model_dev.generation_config, "use_cache", None),
                    getattr(model_dev.config.get_text_config(), "use_cache", None)):
                why = "the config sets use_cache=False: generate keeps no cache"
            elif cache != "StaticCache":
                why = f"generate used {cache}, not a compilable cache"
            elif "llama4" in str(getattr(model_dev.config, "model_type", "")):
                why = "Transformers does not compile llama4's decoding step (get_compiled_call)"
            else:
                why = f"generate did not compile the decoding step ({cache})"
            r.compiled = f"n/a: {why}"
            return
        if error is None:
            prompt_len = inputs_dev["generate"]["input_ids"].shape[1]
            if seq_c.shape == seq_e.shape and torch.equal(seq_c, seq_e):
                r.compiled = "ok"
            else:
                tie = seq_c.shape == seq_e.shape and _tokens_tie(seq_e, seq_c, scores_e,
                                                                 prompt_len, tol)
                r.compiled, r.compiled_note = ("ok", tie) if tie else ("mismatch", "")
            if r.compiled == "ok" and not r.compiled_breaks and not r.compiled_recompile_limit:
                return
        else:
            r.compiled = f"error(compile): {_short(error)}"
        stage = "cpu-inductor"
        at(stage, "compiled")
        control = _cpu_inductor_control(model_cpu, inputs_cpu, tol)
        r.compiled_note = f"{r.compiled_note}; {control}" if r.compiled_note else control
    except Exception as e:  # noqa: BLE001  (_Timeout, or an error that wraps it)
        if not _is_timeout(e):
            raise
        if stage == "cpu-inductor":  # the verdict on axon stands
            r.compiled_note = f"CPU Inductor: timeout after {timeout:g}s"
        else:
            r.compiled = f"error({stage}): timeout after {timeout:g}s"


def run_architecture(model_type: str, *, dtype: torch.dtype = torch.float32,
                     timeout: float | None = DEFAULT_TIMEOUT, device: str = "axon",
                     seed: int = 0, progress=None, compiled: bool = False,
                     compiled_only: bool = False, partial=None) -> ArchResult:
    """Runs one architecture on the CPU and on device; never raises (except
    KeyboardInterrupt). progress(stage) is called as each stage starts
    ("cpu:forward", "axon:generate", "compiled:compile", ...). timeout
    (seconds) is enforced with SIGALRM, which cannot interrupt a hang inside
    C++: main() runs architectures in a worker process it can kill for that.

    compiled: also run the compiled column (run_compiled) after the axon
    checks; compiled_only: build the model and run only the compiled column
    (cpu and axon stay "not run"). partial(result) is called just before the
    compiled column starts, so that a worker killed during it keeps the
    results so far."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    r = ArchResult(model_type, MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(model_type, "?"))
    tol = TOLERANCE.get(dtype, 1e-4)
    if model_type in NOT_STANDALONE:
        r.cpu, r.axon = f"n/a: {NOT_STANDALONE[model_type]}", "skipped"
        if compiled or compiled_only:
            r.compiled = "skipped"
        return r
    compiled = compiled or compiled_only
    if compiled:
        _dynamo_reset()  # every architecture starts from a clean Dynamo
    t0 = time.perf_counter()
    use_alarm = bool(timeout) and hasattr(signal, "SIGALRM") and \
        threading_is_main()
    old = None
    if use_alarm:
        old = signal.signal(signal.SIGALRM, _alarm_handler)
        signal.setitimer(signal.ITIMER_REAL, float(timeout))
    stage = "config"
    model = model_ax = None

    def at(new_stage: str, where: str = "cpu") -> None:
        nonlocal stage
        stage = new_stage
        if progress is not None:
            progress(f"{where}:{new_stage}")

    at("config")
    try:
        # ---- CPU ----
        try:
            config = tiny_config(model_type)
            at("build")
            model, r.attn = build_model(config, dtype, seed, model_type)
            r.model_class = type(model).__name__
            r.params = sum(p.numel() for p in model.parameters())
            model_ax = copy.deepcopy(model)
            inputs = make_inputs(model, seed, model_type)
            if compiled_only:
                raise _CompiledOnly()
            at("forward")
            logits_cpu = run_forward(model, inputs)
            at("train")
            loss_cpu, grads_cpu = run_train_step(model, inputs)
            bad = [n for n, g in grads_cpu.items() if g is not None and not g.isfinite().all()]
            if not loss_cpu.isfinite().all() or bad:
                # Not a usable reference (NaN positions need not match across kernels).
                raise RuntimeError(f"non-finite loss/gradients on CPU ({len(bad)} parameters, "
                                   f"e.g. {bad[0] if bad else 'loss'})")
            at("generate")
            seq_cpu, scores_cpu = run_generate(model, inputs)
            r.cpu = "ok"
        except _CompiledOnly:
            _compiled_column(r, model_ax, model, inputs, device=device, tol=tol,
                             timeout=timeout, at=at, partial=partial)
            return r
        except _Timeout:
            r.cpu = f"error({stage}): timeout after {timeout:g}s"
            r.axon = "skipped"
            if compiled:
                r.compiled = "skipped"
            return r
        except Exception as e:  # noqa: BLE001
            r.cpu = f"error({stage}): {_short(e)}"
            r.axon = "skipped"
            if compiled:
                r.compiled = "skipped"
            return r
        if not compiled:  # else the CPU model serves the compiled column's CPU controls
            del model
            model = None

        # ---- axon ----
        problems = []
        at("to(device)", "axon")
        try:
            model_ax = model_ax.to(device)
            inputs_ax = _to(inputs, device)
            torch.axon.reset_fallback_stats()
            at("forward", "axon")
            logits_ax = run_forward(model_ax, inputs_ax)
            r.logits_err = _max_err(logits_ax, logits_cpu)
            if not _close(logits_ax, logits_cpu, tol):
                problems.append("logits")
            at("train", "axon")
            loss_ax, grads_ax = run_train_step(model_ax, inputs_ax)
            r.fallback_fwd_bwd = torch.axon.fallback_stats()
            r.loss_err = _max_err(loss_ax, loss_cpu)
            grad_err, grads_ok = 0.0, _close(loss_ax, loss_cpu, tol)
            for name, gc_ in grads_cpu.items():
                ga = grads_ax.get(name)
                if (gc_ is None) != (ga is None):
                    grads_ok = False
                    grad_err = math.inf
                    continue
                if gc_ is None:
                    continue
                grad_err = max(grad_err, _max_err(ga, gc_))
                grads_ok = grads_ok and _close(ga, gc_, tol)
            r.grad_err, r.grads_ok = grad_err, grads_ok
            if not grads_ok:
                problems.append("loss/grads")
            at("generate", "axon")
            torch.axon.reset_fallback_stats()
            seq_ax, _ = run_generate(model_ax, inputs_ax)
            r.fallback_generate = torch.axon.fallback_stats()
            if seq_ax.shape == seq_cpu.shape and torch.equal(seq_ax, seq_cpu):
                r.tokens_equal = True
            else:
                tie = None
                if seq_ax.shape == seq_cpu.shape:
                    tie = _tokens_tie(seq_cpu, seq_ax, scores_cpu,
                                      inputs["generate"]["input_ids"].shape[1], tol)
                if tie:
                    r.tokens_equal, r.tokens_note = True, tie
                else:
                    r.tokens_equal = False
                    problems.append("generate")
            r.axon = "ok" if not problems else f"mismatch({', '.join(problems)})"
        except _Timeout:
            r.axon = f"error({stage}): timeout after {timeout:g}s"
        except Exception as e:  # noqa: BLE001
            r.axon = f"error({stage}): {_short(e)}"
            if stage in ("forward", "train") and not r.fallback_fwd_bwd:
                r.fallback_fwd_bwd = torch.axon.fallback_stats()
            elif stage == "generate" and not r.fallback_generate:
                r.fallback_generate = torch.axon.fallback_stats()
        if compiled:
            if "timeout" in r.axon:
                r.compiled = "skipped"  # the time limit is spent
            else:
                _compiled_column(r, model_ax, model, inputs, device=device, tol=tol,
                                 timeout=timeout, at=at, partial=partial)
        return r
    except _Timeout:  # fired between the guarded blocks
        if r.cpu == "not run":
            r.cpu = f"error({stage}): timeout after {timeout:g}s"
        r.axon = r.axon if r.axon != "not run" else f"error({stage}): timeout after {timeout:g}s"
        if compiled and r.compiled == "not run":
            r.compiled = "skipped"
        return r
    finally:
        if use_alarm:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, old)
        r.seconds = time.perf_counter() - t0
        model = model_ax = None
        if compiled:
            with contextlib.suppress(Exception):
                _dynamo_reset()  # drops the compiled graphs (and the model they hold)
        gc.collect()
        with contextlib.suppress(Exception):
            torch.axon.synchronize()
            torch.axon.empty_cache()


class _CompiledOnly(Exception):
    """compiled_only: the model and inputs are ready; skip the CPU checks."""


def _compiled_column(r: ArchResult, model_ax, model_cpu, inputs: dict, *, device: str,
                     tol: float, timeout: float | None, at, partial) -> None:
    """run_compiled on the device copy of the model (moved there if needed);
    never raises (a timeout or error becomes r.compiled)."""
    if partial is not None:
        partial(r)
    stage = "to(device)"
    try:
        if next(iter(model_ax.parameters()), torch.empty(0)).device.type != device:
            at(stage, "compiled")
            model_ax = model_ax.to(device)
        inputs_dev = _to(inputs, device)
        stage = "compiled"
        run_compiled(r, model_ax, inputs_dev, model_cpu, inputs, tol=tol, timeout=timeout,
                     at=at)
    except Exception as e:  # noqa: BLE001
        r.compiled = (f"error({stage}): timeout after {timeout:g}s" if _is_timeout(e)
                      else f"error({stage}): {_short(e)}")


def threading_is_main() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


def _trim(s: str, n: int) -> str:
    return s if len(s) <= n else s[: n - 3] + "..."

