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

RoPE: docs/spec.md rotates halves (GPT-NeoX); DeepSeek's code rotates interleaved pairs (HF's ``rope_interleave``, the
default of DeepSeek-V2 and V3: it reorders q_pe and k_pe as x0, x2, .., x1, x3, .. before a rotate-half). Loading
such a checkpoint needs ``rope_interleave=True``: it permutes the rope rows of each head of w_q / w_qb (and b_q) and
the last dr rows of w_kva from interleaved (x0, x1, x2, x3, ..) to halves (x0, x2, .., x1, x3, ..), which gives the
same attention scores; saving with ``rope_interleave=True`` applies the inverse.
"""
import torch

from . import _mlacp
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
# Keys of HF's module that mlacp cannot hold.
_UNSUPPORTED = {
    "q_a_proj.bias": "mlacp's q-LoRA has no bias on w_qa",
    "kv_a_proj_with_mqa.bias": "mlacp has no bias on w_kva",
}


def deepseek_names(config):
    """{mlacp name: DeepSeek key} for the parameters ``config`` has (biases only with config.bias)."""
    names = Q_LORA_NAMES if config.q_lora_rank > 0 else DENSE_NAMES
    return {row.name: names[row.name] for row in parameter_table(config) if row.present}


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


def from_deepseek_state_dict(state_dict, config, prefix="", rope_interleave=False):
    """mlacp's state_dict ({name: tensor}) from a DeepSeek-V2/V3 attention state_dict for ``config``: the keys of
    the module's table (module docstring) after ``prefix`` (e.g. ``"model.layers.0.self_attn."``; keys without the
    prefix are ignored). A missing key, a key under the prefix that is not in the table, or a tensor of another
    shape raises mlacp.InvalidArgument naming it (and the expected shape). ``rope_interleave``: the checkpoint's
    RoPE rotates interleaved pairs (DeepSeek's default): its rope rows are permuted into docs/spec.md's halves."""
    names = deepseek_names(config)
    shapes = parameter_shapes(config)
    where = "mlacp.from_deepseek_state_dict"
    keys = {k[len(prefix):]: k for k in state_dict if k.startswith(prefix)}
    wanted = {key: name for name, key in names.items()}
    for key in keys:
        if key not in wanted:
            if key in _UNSUPPORTED:
                why = _UNSUPPORTED[key]
            elif key in DENSE_NAMES.values() or key in Q_LORA_NAMES.values():
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
                                         f"{list(shapes[name])} (mlacp's {name} for {config.describe()})")
        out[name] = _permute_rope(name, t, config, inverse=False) if rope_interleave else t
    return out


def to_deepseek_state_dict(state_dict, config, prefix="", rope_interleave=False):
    """The DeepSeek-V2/V3 attention state_dict ({prefix + key: tensor}) of mlacp's ``state_dict`` for ``config``
    (the inverse of from_deepseek_state_dict; ``rope_interleave`` permutes the rope rows back into interleaved
    pairs)."""
    out = {}
    for name, key in deepseek_names(config).items():
        t = state_dict[name]
        out[prefix + key] = _permute_rope(name, t, config, inverse=True) if rope_interleave else t
    return out
