"""FlexAttention under torch.compile on axon.

Inductor lowers the ``flex_attention`` higher-order op to one of its
templates, chosen by device type
(``torch/_inductor/kernel/flex/flex_attention.py::flex_attention``:
``query.get_device().type == "cpu"`` takes the C++ template ``lower_cpu``,
"mps" the Metal one, any other device the Triton one).  axon kernels are
Inductor's C++ kernels on host-addressable memory, so the C++ template is the
one that fits: ``install_lowering`` makes axon take it.

That template computes the forward output only (no log-sum-exp, no max
scores: ``lower_cpu`` raises for them, and Inductor has no C++ template of
``flex_attention_backward`` at all; on the CPU torch.compile of FlexAttention
is inference-only).  Training needs both, so ``decompose`` (a post-grad pass,
run through axon's device custom pass, see codegen.AxonCachePass) replaces on
axon:

* every ``flex_attention_backward`` node, and every ``flex_attention`` node
  whose statistics are used (a training forward, ``return_lse``,
  ``AuxRequest``) or that the template does not take (dtypes), by the ATen
  ops of the op's own dense implementation
  (``torch/_higher_order_ops/flex_attention.py::sdpa_dense`` /
  ``sdpa_dense_backward``, the code eager mode runs), traced with Inductor's
  decompositions and functionalized; Inductor then fuses them into C++
  kernels and matmul extern calls like any other graph.  It materialises the
  scores matrix (B x H x L x S), as eager mode does.
* the remaining ``flex_attention`` nodes (inference: only the output used)
  keep the op, with ``OUTPUT_LOGSUMEXP`` turned off, for the C++ template.
"""

from __future__ import annotations

import functools
import operator
from typing import Any

import torch
import torch.fx as fx
import torch.utils._pytree as pytree

_DEVICE = "axon"


def _ops():
    return torch.ops.higher_order.flex_attention, torch.ops.higher_order.flex_attention_backward


# ---------------------------------------------------------------- lowering


def install_lowering() -> None:
    """Have Inductor's ``flex_attention`` lowering take the C++ template for axon.

    Upstream site: ``torch/_inductor/kernel/flex/flex_attention.py::flex_attention``
    picks ``lower_cpu`` by ``query.get_device().type == "cpu"``.  The generic
    fix: pick it for every device whose Inductor scheduling is C++
    (``isinstance(get_scheduling_for_device(type), CppScheduling)``).
    Idempotent; other devices reach the original lowering.
    """
    import torch._inductor.kernel.flex.flex_attention  # noqa: F401  (registers the lowering)
    from torch._inductor.kernel.flex.flex_cpu import lower_cpu
    from torch._inductor.lowering import lowerings

    hop = torch.ops.higher_order.flex_attention
    original = lowerings[hop]
    if getattr(original, "_axon_patch", False):
        return

    @functools.wraps(original)
    def flex_attention(query, *args, **kwargs):
        if query.get_device().type == _DEVICE:
            return lower_cpu(query, *args, **kwargs)
        return original(query, *args, **kwargs)

    flex_attention._axon_patch = True
    lowerings[hop] = flex_attention


# ------------------------------------------------------------ decomposition


def _val(arg: Any) -> Any:
    return arg.meta.get("val") if isinstance(arg, fx.Node) else arg


def _template_takes(node: fx.Node) -> bool:
    """Whether the C++ template computes everything used of this forward node.

    The template's conditions are ``lower_cpu``'s: the output only (the
    log-sum-exp and max-score outputs unused), q, k and v of one floating
    dtype, a CPU the template supports.
    """
    from torch._inductor.kernel.flex.flex_cpu import check_cpu_supported

    q, k, v = (_val(a) for a in node.args[:3])
    if node.args[6].get("OUTPUT_MAX", False):
        return False
    for user in node.users:
        if user.target is not operator.getitem:
            return False
        if user.args[1] != 0 and user.users:
            return False
    return (q.dtype == k.dtype == v.dtype
            and q.dtype in (torch.float32, torch.bfloat16, torch.float16)
            and check_cpu_supported())


def _dense_impl(target):
    from torch._higher_order_ops.flex_attention import sdpa_dense, sdpa_dense_backward

    return sdpa_dense if target is torch.ops.higher_order.flex_attention else sdpa_dense_backward


