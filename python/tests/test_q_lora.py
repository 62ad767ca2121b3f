# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""q-LoRA (config.q_lora_rank > 0: w_qa, g_q, w_qb in place of w_q) and a configured softmax_scale: the binding, the
module's parameters and their initialisation, forward and gradients against the reference (both strategies), frozen
q-LoRA parameters, gradcheck, and DeepSeek-V2/V3 state_dict names (round trip, bad keys, interleaved RoPE)."""
import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import small_config
from mla_reference import distributed_function, gather, mla_forward, reference, relative_error, shard, tolerance

import mlacp
from mlacp.deepseek import rope_permutation

SCALE = 0.23  # a softmax scale unlike 1/sqrt(dqk) = 0.316 of small_config


def q_lora_config(**overrides):
    fields = dict(q_lora_rank=8, softmax_scale=SCALE)
    fields.update(overrides)
    return small_config(**fields)


def test_config_fields():
    default = mlacp.MlaConfig()
    assert default.q_lora_rank == 0 and default.softmax_scale == 0.0 and not default.q_lora()
    config = q_lora_config()
    assert config.q_lora_rank == 8 and config.softmax_scale == SCALE and config.q_lora()
    assert config.attention_scale() == SCALE
    assert "q_lora_rank=8" in repr(config) and f"softmax_scale={SCALE!r}" in repr(config)
    config.q_lora_rank, config.softmax_scale = 0, 0.0
    assert config.attention_scale() == pytest.approx(1 / math.sqrt(config.qk_dim()))
    copy = mlacp.MlaConfig(q_lora_config())
    assert copy.q_lora_rank == 8 and copy.softmax_scale == SCALE


def test_parameters_and_initialisation(mesh):
    config = q_lora_config(bias=True)
    layer = mlacp.MlaAttention(config, mesh, dtype=torch.float64, seed=5)
    names = [n for n, _ in layer.named_parameters()]
    assert names == ["b_q", "w_kva", "g_kv", "w_kvb", "b_kvb", "w_o", "b_o", "w_qa", "g_q", "w_qb"]
    assert layer.dtype == torch.float64 and layer.config.q_lora_rank == 8
    D, Rq, Hq = config.hidden, config.q_lora_rank, config.heads * config.qk_dim()
    assert layer.w_qa.shape == (Rq, D) and layer.g_q.shape == (Rq, ) and layer.w_qb.shape == (Hq, Rq)
    assert torch.equal(layer.g_q, torch.ones(Rq, dtype=torch.float64))
    # nn.Linear's uniform(+-1/sqrt(fan_in)); b_q takes w_qb's fan-in (Rq)
    for name, fan_in in (("w_qa", D), ("w_qb", Rq), ("b_q", Rq)):
        p = getattr(layer, name)
        bound = 1 / math.sqrt(fan_in)
        assert p.abs().max() <= bound and p.abs().max() > 0.5 * bound and p.std() > 0.3 * bound, name
    assert all(p.requires_grad for p in layer.parameters())
    dense = [n for n, _ in mlacp.MlaAttention(small_config(), mesh).named_parameters()]
    assert dense == ["w_q", "w_kva", "g_kv", "w_kvb", "w_o"]


def run_layer(comm, layer, x_full, dy_full):
    x_local = shard(x_full, comm.rank, comm.size).requires_grad_()
    y_local = layer(x_local)
    y_local.backward(shard(dy_full, comm.rank, comm.size))
    mlacp.all_reduce_grads(layer)
    return gather(comm, y_local), gather(comm, x_local.grad), {n: p.grad for n, p in layer.named_parameters()}


@pytest.mark.parametrize("scale", [SCALE, 0.0], ids=["scale", "defaultscale"])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["double", "float"])
@pytest.mark.parametrize("strategy", ["latent", "expanded"])
def test_matches_reference(comm, mesh, strategy, dtype, bias, scale):
    config = q_lora_config(strategy=strategy, bias=bias, softmax_scale=scale)
    layer = mlacp.MlaAttention(config, mesh, dtype=dtype, seed=7)
    with torch.no_grad():  # a gain away from 1, so that its gradient and its place in the forward are seen
        layer.g_q.uniform_(0.5, 1.5, generator=torch.Generator().manual_seed(2))
    generator = torch.Generator().manual_seed(11)
    x_full = torch.randn(config.batch, config.seq, config.hidden, generator=generator, dtype=torch.float64).to(dtype)
    dy_full = torch.randn(x_full.shape, generator=generator, dtype=torch.float64).to(dtype)

    y, dx, grads = run_layer(comm, layer, x_full, dy_full)
    y_ref, dx_ref, grads_ref = reference(config, layer, x_full, dy_full)

    errors = {"y": relative_error(y, y_ref), "dx": relative_error(dx, dx_ref)}
    expected = {"w_qa", "g_q", "w_qb", "w_kva", "g_kv", "w_kvb", "w_o"} | ({"b_q", "b_kvb", "b_o"} if bias else set())
    assert set(grads) == expected
    for name in expected:
        assert grads[name] is not None and grads[name].dtype == dtype, name
        errors["d" + name] = relative_error(grads[name], grads_ref[name])
    assert max(errors.values()) <= tolerance(dtype), f"relative errors above {tolerance(dtype)}: {errors}"


@pytest.mark.parametrize("strategy", ["latent", "expanded"])
def test_packed_documents(comm, mesh, strategy):
    """q-LoRA with packed documents (the configuration's cu_seqlens) and the blocking schedule (overlap off)."""
    config = q_lora_config(strategy=strategy, bias=True, cu_seqlens=[0, 1, 11, 13, 16], overlap=False)
    layer = mlacp.MlaAttention(config, mesh, dtype=torch.float64, seed=3)
    generator = torch.Generator().manual_seed(6)
    x_full = torch.randn(config.batch, config.seq, config.hidden, generator=generator, dtype=torch.float64)
    dy_full = torch.randn(x_full.shape, generator=generator, dtype=torch.float64)
    y, dx, grads = run_layer(comm, layer, x_full, dy_full)
    y_ref, dx_ref, grads_ref = reference(config, layer, x_full, dy_full)
    errors = {"y": relative_error(y, y_ref), "dx": relative_error(dx, dx_ref)}
    errors.update({"d" + n: relative_error(g, grads_ref[n]) for n, g in grads.items()})
    assert max(errors.values()) <= 1e-10, errors


def test_softmax_scale_changes_the_output(comm, mesh):
    """The configured scale is used (not 1/sqrt(dqk)): the reference with the other scale is far off."""
    config = q_lora_config()
    layer = mlacp.MlaAttention(config, mesh, dtype=torch.float64, seed=7)
    x_full = torch.randn(config.batch, config.seq, config.hidden, generator=torch.Generator().manual_seed(1),
                         dtype=torch.float64)
    with torch.no_grad():
        y = gather(comm, layer(shard(x_full, comm.rank, comm.size)))
    params = {n: p.detach() for n, p in layer.named_parameters()}
    assert relative_error(y, mla_forward(config, x_full, params)) <= 1e-10
    other = mlacp.MlaConfig(config)
    other.softmax_scale = 0.0
    assert relative_error(y, mla_forward(other, x_full, params)) > 1e-3


@pytest.mark.parametrize("strategy", ["latent", "expanded"])
def test_gradcheck(comm, mesh, strategy):
    config = mlacp.MlaConfig(batch=1, seq=8, hidden=6, heads=4, nope=2, rope=2, vdim=2, latent=3, q_lora_rank=3,
                             softmax_scale=0.4, bias=True, strategy=strategy)
    layer = mlacp.MlaAttention(config, mesh, dtype=torch.float64, seed=13)
    x = torch.randn(config.batch, config.seq, config.hidden, generator=torch.Generator().manual_seed(17),
                    dtype=torch.float64)
    inputs = (x.requires_grad_(), *layer.parameters())
    assert torch.autograd.gradcheck(distributed_function(layer, comm), inputs, eps=1e-6, atol=1e-7, rtol=1e-5)


@pytest.mark.parametrize("frozen", [("w_qa", ), ("g_q", "w_qb"), ("w_qa", "g_q", "w_qb", "b_q")])
@pytest.mark.parametrize("strategy", ["latent", "expanded"])
def test_frozen_q_lora_parameters(comm, mesh, strategy, frozen):
    """A frozen q-LoRA parameter gets no gradient; the other gradients and dx are those of the unfrozen layer."""
    config = q_lora_config(strategy=strategy, bias=True)
    x = torch.randn(config.batch, config.seq // mesh.size, config.hidden, generator=torch.Generator().manual_seed(3),
                    dtype=torch.float64)
    results = []
    for names in ((), frozen):
        layer = mlacp.MlaAttention(config, mesh, dtype=torch.float64, seed=9)
        for name in names:
            getattr(layer, name).requires_grad_(False)
        x_local = x.clone().requires_grad_()
        layer(x_local).sum().backward()
        results.append((layer, x_local.grad))
    (full, dx_full), (part, dx_part) = results
    assert torch.equal(dx_part, dx_full)
    for name, p in part.named_parameters():
        if name in frozen:
            assert p.grad is None, name
        else:
            assert torch.equal(p.grad, getattr(full, name).grad), name


# DeepSeek-V2/V3 state_dict names

DENSE_KEYS = [
    "q_proj.weight", "kv_a_proj_with_mqa.weight", "kv_a_layernorm.weight", "kv_b_proj.weight", "o_proj.weight"
]
Q_LORA_KEYS = [
    "q_a_proj.weight", "q_a_layernorm.weight", "q_b_proj.weight", "kv_a_proj_with_mqa.weight", "kv_a_layernorm.weight",
    "kv_b_proj.weight", "o_proj.weight"
]


@pytest.mark.parametrize("q_lora_rank", [0, 8], ids=["dense", "qlora"])
def test_deepseek_names_round_trip(mesh, q_lora_rank):
    config = small_config(q_lora_rank=q_lora_rank, bias=True)
    source = mlacp.MlaAttention(config, mesh, dtype=torch.float64, seed=1)
    sd = source.deepseek_state_dict(prefix="model.layers.3.self_attn.")
    keys = (Q_LORA_KEYS if q_lora_rank else DENSE_KEYS) + [
        "q_b_proj.bias" if q_lora_rank else "q_proj.bias", "kv_b_proj.bias", "o_proj.bias"
    ]
    assert sorted(sd) == sorted("model.layers.3.self_attn." + k for k in keys)
    assert torch.equal(sd["model.layers.3.self_attn.kv_b_proj.weight"], source.w_kvb)
    layer = mlacp.MlaAttention(config, mesh, dtype=torch.float64, seed=2)
    other = {"model.embed_tokens.weight": torch.zeros(3), "model.layers.3.mlp.up.weight": torch.zeros(1)}
    layer.load_deepseek_state_dict({**sd, **other}, prefix="model.layers.3.self_attn.")  # other keys: ignored
    for name, p in layer.named_parameters():
        assert torch.equal(p, getattr(source, name)), name
    assert set(mlacp.from_deepseek_state_dict(sd, config, "model.layers.3.self_attn.")) == set(
        n for n, _ in layer.named_parameters())
    # float checkpoint into a double module: load_state_dict's copy converts
    layer.load_deepseek_state_dict({k: v.float() for k, v in source.deepseek_state_dict().items()})
    assert torch.equal(layer.w_kva, source.w_kva.float().double())


def test_deepseek_bad_keys(mesh):
    config = small_config(q_lora_rank=8)
    layer = mlacp.MlaAttention(config, mesh, dtype=torch.float64)
    sd = layer.deepseek_state_dict()
    missing = {k: v for k, v in sd.items() if k != "q_a_layernorm.weight"}
    with pytest.raises(mlacp.InvalidArgument, match=r"missing key 'q_a_layernorm.weight' \(mlacp's g_q, shape \[8\]"):
        layer.load_deepseek_state_dict(missing)
    with pytest.raises(mlacp.InvalidArgument, match=r"unexpected key 'q_proj.weight': not a parameter of this conf"):
        layer.load_deepseek_state_dict({**sd, "q_proj.weight": torch.zeros(1)})
    with pytest.raises(mlacp.InvalidArgument, match=r"unexpected key 'q_a_proj.bias': mlacp's q-LoRA has no bias"):
        layer.load_deepseek_state_dict({**sd, "q_a_proj.bias": torch.zeros(8)})
    with pytest.raises(mlacp.InvalidArgument, match=r"unexpected key 'rotary_emb.inv_freq': not a DeepSeek MLA"):
        layer.load_deepseek_state_dict({**sd, "rotary_emb.inv_freq": torch.zeros(2)})
    with pytest.raises(mlacp.InvalidArgument, match=r"unexpected key 'o_proj.bias'"):  # bias=False
        layer.load_deepseek_state_dict({**sd, "o_proj.bias": torch.zeros(config.hidden)})
    wrong = dict(sd, **{"q_b_proj.weight": torch.zeros(40, 7)})
    with pytest.raises(mlacp.InvalidArgument, match=r"'q_b_proj.weight' has shape \[40, 7\]; expected \[40, 8\]"):
        layer.load_deepseek_state_dict(wrong)
    dense = mlacp.MlaAttention(small_config(), mesh, dtype=torch.float64)
    with pytest.raises(mlacp.InvalidArgument, match=r"missing key 'pre.q_proj.weight'"):
        dense.load_deepseek_state_dict({"pre." + k: v for k, v in sd.items() if not k.startswith("q_")}, prefix="pre.")


def test_rope_permutation():
    assert rope_permutation(6).tolist() == [0, 2, 4, 1, 3, 5]
    config = small_config(q_lora_rank=8, bias=True)
    sd = {n: torch.randn(s, dtype=torch.float64) for n, s in mlacp.attention.parameter_shapes(config).items()}
    ds = mlacp.to_deepseek_state_dict(sd, config, rope_interleave=True)
    back = mlacp.from_deepseek_state_dict(ds, config, rope_interleave=True)
    dn, dr, dqk, R = config.nope, config.rope, config.qk_dim(), config.latent
    for name in sd:
        assert torch.equal(back[name], sd[name]), name
    # head 1's rope rows of w_qb, kv_a's rope rows: halves (x0, x2, x1, x3) <- interleaved (x0, x1, x2, x3)
    interleaved = ds["q_b_proj.weight"][dqk + dn:2 * dqk]
    assert torch.equal(sd["w_qb"][dqk + dn:2 * dqk], interleaved[[0, 2, 1, 3]])
    assert torch.equal(sd["w_kva"][R:], ds["kv_a_proj_with_mqa.weight"][R:][[0, 2, 1, 3]])
    assert torch.equal(sd["w_qb"][:dn], ds["q_b_proj.weight"][:dn])  # nope rows stay
    assert torch.equal(sd["w_kva"][:R], ds["kv_a_proj_with_mqa.weight"][:R])
    assert torch.equal(sd["b_q"][dn:dqk], ds["q_b_proj.bias"][dn:dqk][[0, 2, 1, 3]])
    assert dr == 4


def deepseek_forward(config, x, sd, inv_freq=None, attention_factor=1.0, softmax_scale=None):
    """DeepSeek-V3's attention (HF DeepseekV3Attention with rope_interleave, one document, causal) on its own
    state_dict: q-LoRA, RMSNorms, interleaved RoPE (q_pe.view(.., dr/2, 2).transpose(-1, -2) then rotate-half).
    ``inv_freq`` and ``attention_factor``: the rotary embedding's frequencies and its factor on cos and sin (default:
    plain RoPE of config.rope_base); ``softmax_scale`` (default: config.softmax_scale)."""
    B, S, _ = x.shape
    H, dn, dr, dv, R = config.heads, config.nope, config.rope, config.vdim, config.latent
    if inv_freq is None:
        inv_freq = config.rope_base**(-torch.arange(0, dr, 2, dtype=torch.float64) / dr)
    scale = config.softmax_scale if softmax_scale is None else softmax_scale

    def norm(t, g):
        return t * torch.rsqrt(t.pow(2).mean(-1, keepdim=True) + config.rms_eps) * g

    def interleaved_rope(t):
        t = t.view(*t.shape[:-1], dr // 2, 2).transpose(-1, -2).reshape(t.shape)
        angles = torch.arange(S, dtype=torch.float64)[:, None] * inv_freq[None, :]
        cos = torch.cat([angles.cos()] * 2, -1) * attention_factor
        sin = torch.cat([angles.sin()] * 2, -1) * attention_factor
        if t.dim() == 4:
            cos, sin = cos[:, None], sin[:, None]
        return t * cos + torch.cat([-t[..., dr // 2:], t[..., :dr // 2]], -1) * sin

    q = F.linear(norm(F.linear(x, sd["q_a_proj.weight"]), sd["q_a_layernorm.weight"]), sd["q_b_proj.weight"])
    q = q.view(B, S, H, dn + dr)
    q = torch.cat([q[..., :dn], interleaved_rope(q[..., dn:])], -1)
    a = F.linear(x, sd["kv_a_proj_with_mqa.weight"])
    c, k_pe = norm(a[..., :R], sd["kv_a_layernorm.weight"]), interleaved_rope(a[..., R:])
    kv = F.linear(c, sd["kv_b_proj.weight"]).view(B, S, H, dn + dv)
    k = torch.cat([kv[..., :dn], k_pe[:, :, None, :].expand(B, S, H, dr)], -1)
    scores = torch.einsum("bshd,bthd->bhst", q, k) * scale
    scores = scores.masked_fill(~torch.ones(S, S, dtype=torch.bool).tril(), float("-inf"))
    o = torch.einsum("bhst,bthd->bshd", scores.softmax(-1), kv[..., dn:]).reshape(B, S, H * dv)
    return F.linear(o, sd["o_proj.weight"])


@pytest.mark.parametrize("strategy", ["latent", "expanded"])
def test_interleaved_rope_checkpoint(comm, mesh, strategy):
    """A checkpoint of DeepSeek's interleaved RoPE, loaded with rope_interleave=True, gives DeepSeek's output; loaded
    without it, it does not."""
    config = q_lora_config(strategy=strategy)
    generator = torch.Generator().manual_seed(4)
    shapes = mlacp.attention.parameter_shapes(config)
    names = mlacp.deepseek.deepseek_names(config)
    checkpoint = {names[n]: torch.randn(s, generator=generator, dtype=torch.float64) * 0.3 for n, s in shapes.items()}
    x_full = torch.randn(config.batch, config.seq, config.hidden, generator=generator, dtype=torch.float64)
    expected = deepseek_forward(config, x_full, checkpoint)
    layer = mlacp.MlaAttention(config, mesh, dtype=torch.float64)
    errors = []
    for interleave in (True, False):
        layer.load_deepseek_state_dict(checkpoint, rope_interleave=interleave)
        with torch.no_grad():
            errors.append(relative_error(gather(comm, layer(shard(x_full, comm.rank, comm.size))), expected))
    assert errors[0] <= 1e-10 and errors[1] > 1e-3, errors
    back = layer.deepseek_state_dict(rope_interleave=False)  # the last load: no permutation either way
    assert all(torch.equal(back[k], checkpoint[k]) for k in checkpoint)


# The q-LoRA dump format of mlacp-mla-block --dump (w_qa, g_q, w_qb and their gradients in place of w_q's), written
# here from the double reference: what scripts/check_dump.py and the peer's --check read.

ROOT = Path(__file__).resolve().parents[2]


def write_dump(directory, config, layer, seed=3):
    """An mlacp-mla-block-style dump of the reference for ``layer``'s weights (double, full sequence)."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(config.batch, config.seq, config.hidden, generator=generator, dtype=torch.float64)
    dy = torch.randn(x.shape, generator=generator, dtype=torch.float64)
    y, dx, grads = reference(config, layer, x, dy)
    arrays = {"x": x, "dy": dy, "y": y, "dx": dx}
    for name, p in layer.named_parameters():
        arrays[name], arrays["d" + name] = p.detach().double(), grads[name]
    for name, t in arrays.items():
        np.save(directory / f"{name}.npy", t.numpy())
    (directory / "config.json").write_text(json.dumps({
        "batch": config.batch, "seq": config.seq, "hidden": config.hidden, "heads": config.heads,
        "qk_nope_head_dim": config.nope, "qk_rope_head_dim": config.rope, "v_head_dim": config.vdim,
        "kv_lora_rank": config.latent, "q_lora_rank": config.q_lora_rank, "softmax_scale": config.softmax_scale,
        "bias": config.bias, "dtype": "double", "strategy": str(config.strategy).split(".")[-1], "ranks": 1
    }))


def check_dump(directory):
    return subprocess.run([sys.executable, str(ROOT / "scripts" / "check_dump.py"), str(directory)],
                          capture_output=True, text=True)


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
def test_check_dump_reads_q_lora(mesh, tmp_path, bias):
    config = q_lora_config(bias=bias)
    layer = mlacp.MlaAttention(config, mesh, dtype=torch.float64, seed=8)
    write_dump(tmp_path, config, layer)
    result = check_dump(tmp_path)
    assert result.returncode == 0 and "q_lora_rank=8" in result.stdout, result.stdout + result.stderr
    for name in ("dw_qb", "dg_q"):  # a wrong q-LoRA gradient is caught
        good = np.load(tmp_path / f"{name}.npy")
        np.save(tmp_path / f"{name}.npy", good * 1.01)
        result = check_dump(tmp_path)
        assert result.returncode == 1 and f"{name}:" in result.stdout, result.stdout
        np.save(tmp_path / f"{name}.npy", good)
    config_json = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(dict(config_json, softmax_scale=0.0)))  # the wrong scale
    result = check_dump(tmp_path)
    assert result.returncode == 1 and "y differs" in result.stdout, result.stdout


def test_check_dump_without_the_new_keys(mesh, tmp_path):
    """A dense dump of a tool that writes neither q_lora_rank nor softmax_scale still checks (defaults 0)."""
    config = small_config(bias=True)
    write_dump(tmp_path, config, mlacp.MlaAttention(config, mesh, dtype=torch.float64, seed=8))
    config_json = json.loads((tmp_path / "config.json").read_text())
    del config_json["q_lora_rank"], config_json["softmax_scale"]
    (tmp_path / "config.json").write_text(json.dumps(config_json))
    result = check_dump(tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
