"""torch.compile: let Dynamo and Inductor find the axon device; reduce-overhead's graphs.

Loading Dynamo or Inductor costs more than a second, so nothing here imports
them: the hooks below run when PyTorch itself loads them.
"""

from __future__ import annotations

import functools
import inspect

from ._hooks import on_import


@on_import("torch._dynamo.device_interface")
def dynamo_device_interface(device_interface) -> None:
    """Register axon's ``DeviceInterface`` with Dynamo.

    ``torch._dynamo.device_interface`` registers only the devices it knows
    (cuda, xpu, mtia, mps, cpu) and has no PrivateUse1 hook; Dynamo's stream
    and event support is built from the interfaces registered when it loads.
    """
    from ..compiler.device_interface import AxonInterface

    device_interface.register_interface_for_device("axon", AxonInterface)


def inductor_scheduling() -> None:
    """Called through ``torch.axon.Scheduling``: register axon's Inductor backend.

    Inductor's ``init_backend_registration`` (run before every compilation)
    looks up ``Scheduling``, ``PythonWrapperCodegen`` and ``CppWrapperCodegen``
    on the PrivateUse1 device module.  Looking up the first one registers the
    backend in full (with its cache-key pass, which that lookup path cannot
    pass on) and Inductor's own registration then finds it done.
    """
    from ..compiler import register

    register()


@on_import("torch._dynamo.trace_rules")
def dynamo_skip_rng_state(trace_rules) -> None:
    """Have Dynamo call torch.axon's RNG functions instead of tracing them.

    ``torch._dynamo.trace_rules`` marks ``torch.cuda.random``'s
    ``get_rng_state``/``set_rng_state``/``manual_seed``... as functions to run,
    not trace.  torch.axon's are Python that Dynamo would otherwise step into,
    and fail on (``torch.testing``'s ``freeze_rng_state``, used around compiled
    code, calls them under ``no_dispatch()``).  ``trace_rules.add`` puts the
    module in Dynamo's skip list: calls into it run eagerly, as a graph break.
    """
    trace_rules.add("torch_axon.axon.random")


@on_import("torch._decomp.decompositions")
def batch_norm_statistics_like_cpu(decompositions) -> None:
    """Patch ``torch._decomp.decompositions.native_batch_norm_helper``.

    The batch-norm decompositions (and so the fake/meta results torch.compile
    traces with) give the saved statistics CUDA's shapes on every device but
    "cpu": in eval mode ``save_mean``/``save_rstd`` are the running statistics
    rather than empty tensors.  axon's batch norm is the CPU kernel, which
    returns empty tensors in eval mode and statistics in the input's dtype (the
    parameters' when they differ); the wrapper makes the decomposition say the
    same for axon inputs.
    """
    original = decompositions.native_batch_norm_helper
    if getattr(original, "_axon_patch", False):
        return

    @functools.wraps(original)
    def native_batch_norm_helper(input, weight, bias, running_mean, running_var, training,
                                 momentum, eps, functional):
        out = original(input, weight, bias, running_mean, running_var, training, momentum,
                       eps, functional)
        if input.device.type != "axon":
            return out
        output, save_mean, save_rstd, new_mean, new_var = out
        # The CPU kernel's dtype: the parameters' when they differ from the
        # input's (float32 parameters of 16-bit activations), else the input's.
        dtype = next((t.dtype for t in (weight, bias, running_mean, running_var)
                      if t is not None and t.dtype != input.dtype), input.dtype)
        if not training:
            save_mean, save_rstd = input.new_zeros((0,)), input.new_zeros((0,))
        return (output, save_mean.to(dtype=dtype), save_rstd.to(dtype=dtype), new_mean, new_var)

    native_batch_norm_helper._axon_patch = True
    decompositions.native_batch_norm_helper = native_batch_norm_helper




