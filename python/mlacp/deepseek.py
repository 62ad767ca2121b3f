# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""DeepSeek-V2/V3 attention weights to and from mlacp's parameter names.

Hugging Face's ``DeepseekV2Attention`` / ``DeepseekV3Attention`` (one ``self_attn`` module of a decoder layer) holds
the same weights as mlacp.MlaAttention under other names. The row layouts agree with docs/spec.md's:

    DeepSeek (HF) key                   mlacp   shape and rows
    q_proj.weight                       w_q     [H*dqk, D], per head [nope | rope] (dense query: q_lora_rank = 0)
    q_a_proj.weight                     w_qa    [Rq, D] (q-LoRA: q_lora_rank = Rq > 0)
    q_a_layernorm.weight                g_q     [Rq]
    q_b_proj.weight                     w_qb    [H*dqk, Rq], per head [nope | rope] (HF: q.view(.., H, dqk).split)
    q_proj.bias or q_b_proj.bias        b_q     [H*dqk] (config.bias)
    kv_a_proj_with_mqa.weight           w_kva   [R + dr, D]: the latent's R rows, then the shared rope key's dr
    kv_a_layernorm.weight               g_kv    [R]
    kv_b_proj.weight                    w_kvb   [H*(dn+dv), R], per head [k_nope | v]
    kv_b_proj.bias                      b_kvb   [H*(dn+dv)] (config.bias)
    o_proj.weight                       w_o     [D, H*dv]
    o_proj.bias                         b_o     [D] (config.bias)

mlacp has no bias on the A projections: a checkpoint with ``q_a_proj.bias`` or ``kv_a_proj_with_mqa.bias``
(``attention_bias=True`` in HF's code) is refused. Both RMSNorms use config.rms_eps (DeepSeek's 1e-6). DeepSeek-V3's
YaRN-adjusted softmax scale (mscale^2 / sqrt(dqk)) goes into config.softmax_scale.

Two key formats (``checkpoint_format``): "hf", the table above, and "inference", DeepSeek's own inference code's
(its convert.py renames q_proj -> wq, q_a_proj -> wq_a, q_a_layernorm -> q_norm, q_b_proj -> wq_b,
kv_a_proj_with_mqa -> wkv_a, kv_a_layernorm -> kv_norm, kv_b_proj -> wkv_b, o_proj -> wo, weight_scale_inv ->
scale; that model has no attention biases). "auto" (loading) tells them apart by the keys. convert.py also splits
wq, wq_b, wkv_b (rows) and wo (columns) across ``model{i}-mp{n}`` files: mlacp takes whole weights, so a shard is
refused with a message that says so (convert with ``--model-parallel 1``). fp8 weights (V3 as released: e4m3fn codes
with a scale per 128 x 128 block) are dequantised on load into float32 (mlacp.fp8_checkpoint).

