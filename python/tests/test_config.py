# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""mlacp.MlaConfig from the C++ field table (mlacp/mla/config_fields.hpp): every field a keyword and an attribute,
the enums also by name, a repr that rebuilds the configuration, and clear errors for unknown keywords and wrong
types."""
import pytest
import torch
from conftest import small_config

import mlacp

FIELDS = ("batch", "seq", "hidden", "heads", "nope", "rope", "vdim", "latent", "q_lora_rank", "softmax_scale", "bias",
          "strategy", "rope_base", "rms_eps", "overlap", "cu_seqlens", "max_documents", "wire_dtype", "ring_layout",
          "bf16_compute")


def test_every_field_is_a_keyword_and_an_attribute():
    c = mlacp.MlaConfig(batch=2, seq=16, hidden=32, heads=4, nope=8, rope=4, vdim=8, latent=16, q_lora_rank=12,
                        softmax_scale=0.25, bias=True, strategy="expanded", rope_base=500.0, rms_eps=1e-5,
                        overlap=False, cu_seqlens=[0, 5, 16], max_documents=8, wire_dtype="bf16",
                        ring_layout="contiguous")
    assert (c.batch, c.seq, c.hidden, c.heads, c.nope, c.rope, c.vdim, c.latent) == (2, 16, 32, 4, 8, 4, 8, 16)
    assert (c.q_lora_rank, c.softmax_scale, c.bias, c.rope_base, c.rms_eps, c.overlap) == (12, 0.25, True, 500.0,
                                                                                            1e-5, False)
    assert c.strategy == mlacp.MlaStrategy.expanded and c.ring_layout == mlacp.RingLayout.contiguous
    assert c.cu_seqlens == [0, 5, 16] and c.max_documents == 8 and c.wire_dtype == mlacp.WireDtype.bf16
    for name in FIELDS:
        assert hasattr(c, name), name
    c.wire_dtype = mlacp.WireDtype.bf16_all
    c.max_documents = 3
    assert c.wire_dtype == mlacp.WireDtype.bf16_all and c.max_documents == 3
    assert "wire=bf16_all" in c.describe() and "max_documents=3" in c.describe()
    c.wire_dtype = "fp8"  # the fp8 codec's row of the wire policy (forward in fp8, backward in bf16)
    assert c.wire_dtype == mlacp.WireDtype.fp8 and "wire=fp8" in c.describe()
    assert [v.name for v in mlacp.WireDtype.__members__.values()] == ["same", "bf16", "bf16_all", "fp8"]
    assert c.bf16_compute == mlacp.Bf16Compute.auto and "bf16_compute" not in c.describe()  # the default
    c.bf16_compute = "float"
    assert c.bf16_compute == mlacp.Bf16Compute.float and "bf16_compute=float" in c.describe()
    assert [v.name for v in mlacp.Bf16Compute.__members__.values()] == ["auto", "bf16", "float"]


def test_repr_rebuilds_the_configuration():
    c = mlacp.MlaConfig(batch=1, seq=8, hidden=16, heads=2, nope=4, rope=2, vdim=4, latent=8, wire_dtype="bf16",
                        max_documents=5, cu_seqlens=[0, 3, 8])
    text = repr(c)
    assert text.startswith("mlacp.MlaConfig(") and "wire_dtype='bf16'" in text and "max_documents=5" in text
    again = eval(text, {"mlacp": mlacp})
    assert repr(again) == text
    assert "cu_seqlens" not in repr(mlacp.MlaConfig())  # only when set


def test_unknown_keywords_and_wrong_types_are_named():
    with pytest.raises(TypeError, match="unexpected keyword 'sq'; expected one of batch, seq"):
        mlacp.MlaConfig(batch=1, sq=8)
    with pytest.raises(TypeError, match="max_documents = 'many' has the wrong type"):
        mlacp.MlaConfig(max_documents="many")
    c = mlacp.MlaConfig()
    with pytest.raises(TypeError, match="heads = 2.5 has the wrong type"):
        c.heads = 2.5
    with pytest.raises(mlacp.InvalidArgument, match="wire dtype 'fp4' is not known"):
        mlacp.MlaConfig(wire_dtype="fp4")


def test_a_float_layer_with_the_bf16_wire(comm, mesh):
    """wire_dtype from Python: the layer moves bf16 across ranks (at P > 1 its output differs from the float wire's
    by bf16 rounding only); at P = 1 nothing is sent and the outputs are identical."""
    from mla_reference import relative_error
    from test_mla_attention import run_layer

    generator = torch.Generator().manual_seed(3)
    outputs = {}
    for wire in ("same", "bf16"):
        config = small_config(wire_dtype=wire)
        layer = mlacp.MlaAttention(config, mesh, dtype=torch.float32, seed=5)
        x = torch.randn(config.batch, config.seq, config.hidden, generator=torch.Generator().manual_seed(11))
        dy = torch.randn(x.shape, generator=generator.manual_seed(12))
        outputs[wire] = run_layer(comm, layer, x, dy)[:2]
    for same, bf16 in zip(outputs["same"], outputs["bf16"]):
        error = relative_error(bf16, same)
        if comm.size == 1:
            assert error == 0
        else:
            assert 0 < error < 2e-2, error