@on_import("torch._subclasses.fake_impls")
def conv_layout_like_cpu(fake_impls) -> None:
    """Patch ``torch._subclasses.fake_impls.conv`` (in ``op_implementations_dict``).

    The fake convolutions (``convolution``, ``_convolution``,
    ``convolution_backward``) lay results out in the memory format of the
    backend ``torch._C._select_conv_backend`` picks; for a PrivateUse1 tensor
    that is ``Overrideable``, whose format is always contiguous.  axon runs the
    CPU's convolution and, like it, returns channels_last results for
    channels_last inputs or weights (where the CPU's backend does:
    ``_C._conv_memory_format``); the wrapper gives axon's fake results that
    format, so compiled code lays tensors out as eager does; where the input or
    weight is not contiguous, the sizes the choice depends on are specialised.
    (An empty batch, whose eager layout follows the input's strides, keeps
    upstream's layout.)
    """
    import torch

    aten = torch.ops.aten
    table = fake_impls.op_implementations_dict
    normalize = getattr(fake_impls, "_normalize_function_or_error", None)
    if normalize is None:
        return
    from .. import _C

    def wrap(original):
        @functools.wraps(original)
        def conv(fake_mode, func, *args, **kwargs):
            out = original(fake_mode, func, *args, **kwargs)
            _, kw = normalize(func, args=args, kwargs=kwargs, normalize_to_only_use_kwargs=True)
            input_, weight = kw["input"], kw["weight"]
            device = getattr(input_, "fake_device", None)
            if device is None or device.type != "axon" or input_.dim() not in (3, 4, 5):
                return out
            if input_.is_contiguous() and weight.is_contiguous():
                return out  # contiguous results, whatever the sizes
            # The CPU backend's choice depends on the sizes: int() specialises
            # them (guards), so a graph is not reused for sizes that would
            # lay the result out otherwise.
            try:
                if int(input_.shape[0]) == 0:
                    return out
                bias_sizes = kw.get("bias_sizes")
                fmt = _C._conv_memory_format(
                    [int(v) for v in input_.shape], [int(v) for v in input_.stride()],
                    [int(v) for v in weight.shape], [int(v) for v in weight.stride()],
                    input_.dtype, None if bias_sizes is None else [int(v) for v in bias_sizes],
                    [int(v) for v in kw["stride"]], [int(v) for v in kw["padding"]],
                    [int(v) for v in kw["dilation"]], bool(kw["transposed"]),
                    [int(v) for v in kw["output_padding"]], int(kw["groups"]))
            except Exception:  # sizes without a value (unbacked): upstream's layout
                return out
            if fmt == torch.contiguous_format:
                return out

            def relayout(t):
                if t is None:
                    return t
                with fake_mode:
                    if t.dim() == 3:
                        return t.unsqueeze(2).contiguous(memory_format=fmt).squeeze(2)
                    return t.contiguous(memory_format=fmt)

            if isinstance(out, tuple):  # convolution_backward: grad_input, grad_weight
                return (relayout(out[0]), relayout(out[1]), out[2])
            return relayout(out)

        conv._axon_patch = True
        return conv

    for op in (aten.convolution.default, aten._convolution.default,
               aten._convolution.deprecated, aten.convolution_backward.default):
        original = table.get(op)
        if original is not None and not getattr(original, "_axon_patch", False):
            table[op] = wrap(original)


# ==========================================================================
# torch.compile(mode="reduce-overhead"): Inductor's graphs on axon.
#
# ``mode="reduce-overhead"`` turns on ``torch._inductor.config.triton.cudagraphs``:
# Inductor then wraps each compiled graph in CUDA graph capture and replay
# (``torch._inductor.cudagraph_trees``), after a device check that accepts a
# single "cuda" device only.  On axon every graph was skipped, silently (the
# skip is logged for "cuda" graphs only).  The patches below, each naming its
# upstream site, let axon graphs through and wrap them with ``AxonGraphPolicy``
# (Inductor's own plugin point, ``torch._inductor.config.cudagraph_policy``),
# set only while an axon graph is post-compiled: other devices go through
# Inductor's code exactly as upstream wrote it.
#
# What the wrapper does (``_AxonGraphed``), per compiled graph and per value of
# its integer inputs (the sizes of a dynamic-shape graph, as cudagraph trees
# key their graphs):
#
# - first call: runs the compiled code as it is (warm-up; its results are the
#   call's results, so mutations and random numbers happen once, as eagerly);
# - second call: records an ``AxonGraph`` on a side stream, in a private pool,
#   and replays it (a capture runs nothing, so the call still runs once);
#   static inputs (parameters, buffers, ``mark_static_address`` tensors such as
#   a StaticCache's) are used in place; the other tensor inputs are copied into
#   static buffers at every call (Inductor's non-tree ``cudagraphify_impl``);
# - later calls: copy the non-static inputs, replay.  Static inputs at new
#   addresses record another graph for them (as cudagraph trees record a node
#   per set of static addresses): two modules of one class share the compiled
#   code (regional compilation, ``compile_repeated_blocks``) and get a graph
#   each, in a pool of its own, so one's replay leaves the other's outputs
#   alone.  A graph with a freed static input is retired when its size is next
#   recorded, and released once its last outputs are freed.  More than
#   ``config.triton.cudagraph_unexpected_rerecord_limit`` graphs for one size
#   at once, or a failing capture (an op that synchronises, such as
#   ``.item()``), skips the graph with Inductor's "skipping cudagraphs due to
#   ..." message: the compiled code runs without a graph.
#
# Outputs: outputs live in the graph's memory and the next replay of the same
# graph (the same sizes and static inputs) overwrites them.  Each call returns
# new tensors on storages of their own that alias that memory without owning
# it; the next replay (or the graph's release) invalidates those storages, so
# reading an earlier output, or a view of it (also as saved for a backward),
# raises "overwritten by a subsequent run" as cudagraph trees do; such outputs
# cannot be resized.
# Outputs that alias a static input keep that input's storage: a replay bumps
# their version counter, so a backward that saved one raises.  Clone an
# output to keep it across calls.
# ``torch.compiler.cudagraph_mark_step_begin()`` is accepted and not needed.

