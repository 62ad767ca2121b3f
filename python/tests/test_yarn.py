# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""DeepSeek as it ships (issue 34): YaRN RoPE scaling and MlaConfig.from_hf_config.

- the reference's frequencies (docs/spec.md step 4) against a transcription of Hugging Face's YaRN code;
- the layer with YaRN on against the reference, forward and every gradient, both strategies, q-LoRA;
- from_hf_config from a dict, a config.json path and a config object, with its refusals by name;
- the whole V3 path: a V3-shaped config.json and an fp8 checkpoint in DeepSeek's interleaved convention load in one
  call each, and the layer's output equals DeepSeek's attention written out here (interleaved RoPE, YaRN's
  frequencies and cos/sin factor, the mscale-adjusted softmax scale)."""
import json
import math

import pytest
import torch
from conftest import small_config
from mla_reference import gather, reference, relative_error, rope_frequencies, shard
from test_deepseek_checkpoint import fp8_checkpoint_of, plain_e4m3fn
from test_q_lora import deepseek_forward

import mlacp


# ---- Hugging Face's YaRN (modeling_rope_utils._compute_yarn_parameters and DeepseekV3's get_mscale), transcribed in
# float64 with its own names, as the second reading of the spec's formulas.

def hf_yarn(dim, base, factor, original_max_position_embeddings, beta_fast=32, beta_slow=1, mscale=None,
            mscale_all_dim=None, attention_factor=None):

    def get_mscale(scale, mscale=1):
        if scale <= 1:
            return 1.0
        return 0.1 * mscale * math.log(scale) + 1.0

    if attention_factor is None:
        if mscale and mscale_all_dim:
            attention_factor = float(get_mscale(factor, mscale) / get_mscale(factor, mscale_all_dim))
        else:
            attention_factor = get_mscale(factor)

    def find_correction_dim(num_rotations, dim, base, max_position_embeddings):
        return (dim * math.log(max_position_embeddings / (num_rotations * 2 * math.pi))) / (2 * math.log(base))

    def find_correction_range(low_rot, high_rot, dim, base, max_position_embeddings):
        low = math.floor(find_correction_dim(low_rot, dim, base, max_position_embeddings))
        high = math.ceil(find_correction_dim(high_rot, dim, base, max_position_embeddings))
        return max(low, 0), min(high, dim - 1)

    def linear_ramp_factor(min, max, dim):  # noqa: A002 (Hugging Face's names)
        if min == max:
            max += 0.001
        linear_func = (torch.arange(dim, dtype=torch.float64) - min) / (max - min)
        return torch.clamp(linear_func, 0, 1)

    pos_freqs = base**(torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    inv_freq_extrapolation = 1.0 / pos_freqs
    inv_freq_interpolation = 1.0 / (factor * pos_freqs)
    low, high = find_correction_range(beta_fast, beta_slow, dim, base, original_max_position_embeddings)
    inv_freq_extrapolation_factor = 1 - linear_ramp_factor(low, high, dim // 2)
    inv_freq = (inv_freq_interpolation * (1 - inv_freq_extrapolation_factor) +
                inv_freq_extrapolation * inv_freq_extrapolation_factor)
    return inv_freq, attention_factor


V3_SCALING = dict(factor=40, original_max_position_embeddings=4096, beta_fast=32, beta_slow=1, mscale=1.0,
                  mscale_all_dim=1.0)


@pytest.mark.parametrize("scaling", [
    V3_SCALING,
    dict(factor=4, original_max_position_embeddings=64, mscale=0.707, mscale_all_dim=1.0),
    dict(factor=8, original_max_position_embeddings=256, beta_fast=16, beta_slow=2),
    dict(factor=2, original_max_position_embeddings=512, attention_factor=0.9),
])
def test_reference_frequencies_match_hugging_face(scaling):
    config = mlacp.MlaConfig.from_hf_config(hf_config_dict(qk_rope_head_dim=64, rope_scaling=dict(scaling, type="yarn")))
    want_inv, want_factor = hf_yarn(64, 10000.0, **scaling)
    inv, factor = rope_frequencies(config, 64)
    assert torch.allclose(inv, want_inv, rtol=1e-14, atol=0), (inv - want_inv).abs().max()
    assert factor == pytest.approx(want_factor, rel=1e-15)


def yarn_config(**overrides):
    """small_config with dr = 8 and a YaRN scaling whose ramp lies inside it, cos/sin factor != 1, its softmax scale."""
    fields = dict(rope=8, rope_factor=4.0, rope_original_max_position=64, rope_mscale=0.707, rope_mscale_all_dim=1.0)
    fields.update(overrides)
    config = small_config(**fields)
    g = 0.1 * math.log(4.0) + 1
    config.softmax_scale = g * g / math.sqrt(config.qk_dim())
    return config


@pytest.mark.parametrize("strategy", ["latent", "expanded"])
@pytest.mark.parametrize("q_lora_rank", [0, 8])
def test_yarn_layer_matches_reference(comm, mesh, strategy, q_lora_rank):
    config = yarn_config(strategy=strategy, q_lora_rank=q_lora_rank, bias=True)
    layer = mlacp.MlaAttention(config, mesh, dtype=torch.float64, seed=3)
    generator = torch.Generator().manual_seed(5)
    x = torch.randn(config.batch, config.seq, config.hidden, generator=generator, dtype=torch.float64)
    dy = torch.randn(x.shape, generator=generator, dtype=torch.float64)
    y_ref, dx_ref, grads_ref = reference(config, layer, x, dy)
    x_local = shard(x, comm.rank, comm.size).requires_grad_()
    y = layer(x_local)
    y.backward(shard(dy, comm.rank, comm.size))
    assert relative_error(gather(comm, y), y_ref) <= 1e-10
    assert relative_error(gather(comm, x_local.grad), dx_ref) <= 1e-10
    mlacp.all_reduce_grads(layer)
    for name, p in layer.named_parameters():
        assert relative_error(p.grad, grads_ref[name]) <= 1e-10, name
    # Without the scaling the reference differs: the test sees YaRN.
    plain = mlacp.MlaConfig(config)
    plain.rope_factor = 1.0
    assert relative_error(reference(plain, layer, x, dy)[0], y_ref) > 1e-3


# ---- from_hf_config

def hf_config_dict(**overrides):
    """A DeepSeek-V3-style config.json (attention keys of V3's shape scaled down, the MoE keys beside them)."""
    cfg = {
        "architectures": ["DeepseekV3ForCausalLM"], "attention_bias": False, "hidden_size": 48,
        "num_attention_heads": 4, "num_key_value_heads": 4, "q_lora_rank": 16, "kv_lora_rank": 12,
        "qk_nope_head_dim": 6, "qk_rope_head_dim": 8, "v_head_dim": 5, "rope_theta": 10000, "rms_norm_eps": 1e-5,
        "max_position_embeddings": 163840, "n_routed_experts": 256, "num_experts_per_tok": 8,
        "auto_map": {"AutoConfig": "configuration_deepseek.DeepseekV3Config"},
        "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                                "weight_block_size": [128, 128]},
        "rope_scaling": {"type": "yarn", "factor": 40, "original_max_position_embeddings": 64, "beta_fast": 32,
                         "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0},
        "torch_dtype": "bfloat16",
    }
    cfg.update(overrides)
    return cfg


def test_from_hf_config_dict_path_and_object(tmp_path):
    cfg = hf_config_dict()
    config = mlacp.MlaConfig.from_hf_config(cfg, batch=2, seq=16)
    assert (config.batch, config.seq, config.hidden, config.heads, config.q_lora_rank, config.latent) == (2, 16, 48, 4,
                                                                                                         16, 12)
    assert (config.nope, config.rope, config.vdim) == (6, 8, 5)
    assert config.rms_eps == 1e-6 and config.rope_interleave and not config.bias
    assert (config.rope_factor, config.rope_original_max_position, config.rope_mscale_all_dim) == (40.0, 64, 1.0)
    g = 0.1 * math.log(40) + 1
    assert config.attention_scale() == pytest.approx(g * g / math.sqrt(14), rel=1e-15)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    assert repr(mlacp.MlaConfig.from_hf_config(path, batch=2, seq=16)) == repr(config)
    assert repr(mlacp.MlaConfig.from_hf_config(str(path), batch=2, seq=16)) == repr(config)

    class PretrainedLike:  # transformers' PretrainedConfig: to_dict(), a torch dtype among the values

        def to_dict(self):
            return dict(cfg, torch_dtype=torch.bfloat16)

    class Attributes:

        def __init__(self):
            self.__dict__.update(cfg)
            self.q_lora_rank = None  # V2-Lite: no query latent

    assert repr(mlacp.MlaConfig.from_hf_config(PretrainedLike(), batch=2, seq=16)) == repr(config)
    assert mlacp.MlaConfig.from_hf_config(Attributes()).q_lora_rank == 0
    unset = mlacp.MlaConfig.from_hf_config(cfg)
    assert unset.batch == 0 and unset.seq == 0


@pytest.mark.parametrize("change, message", [
    (dict(attention_bias=True), r"attention_bias = true; expected false: Hugging Face's attention_bias puts biases"),
    (dict(rope_scaling={"type": "linear", "factor": 2.0}), r"rope_scaling: type = 'linear'; expected 'yarn'"),
    (dict(rope_scaling={"rope_type": "llama3", "factor": 8.0}), r"type = 'llama3'"),
    (dict(hidden_size="48"), r'hidden_size = "48"; expected a positive integer'),
    (dict(kv_lora_rank=None), r"kv_lora_rank = absent; expected a positive integer"),
    (dict(rope_scaling={"type": "yarn", "factor": 0.5, "original_max_position_embeddings": 64}), r"rope_factor = 0.5"),
])
def test_from_hf_config_refusals_name_the_key(change, message):
    with pytest.raises(mlacp.InvalidArgument, match=message):
        mlacp.MlaConfig.from_hf_config(hf_config_dict(**change))
    with pytest.raises(TypeError, match="expected a config.json path, a dict or a config object"):
        mlacp.MlaConfig.from_hf_config(42)


# ---- DeepSeek-V3 as it ships: config.json + fp8 checkpoint in one call each

def deepseek_v3_attention(config, cfg, x, sd):
    """Hugging Face's DeepseekV3Attention (rope_interleave, YaRN) on its own float64 state_dict, one document, causal
    (test_q_lora.deepseek_forward): interleaved RoPE with YaRN's frequencies and cos/sin factor from the Hugging Face
    transcription above, softmax_scale = qk_head_dim^-0.5 * get_mscale(factor, mscale_all_dim)^2, both from the
    config.json ``cfg`` itself, not from mlacp's reading of it."""
    scaling = {k: v for k, v in cfg["rope_scaling"].items() if k != "type"}
    inv_freq, attention_factor = hf_yarn(cfg["qk_rope_head_dim"], float(cfg["rope_theta"]), **scaling)
    m = 0.1 * scaling["mscale_all_dim"] * math.log(scaling["factor"]) + 1.0
    scale = (cfg["qk_nope_head_dim"] + cfg["qk_rope_head_dim"])**-0.5 * m * m
    return deepseek_forward(config, x, sd, inv_freq, attention_factor, scale)


@pytest.mark.parametrize("strategy", ["latent", "expanded"])
def test_deepseek_v3_config_and_fp8_checkpoint(comm, mesh, tmp_path, strategy):
    # Sizes that are not multiples of 128 (partial fp8 blocks), V3's scaling with a short original length.
    cfg = hf_config_dict(hidden_size=200, q_lora_rank=130, kv_lora_rank=136, qk_nope_head_dim=16, v_head_dim=16,
                         num_attention_heads=2)
    path = tmp_path / f"config_{comm.rank}.json"
    path.write_text(json.dumps(cfg))
    # The five lines of the README.
    config = mlacp.MlaConfig.from_hf_config(path, batch=2, seq=16)
    config.strategy = strategy
    layer = mlacp.MlaAttention(config, mesh, dtype=torch.float64)
    codes, _ = fp8_checkpoint_of(config, seed=7)
    generator = torch.Generator().manual_seed(11)  # the same checkpoint and x on every rank
    gains = {
        "q_a_layernorm.weight": torch.rand(130, generator=generator) + 0.5,
        "kv_a_layernorm.weight": torch.rand(136, generator=generator) + 0.5
    }
    prefix = "model.layers.3.self_attn."
    layer.load_deepseek_state_dict({prefix + k: v for k, v in {**codes, **gains}.items()}, prefix=prefix)

    # DeepSeek's attention on the same checkpoint, dequantised by a plain loop of its own (codes times block scale).
    table = torch.tensor([plain_e4m3fn(c) or 0.0 for c in range(256)], dtype=torch.float64)
    sd = {k: v.double() for k, v in gains.items()}
    for key, t in codes.items():
        if key.endswith(".weight"):
            scale = codes[key[:-len(".weight")] + ".weight_scale_inv"].double()
            per = scale.repeat_interleave(128, 0)[:t.shape[0]].repeat_interleave(128, 1)[:, :t.shape[1]]
            sd[key] = (table[t.long()] * per).float().double()
    x = torch.randn(config.batch, config.seq, config.hidden, generator=generator, dtype=torch.float64)
    dy = torch.randn(x.shape, generator=generator, dtype=torch.float64)
    expected = deepseek_v3_attention(config, cfg, x, sd)
    x_local = shard(x, comm.rank, comm.size).requires_grad_()
    y = layer(x_local)
    assert relative_error(gather(comm, y), expected) <= 1e-10
    # Gradients: every one against the reference of the same math (docs/spec.md, YaRN on).
    y.backward(shard(dy, comm.rank, comm.size))
    _, dx_ref, grads_ref = reference(config, layer, x, dy)
    assert relative_error(gather(comm, x_local.grad), dx_ref) <= 1e-10
    mlacp.all_reduce_grads(layer)
    for name, p in layer.named_parameters():
        assert relative_error(p.grad, grads_ref[name]) <= 1e-10, name
    # The round trip keeps DeepSeek's convention without a flag.
    back = layer.deepseek_state_dict()
    assert torch.allclose(back["kv_a_proj_with_mqa.weight"], sd["kv_a_proj_with_mqa.weight"], rtol=0, atol=0)
