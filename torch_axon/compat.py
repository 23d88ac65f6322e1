"""Compatibility harness: every causal-LM architecture of the installed Transformers
on the CPU and on axon.

    python -m torch_axon.compat [--only a,b,c] [--limit N] [--timeout S]
                                [--compiled | --compiled-only] [--compile-timeout S]
                                [--output docs/COMPATIBILITY.md | --no-write]
                                [--dtype float32] [--in-process]
                                [--save-results JSON] [--from-results JSON]

For each ``model_type`` in ``MODEL_FOR_CAUSAL_LM_MAPPING_NAMES`` it builds a tiny,
randomly initialised model (no download), runs the same work on the CPU and on
axon and compares:

1. forward: logits of a batch of 2 x 16 random token ids with an attention mask
   (row 1 left-padded by 3) in ``eval()`` mode; max abs error, ok within
   ``|axon - cpu| <= TOL + TOL * |cpu|`` (TOL = 1e-4 in float32);
2. one training step: ``train()`` mode (dropouts are 0), ``labels = input_ids``
   (padding -100), ``loss.backward()``; the loss and every parameter gradient
   are compared with the same tolerance (a gradient present on one device only
   is a mismatch);
3. ``generate()``: greedy (``do_sample=False``), prompt 2 x 8 (row 1 left-padded
   by 2), ``max_new_tokens = min_new_tokens = 16``, ``pad_token_id`` set; the
   tokens must be identical. Where they differ, the CPU scores at the first
   differing step are checked: if both tokens' scores are within the tolerance
   (a tie up to rounding) the run counts as equal and is marked "tie".

4. (opt-in, ``--compiled``) the compiled column, on axon only: the same greedy
   ``generate()`` (prompt and keyword arguments as in 3) with
   ``cache_implementation="static"``, once eagerly (``disable_compile=True``)
   and once with ``compile_config=CompileConfig(backend="axon",
   fullgraph=False, dynamic=False)``: Transformers runs the prefill eagerly
   and compiles the decoding step. The tokens must be identical (the tie rule
   of 3, on the eager run's scores). See "The compiled column" below.

An architecture "works on CPU" when checks 1-3 run on the CPU; it "works on axon"
when they also run on axon and match (the compiled column does not enter it).
The model is built once on the CPU from a fixed seed; axon gets a deep copy
(``.to("axon")``) taken before anything runs, so both devices start from
identical weights (the compiled column reuses that copy after check 3). Inputs come from a seeded CPU
generator and avoid every special token id. ``torch.axon.fallback_stats()`` is
reset after the copy and read after the backward pass (the ops that ran through
the CPU fallback in forward + backward) and again around ``generate()``.

Isolation: each architecture runs under a time limit (``--timeout``, SIGALRM) and
in a try/except, so one failing model never stops the run. A hang inside C++
cannot be interrupted by a signal, so by default the architectures run in a
worker process (``python -m torch_axon.compat --worker``) that reports each stage
as it starts; a worker that does not answer within the limit plus
``HANG_GRACE`` seconds, or dies, is killed and replaced, and the architecture is
reported as hung / crashed at the stage it had reached (a worker lost during
the compiled column keeps the results of checks 1-3: it reports them before
the column starts). ``--in-process`` runs everything in the calling process
instead. The exit code is 0 unless the harness itself fails.
``--save-results`` writes the raw results as JSON; ``--from-results`` renders
the report from such a file without running anything.

The compiled column
-------------------
``--compiled`` adds it to checks 1-3 (it costs a compilation per
architecture: ~5-40 s each on 2 cores, less with Inductor's on-disk caches
warm); ``--compiled-only`` runs only the column (model and inputs built as
usual, no CPU reference checks; with ``--only a,b`` for a quick look). The
per-architecture limit becomes ``--timeout`` + ``--compile-timeout`` (default
``COMPILE_TIMEOUT`` seconds; ``--compiled-only``: ``--compile-timeout``).
Before each architecture ``torch._dynamo.reset()``; the Dynamo counters are
cleared just before the compiled ``generate()``. Recorded per architecture:

- status: "ok" (tokens identical, or a tie), "mismatch", "error(stage): msg"
  (stages: static-eager = the eager static-cache run failed on axon while it
  runs on the CPU, compile = the compiled run failed), "n/a: reason" or
  "skipped" (not run: the CPU checks failed, the model is not standalone, or
  the time limit ran out before the column);
- graphs: ``counters["stats"]["unique_graphs"]`` (1 for a decoding step that
  compiles once; more when Dynamo recompiles, e.g. on Python-int state of
  sliding-window caches), graph breaks: ``sum(counters["graph_break"].values())``
  (and their reasons), seconds of the compiled ``generate()`` (compile
  included);
- whether the model class declares ``_can_compile_fullgraph`` (informative:
  the column runs every model with ``fullgraph=False``, as Transformers would
  on axon, declared or not).

"n/a" means the model cannot use a static cache, decided by running rather
than by class attributes (``_can_compile_fullgraph`` is only a claim about
graph breaks; Transformers 5 has no ``_supports_static_cache``): the eager
static-cache ``generate()`` fails on axon *and* on the CPU (a model
limitation; if it fails on axon only, that is "error(static-eager)"), or
``generate()`` compiled nothing (0 graphs): the model keeps its own cache and
ignores ``cache_implementation`` (``_supports_default_dynamic_cache()``
False), its cache is not a compilable one, or Transformers skips it
(``get_compiled_call`` returns the eager call for llama4). "n/a" models are
left out of the summary "N/M compile with tokens equal to eager; X with no
graph breaks" (M: ok + mismatch + error; X: ok with 0 breaks).

Also recorded: whether Dynamo hit its recompile limit
(``torch._dynamo.config.recompile_limit``, "Dynamo recompile limit exceeded"
in ``counters["unimplemented"]``): the decoding step recompiled every step
(shapes or Python-int cache state that change, e.g. a model that ignores the
cache and reruns the whole sequence, or sliding-window cache layers) and the
later steps ran eagerly.

On "mismatch", "error(compile)", graph breaks or the recompile limit, the same
compiled ``generate()`` runs on the CPU with Inductor
(``compile_config._compile_all_devices = True``) against the CPU's eager
static-cache run: the control that tells an axon problem from a Transformers /
Dynamo limitation. Its outcome is the note ("CPU Inductor: ok / mismatch
(graphs, breaks) / error: msg").

How the tiny config is made (``tiny_config``)
---------------------------------------------
Start from the config class's defaults (``CONFIG_MAPPING[model_type]()``), take
``to_dict()``, shrink it with the generic rules below, then call the config
class with the changed values only, so its own derived fields and validation
run on the new sizes. The rules apply recursively to nested sub-configs
(``text_config``, ``vision_config``, ...); values only ever shrink:

- width (``hidden_size``, ``d_model``, ``n_embd``, ``embed_dim``, ...) -> 64;
  attention heads -> 4; key/value heads -> 2 (kept at 1 if multi-query, 4 if
  the default has as many as attention heads; None -> 4); head sizes
  (``head_dim``, ``attention_head_size``, ...; None -> 16) -> 16;
  ``rotary_dim`` -> 8; feed-forward sizes (``intermediate_size``, ``ffn_dim``,
  ``n_inner``, ...) -> 128, expert feed-forward sizes -> 32;
- multi-head latent attention: rope head 8, nope head 16, value head 16, LoRA
  ranks 32; a head size that equalled the rope (or rope + nope) size follows it;
- mixture of experts: 4 experts, 2 per token, at most 1 shared expert, 1 expert
  group, at most 1 dense prefix layer (None counts become 4 / 2 / 1 when the
  config has expert sizes);
- state-space models: state size 16, ``dt`` ranks 8, chunk 8, heads x head size
  = expand x width (head size 16);
- depth: the layers kept are the first layer of each distinct combination of
  the per-layer settings (``layer_types``, ``mlp_layer_types``, membership of
  layer-index lists such as ``mlp_only_layers``), at least 2 (a hybrid model
  keeps e.g. one sliding and one full attention layer, a MoE model one dense
  and one sparse layer); every list as long as the default depth is cut to
  those layers, layer-index lists and ``per_layer_config`` are renumbered, and
  the depth becomes the number of layers kept; ``*_layer_period`` -> 2,
  ``*_layer_offset`` -> 1;
- ``vocab_size`` (and similar) -> 256; special token ids (pad/bos/eos/...) that
  fall outside the new vocabulary are moved to its top ids;
- position limits (``max_position_embeddings``, ``n_positions``, ...) -> 256;
- sliding / chunked attention windows and top-k token selections (``index_topk``)
  -> 8, below the 16-token inputs so the windowed / sparse paths are exercised;
- every dropout / layerdrop / jitter probability -> 0 (train mode is then
  deterministic);
- ``rope_scaling`` / ``rope_parameters`` are left as they are, except that
  per-frequency lists (``long_factor``, ``short_factor``) are cut to the new
  rotary size;
- ``is_decoder = True``, ``add_cross_attention = False`` where present.

Architectures the generic rules do not fit get an entry in ``OVERRIDES`` (each
with its reason), extra inputs in ``INPUT_HOOKS``; ``NOT_STANDALONE`` lists the
ones that cannot run alone. All three are listed in the generated
COMPATIBILITY.md. A guard refuses configs that still have more than
``MAX_PARAMS`` parameters.

Attention: ``attn_implementation="sdpa"`` where the model supports it, else
``"eager"``; the report records which.
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import dataclasses
import datetime
import gc
import inspect
import io
import json
import logging
import math
import os
import platform
import signal
import sys
import time
import traceback
import warnings

import torch

HIDDEN = 64
LAYERS = 2
HEADS = 4
KV_HEADS = 2
HEAD_DIM = HIDDEN // HEADS
INTERMEDIATE = 128
EXPERT_INTERMEDIATE = 32
VOCAB = 256
MAX_POSITIONS = 256
EXPERTS = 4
EXPERTS_PER_TOKEN = 2
WINDOW = 8
MAX_PARAMS = 20_000_000

BATCH = 2
SEQ_LEN = 16
PAD_LEFT = 3
PROMPT_LEN = 8
PROMPT_PAD_LEFT = 2
NEW_TOKENS = 16

TOLERANCE = {torch.float32: 1e-4, torch.bfloat16: 3e-2, torch.float16: 5e-3}
DEFAULT_TIMEOUT = 60
COMPILE_TIMEOUT = 240  # added to the limit for the compiled column (cold compiles: ~20-60 s)
DEFAULT_OUTPUT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                              "docs", "COMPATIBILITY.md")

# --- generic shrink rules -------------------------------------------------------

WIDTH_KEYS = {
    "hidden_size", "d_model", "n_embd", "embed_dim", "dim", "emb_dim", "embedding_dim",
    "embedding_size", "word_embed_proj_dim", "input_embedding_size",
    "output_embedding_size", "lru_width", "ple_embed_dim", "hidden_size_global",
}
DEPTH_KEYS = {
    "num_hidden_layers", "n_layer", "n_layers", "num_layers", "decoder_layers",
    "encoder_layers", "num_decoder_layers", "num_encoder_layers", "num_blocks",
}
HEAD_KEYS = {
    "num_attention_heads", "n_head", "n_heads", "num_heads", "decoder_attention_heads",
    "encoder_attention_heads", "num_decoder_attention_heads",
    "num_encoder_attention_heads", "attention_heads", "swa_num_attention_heads",
    "index_n_heads", "indexer_n_heads", "linear_num_heads",
}
KV_HEAD_KEYS = {
    "num_key_value_heads", "num_kv_heads", "n_kv_heads", "multi_query_group_num",
    "swa_num_key_value_heads", "num_query_groups", "indexer_kv_heads", "kv_n_heads",
}
HEAD_DIM_KEYS = {
    "head_dim", "attention_head_size", "d_head", "dim_head", "attention_head_dim",
    "swa_head_dim", "index_head_dim", "indexer_head_dim", "linear_head_dim",
    "linear_key_head_dim", "linear_value_head_dim", "kv_channels", "d_kv",
}
FFN_KEYS = {
    "intermediate_size", "ffn_dim", "n_inner", "decoder_ffn_dim", "encoder_ffn_dim",
    "dim_ff", "feed_forward_size", "dff", "d_inner", "intermediate_size_mlp",
    "dense_intermediate_size", "prefix_dense_intermediate_size", "ffn_hidden_size",
    "d_ff",
}
EXPERT_FFN_KEYS = {
    "moe_intermediate_size", "shared_expert_intermediate_size",
    "moe_shared_expert_intermediate_size", "expert_ffn_hidden_size",
    "shared_intermediate_size", "shared_experts_intermediate_size",
}
EXPERT_COUNT_KEYS = {
    "num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts",
}
EXPERTS_PER_TOKEN_KEYS = {
    "num_experts_per_tok", "num_experts_per_token", "moe_topk", "moe_top_k",
    "top_k_experts", "moe_k",
}
SHARED_EXPERT_KEYS = {"n_shared_experts", "num_shared_experts", "moe_num_shared_experts"}
ONE_KEYS = {  # counts of "special" layers or groups: at most 1
    "n_group", "topk_group", "num_expert_group", "first_k_dense_replace",
    "num_dense_layers", "zero_expert_num",
}
POSITION_KEYS = {"max_position_embeddings", "n_positions", "n_ctx", "max_target_positions",
                 "max_seq_len"}
WINDOW_KEYS = {  # windows and top-k token selections: below the 16-token inputs
    "sliding_window", "sliding_window_size", "attention_window_size",
    "local_attention_window_len", "attention_chunk_size", "index_topk", "keep_window_size",
}
LORA_RANK_KEYS = {"kv_lora_rank", "q_lora_rank", "o_lora_rank"}
RANK_KEYS = {"time_step_rank", "mamba_dt_rank", "adapter_rank", "laurel_rank",
             "hc_lowrank"}
STATE_KEYS = {"mamba_d_state", "state_size", "ssm_state_size"}
CHUNK_KEYS = {"mamba_chunk_size"}
ZERO_KEYS = {"router_jitter_noise", "input_jitter_noise"}
VOCAB_KEYS = {"vocab_size", "decoder_vocab_size", "unpadded_vocab_size",
              "vocab_size_per_layer_input", "encoder_hash_byte_group_vocab",
              "pronunciation_vocab_size", "shape_vocab_size"}
# Lists of layer indices (remapped to the layers kept).
LAYER_INDEX_KEYS = {
    "full_attn_idxs", "hybrid_layer_ids", "mlp_only_layers", "moe_layers",
    "attn_layer_indices", "local_layer_ids", "ple_layer_ids", "global_attn_layers",
    "no_rope_layers_idx",
}
# (heads key, head size key): heads * head size must equal the SSM inner size
# (expand * hidden, or mamba_d_ssm).
MAMBA_HEAD_PAIRS = (("mamba_n_heads", "mamba_d_head"), ("mamba_num_heads", "mamba_head_dim"),
                    ("n_mamba_heads", "mamba_headdim"))
TEXT_SPECIAL_TOKENS = (
    "pad_token_id", "bos_token_id", "eos_token_id", "decoder_start_token_id",
    "sep_token_id", "cls_token_id", "mask_token_id", "unk_token_id",
    "forced_eos_token_id", "forced_bos_token_id",
)

# --- per-architecture overrides ---------------------------------------------
# model_type -> {dotted config-dict path: value}, applied after the generic rules.
# Special keys: "@why": the reason (shown in the report); "@layers": indices of
# the default layers to keep (instead of the automatic choice); "@config": use
# this sub-config (e.g. "decoder") as the model's config; value DELETE: drop the
# key so the class default applies. Every entry is a case the generic rules get wrong; the table
# is listed in COMPATIBILITY.md.
DELETE = "@delete"  # override value: drop the key (the class default applies)
_DOTS3_SWA = {"swa_num_attention_heads": HEADS, "swa_num_key_value_heads": HEADS,
              "swa_q_lora_rank": 32, "swa_kv_lora_rank": 32, "swa_head_dim": 24,
              "swa_qk_nope_head_dim": 16, "swa_v_head_dim": HEAD_DIM}
OVERRIDES: dict[str, dict] = {
    # Default configs that cannot build or run a model as they are.
    "cohere_compass_text": {
        "@why": "default rope_parameters is {}; the model looks it up per layer type",
        "rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 10000.0},
                            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}}},
    "dbrx": {"@why": "the default attention config lacks rope_theta (read by DbrxAttention) and "
                     "its clip_qkv=None reaches torch.clamp(min=None, max=None)",
             "attn_config.rope_theta": 10000.0, "attn_config.clip_qkv": 8.0},
    "lfm2_moe": {"@why": "default layer_types is None", "layer_types": ["conv", "full_attention"]},
    "qwen4_exp_text": {"@why": "default indexer sizes are None", "indexer_n_heads": 4,
                       "indexer_kv_heads": 1, "indexer_head_dim": 16, "indexer_budget": 8,
                       "indexer_compress_ratio": 2},
    "qwen4_exp": {"@why": "default indexer sizes are None",
                  "text_config.indexer_n_heads": 4, "text_config.indexer_kv_heads": 1,
                  "text_config.indexer_head_dim": 16, "text_config.indexer_budget": 8,
                  "text_config.indexer_compress_ratio": 2},
    "xmod": {"@why": "no default language: forward raises \"Input language unknown\"",
             "default_language": "en_XX"},
    # Hybrid models whose first layers are all of one kind: keep an attention layer.
    "bamba": {"@why": "default has no attention layer", "attn_layer_indices": [1]},
    "granitemoehybrid": {"@why": "default has no attention layer",
                         "layer_types": ["linear_attention", "full_attention"]},
    "recurrent_gemma": {"@why": "the first 2 blocks of the default pattern are recurrent",
                        "block_types": ["recurrent", "attention"]},
    "zamba": {"@why": "needs two hybrid layers: they share (tie) one transformer",
              "@layers": [0, 2, 7]},
    # Layer-count bookkeeping the generic rules do not know.
    "dots3_note_text": {"@why": "per-layer sliding-attention sizes rebuilt from swa_* (MLA: "
                                "head_dim = nope + rope)",
                        "per_layer_config": DELETE, **_DOTS3_SWA},
    "dots3_note": {"@why": "as dots3_note_text; adapters' widths must match the towers",
                   "text_config.per_layer_config": DELETE, "vision_config.adapter_in_dim": HIDDEN,
                   "vision_config.adapter_out_dim": HIDDEN,
                   "audio_config.adapter_input_size": HIDDEN,
                   "audio_config.adapter_out_dim": HIDDEN,
                   **{f"text_config.{k}": v for k, v in _DOTS3_SWA.items()}},
    "dory": {"@why": "3 (attention, mlp) pairs = input, recurrent and output stacks",
             "@layers": [0, 1, 6, 7, 8, 9], "n_input_layers": 2, "n_recurrent_layers": 2,
             "n_output_layers": 2},
    "gemma3n_text": {"@why": "KV-shared layers must reuse both layer types",
                     "@layers": [0, 4, 5, 9], "num_kv_shared_layers": 2},
    "hrm_text": {"@why": "layers = per_stack * H_cycles * (L_cycles + 1)",
                 "num_layers_per_stack": 1, "H_cycles": 2, "L_cycles": 1, "L_bp_cycles": [1],
                 "num_hidden_layers": 4},
    "mamba2": {"@why": "num_heads * head_dim = expand * hidden_size", "num_heads": 8},
    # Sizes with constraints.
    "reformer": {"@why": "axial position factors must multiply to the sequence length",
                 "axial_pos_embds": False},
    "xlstm": {"@why": "qk size rounds up to a multiple of 64", "hidden_size": 128,
              "embedding_dim": 128},
    "git": {"@why": "5 image tokens (the inputs get pixel_values: its loss skips image "
                    "positions)", "vision_config.image_size": 32},
    # The causal LM is the decoder sub-model (one codebook: inputs stay batch x length).
    "musicgen": {"@why": "the causal LM is the decoder sub-model; one codebook",
                 "@config": "decoder", "decoder.num_codebooks": 1},
    "musicgen_melody": {"@why": "the causal LM is the decoder sub-model; one codebook",
                        "@config": "decoder", "decoder.num_codebooks": 1},
}

# Architectures that are not standalone language models: model_type -> reason.
NOT_STANDALONE = {
    "gemma4_assistant": "draft model for speculative decoding: needs the target model's "
                        "KV states",
    "gemma4_unified_assistant": "draft model for speculative decoding: needs the target "
                                "model's KV states",
}


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


class _StageError(Exception):
    def __init__(self, stage: str, exc: BaseException):
        super().__init__(f"{stage}: {exc}")
        self.stage = stage
        self.exc = exc


def _short(exc: BaseException, limit: int = 160) -> str:
    msg = [m.strip() for m in str(exc).strip().splitlines() if m.strip()]
    text = f"{type(exc).__name__}: {msg[0] if msg else ''}"
    for m in msg[1:3]:
        if len(text) >= 60 and not text.endswith(":"):
            break
        text += " " + m
    text = text.replace("|", "/")
    return text if len(text) <= limit else text[: limit - 3] + "..."


# --- tiny config --------------------------------------------------------------


def _is_config_dict(v) -> bool:
    return isinstance(v, dict) and ("model_type" in v or "hidden_size" in v
                                    or "vocab_size" in v or "d_model" in v)


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _per_layer_keys(d: dict, depth: int) -> list[str]:
    return [k for k, v in d.items() if isinstance(v, list) and len(v) == depth
            and k not in LAYER_INDEX_KEYS]


def _layer_selection(d: dict, depth: int) -> list[int]:
    """Indices of the default layers to keep: the first layer of each distinct
    combination of per-layer settings (layer_types, mlp_layer_types, membership
    of index lists, ...), padded to at least LAYERS layers."""
    keys = [k for k in _per_layer_keys(d, depth)
            if all(isinstance(t, (str, bool)) for t in d[k])]
    index_sets = [set(d[k]) for k in LAYER_INDEX_KEYS
                  if isinstance(d.get(k), list) and all(_is_int(i) for i in d[k])]
    seen, keep = set(), []
    for i in range(depth):
        sig = tuple(d[k][i] for k in keys) + tuple(i in s for s in index_sets)
        if sig not in seen:
            seen.add(sig)
            keep.append(i)
    for i in range(depth):
        if len(keep) >= LAYERS:
            break
        if i not in keep:
            keep.append(i)
    return sorted(keep)


def _shrink_rope(rope, rotary: int) -> None:
    if not isinstance(rope, dict):
        return
    for r in [rope] + [v for v in rope.values() if isinstance(v, dict)]:
        for fk in ("long_factor", "short_factor"):
            f = r.get(fk)
            if isinstance(f, list):
                factor = r.get("partial_rotary_factor") or 1.0
                r[fk] = f[: max(1, int(rotary * factor) // 2)]


def shrink_dict(d: dict, layers: list[int] | None = None) -> dict:
    """The generic shrink rules applied to one config dict (recursively to
    sub-config dicts). Returns a new dict. layers: default layers to keep."""
    d = copy.deepcopy(d)
    for k, v in list(d.items()):
        if _is_config_dict(v):
            d[k] = shrink_dict(v)

    def has_int(k):
        return _is_int(d.get(k))

    def cap(keys, limit):  # integer entries above limit become limit
        for k in keys:
            if has_int(k) and d[k] > limit:
                d[k] = limit

    old = dict(d)
    heads_default = next((d[k] for k in sorted(HEAD_KEYS) if has_int(k)), None)
    depth_key = next((k for k in ("num_hidden_layers", "n_layer", "n_layers", "num_layers",
                                  "decoder_layers", "num_blocks") if has_int(k)), None)
    depth_default = d[depth_key] if depth_key else None

    cap(WIDTH_KEYS, HIDDEN)
    cap(HEAD_KEYS, HEADS)
    for k in KV_HEAD_KEYS:
        if k in d and d[k] is None and heads_default is not None and k == "num_key_value_heads":
            d[k] = HEADS
        elif has_int(k) and d[k] > 1:
            d[k] = HEADS if heads_default is not None and d[k] >= heads_default else KV_HEADS
    cap(HEAD_DIM_KEYS, HEAD_DIM)
    if "head_dim" in d and d["head_dim"] is None and heads_default is not None:
        d["head_dim"] = HEAD_DIM
    if has_int("rotary_dim"):
        d["rotary_dim"] = min(d["rotary_dim"], HEAD_DIM // 2)
    # Multi-head latent attention: head_dim may mean the rotary part.
    if has_int("qk_rope_head_dim"):
        d["qk_rope_head_dim"] = 8
        if has_int("qk_nope_head_dim"):
            d["qk_nope_head_dim"] = HEAD_DIM
        if has_int("v_head_dim"):
            d["v_head_dim"] = HEAD_DIM
        if has_int("qk_head_dim"):
            d["qk_head_dim"] = d["qk_rope_head_dim"] + d.get("qk_nope_head_dim", 0)
        qk = d["qk_rope_head_dim"] + d.get("qk_nope_head_dim", 0)
        qk_old = old["qk_rope_head_dim"] + old.get("qk_nope_head_dim", 0)
        for k in HEAD_DIM_KEYS:
            if has_int(k) and old[k] == old["qk_rope_head_dim"]:
                d[k] = d["qk_rope_head_dim"]
            elif has_int(k) and old[k] == qk_old:
                d[k] = qk
    cap(LORA_RANK_KEYS, 2 * HIDDEN // 4)
    for k in FFN_KEYS:
        if has_int(k) and d[k] > INTERMEDIATE:
            d[k] = INTERMEDIATE
        elif isinstance(d.get(k), list) and all(_is_int(x) for x in d[k]):
            d[k] = [min(x, INTERMEDIATE) for x in d[k]]
    cap(EXPERT_FFN_KEYS, EXPERT_INTERMEDIATE)
    moe = any(has_int(k) for k in EXPERT_COUNT_KEYS | EXPERT_FFN_KEYS)
    for k in EXPERT_COUNT_KEYS:
        if has_int(k) and d[k] > EXPERTS:
            d[k] = EXPERTS
        elif k in d and d[k] is None and moe and k in old and "moe_intermediate_size" in d:
            d[k] = EXPERTS
    for k in EXPERTS_PER_TOKEN_KEYS:
        if has_int(k) and d[k] > EXPERTS_PER_TOKEN:
            d[k] = EXPERTS_PER_TOKEN
        elif k in d and d[k] is None and moe and "moe_intermediate_size" in d:
            d[k] = EXPERTS_PER_TOKEN
    for k in SHARED_EXPERT_KEYS:
        if has_int(k) and d[k] > 1:
            d[k] = 1
        elif k in d and d[k] is None and moe and "moe_intermediate_size" in d:
            d[k] = 1
    cap(ONE_KEYS, 1)
    cap(POSITION_KEYS, MAX_POSITIONS)
    cap(WINDOW_KEYS | CHUNK_KEYS, WINDOW)
    cap(RANK_KEYS, 8)
    cap(STATE_KEYS, 16)
    # State-space heads: heads * head size = inner size.
    expand = d.get("mamba_expand") or d.get("expand") or 2
    if has_int("mamba_d_ssm"):
        d["mamba_d_ssm"] = int(expand * HIDDEN)
    for hk, dk in MAMBA_HEAD_PAIRS:
        if has_int(hk) and has_int(dk):
            d[dk] = HEAD_DIM
            d[hk] = (d.get("mamba_d_ssm") or int(expand * HIDDEN)) // HEAD_DIM
    for k, v in list(d.items()):
        if isinstance(v, float) and ("dropout" in k or "pdrop" in k or "layerdrop" in k
                                     or k in ZERO_KEYS):
            d[k] = 0.0
        if k.endswith("_layer_period") and _is_int(v) and v > 2:
            d[k] = 2
        if k.endswith("_layer_offset") and _is_int(v) and v > 1:
            d[k] = 1
    if "is_decoder" in d:
        d["is_decoder"] = True
    if "add_cross_attention" in d:
        d["add_cross_attention"] = False

    # Per-layer lists, layer index lists, per-layer config overrides.
    if depth_default is not None and (depth_default > LAYERS or layers is not None):
        keep = layers if layers is not None else _layer_selection(d, depth_default)
        for k in _per_layer_keys(d, depth_default):
            d[k] = [d[k][i] for i in keep]
        for k in LAYER_INDEX_KEYS:
            v = d.get(k)
            if isinstance(v, list) and all(_is_int(i) for i in v):
                d[k] = [keep.index(i) for i in v if i in keep]
        plc = d.get("per_layer_config")
        if isinstance(plc, dict):
            d["per_layer_config"] = {
                str(keep.index(int(i))): shrink_dict(v) for i, v in plc.items()
                if str(i).isdigit() and int(i) in keep}
        for k in DEPTH_KEYS:
            if has_int(k) and d[k] == depth_default:
                d[k] = len(keep)

    for rk in ("rope_scaling", "rope_parameters"):
        _shrink_rope(d.get(rk), d.get("head_dim") if has_int("head_dim") else HEAD_DIM)

    # Vocabulary and special tokens.
    for k in VOCAB_KEYS:
        if has_int(k) and d[k] > VOCAB:
            d[k] = VOCAB
    vocab = d.get("vocab_size") if has_int("vocab_size") else None
    if vocab is not None:
        used = set()
        for k in TEXT_SPECIAL_TOKENS:
            v = d.get(k)
            for t in (v if isinstance(v, list) else [v]):
                if _is_int(t) and 0 <= t < vocab:
                    used.add(t)
        remap = {}
        top = vocab - 1

        def fix(t):
            nonlocal top
            if not _is_int(t) or t < vocab:
                return t
            if t not in remap:
                while top in used:
                    top -= 1
                remap[t] = top
                used.add(top)
            return remap[t]

        for k in TEXT_SPECIAL_TOKENS:
            v = d.get(k)
            if isinstance(v, list):
                d[k] = [fix(t) for t in v]
            elif v is not None:
                d[k] = fix(v)
    return d


def _set_path(d: dict, path: str, value) -> None:
    *parents, last = path.split(".")
    for p in parents:
        d = d.setdefault(p, {})
    if value == DELETE:
        d.pop(last, None)
    else:
        d[last] = value


def _changed(default: dict, new: dict) -> dict:
    """The entries of new that differ from default (sub-config dicts: their
    changed entries plus model_type)."""
    out = {}
    for k, v in new.items():
        if k in default and default[k] == v:
            continue
        if _is_config_dict(v) and isinstance(default.get(k), dict):
            sub = _changed(default[k], v)
            if v.get("model_type"):
                sub["model_type"] = v["model_type"]
            out[k] = sub
        else:
            out[k] = v
    return out


def tiny_config(model_type: str):
    """The shrunk config of model_type (see the module docstring): the config
    class is called with the changed entries only, so its own derived fields
    and validation run on the new sizes."""
    from transformers import CONFIG_MAPPING

    cls = CONFIG_MAPPING[model_type]
    overrides = dict(OVERRIDES.get(model_type, {}))
    overrides.pop("@why", None)
    layers = overrides.pop("@layers", None)
    sub = overrides.pop("@config", None)
    with _quiet():
        default = cls()
    d0 = default.to_dict()
    d = shrink_dict(d0, layers)
    for path, value in overrides.items():
        _set_path(d, path, value)
    kwargs = _changed(d0, d)
    for k in ("transformers_version", "architectures", "_name_or_path", "model_type"):
        kwargs.pop(k, None)
    with _quiet():
        config = cls(**kwargs)
    if sub:
        config = getattr(config, sub)
    return config


@contextlib.contextmanager
def _quiet():
    """Silences Transformers' logging and Python warnings (config validation
    chatter about the shrunk sizes, generation flags)."""
    from transformers.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        hf_logging.set_verbosity(level)


# --- model, inputs ---------------------------------------------------------------


def build_model(config, dtype: torch.dtype, seed: int = 0, model_type: str | None = None):
    """(model on the CPU in eval mode, attention implementation used).
    AutoModelForCausalLM picks the class, except for architectures whose
    config is a sub-config ("@config" override): the class the causal-LM
    mapping names."""
    import transformers
    from transformers import AutoModelForCausalLM
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    factory = AutoModelForCausalLM.from_config
    if "@config" in OVERRIDES.get(model_type, {}):
        factory = getattr(transformers, MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[model_type])._from_config

    # Cheap guard first: count parameters on the meta device.
    try:
        with _quiet(), torch.device("meta"):
            meta = factory(config, dtype=dtype)
        n = sum(p.numel() for p in meta.parameters())
        del meta
    except Exception:  # noqa: BLE001  (some inits need real tensors)
        n = None
    if n is not None and n > MAX_PARAMS:
        raise RuntimeError(f"tiny config still has {n / 1e6:.1f}M parameters (harness bug)")
    last = None
    for attn in ("sdpa", "eager"):
        torch.manual_seed(seed)
        try:
            with _quiet():
                model = factory(config, dtype=dtype, attn_implementation=attn)
        except (ValueError, ImportError, NotImplementedError) as e:
            last = e
            if any(w in str(e).lower() for w in ("attn", "sdpa", "attention")):
                continue
            raise
        model.eval()
        used = getattr(model.config, "_attn_implementation", None) or attn
        return model, used
    raise last


def _forward_params(model) -> set[str]:
    try:
        return set(inspect.signature(model.forward).parameters)
    except (TypeError, ValueError):
        return set()


def _special_ids(config) -> set[int]:
    ids = set()
    for cfg in (config, getattr(config, "get_text_config", lambda: config)()):
        for k, v in cfg.to_dict().items():
            if k.endswith("_token_id") or k.endswith("_token_index") or k.endswith("_token_ids"):
                for t in (v if isinstance(v, list) else [v]):
                    if isinstance(t, int) and not isinstance(t, bool):
                        ids.add(t)
    return ids


def _image_inputs(inputs: dict, config, g: torch.Generator) -> None:
    """random pixel_values with every batch (its loss skips the image positions)"""
    v = config.vision_config
    for key in ("forward", "generate"):
        n = inputs[key]["input_ids"].shape[0]
        inputs[key]["pixel_values"] = torch.randn(
            n, v.num_channels, v.image_size, v.image_size, generator=g)


def _unpadded_tokens(inputs: dict, config, g: torch.Generator) -> None:
    """masked (padding) positions of the training batch hold regular tokens: the pad
    embedding is zero and the per-layer magnitude `mean(h**2) ** 0.5` has an
    infinite gradient at 0 (NaN gradients on the CPU)"""
    fwd = inputs["forward"]
    fwd["input_ids"] = torch.where(fwd["attention_mask"] == 0, fwd["input_ids"][0, 0],
                                   fwd["input_ids"])


def _codebook_labels(inputs: dict, config, g: torch.Generator) -> None:
    """labels (batch, length, codebooks); generate() with decoder_start_token_id
    and an unpadded prompt (it drops pad tokens from its output)"""
    inputs["labels"] = inputs["labels"].unsqueeze(-1)  # (batch, length, codebooks)
    # generate() pads the delay pattern with the decoder start token, which the
    # decoder-only config does not set.
    inputs["generate_kwargs"] = {"decoder_start_token_id": config.bos_token_id,
                                 "num_return_sequences": 1}
    # generate() drops pad tokens from its output: no padding in the prompt.
    gen = inputs["generate"]
    gen["input_ids"][gen["attention_mask"] == 0] = gen["input_ids"][0, 0]
    gen["attention_mask"].fill_(1)


# Extra or reshaped inputs: model_type -> f(inputs, config, generator), in place.
INPUT_HOOKS = {
    "git": _image_inputs,
    "gemma3n_text": _unpadded_tokens,
    "musicgen": _codebook_labels,
    "musicgen_melody": _codebook_labels,
}


def make_inputs(model, seed: int = 0, model_type: str | None = None) -> dict:
    """Seeded CPU inputs: forward/training batch and generation prompt."""
    config = model.config
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    vocab = getattr(text, "vocab_size", None) or VOCAB
    special = _special_ids(config)
    allowed = torch.tensor([t for t in range(min(vocab, VOCAB)) if t not in special])
    pad = getattr(text, "pad_token_id", None)
    if isinstance(pad, list):
        pad = pad[0] if pad else None
    if pad is None:
        eos = getattr(text, "eos_token_id", None)
        pad = eos[0] if isinstance(eos, list) and eos else eos
    if pad is None or pad >= vocab:
        pad = 0
    g = torch.Generator().manual_seed(seed)

    def ids(n, length, pad_left):
        x = allowed[torch.randint(0, len(allowed), (n, length), generator=g)]
        mask = torch.ones(n, length, dtype=torch.long)
        if pad_left:
            x[1, :pad_left] = pad
            mask[1, :pad_left] = 0
        return x, mask

    params = _forward_params(model)
    use_mask = "attention_mask" in params
    x, m = ids(BATCH, SEQ_LEN, PAD_LEFT if use_mask else 0)
    p, pm = ids(BATCH, PROMPT_LEN, PROMPT_PAD_LEFT if use_mask else 0)
    fwd = {"input_ids": x}
    gen = {"input_ids": p}
    if use_mask:
        fwd["attention_mask"] = m
        gen["attention_mask"] = pm
    labels = x.clone()
    if use_mask:
        labels[m == 0] = -100
    inputs = {"forward": fwd, "labels": labels, "generate": gen, "pad": pad}
    if model_type in INPUT_HOOKS:
        INPUT_HOOKS[model_type](inputs, config, g)
    return inputs


def _to(obj, device):
    if isinstance(obj, torch.Tensor):
        return obj.to(device)
    if isinstance(obj, dict):
        return {k: _to(v, device) for k, v in obj.items()}
    return obj


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
    """The compiled column (see the module docstring): greedy generate with a
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