def _inline_dense(gm: fx.GraphModule, node: fx.Node) -> None:
    """Replace ``node`` by the traced ATen ops of its dense implementation."""
    from torch._dispatch.python import enable_python_dispatcher
    from torch._guards import detect_fake_mode
    from torch._inductor.decomposition import select_decomp_table
    from torch._subclasses.functional_tensor import FunctionalTensorMode, dispatch_functionalize
    from torch.fx.experimental.proxy_tensor import make_fx

    graph = gm.graph
    impl = _dense_impl(node.target)

    # Graph inputs of the replacement: the tensor/SymInt-valued argument
    # nodes.  Subgraphs (get_attr nodes) and constants are baked in.
    flat_args, spec = pytree.tree_flatten((node.args, node.kwargs))
    input_nodes: list[fx.Node] = []
    baked: list[Any] = []
    for a in flat_args:
        if isinstance(a, fx.Node) and a.op == "get_attr":
            baked.append(_vmappable(getattr(gm, a.target)))
        elif isinstance(a, fx.Node):
            baked.append(None)
            input_nodes.append(a)
        else:
            baked.append(a)
    slots = [i for i, a in enumerate(flat_args) if isinstance(a, fx.Node) and a.op != "get_attr"]

    def dense(*inputs):
        leaves = list(baked)
        for i, x in zip(slots, inputs):
            leaves[i] = x
        args, kwargs = pytree.tree_unflatten(leaves, spec)
        with torch.no_grad():
            return pytree.tree_leaves(impl(*args, **kwargs))

    example = [_val(a) for a in input_nodes]
    fake_mode = detect_fake_mode(example)
    if node.target is torch.ops.higher_order.flex_attention_backward:
        # Fake tensors of the post-grad graph do not require grad; the dense
        # backward returns gradients for the captured score_mod buffers that
        # do: mark those whose gradients the op's result has.
        wanted = {a for a, g in zip(node.args[12], node.meta["val"][3])
                  if isinstance(a, fx.Node) and g is not None}
        example = [v.detach().requires_grad_() if a in wanted else v
                   for a, v in zip(input_nodes, example)]
    with fake_mode, enable_python_dispatcher():
        # Twice: vmap (score_mod, mask_mod) resolves to batched ATen ops
        # first; decomposing inside vmap would hit ops without batching
        # rules (prims), which vmap runs once per element.
        batched = make_fx(dispatch_functionalize(dense, FunctionalTensorMode()),
                          tracing_mode="real")(*example)
        traced = make_fx(batched, select_decomp_table(), tracing_mode="real")(*example)

    # The dense implementation's result, as the op's nested output structure.
    out_val = node.meta["val"]
    _, out_spec = pytree.tree_flatten(out_val)

    env: dict[fx.Node, Any] = {}
    placeholders = traced.graph.find_nodes(op="placeholder")
    for ph, inp in zip(placeholders, input_nodes):
        env[ph] = inp
    outputs: Any = None
    with graph.inserting_before(node):
        for n in traced.graph.nodes:
            if n.op == "placeholder":
                continue
            if n.op == "output":
                outputs = fx.map_arg(n.args[0], lambda x: env[x])
                break
            if n.op == "get_attr":
                env[n] = _constant(gm, fake_mode, getattr(traced, n.target))
                continue
            if n.target is torch.ops.aten.lift_fresh_copy.default:
                env[n] = env[n.args[0]]
                continue
            env[n] = graph.node_copy(n, lambda x: env[x])
    result = pytree.tree_unflatten(list(outputs), out_spec)

    def replace(user_of: fx.Node, value: Any) -> None:
        for user in list(user_of.users):
            assert user.target is operator.getitem, user
            part = value[user.args[1]]
            if isinstance(part, (tuple, list)):
                replace(user, part)
            elif user.users:
                assert isinstance(part, fx.Node), (user, part)
                user.replace_all_uses_with(part)
            graph.erase_node(user)

    replace(node, result)
    graph.erase_node(node)


def _vmappable(sub: Any) -> Any:
    """A subgraph (score_mod, joint, mask_mod) that vmap batches as whole tensors.

    Inductor's passes have already turned dtype conversions in these
    subgraphs into ``prims.convert_element_type``, which has no vmap
    batching rule: vmap would run it once per score element.  The copy
    converts with ``aten._to_copy`` instead.
    """
    if not isinstance(sub, fx.GraphModule):
        return sub
    convert = torch.ops.prims.convert_element_type.default
    if not any(n.target is convert for n in sub.graph.nodes):
        return sub
    graph = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    for n in sub.graph.nodes:
        if n.target is convert:
            x, dtype = n.args
            env[n] = graph.call_function(torch.ops.aten._to_copy.default, (env[x],),
                                         {"dtype": dtype})
            env[n].meta.update(n.meta)
        else:
            env[n] = graph.node_copy(n, lambda x: env[x])
    return fx.GraphModule(sub, graph)


def _constant(gm: fx.GraphModule, fake_mode, value: torch.Tensor) -> fx.Node:
    """A node for a constant tensor of the traced implementation.

    The dense implementation's constants are scalars (``-inf``, ``0``):
    they become ``aten.full`` nodes (which Inductor inlines into kernels);
    anything else becomes a buffer of ``gm``.
    """
    graph = gm.graph
    if value.dim() == 0:
        node = graph.call_function(
            torch.ops.aten.full.default, ([], value.item()),
            {"dtype": value.dtype, "device": value.device, "pin_memory": False})
    else:
        i = 0
        while hasattr(gm, f"_axon_flex_constant{i}"):
            i += 1
        gm.register_buffer(f"_axon_flex_constant{i}", value)
        node = graph.get_attr(f"_axon_flex_constant{i}")
    node.meta["val"] = fake_mode.from_tensor(value)
    return node


def decompose(gm: fx.GraphModule) -> None:
    """The post-grad pass: see the module docstring."""
    flex, flex_backward = _ops()
    changed = False
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target not in (flex, flex_backward):
            continue
        query = _val(node.args[0])
        if not isinstance(query, torch.Tensor) or query.device.type != _DEVICE:
            continue
        if node.target is flex and _template_takes(node):
            if node.args[6].get("OUTPUT_LOGSUMEXP", False):
                args = list(node.args)
                args[6] = {**args[6], "OUTPUT_LOGSUMEXP": False}
                node.args = tuple(args)
                changed = True
            continue
        _inline_dense(gm, node)
        changed = True
    if changed:
        gm.graph.eliminate_dead_code()
        gm.graph.lint()
        gm.recompile()