RoPE: docs/spec.md rotates halves (GPT-NeoX); DeepSeek's code rotates interleaved pairs (HF's ``rope_interleave``, the
default of DeepSeek-V2 and V3: it reorders q_pe and k_pe as x0, x2, .., x1, x3, .. before a rotate-half). Loading
such a checkpoint permutes the rope rows of each head of w_q / w_qb (and b_q) and the last dr rows of w_kva from
interleaved (x0, x1, x2, x3, ..) to halves (x0, x2, .., x1, x3, ..), which gives the same attention scores; saving
applies the inverse. The convention is the configuration's ``rope_interleave`` (True in a config read by
``MlaConfig.from_hf_config`` unless the config.json says otherwise), so that no flag has to be remembered; the
functions' ``rope_interleave`` argument overrides it.
"""
import torch

from . import _mlacp
from .fp8_checkpoint import dequantize, is_fp8, scale_key
from .parameters import parameter_shapes, parameter_table

# mlacp name -> DeepSeek (HF) key, for the dense query (q_lora_rank = 0) and for q-LoRA.
_COMMON = {
    "w_kva": "kv_a_proj_with_mqa.weight",
    "g_kv": "kv_a_layernorm.weight",
    "w_kvb": "kv_b_proj.weight",
    "b_kvb": "kv_b_proj.bias",
    "w_o": "o_proj.weight",
    "b_o": "o_proj.bias",
}
DENSE_NAMES = {"w_q": "q_proj.weight", "b_q": "q_proj.bias", **_COMMON}
Q_LORA_NAMES = {
    "w_qa": "q_a_proj.weight",
    "g_q": "q_a_layernorm.weight",
    "w_qb": "q_b_proj.weight",
    "b_q": "q_b_proj.bias",
    **_COMMON,
}
# DeepSeek's inference format (inference/model.py, convert.py): the same weights under other names, no biases.
_INFERENCE_COMMON = {
    "w_kva": "wkv_a.weight",
    "g_kv": "kv_norm.weight",
    "w_kvb": "wkv_b.weight",
    "w_o": "wo.weight",
}
INFERENCE_DENSE_NAMES = {"w_q": "wq.weight", **_INFERENCE_COMMON}
INFERENCE_Q_LORA_NAMES = {"w_qa": "wq_a.weight", "g_q": "q_norm.weight", "w_qb": "wq_b.weight", **_INFERENCE_COMMON}
# Each key format's name tables: (dense query, q-LoRA).
_NAME_TABLES = {
    "hf": (DENSE_NAMES, Q_LORA_NAMES),
    "inference": (INFERENCE_DENSE_NAMES, INFERENCE_Q_LORA_NAMES),
}
CHECKPOINT_FORMATS = ("auto", *_NAME_TABLES)
# The dimension along which DeepSeek's convert.py splits a weight across model-parallel files.
_MODEL_PARALLEL_DIM = {"w_q": 0, "w_qb": 0, "w_kvb": 0, "w_o": 1}
# Keys of HF's module that mlacp cannot hold.
_UNSUPPORTED = {
    "q_a_proj.bias": "mlacp's q-LoRA has no bias on w_qa",
    "kv_a_proj_with_mqa.bias": "mlacp has no bias on w_kva",
}


def deepseek_names(config, checkpoint_format="hf"):
    """{mlacp name: DeepSeek key} for the parameters ``config`` has (biases only with config.bias), in
    ``checkpoint_format`` "hf" or "inference" (which has no biases: a config with bias=True is refused)."""
    if checkpoint_format == "inference" and config.bias:
        raise _mlacp.InvalidArgument("mlacp: DeepSeek's inference format has no attention biases (b_q, b_kvb, "
                                     "b_o); expected a config with bias=False, or checkpoint_format='hf'")
    dense, q_lora = _NAME_TABLES[checkpoint_format]
    names = q_lora if config.q_lora_rank > 0 else dense
    return {row.name: names[row.name] for row in parameter_table(config) if row.present}


def _module_names(tables):
    return {key.split(".")[0] for table in tables for key in table.values()}


_HF_MODULES = _module_names(_NAME_TABLES["hf"])
_INFERENCE_MODULES = _module_names(_NAME_TABLES["inference"])


def _resolve_format(checkpoint_format, keys, where):
    """"hf" or "inference": as given, or (auto) as the keys' module names say."""
    if checkpoint_format not in CHECKPOINT_FORMATS:
        raise _mlacp.InvalidArgument(f"{where}: checkpoint_format={checkpoint_format!r}; expected one of "
                                     f"{list(CHECKPOINT_FORMATS)}")
    if checkpoint_format != "auto":
        return checkpoint_format
    modules = {key.split(".")[0] for key in keys}
    hf, inference = sorted(modules & _HF_MODULES), sorted(modules & _INFERENCE_MODULES)
    if hf and inference:
        raise _mlacp.InvalidArgument(f"{where}: the keys mix Hugging Face's modules {hf} and DeepSeek inference "
                                     f"format's {inference}; expected one format")
    return "inference" if inference else "hf"


def _shard_hint(name, got, expected):
    """Where ``got`` is a 1/n slice of ``expected`` along the dimension convert.py splits ``name`` on: a sentence that
    says so; else ""."""
    dim = _MODEL_PARALLEL_DIM.get(name)
    if dim is None or len(got) != 2 or len(expected) != 2 or got[1 - dim] != expected[1 - dim]:
        return ""
    if not 0 < got[dim] < expected[dim] or expected[dim] % got[dim] != 0:
        return ""
    n = expected[dim] // got[dim]
    return (f"; it is 1/{n} of the weight along dimension {dim}, as in one of {n} model-parallel files (DeepSeek's "
            f"convert.py --model-parallel {n} writes model{{i}}-mp{n}.safetensors): mlacp takes whole weights, "
            "convert with --model-parallel 1")


def rope_permutation(rope):
    """Row order that turns interleaved rope pairs (x0, x1, x2, x3, ..) into rotate-half halves (x0, x2, .., x1, x3,
    ..): ``halves = interleaved[perm]``."""
    return torch.cat([torch.arange(0, rope, 2), torch.arange(1, rope, 2)])


def _rope_rows(name, config):
    """The row indices of ``name`` that hold rope outputs (empty when it has none)."""
    dn, dr, dqk = config.nope, config.rope, config.nope + config.rope
    if name in ("w_q", "w_qb", "b_q"):
        return (torch.arange(config.heads)[:, None] * dqk + dn + torch.arange(dr)[None, :]).reshape(-1)
    if name == "w_kva":
        return config.latent + torch.arange(dr)
    return torch.arange(0)


def _permute_rope(name, t, config, inverse):
    """``t`` with the rope rows of each head reordered from interleaved to halves (or back, ``inverse``)."""
    rows = _rope_rows(name, config)
    if rows.numel() == 0:
        return t
    perm = rope_permutation(config.rope)
    if inverse:
        perm = torch.argsort(perm)
    order = rows.view(-1, config.rope)[:, perm].reshape(-1)
    out = t.clone()
    out[rows] = t[order]
    return out


