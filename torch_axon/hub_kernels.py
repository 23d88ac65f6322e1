"""Hub kernels for Transformers models on axon, with the pinned Transformers.

The shipped kernel repositories (``examples/kernels/axon-*``, the Hugging Face
kernel-hub layout with the build variant ``build/torch-axon/``) load with the
``kernels`` library from a local directory, and ``kernels.kernelize(model,
device="axon", mode=...)`` swaps them in (torch_axon.integrations.hf_kernels
makes the library accept the device).

Transformers marks its layers for the hub with ``use_kernel_forward_from_hub``
and ``use_kernelized_func``, but only when the installed ``kernels`` is in its
supported range (Transformers 5.24: ``>=0.18.2,<0.19``; the package index has
0.17.2); otherwise those decorators are no-ops and ``use_kernels=True`` /
``model.kernelize()`` raise.  :func:`prepare` does what the decorators would
have done for the classes of one model, read from the decorators in their
source (``@use_kernel_forward_from_hub("RMSNorm")`` over ``LlamaRMSNorm``,
``@use_kernelized_func(apply_rotary_pos_emb)`` over ``LlamaAttention``), plus
the layers the axon repositories have kernels for that Transformers does not
mark (``LlamaMLP``, ``LlamaDecoderLayer``: the residual add fused into the
post-attention RMSNorm, ``ViTAttention``, ``ViTLayer``), through the library's own
``replace_kernel_forward_from_hub``.  :func:`kernelize` = prepare + the axon
kernel mapping + ``kernels.kernelize``::

    import torch_axon.hub_kernels as hub_kernels
    model = LlamaForCausalLM(config).to("axon").eval()
    hub_kernels.kernelize(model)                      # Mode.INFERENCE, device "axon"

A model kernelized this way runs the kernels in eager mode and under
``torch.compile`` (each is a custom op with a fake implementation).

Functions such as ``apply_rotary_pos_emb`` become one function layer per
Transformers module, installed in place of the module-level function (as
Transformers' own decorator does with ``kernels`` in range), so kernelizing
one model swaps the function for every model of that family in the process;
the axon rotary layer runs PyTorch's math for tensors that are not on axon.
"""

from __future__ import annotations

import inspect
import re
import sys
from pathlib import Path

__all__ = ["REPOSITORIES", "default_repo_root", "kernel_mapping", "prepare", "kernelize"]

# layer name -> (repository directory, layer class in its ``layers``)
REPOSITORIES = {
    "RMSNorm": ("axon-layernorm", "RMSNorm"),
    "LayerNorm": ("axon-layernorm", "LayerNorm"),
    "SiluAndMul": ("axon-activation", "SiluAndMul"),
    "GeluAndMul": ("axon-activation", "GeluAndMul"),
    "GeluTanhAndMul": ("axon-activation", "GeluTanhAndMul"),
    "LlamaMLP": ("axon-activation", "LlamaMLP"),
    "LlamaDecoderLayer": ("axon-layernorm", "LlamaDecoderLayer"),
    "rotary_pos_emb": ("axon-rotary", "RotaryPosEmb"),
    "ViTAttention": ("axon-vit", "ViTAttention"),
    "ViTLayer": ("axon-vit", "ViTLayer"),
}

# Transformers classes that have an axon kernel but no hub decorator: class name -> layer name.
_UNMARKED = {"LlamaMLP": "LlamaMLP", "LlamaDecoderLayer": "LlamaDecoderLayer",
             "ViTAttention": "ViTAttention", "ViTLayer": "ViTLayer"}

_FORWARD_RE = re.compile(r'@use_kernel_forward_from_hub\(\s*["\']([^"\']+)["\']\s*\)')
_FUNCS_RE = re.compile(r"@use_kernelized_func\(([^)]*)\)")


def default_repo_root() -> Path:
    """``examples/kernels`` of the source tree torch_axon runs from."""
    return Path(__file__).resolve().parent.parent / "examples" / "kernels"


def kernel_mapping(repo_root: str | Path | None = None) -> dict:
    """The ``kernels`` mapping {layer name: {"axon": LocalLayerRepository}} of the
    shipped repositories under ``repo_root`` (default :func:`default_repo_root`)."""
    from kernels import LocalLayerRepository

    root = Path(repo_root) if repo_root is not None else default_repo_root()
    if not root.is_dir():
        raise FileNotFoundError(f"hub_kernels: no kernel repositories at {root} (pass repo_root)")
    return {name: {"axon": LocalLayerRepository(repo_path=root / repo, layer_name=layer)}
            for name, (repo, layer) in REPOSITORIES.items()}