_SKIP = "skipping cudagraphs due to "


def _axon_only(device_types) -> bool:
    """A compiled graph that runs on axon (and maybe the CPU), no other device."""
    kinds = set(device_types) - {"cpu", "meta"}
    return kinds == {"axon"}


def _log_skip(msg: str, *, bump: bool) -> None:
    """What ``cudagraph_utils.log_cudagraph_skip_and_bump_counter`` does for a
    "cuda" graph; ``bump=False`` where upstream already counted the skip."""
    from torch._inductor import config
    from torch._inductor import cudagraph_utils

    if bump:
        cudagraph_utils.log_cudagraph_skip_and_bump_counter(msg)
        return
    cudagraph_utils.cudagraphs_log.warning(msg)
    if config.triton.cudagraph_or_error:
        raise RuntimeError(msg)
    from torch._dynamo.utils import get_metrics_context

    metrics = get_metrics_context()
    if metrics.in_progress():
        metrics.set("cudagraph_skip_reason", msg, overwrite=True)


# --------------------------------------------------------------------------
# The device check


@on_import("torch._inductor.cudagraph_utils")
def device_check_accepts_axon(cudagraph_utils) -> None:
    """Patch ``torch._inductor.cudagraph_utils.check_multiple_devices_or_any_cpu_nodes``.

    Upstream graphs a compiled graph only if its nodes live on one device of
    type "cuda" (``next(iter(device_node_mapping)).type == "cuda"``).  A graph
    on one axon device passes here; a graph with a CPU node is skipped with
    upstream's message even when ``graph_partition`` is on (upstream then
    ignores CPU nodes, because its partitioned wrapper keeps them out of the
    graphs; the axon wrapper graphs the whole compiled callable).  Any mapping
    without axon goes to upstream's function.  Generic fix: accept any single
    device whose backend registers a graph implementation
    (``torch.accelerator.Graph``).
    """
    original = cudagraph_utils.check_multiple_devices_or_any_cpu_nodes
    if getattr(original, "_axon_patch", False):
        return

    import torch

    @functools.wraps(original)
    def check_multiple_devices_or_any_cpu_nodes(device_node_mapping):
        if not any(d.type == "axon" for d in device_node_mapping):
            return original(device_node_mapping)
        device_node_mapping.pop(torch.device("meta"), None)
        cpu_node = device_node_mapping.get(torch.device("cpu"))
        if cpu_node is not None:
            msg = f"cpu device ({cpu_node.name})"
            if stack_trace := cudagraph_utils._get_use_stack_trace(cpu_node):
                msg = f"{msg}. Found from : \n {stack_trace}"
            return cudagraph_utils.format_default_skip_message(msg)
        if len(device_node_mapping) == 1:
            return None
        return cudagraph_utils.format_default_skip_message(
            "multiple devices: " + ", ".join(repr(d) for d in device_node_mapping))

    check_multiple_devices_or_any_cpu_nodes._axon_patch = True
    setattr(cudagraph_utils, "check_multiple_devices_or_any_cpu_nodes",
            check_multiple_devices_or_any_cpu_nodes)


# --------------------------------------------------------------------------
# Where Inductor wraps compiled graphs


