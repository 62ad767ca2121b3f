# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""DeepSeek checkpoints as they come: V3's fp8 weights with a scale per 128 x 128 block (dequantised on load, checked
against a plain decoding of every e4m3fn bit pattern, with blocks cut at the edges), DeepSeek's inference key format
(wq_a, q_norm, wkv_a, ...), and the refusals: a NaN code, a missing or stray scale, a model-parallel shard, mixed
formats, biases in the inference format."""
import math

import pytest
import torch
from conftest import small_config

import mlacp
from mlacp import fp8_checkpoint


def plain_e4m3fn(code):
    """One e4m3fn byte's value, decoded bit by bit from the format's definition (None for NaN)."""
    sign = -1.0 if code & 0x80 else 1.0
    exponent, mantissa = (code >> 3) & 0xF, code & 0x7
    if exponent == 0xF and mantissa == 0x7:
        return None
    if exponent == 0:
        return sign * math.ldexp(mantissa, -9)  # subnormal: 0.mmm x 2^-6
    return sign * math.ldexp(8 + mantissa, exponent - 10)  # 1.mmm x 2^(e-7)


def test_every_e4m3fn_code_decodes_as_its_definition():
    table = fp8_checkpoint.e4m3fn_values()
    for code in range(256):
        plain = plain_e4m3fn(code)
        if plain is None:
            assert math.isnan(table[code]), code
        else:
            assert table[code].item() == plain, hex(code)
    assert table[0x7E] == 448 and table[0xFE] == -448 and table[0x01] == 2.0**-9 and table[0x08] == 2.0**-6


# A configuration whose weights are cut into partial blocks: w_kva is [R + dr, D] = [144, 200] (a whole row block and
# one of 16 rows; a whole column block and one of 72 columns), w_qa [130, 200], w_qb [H*dqk, 130] = [48, 130].
def fp8_config():
    return small_config(hidden=200, latent=136, rope=8, nope=16, vdim=16, heads=2, q_lora_rank=130)


LINEARS = {"w_qa": "q_a_proj", "w_qb": "q_b_proj", "w_kva": "kv_a_proj_with_mqa", "w_kvb": "kv_b_proj", "w_o": "o_proj"}


def fp8_checkpoint_of(config, seed, scale_suffix=".weight_scale_inv", names=None):
    """A checkpoint of random fp8 codes (every finite code present in each weight) and positive block scales, the
    RMSNorm gains in float32, and the weights that a plain decoding gives ({mlacp name: float32 tensor})."""
    gen = torch.Generator().manual_seed(seed)
    shapes = mlacp.attention.parameter_shapes(config)
    finite = torch.tensor([c for c in range(256) if plain_e4m3fn(c) is not None], dtype=torch.uint8)
    names = names or {n: m + ".weight" for n, m in LINEARS.items()}
    sd, expected = {}, {}
    for name, key in names.items():
        m, n = shapes[name]
        codes = finite[torch.randint(len(finite), (m, n), generator=gen)]
        codes.view(-1)[:len(finite)] = finite  # every finite pattern at least once
        scale = torch.rand(-(-m // 128), -(-n // 128), generator=gen) * 1e-2 + 1e-3
        sd[key], sd[key[:-len(".weight")] + scale_suffix] = codes, scale
        plain = torch.tensor([[plain_e4m3fn(int(c)) for c in row] for row in codes.tolist()], dtype=torch.float64)
        per_element = torch.tensor([[float(scale[i // 128, j // 128]) for j in range(n)] for i in range(m)],
                                   dtype=torch.float64)
        # a float32 times a float32 is exact in float64: one rounding to float32, as the dequantisation's multiply
        expected[name] = (plain * per_element).float()
    return sd, expected


def test_fp8_checkpoint_is_dequantised_on_load(mesh):
    config = fp8_config()
    sd, expected = fp8_checkpoint_of(config, seed=3)
    gains = {"q_a_layernorm.weight": torch.rand(130) + 0.5, "kv_a_layernorm.weight": torch.rand(136) + 0.5}
    layer = mlacp.MlaAttention(config, mesh, dtype=torch.float64)
    prefix = "model.layers.0.self_attn."
    layer.load_deepseek_state_dict({prefix + k: v for k, v in {**sd, **gains}.items()}, prefix=prefix)
    for name, want in expected.items():
        assert torch.equal(getattr(layer, name), want.double()), name
    assert torch.equal(layer.g_q, gains["q_a_layernorm.weight"].double())
    # The same codes in DeepSeek's inference format (``scale`` keys) load to the same weights.
    inference_names = {"w_qa": "wq_a.weight", "w_qb": "wq_b.weight", "w_kva": "wkv_a.weight", "w_kvb": "wkv_b.weight",
                       "w_o": "wo.weight"}
    isd, iexpected = fp8_checkpoint_of(config, seed=3, scale_suffix=".scale", names=inference_names)
    other = mlacp.MlaAttention(config, mesh, dtype=torch.float64)
    other.load_deepseek_state_dict({"layers.0.attn." + k: v for k, v in isd.items()} | {
        "layers.0.attn.q_norm.weight": gains["q_a_layernorm.weight"],
        "layers.0.attn.kv_norm.weight": gains["kv_a_layernorm.weight"]
    }, prefix="layers.0.attn.")
    for name in expected:
        assert torch.equal(getattr(other, name), getattr(layer, name)), name
    assert all(torch.equal(iexpected[n], expected[n]) for n in expected)


def test_fp8_refusals_name_the_key(mesh):
    config = fp8_config()
    sd, _ = fp8_checkpoint_of(config, seed=4)
    gains = {"q_a_layernorm.weight": torch.ones(130), "kv_a_layernorm.weight": torch.ones(136)}
    layer = mlacp.MlaAttention(config, mesh, dtype=torch.float64)
    for nan in (0x7F, 0xFF):
        bad = dict(sd, **gains)
        bad["kv_b_proj.weight"] = sd["kv_b_proj.weight"].clone()
        bad["kv_b_proj.weight"][3, 5] = nan
        with pytest.raises(mlacp.InvalidArgument, match=rf"'kv_b_proj.weight'\[3, 5\] is the e4m3fn NaN code 0x{nan:X}"):
            layer.load_deepseek_state_dict(bad)
    missing = {k: v for k, v in {**sd, **gains}.items() if k != "o_proj.weight_scale_inv"}
    with pytest.raises(mlacp.InvalidArgument, match=r"'o_proj.weight' holds fp8 codes .* 'o_proj.weight_scale_inv' is"):
        layer.load_deepseek_state_dict(missing)
    wrong = dict(sd, **gains, **{"q_a_proj.weight_scale_inv": torch.ones(1, 2)})
    with pytest.raises(mlacp.InvalidArgument, match=r"scale of 'q_a_proj.weight' has shape \[1, 2\]; expected \[2, 2\]"):
        layer.load_deepseek_state_dict(wrong)
    stray = dict(sd, **gains, **{"q_a_proj.weight": torch.zeros(130, 200)})
    with pytest.raises(mlacp.InvalidArgument, match=r"unexpected key 'q_a_proj.weight_scale_inv': it scales fp8 codes"):
        layer.load_deepseek_state_dict(stray)


def test_inference_format_round_trip_and_refusals(mesh):
    config = small_config(q_lora_rank=8)
    source = mlacp.MlaAttention(config, mesh, dtype=torch.float64, seed=1)
    sd = source.deepseek_state_dict(prefix="layers.2.attn.", checkpoint_format="inference")
    assert sorted(sd) == sorted("layers.2.attn." + k for k in
                                ("wq_a.weight", "q_norm.weight", "wq_b.weight", "wkv_a.weight", "kv_norm.weight",
                                 "wkv_b.weight", "wo.weight"))
    layer = mlacp.MlaAttention(config, mesh, dtype=torch.float64, seed=2)
    layer.load_deepseek_state_dict({**sd, "layers.2.ffn.w1.weight": torch.zeros(1)}, prefix="layers.2.attn.")
    for name, p in layer.named_parameters():
        assert torch.equal(p, getattr(source, name)), name
    dense = small_config()
    dsd = mlacp.MlaAttention(dense, mesh, dtype=torch.float64, seed=3).deepseek_state_dict(checkpoint_format="inference")
    assert sorted(dsd) == ["kv_norm.weight", "wkv_a.weight", "wkv_b.weight", "wo.weight", "wq.weight"]
    with pytest.raises(mlacp.InvalidArgument, match=r"inference format has no attention biases"):
        mlacp.MlaAttention(small_config(bias=True), mesh).deepseek_state_dict(checkpoint_format="inference")
    hf = source.deepseek_state_dict()
    with pytest.raises(mlacp.InvalidArgument, match=r"mix Hugging Face's modules \['o_proj'\] and DeepSeek inference"):
        layer.load_deepseek_state_dict({**{k[len("layers.2.attn."):]: v for k, v in sd.items()}, "o_proj.weight": hf[
            "o_proj.weight"]})
    with pytest.raises(mlacp.InvalidArgument, match=r"checkpoint_format='megatron'; expected one of"):
        layer.load_deepseek_state_dict(hf, checkpoint_format="megatron")


@pytest.mark.parametrize("key,dim", [("wq_b.weight", 0), ("wkv_b.weight", 0), ("wo.weight", 1)])
def test_a_model_parallel_shard_is_named(mesh, key, dim):
    config = small_config(q_lora_rank=8)
    layer = mlacp.MlaAttention(config, mesh, dtype=torch.float64)
    sd = layer.deepseek_state_dict(checkpoint_format="inference")
    sd[key] = sd[key].narrow(dim, 0, sd[key].shape[dim] // 2)
    with pytest.raises(mlacp.InvalidArgument, match=rf"1/2 of the weight along dimension {dim}, as in one of 2 "
                       r"model-parallel files .*--model-parallel 2 writes model\{i\}-mp2.safetensors.*"
                       r"--model-parallel 1"):
        layer.load_deepseek_state_dict(sd)