def from_deepseek_state_dict(state_dict, config, prefix="", rope_interleave=None, checkpoint_format="auto"):
    """mlacp's state_dict ({name: tensor}) from a DeepSeek-V2/V3 attention state_dict for ``config``: the keys of
    the module's table (module docstring) after ``prefix`` (e.g. ``"model.layers.0.self_attn."`` or, in DeepSeek's
    inference format, ``"layers.0.attn."``; keys without the prefix are ignored). ``checkpoint_format``: "hf",
    "inference" or "auto" (from the keys). fp8 weights (uint8 or float8 codes beside their block scales) are
    dequantised into float32. A missing key, a key under the prefix that is not in the table, a tensor of another
    shape (a model-parallel shard is named as one), a scale without its weight or a NaN code raises
    mlacp.InvalidArgument naming it (and what was expected). ``rope_interleave`` (None: ``config.rope_interleave``):
    the checkpoint's RoPE rotates interleaved pairs (DeepSeek's): its rope rows are permuted into docs/spec.md's
    halves."""
    where = "mlacp.from_deepseek_state_dict"
    rope_interleave = config.rope_interleave if rope_interleave is None else rope_interleave
    keys = {k[len(prefix):]: k for k in state_dict if k.startswith(prefix)}
    checkpoint_format = _resolve_format(checkpoint_format, keys, where)
    names = deepseek_names(config, checkpoint_format)
    shapes = parameter_shapes(config)
    wanted = {key: name for name, key in names.items()}
    scales = {scale_key(key, checkpoint_format): key for key in wanted if key.endswith(".weight")}
    for key in keys:
        if key in scales:
            weight = scales[key]
            if weight not in keys or not is_fp8(state_dict[keys[weight]]):
                raise _mlacp.InvalidArgument(f"{where}: unexpected key {keys[key]!r}: it scales fp8 codes, but "
                                             f"{prefix + weight!r} holds none; expected no scale beside a weight "
                                             "that is not fp8")
            continue
        if key not in wanted:
            if checkpoint_format == "hf" and key in _UNSUPPORTED:
                why = _UNSUPPORTED[key]
            elif any(key in table.values() for table in _NAME_TABLES[checkpoint_format]):
                why = (f"not a parameter of this configuration (q_lora_rank={config.q_lora_rank}, "
                       f"bias={config.bias})")
            else:
                why = "not a DeepSeek MLA attention parameter"
            raise _mlacp.InvalidArgument(f"{where}: unexpected key {keys[key]!r}: {why}; expected the keys "
                                         f"{[prefix + k for k in wanted]}")
    out = {}
    for key, name in wanted.items():
        if key not in keys:
            raise _mlacp.InvalidArgument(f"{where}: missing key {prefix + key!r} (mlacp's {name}, shape "
                                         f"{list(shapes[name])}; q_lora_rank={config.q_lora_rank}, "
                                         f"bias={config.bias})")
        t = state_dict[keys[key]]
        if tuple(t.shape) != tuple(shapes[name]):
            raise _mlacp.InvalidArgument(f"{where}: {prefix + key!r} has shape {list(t.shape)}; expected "
                                         f"{list(shapes[name])} (mlacp's {name} for {config.describe()})" +
                                         _shard_hint(name, tuple(t.shape), tuple(shapes[name])))
        if is_fp8(t):
            scale = scale_key(key, checkpoint_format)
            if scale not in keys:
                raise _mlacp.InvalidArgument(f"{where}: {prefix + key!r} holds fp8 codes ({t.dtype}) but "
                                             f"{prefix + scale!r} is missing; expected its scale per 128 x 128 block")
            t = dequantize(t, state_dict[keys[scale]], prefix + key)
        out[name] = _permute_rope(name, t, config, inverse=False) if rope_interleave else t
    return out


def to_deepseek_state_dict(state_dict, config, prefix="", rope_interleave=None, checkpoint_format="hf"):
    """The DeepSeek-V2/V3 attention state_dict ({prefix + key: tensor}) of mlacp's ``state_dict`` for ``config``
    (the inverse of from_deepseek_state_dict; ``rope_interleave`` (None: ``config.rope_interleave``) permutes the rope
    rows back into interleaved pairs; ``checkpoint_format`` "hf" or "inference" names the keys; the values stay as
    they are, never fp8)."""
    rope_interleave = config.rope_interleave if rope_interleave is None else rope_interleave
    if checkpoint_format not in _NAME_TABLES:
        raise _mlacp.InvalidArgument(f"mlacp.to_deepseek_state_dict: checkpoint_format={checkpoint_format!r}; "
                                     "expected 'hf' or 'inference'")
    out = {}
    for name, key in deepseek_names(config, checkpoint_format).items():
        t = state_dict[name]
        out[prefix + key] = _permute_rope(name, t, config, inverse=True) if rope_interleave else t
    return out