@on_import("torch._inductor.output_code")
def graph_axon_outputs(output_code) -> None:
    """Patch ``torch._inductor.output_code.CompiledFxGraph.post_compile`` (also its
    ``__init__`` and ``output_code.maybe_handle_backward_generation``).

    - ``post_compile`` wraps a graph with ``compile_fx.cudagraphify`` (cudagraph
      trees: ``torch.cuda`` streams, pools and graphs) unless
      ``config.cudagraph_policy`` is set; for a graph on axon (and only then)
      the patch sets ``AxonGraphPolicy`` (below) for the call.  With
      ``graph_partition`` on, a policy also routes the graph through
      ``cudagraph_post_compile`` (the whole callable) instead of the
      partition path.
    - ``__init__``, ``post_compile`` and ``cudagraph_post_compile`` log a
      skipped graph (``"skipping cudagraphs due to ..."``) only when
      ``"cuda" in device_types``; the patch logs the same for axon graphs.
    - ``maybe_handle_backward_generation`` tells the cudagraph-tree manager
      of the forward's device that a backward runs; a backward on axon has
      no tree manager (the assertion ``manager is not None`` would fail when
      its forward was graphed and it is not), so it is left as it is.

    Generic fix: a per-device graph policy (or ``torch.accelerator.Graph``
    in cudagraph trees) and logging keyed on "any device but cpu/meta".
    """
    cls = output_code.CompiledFxGraph
    if getattr(cls.post_compile, "_axon_patch", False):
        return

    from torch._inductor import config

    original_post_compile = cls.post_compile
    original_init = cls.__init__
    original_backward = output_code.maybe_handle_backward_generation
    init_signature = inspect.signature(original_init)

    @functools.wraps(original_post_compile)
    def post_compile(self, example_inputs, constants, graph_kwargs):
        if not _axon_only(getattr(self, "device_types", ())):
            return original_post_compile(self, example_inputs, constants, graph_kwargs)
        cudagraphs = graph_kwargs.get("cudagraphs")
        wanted = bool(cudagraphs)
        reason = self.disabled_cudagraphs_reason
        info = self.cudagraph_info
        fail_reasons = info.cudagraph_fail_reasons if info is not None else None
        if wanted and config.cudagraph_policy is None:
            with config.patch(cudagraph_policy=_axon_graph_policy()):
                original_post_compile(self, example_inputs, constants, graph_kwargs)
        else:
            original_post_compile(self, example_inputs, constants, graph_kwargs)
        if wanted and not cudagraphs:  # skipped: say why, as upstream does for cuda
            if reason:  # counted by upstream
                _log_skip(f"{_SKIP}{reason}", bump=False)
            elif fail_reasons:  # not counted by upstream for other devices
                _log_skip(self.disabled_cudagraphs_reason or f"{_SKIP}{fail_reasons}", bump=True)

    @functools.wraps(original_init)
    def __init__(self, *args, **kwargs):
        bound = init_signature.bind(self, *args, **kwargs)
        cudagraphs = bound.arguments.get("cudagraphs")
        wanted = bool(cudagraphs)
        original_init(self, *args, **kwargs)
        if (wanted and not cudagraphs and _axon_only(self.device_types)
                and self.disabled_cudagraphs_reason):
            _log_skip(f"{_SKIP}{self.disabled_cudagraphs_reason}", bump=False)

    @functools.wraps(original_backward)
    def maybe_handle_backward_generation(compiled_graph, boxed_forward_device_index):
        if _axon_only(compiled_graph.device_types):
            return None
        return original_backward(compiled_graph, boxed_forward_device_index)

    for fn in (post_compile, __init__, maybe_handle_backward_generation):
        fn._axon_patch = True
    cls.post_compile = post_compile
    cls.__init__ = __init__
    output_code.maybe_handle_backward_generation = maybe_handle_backward_generation


# --------------------------------------------------------------------------
# The policy and the wrapper


def _policy_base():
    from torch._inductor.cudagraph_utils import CUDAGraphPolicy

    return CUDAGraphPolicy