def _decorators(obj) -> str:
    """The decorator lines of a class's or function's definition ("" without source)."""
    try:
        src = inspect.getsource(obj)
    except (OSError, TypeError):
        return ""
    return re.split(r"^\s*(?:class|def)\s", src, maxsplit=1, flags=re.M)[0]


def _llama_mlp_condition(module) -> bool:
    act = getattr(getattr(module, "config", None), "hidden_act", None)
    return act in ("silu", "swish", "gelu", "gelu_pytorch_tanh", "gelu_new")


_CONDITIONS = {"LlamaMLP": _llama_mlp_condition}
_func_modules: dict = {}


def _func_module(module_globals: dict, fn_name: str, layer_name: str):
    """Transformers' function layer for ``fn_name`` (what ``use_kernel_forward_from_hub``
    makes of a function with kernels in range), installed in the defining module."""
    from kernels import use_kernel_forward_from_hub

    fn = module_globals.get(fn_name)
    if fn is None:
        return None
    if hasattr(fn, "kernel_layer_name"):  # already a function layer
        return fn
    key = (id(module_globals), fn_name)
    if key not in _func_modules:
        layer = use_kernel_forward_from_hub(layer_name)(fn)
        layer.__name__ = fn_name
        _func_modules[key] = layer
        module_globals[fn_name] = layer  # the forward calls the module-level name
    return _func_modules[key]


def prepare(model) -> list[str]:
    """Mark the layers of ``model`` that have axon kernels for ``kernels.kernelize``.

    Returns the names of the layers marked.  Classes already marked (by
    Transformers with ``kernels`` in its range, or an earlier call) are left
    as they are.
    """
    from kernels import replace_kernel_forward_from_hub

    marked = []
    for module in model.modules():
        cls = type(module)
        if hasattr(cls, "kernel_layer_name"):
            if cls.kernel_layer_name in REPOSITORIES:
                marked.append(cls.kernel_layer_name)
        else:
            decorators = _decorators(cls) if cls.__module__.startswith("transformers.") else ""
            m = _FORWARD_RE.search(decorators)
            name = m.group(1) if m else _UNMARKED.get(cls.__name__)
            if name in REPOSITORIES and cls.__module__.startswith("transformers."):
                replace_kernel_forward_from_hub(cls, name, _CONDITIONS.get(name))
                marked.append(name)
        # functions a layer calls (``@use_kernelized_func(apply_rotary_pos_emb)``)
        if cls.__module__.startswith("transformers.") and "_kernel_funcs" not in module.__dict__:
            m = _FUNCS_RE.search(_decorators(cls))
            if m:
                module_globals = vars(sys.modules[cls.__module__])
                funcs = {}
                for fn_name in (n.strip() for n in m.group(1).split(",") if n.strip()):
                    src = _decorators(module_globals.get(fn_name)) if inspect.isfunction(
                        module_globals.get(fn_name)) else ""
                    fm = _FORWARD_RE.search(src)
                    layer = (_func_module(module_globals, fn_name, fm.group(1)) if fm else
                             module_globals.get(fn_name) if hasattr(module_globals.get(fn_name),
                                                                    "kernel_layer_name") else None)
                    if layer is not None:
                        funcs[fn_name] = layer
                        marked.append(layer.kernel_layer_name)
                if funcs:
                    module.__dict__["_kernel_funcs"] = funcs
    return sorted(set(marked))


def kernelize(model, mode=None, device: str = "axon", repo_root: str | Path | None = None,
              use_fallback=True):
    """prepare(model), then ``kernels.kernelize`` with the axon repositories' mapping.

    ``mode`` defaults to ``Mode.TRAINING`` for a model in training mode,
    ``Mode.INFERENCE`` otherwise.  Returns the model.
    """
    import kernels

    prepare(model)
    if mode is None:
        mode = kernels.Mode.TRAINING if model.training else kernels.Mode.INFERENCE
    with kernels.use_kernel_mapping(kernel_mapping(repo_root)):
        return kernels.kernelize(model, mode=mode, device=device, use_fallback=use_fallback)