# --- report -------------------------------------------------------------------


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


def _trim(s: str, n: int) -> str:
    return s if len(s) <= n else s[: n - 3] + "..."


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
        "Regenerate with `python -m torch_axon.compat` "
        "(see the docstring of `torch_axon/compat.py`).",
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
        "Details: the docstring of `torch_axon/compat.py`.",
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


# --- worker process -------------------------------------------------------------
# A hang inside C++ (a wait that never returns) cannot be interrupted by SIGALRM.
# main() therefore runs the architectures in a worker process: it sends model
# types on the worker's stdin and reads "@@STAGE <stage>" and "@@RESULT <json>"
# lines back; a worker that does not answer within the time limit (plus a grace
# period) or dies is killed, the architecture is reported as hung/crashed at the
# stage it had reached, and a fresh worker continues with the next one.

HANG_GRACE = 30.0


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
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        flags = ["--compiled-only"] if compiled_only else ["--compiled"] if compiled else []
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "torch_axon.compat", "--worker", "--dtype",
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


# --- CLI ------------------------------------------------------------------------


def all_model_types() -> list[str]:
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return list(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m torch_axon.compat",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", help="comma-separated model types")
    ap.add_argument("--limit", type=int, help="first N architectures only")
    out = ap.add_mutually_exclusive_group()
    out.add_argument("--output", default=DEFAULT_OUTPUT,
                     help="markdown report path (default: the repository's docs/COMPATIBILITY.md)")
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
    command = " ".join(["python -m torch_axon.compat", *given])
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


@contextlib.contextmanager
def _capture_output():
    """Swallows what models print to stdout/stderr while they run."""
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):
        yield buf


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception:  # noqa: BLE001
        traceback.print_exc()
        sys.exit(2)