def _make_policy_class():
    base = _policy_base()

    class AxonGraphPolicy(base):
        """``CUDAGraphPolicy`` whose ``cudagraphify`` records ``torch.axon.AxonGraph``s.

        Set (by the ``post_compile`` patch) only for graphs on axon; any other
        graph reaching it goes to upstream's implementation.
        """

        def cudagraphify(self, model, example_inputs, static_input_idxs, *, device_index,
                         is_backward, is_inference, **kwargs):
            devices = {t.device.type for t in example_inputs if hasattr(t, "device")}
            if "axon" not in devices:
                return super().cudagraphify(model, example_inputs, static_input_idxs,
                                            device_index=device_index, is_backward=is_backward,
                                            is_inference=is_inference, **kwargs)
            # Inputs the graph mutates must be static (used in place); a
            # mutation of a copied input would land in the copy.  Cudagraph
            # trees run such a function without graphs (check_for_mutation),
            # with this message.
            static = set(static_input_idxs)
            mutated = [i for i in kwargs.get("mutated_input_idxs", ()) if i not in static]
            if mutated:
                from torch._inductor.cudagraph_utils import (get_mutation_stack_trace,
                                                             log_cudagraph_skip_and_bump_counter)

                log_cudagraph_skip_and_bump_counter(
                    get_mutation_stack_trace(kwargs.get("placeholders", ()), mutated))
                return model
            return _AxonGraphed(model, static_input_idxs, device_index)

    return AxonGraphPolicy


@functools.cache
def _policy_class():
    """``AxonGraphPolicy``, built on first use (nothing here imports Inductor)."""
    return _make_policy_class()


def _axon_graph_policy():
    return _policy_class()()


class _AxonGraphed:
    """A compiled graph's boxed callable with axon graph capture and replay.

    Per value of the integer inputs: warm-up, then ``_Variants`` (one
    ``_Recording`` per set of static input addresses); see the module
    docstring for the call sequence.
    """

    def __init__(self, model, static_input_idxs, device_index: int) -> None:
        self.model = model
        self.static_input_idxs = tuple(static_input_idxs)
        self.device_index = device_index
        self.entries: dict = {}
        self.int_idxs: tuple[int, ...] | None = None
        self.skip_reason: str | None = None
        self.pool = None
        self.retired: list = []  # after a skip: recordings whose outputs are in use

    def __call__(self, inputs):
        # The hot path (a recorded graph for these sizes and static inputs): a
        # few dict and pointer checks, the input copies, one replay.
        if self.skip_reason is None and self.int_idxs is not None:
            entry = self.entries.get(tuple(inputs[i] for i in self.int_idxs))
            if type(entry) is _Variants:
                recording = entry.find(inputs)
                if recording is not None:
                    return recording.run(inputs)
        return self._call_slow(inputs)

    def _call_slow(self, inputs):
        from torch._inductor import config

        if self.skip_reason is not None:
            if self.retired:
                self.retired = _release_unused(self.retired)
            return self.model(inputs)
        if self.int_idxs is None:
            self.int_idxs = tuple(i for i, v in enumerate(inputs) if isinstance(v, int))
        key = tuple(inputs[i] for i in self.int_idxs)
        entry = self.entries.get(key)
        if entry is None:
            sizes = config.triton.cudagraph_capture_sizes
            if sizes is not None and key and (key if len(key) > 1 else key[0]) not in sizes:
                self.entries[key] = _NO_GRAPH  # a size not to capture (as cudagraph trees)
            else:
                self.entries[key] = _WARM  # warm-up: the compiled code as it is
            return self.model(inputs)
        if entry is _NO_GRAPH:
            return self.model(inputs)
        if entry is _WARM:
            entry = self.entries[key] = _Variants()
        else:
            # Static inputs at addresses this size has no graph for: another graph.
            entry.release_dead()
            limit = config.triton.cudagraph_unexpected_rerecord_limit
            if len(entry.recordings) >= limit:
                self._skip(f"more than {limit} sets of static input data pointers (parameters "
                           "of modules sharing the compiled code) in use at once")
                return self.model(inputs)
        return self._record(entry, inputs)

    def _skip(self, reason: str) -> None:
        from torch._inductor.cudagraph_utils import log_cudagraph_skip_and_bump_counter

        self.skip_reason = reason
        # Outputs handed out stay valid (the next block may be reading one):
        # each graph is released once its outputs are freed.
        for entry in self.entries.values():
            if isinstance(entry, _Variants):
                self.retired += entry.retire_all()
        self.entries.clear()
        self.retired = _release_unused(self.retired)
        log_cudagraph_skip_and_bump_counter(f"{_SKIP}{reason}")

    def _record(self, variants: "_Variants", inputs):
        import torch

        saved = list(inputs)
        # The first graph of each size shares one pool (as cudagraph trees
        # share one per device); the graphs of other static inputs get pools of
        # their own: the replay of one module's graph must not write into
        # memory another module's live outputs sit in.
        shared = not any(r.shared_pool for r in variants.recordings.values())
        try:
            if shared and self.pool is None:
                self.pool = torch.axon.graph_pool_handle()
            recording = _Recording(self.model, inputs, self.static_input_idxs, self.device_index,
                                   self.pool if shared else torch.axon.graph_pool_handle())
        except RuntimeError as e:
            self._skip(f"an axon graph capture failure: {e}")
            return self.model(saved)
        recording.shared_pool = shared
        variants.add(recording, saved)
        return recording.run(inputs)


