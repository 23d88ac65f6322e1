"""Graphs: capture axon work once, replay it with one call (torch.cuda's CUDA graphs).

``AxonGraph`` is the axon implementation behind ``torch.accelerator.Graph``
(registered with ATen's graph registry, csrc/core/AxonGraph.cpp) with
``torch.cuda.CUDAGraph``'s signatures; ``graph`` and ``make_graphed_callables``
follow torch/cuda/graphs.py.  The rules are CUDA's: capture on a side
stream; the graph's allocations come from a private pool and its tensors are
static (replay rewrites them in place); synchronising calls during a capture
(``.item()``, ``.cpu()``, ``torch.axon.synchronize()``) raise and invalidate it.
Random ops draw new numbers at each replay, the numbers they would draw if
they ran eagerly at that point.
"""

from __future__ import annotations

import gc
from typing import Any, Callable

import torch

from .. import _C
from .device import _get_device_index, synchronize
from . import memory as _memory
from .memory import empty_cache, graph_pool_handle  # noqa: F401  (as torch.cuda.graphs)
from .streams import Stream
from .streams import stream as _stream_context

__all__ = ["AxonGraph", "graph", "make_graphed_callables", "is_current_stream_capturing",
           "graph_pool_handle"]

_C._register_graph_impl()


def is_current_stream_capturing() -> bool:
    """True if a graph capture is underway on the current axon stream."""
    return bool(_C._is_current_stream_capturing(_get_device_index(None, optional=True)))


