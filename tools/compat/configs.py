"""What the harness builds: the tiny config of each architecture (generic shrink
rules applied to ``CONFIG_MAPPING[model_type]()``'s defaults, plus ``OVERRIDES``),
the model on the CPU and its seeded inputs (``INPUT_HOOKS``); ``NOT_STANDALONE``
lists the architectures that cannot run alone. The rules are described in
tools/compat/README.md ("How the tiny config is made")."""
from __future__ import annotations

import contextlib
import copy
import inspect
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
    """The shrunk config of model_type (see README.md): the config
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