class _Variants:
    """One size's recordings, by the addresses of their static inputs."""

    __slots__ = ("idxs", "recordings", "retired")

    def __init__(self) -> None:
        self.idxs: tuple[int, ...] | None = None  # the static tensor inputs' indices
        self.recordings: dict = {}
        # Graphs not to replay again (a static input was freed, or another graph
        # took their addresses) whose last outputs are still in use: released
        # once those are freed.
        self.retired: list = []

    def find(self, inputs):
        if self.idxs is None:  # nothing recorded
            return None
        recording = self.recordings.get(tuple([inputs[i].data_ptr() for i in self.idxs]))
        if recording is not None and recording.static_idxs != self.idxs and \
                not recording.static_inputs_stable(inputs):  # (misaligned inputs)
            return None
        return recording

    def add(self, recording, inputs) -> None:
        if self.idxs is None:
            self.idxs = tuple(recording.static_idxs)
        ptrs = tuple([inputs[i].data_ptr() for i in self.idxs])
        old = self.recordings.pop(ptrs, None)
        if old is not None:
            self.retired.append(old)
        self.recordings[ptrs] = recording

    def release_dead(self) -> None:
        """Retires the graphs of which a static input was freed; releases the retired
        graphs whose outputs are all freed."""
        for ptrs, recording in list(self.recordings.items()):
            if any(r.expired() for r in recording.static_refs):
                del self.recordings[ptrs]
                self.retired.append(recording)
        self.retired = _release_unused(self.retired)

    def retire_all(self) -> list:
        retired = [*self.recordings.values(), *self.retired]
        self.recordings.clear()
        self.retired = []
        return retired


def _release_unused(recordings: list) -> list:
    """Closes the recordings whose outputs are all freed; returns the others."""
    keep = []
    for recording in recordings:
        if recording.outputs_in_use():
            keep.append(recording)
        else:
            recording.close()
    return keep


_OVERWRITTEN = (
    "Error: accessing tensor output of an axon graph (torch.compile mode='reduce-overhead') "
    "that has been overwritten by a subsequent run. To prevent overwriting, clone the tensor "
    "outside of torch.compile(). A gradient the compiled backward returned is such an output: "
    "set .grad to None before each backward (zero_grad(set_to_none=True)), or allocate .grad "
    "outside the compiled backward to accumulate gradients.")

_WARM = object()
_NO_GRAPH = object()
# The storages (StorageImpl addresses) of the outputs the last replay of each
# graph handed out.
_HANDED_OUT: set[int] = set()