def _liveness_tracker():
    """torch.cuda.graph's input-liveness tracker (torch/utils/_cuda_debug.py) for axon:
    external tensors read during a capture are watched, and a replay after one was
    freed raises with where it was made and freed (the graph reads it by address)."""
    from torch.utils import _cuda_debug as debug
    from torch.utils._pytree import tree_iter

    class Mode(debug._TensorTrackingMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            out = func(*args, **kwargs)
            inputs = [args, kwargs]
            if is_current_stream_capturing() and any(
                    isinstance(v, torch.Tensor) and v.device.type == "axon"
                    for v in tree_iter(inputs)):
                self._track_inputs(inputs)
                self._mark_outputs(out)
            return out

        def _track_inputs(self, values) -> None:
            for v in tree_iter(values):
                if isinstance(v, torch.Tensor) and v.data_ptr() != 0 and (
                        v.device.type == "axon" or v.is_pinned()):
                    self._tracker.track_external_input(v)

        def _mark_outputs(self, values) -> None:
            for v in tree_iter(values):
                if isinstance(v, torch.Tensor) and v.device.type == "axon":
                    self._tracker.mark_internal_output(v)

    class Tracker(debug._CUDAGraphInputLivenessTracker):
        def start(self) -> None:
            self._dispatch_mode = Mode(self)
            self._dispatch_mode.__enter__()

        def check_alive(self, capture_pool) -> None:
            try:
                super().check_alive(capture_pool)
            except RuntimeError as e:
                raise RuntimeError(str(e).replace("CUDA graph replay", "axon graph replay", 1)) \
                    from None

        def _get_memory_snapshot(self, capture_pool):
            if self._memory_snapshot is None:
                self._memory_snapshot = _memory.memory_snapshot(capture_pool,
                                                                include_traces=False)
            return self._memory_snapshot

    return Tracker()


class AxonGraph(torch._C._acceleratorGraph):
    """A captured sequence of axon work (torch.cuda.CUDAGraph's counterpart).

    ``keep_graph`` is accepted for compatibility: an axon graph needs no
    instantiation, so it is always ready to replay after ``capture_end``.
    """

    def __new__(cls, keep_graph: bool = False):
        return super().__new__(cls, keep_graph)

    def __init__(self, keep_graph: bool = False) -> None:
        super().__init__(keep_graph)
        self._tracker = None

    def _stop_tracking(self) -> None:
        if getattr(self, "_tracker", None) is not None:
            self._tracker.stop()

    def capture_begin(self, pool=None, capture_error_mode: str = "global",
                      check_input_liveness: bool = False) -> None:
        """Begin capturing axon work on the current stream (prefer ``torch.axon.graph``).

        ``check_input_liveness``: watch the tensors from outside the capture that it
        reads; a replay after one was freed raises (as torch.cuda's)."""
        if capture_error_mode not in ("global", "thread_local", "relaxed", "default"):
            raise ValueError(f"Unknown capture_error_mode '{capture_error_mode}'; expected "
                             "'global', 'thread_local' or 'relaxed'")
        self._stop_tracking()
        self._tracker = None
        super().capture_begin(pool=pool, capture_error_mode=capture_error_mode)
        if check_input_liveness:
            self._tracker = _liveness_tracker()
            self._tracker.start()

    def capture_end(self) -> None:
        """End the capture begun on the current stream."""
        try:
            super().capture_end()
        finally:
            self._stop_tracking()

    def instantiate(self) -> None:
        super().instantiate()

    def replay(self) -> None:
        """Enqueue the captured work on the current stream (one launch)."""
        if getattr(self, "_tracker", None) is not None:
            self._tracker.check_alive(self.pool())
        super().replay()

    def reset(self) -> None:
        """Delete the captured graph and release its memory pool."""
        self._stop_tracking()
        self._tracker = None
        super().reset()

    def pool(self):
        """The id of this graph's memory pool, to share it with another capture."""
        return super().pool()

    def enable_debug_mode(self) -> None:
        super().enable_debug_mode()

    def debug_dump(self, debug_path: str) -> None:
        """Write the captured tasks, in replay order, to ``debug_path``."""
        super().debug_dump(debug_path)


class graph:
    """Context manager that captures axon work into an ``AxonGraph`` (torch.cuda.graph)."""

    default_capture_stream: Stream | None = None

    def __init__(self, axon_graph: AxonGraph, pool=None, stream: Stream | None = None,
                 capture_error_mode: str = "global", enable_annotations: bool = False,
                 check_input_liveness: bool = False) -> None:
        if enable_annotations:
            raise NotImplementedError(
                "torch.axon.graph(enable_annotations=True): kernel annotations are CUDA "
                "driver records (cuda.bindings); axon's kernels show in torch.profiler")
        if stream is None and self.__class__.default_capture_stream is None:
            self.__class__.default_capture_stream = Stream()
        self.pool = () if pool is None else (pool,)
        self.capture_stream = stream if stream is not None else self.__class__.default_capture_stream
        self.stream_ctx = _stream_context(self.capture_stream)
        self.axon_graph = axon_graph
        self.capture_error_mode = capture_error_mode
        self.check_input_liveness = check_input_liveness

    def __enter__(self) -> None:
        synchronize()
        if torch.compiler.config.force_cudagraph_gc:
            gc.collect()
        empty_cache()
        self.stream_ctx.__enter__()
        try:
            self.axon_graph.capture_begin(*self.pool, capture_error_mode=self.capture_error_mode,
                                          check_input_liveness=self.check_input_liveness)
        except BaseException:
            self.stream_ctx.__exit__(None, None, None)
            raise

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            if exc_type is None:
                self.axon_graph.capture_end()
            else:
                # The body raised: abandon the capture, keep the body's exception.
                self.axon_graph.reset()
        finally:
            self.stream_ctx.__exit__(exc_type, exc, tb)


def make_graphed_callables(callables, sample_args, num_warmup_iters: int = 3,
                           allow_unused_input: bool = False, pool=None):
    """Graphed versions of callables or modules (torch.cuda.make_graphed_callables).

    Each graphed callable's forward replays a graph of its forward work and its
    backward replays a graph of its backward work, inside one autograd node.
    The same restrictions as CUDA's apply: tensor arguments only, no hooks on
    modules, buffers without grad, and the same argument shapes and
    requires_grad as the sample arguments at every call.
    """
    if torch.is_autocast_enabled() and torch.is_autocast_cache_enabled():
        raise RuntimeError("make_graphed_callables does not support the autocast caching. "
                           "Please set `cache_enabled=False`.")
    just_one = not isinstance(callables, tuple)
    if just_one:
        callables = (callables,)
        sample_args = (sample_args,)
    pytree = torch.utils._pytree
    flat_args = []
    for c, args in zip(callables, sample_args):
        if isinstance(c, torch.nn.Module):
            if c._backward_hooks or c._forward_hooks or c._forward_pre_hooks:
                raise AssertionError(
                    "Modules must not have hooks registered at the time they are passed. However, "
                    "registering hooks on modules after passing them through "
                    "make_graphed_callables is allowed.")
            if any(b.requires_grad for b in c.buffers()):
                raise AssertionError(
                    "In any :class:`~torch.nn.Module` passed to :func:`~make_graphed_callables`, "
                    "only parameters may be trainable. All buffers must have "
                    "``requires_grad=False``.")
        leaves = tuple(pytree.arg_tree_leaves(*args))
        if not all(isinstance(a, torch.Tensor) for a in leaves):
            raise AssertionError("In the beta API, sample_args for each callable must contain "
                                 "only Tensors. Other types are not allowed.")
        flat_args.append(leaves)
    n_user_args = [len(a) for a in flat_args]
    module_params = [tuple(c.parameters()) if isinstance(c, torch.nn.Module) else ()
                     for c in callables]
    surfaces = [flat_args[i] + module_params[i] for i in range(len(callables))]
    fwd_graphs = [AxonGraph() for _ in callables]
    bwd_graphs = [AxonGraph() for _ in callables]
    mempool = _memory.graph_pool_handle() if pool is None else pool

    def grads_of(outputs, surface, grad_outputs):
        return torch.autograd.grad(
            outputs=tuple(o for o in outputs if o.requires_grad),
            inputs=tuple(i for i in surface if i.requires_grad),
            grad_outputs=grad_outputs, only_inputs=True, allow_unused=allow_unused_input)

    # Warm up on a side stream (lazy initialisations, first-signature checks).
    synchronize()
    with _stream_context(Stream()):
        for func, args, surface in zip(callables, sample_args, surfaces):
            for _ in range(num_warmup_iters):
                outputs = pytree.tree_leaves(func(*args))
                if any(o.requires_grad for o in outputs):
                    grads_of(outputs, surface,
                             tuple(torch.empty_like(o) for o in outputs if o.requires_grad))
            del outputs
    synchronize()

    static_outputs, out_specs = [], []
    for func, args, fwd in zip(callables, sample_args, fwd_graphs):
        with graph(fwd, pool=mempool):
            outputs = func(*args)
        flat, spec = pytree.tree_flatten(outputs)
        static_outputs.append(tuple(flat))
        out_specs.append(spec)

    static_grad_outputs, static_grad_inputs = [], []
    for surface, outs, bwd in zip(reversed(surfaces), reversed(static_outputs),
                                  reversed(bwd_graphs)):
        grad_outs = tuple(torch.empty_like(o) if o.requires_grad else None for o in outs)
        grad_inputs = None
        if any(o.requires_grad for o in outs):
            with graph(bwd, pool=mempool):
                grad_inputs = grads_of(outs, surface, tuple(g for g in grad_outs if g is not None))
        per_input, k = [], 0
        for a in surface:
            if a.requires_grad and grad_inputs is not None:
                per_input.append(grad_inputs[k])
                k += 1
            else:
                per_input.append(None)
        static_grad_outputs.append(grad_outs)
        static_grad_inputs.append(tuple(per_input))
    static_grad_outputs.reverse()
    static_grad_inputs.reverse()

    def graphed_function(i: int) -> Callable[..., Any]:
        fwd, bwd, params, n_args = fwd_graphs[i], bwd_graphs[i], module_params[i], n_user_args[i]
        surface, outs = surfaces[i], static_outputs[i]
        grad_outs, grad_ins, spec = static_grad_outputs[i], static_grad_inputs[i], out_specs[i]

        class Graphed(torch.autograd.Function):
            @staticmethod
            def forward(ctx, *inputs):
                for j in range(n_args):
                    if surface[j].data_ptr() != inputs[j].data_ptr():
                        surface[j].copy_(inputs[j])
                fwd.replay()
                return tuple(o.detach() for o in outs)

            @staticmethod
            @torch.autograd.function.once_differentiable
            def backward(ctx, *grads):
                for g, grad in zip(grad_outs, grads):
                    if g is not None and grad is not None and g.data_ptr() != grad.data_ptr():
                        g.copy_(grad)
                bwd.replay()
                return tuple(b.detach() if b is not None else None for b in grad_ins)

        def functionalized(*user_args):
            flat = pytree.arg_tree_leaves(*user_args)
            out = Graphed.apply(*(tuple(flat) + params))
            return pytree.tree_unflatten(out, spec)

        # The graphs live as long as the function (their pool with them).
        functionalized._axon_graphs = (fwd, bwd)
        return functionalized

    result = []
    for i, func in enumerate(callables):
        graphed = graphed_function(i)
        if isinstance(func, torch.nn.Module):
            def make_forward(func, training, graphed, orig_forward):
                def forward(*args, **kwargs):
                    if func.training == training:
                        return graphed(*args, **kwargs)
                    return orig_forward(*args, **kwargs)
                return forward

            func.forward = make_forward(func, func.training, graphed, func.forward)
            result.append(func)
        else:
            result.append(graphed)
    return result[0] if just_one else tuple(result)