class _Recording:
    """One recorded graph: static input buffers, the graph, its outputs."""

    def __init__(self, model, inputs, static_input_idxs, device_index: int, pool=None) -> None:
        import torch
        from torch._inductor import compile_fx as cfx

        check_idxs = cfx.get_input_idxs_to_check(inputs, static_input_idxs)
        static = set(cfx.remove_unaligned_input_idxs(inputs, static_input_idxs))
        cfx.copy_misaligned_inputs(inputs, check_idxs)
        tensor = torch.Tensor
        self.static_idxs = tuple(i for i in sorted(static) if isinstance(inputs[i], tensor))
        self.static_ptrs = [inputs[i].data_ptr() for i in self.static_idxs]
        self.copy_idxs = [i for i, x in enumerate(inputs)
                          if isinstance(x, tensor) and i not in static]
        self.expanded = {i: cfx.get_expanded_dims(inputs[i]) for i in self.copy_idxs}
        self.static_inputs = [
            x if not isinstance(x, tensor) else (x.detach() if i in static else cfx.static_input(x))
            for i, x in enumerate(inputs)]
        self._copy_inputs(inputs)
        self.graph = torch.axon.AxonGraph()
        with torch.axon.device(device_index):
            stream = torch.axon.Stream()
            stream.wait_stream(torch.axon.current_stream())
            rng = torch.axon.get_rng_state()
            try:
                with torch.axon.graph(self.graph, pool=pool, stream=stream,
                                      capture_error_mode="thread_local"):
                    outputs = model(list(self.static_inputs))
            finally:
                torch.axon.set_rng_state(rng)  # the replays draw the numbers
        if not isinstance(outputs, (list, tuple)):
            outputs = (outputs,)
        self.outputs = list(outputs)
        # Outputs in the graph's memory (not views of an input): a replay
        # rewrites them; they are handed out on storages of their own
        # (_hand_out), which the next replay invalidates.
        input_storages = {x.untyped_storage().data_ptr() for x in self.static_inputs
                          if isinstance(x, tensor)}
        self.owned = [o for o in self.outputs if isinstance(o, tensor)
                      and o.untyped_storage().data_ptr() not in input_storages]
        owned_ids = {id(o) for o in self.owned}
        self.owned_idxs = [i for i, o in enumerate(self.outputs) if id(o) in owned_ids]
        self.handed_out = []  # weak references to the storages the last run returned
        self.shared_pool = False
        # The graph reads the static inputs at their addresses; it does not
        # keep them alive (as cudagraph trees): once one is freed, the graph is
        # retired (_Variants.release_dead).  Outputs of graphs (a forward's,
        # saved for its backward) come on a new storage at every replay, at the
        # same address: not watched.
        from torch.multiprocessing.reductions import StorageWeakRef

        self.static_refs = []
        for i in self.static_idxs:
            storage = self.static_inputs[i].untyped_storage()
            if storage._cdata not in _HANDED_OUT:
                self.static_refs.append(StorageWeakRef(storage))
            self.static_inputs[i] = None
        self.run = self._run_checked if cfx.config.size_asserts else self._run

    def static_inputs_stable(self, inputs) -> bool:
        return all(inputs[i].data_ptr() == p for i, p in zip(self.static_idxs, self.static_ptrs))

    def _copy_inputs(self, inputs) -> None:
        from torch._inductor.compile_fx import index_expanded_dims_and_copy_

        dst = self.static_inputs
        for i in self.copy_idxs:
            index_expanded_dims_and_copy_(dst[i], inputs[i], self.expanded[i])

    def _run(self, inputs):
        import torch

        self._copy_inputs(inputs)
        inputs.clear()
        if self.owned:
            torch._C._increment_version(self.owned)
        self._invalidate_handed_out()
        self.graph.replay()
        return self._hand_out()

    def _hand_out(self):
        """The outputs, those in the graph's memory on storages of this run's own (not
        owning the memory), which the next replay invalidates: as cudagraph trees, a
        program that reads an output after the next run (which overwrote it) gets an
        error, not the next run's values."""
        import torch
        from torch.multiprocessing.reductions import StorageWeakRef

        out = [o.detach() if isinstance(o, torch.Tensor) else o for o in self.outputs]
        fresh = {}
        for i in self.owned_idxs:
            o = self.outputs[i]
            storage = o.untyped_storage()
            key = storage.data_ptr()
            if key not in fresh:
                fresh[key] = torch._C._construct_storage_from_data_pointer(
                    key, o.device, storage.nbytes())
            out[i] = torch.empty(0, dtype=o.dtype, device=o.device).set_(
                fresh[key], o.storage_offset(), o.size(), o.stride())
        self.handed_out = [StorageWeakRef(st) for st in fresh.values()]
        _HANDED_OUT.update(ref.cdata for ref in self.handed_out)
        return out

    def outputs_in_use(self) -> bool:
        return any(not ref.expired() for ref in self.handed_out)

    def _invalidate_handed_out(self) -> None:
        import torch

        from .. import _C

        for ref in self.handed_out:
            _HANDED_OUT.discard(ref.cdata)
            if ref.expired():
                continue
            storage = torch.UntypedStorage._new_with_weak_ptr(ref.cdata)
            holder = torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage)
            _C._invalidate_storage(holder, _OVERWRITTEN)
        self.handed_out = []

    def _run_checked(self, inputs):
        assert len(inputs) == len(self.static_inputs)
        return self._run(inputs)

    def close(self) -> None:
        self._invalidate_handed_out()  # their memory goes back to the pool
        self.graph.reset()
        self.outputs = self.owned = self.static_inputs = []

    def __del__(self) -> None:
        try:
            self._invalidate_handed_out()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass


@on_import("torch._prims.rng_prims")
def checkpoint_rng_state_ops(rng_prims) -> None:
    """Patch ``torch._prims.rng_prims``'s ``run_and_save_rng_state`` and
    ``run_with_rng_state`` (their BackendSelect, fake and proxy kernels).

    torch.compile's activation-checkpointing partitioner wraps each random op of
    a recomputed region (SDPA counts as one) in these two operators, whose
    kernels know cuda, cpu, hpu and xpu only: every compiled model with
    gradient checkpointing and SDPA on axon failed with "Backend not supported
    for axon".  Axon's entries save and restore torch.axon's generator state
    (the device of the op's first tensor), as CUDA's do with torch.cuda's.  The
    generic fix: ask the device module for get_rng_state/set_rng_state.
    """
    import torch
    from torch._C import DispatchKey
    from torch._higher_order_ops.utils import registered_hop_fake_fns
    from torch.fx.experimental.proxy_tensor import ProxyTorchDispatchMode, track_tensor_tree
    from torch.utils import _pytree as pytree

    save, run_with = rng_prims.run_and_save_rng_state, rng_prims.run_with_rng_state
    if getattr(save, "_axon_patched", False):
        return

    def axon_device(args, kwargs):
        if rng_prims.get_device(args, kwargs) != "axon":
            return None
        device = kwargs.get("device")
        if device is None:
            device = next(a.device for a in args if isinstance(a, torch.Tensor))
        return torch.device(device)

    def save_on_axon(device, op, *args, **kwargs):
        return torch.axon.get_rng_state(device), op(*args, **kwargs)

    def run_with_on_axon(device, rng_state, op, *args, **kwargs):
        current = torch.axon.get_rng_state(device)
        torch.axon.set_rng_state(rng_state.cpu(), device)
        try:
            return op(*args, **kwargs)
        finally:
            torch.axon.set_rng_state(current, device)

    def first_device(args):
        return next(a.device for a in args if isinstance(a, torch.Tensor))

    save.py_impl(DispatchKey.PrivateUse1)(
        lambda op, *a, **kw: save_on_axon(first_device(a), op, *a, **kw))
    run_with.py_impl(DispatchKey.PrivateUse1)(
        lambda st, op, *a, **kw: run_with_on_axon(first_device(a), st, op, *a, **kw))

    save_select = save.py_kernels[DispatchKey.BackendSelect]
    run_with_select = run_with.py_kernels[DispatchKey.BackendSelect]

    def save_backend_select(op, *args, **kwargs):
        device = axon_device(args, kwargs)
        if device is not None:
            return save_on_axon(device, op, *args, **kwargs)
        return save_select(op, *args, **kwargs)

    def run_with_backend_select(rng_state, op, *args, **kwargs):
        device = axon_device(args, kwargs)
        if device is not None:
            return run_with_on_axon(device, rng_state, op, *args, **kwargs)
        return run_with_select(rng_state, op, *args, **kwargs)

    save.py_kernels[DispatchKey.BackendSelect] = save_backend_select
    run_with.py_kernels[DispatchKey.BackendSelect] = run_with_backend_select
    save._dispatch_cache.clear()
    run_with._dispatch_cache.clear()

    save_fake = registered_hop_fake_fns[save]

    def save_fake_with_axon(op, *args, **kwargs):
        device = axon_device(args, kwargs)
        if device is not None:
            return save_on_axon(device, op, *args, **kwargs)
        return save_fake(op, *args, **kwargs)

    registered_hop_fake_fns[save] = save_fake_with_axon

    save_proxy = save.python_key_table[ProxyTorchDispatchMode]

    def save_proxy_with_axon(mode, op, *args, **kwargs):
        if axon_device(args, kwargs) is None:
            return save_proxy(mode, op, *args, **kwargs)
        out = save_backend_select(op, *args, **kwargs)
        proxy_args = pytree.tree_map(mode.tracer.unwrap_proxy, (op, *args))
        proxy_kwargs = pytree.tree_map(mode.tracer.unwrap_proxy, kwargs)
        out_proxy = mode.tracer.create_proxy("call_function", save, proxy_args, proxy_kwargs)
        return track_tensor_tree(out, out_proxy, constant=None, tracer=mode.tracer)

    save.python_key_table[ProxyTorchDispatchMode] = save_proxy_with_axon
    save._axon_patched = True
