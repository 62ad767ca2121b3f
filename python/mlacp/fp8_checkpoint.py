# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""DeepSeek-V3's fp8 weights, dequantised on load.

V3's released checkpoint stores each linear weight as fp8 E4M3 ("e4m3fn": no infinities, largest finite 448, the codes
0x7F and 0xFF are NaN) with one float scale per 128 x 128 block: Hugging Face's ``<name>.weight_scale_inv``, DeepSeek's
inference format's ``<name>.scale`` (its convert.py renames the key). The weight is

    W[i, j] = e4m3fn(code[i, j]) * scale[i // 128, j // 128]

with partial blocks at the edges (``kv_a_proj_with_mqa`` has R + dr = 576 rows: 4 whole blocks and one of 64 rows).
The codes arrive as ``torch.uint8`` (torch 1.13, which this package runs on, has no float8 dtype; safetensors and
newer torches hand them over as ``float8_e4m3fn``, which is viewed as the same bytes). The values are decoded exactly
into float32 (every e4m3fn value is a float32) and multiplied by the float32 scale in float32, as DeepSeek's
``weight_dequant`` does; a NaN code is an error naming the key and the element.
"""
import torch

from . import _mlacp

BLOCK = 128  # rows and columns of a block that shares one scale

# The scale's key for a weight's key, by checkpoint format.
SCALE_SUFFIX = {"hf": ".weight_scale_inv", "inference": ".scale"}


def e4m3fn_values():
    """The 256 e4m3fn codes as float32 (NaN at 0x7F and 0xFF): sign, 4 exponent bits (bias 7), 3 mantissa bits;
    exponent 0 is subnormal (m/8 * 2^-6)."""
    codes = torch.arange(256)
    sign = torch.where(codes >= 128, -1.0, 1.0).double()
    exponent = (codes >> 3) & 0xF
    mantissa = (codes & 0x7).double()
    normal = (1 + mantissa / 8) * torch.pow(2.0, (exponent - 7).double())
    subnormal = mantissa / 8 * 2.0**-6
    values = sign * torch.where(exponent == 0, subnormal, normal)
    values[(codes & 0x7F) == 0x7F] = float("nan")
    return values.float()


_VALUES = e4m3fn_values()


def is_fp8(tensor):
    """Whether ``tensor`` holds fp8 codes: uint8, or a float8 dtype of a newer torch."""
    return tensor.dtype == torch.uint8 or "float8" in str(tensor.dtype)


def dequantize(codes, scale, key):
    """The float32 weight of fp8 ``codes`` [m, n] with ``scale`` [ceil(m/128), ceil(n/128)]; ``key`` names the weight
    in errors (a wrong rank or scale shape, a NaN code)."""
    where = "mlacp: fp8 checkpoint"
    if codes.dim() != 2:
        raise _mlacp.InvalidArgument(f"{where}: {key!r} has shape {list(codes.shape)}; expected a matrix of fp8 codes")
    if codes.dtype != torch.uint8:
        codes = codes.view(torch.uint8)
    m, n = codes.shape
    blocks = [-(-m // BLOCK), -(-n // BLOCK)]
    if list(scale.shape) != blocks:
        raise _mlacp.InvalidArgument(f"{where}: the scale of {key!r} has shape {list(scale.shape)}; expected {blocks} "
                                     f"(one per {BLOCK} x {BLOCK} block of its {m} x {n} codes)")
    nan = (codes & 0x7F) == 0x7F
    if bool(nan.any()):
        i, j = (int(v) for v in nan.nonzero()[0])
        raise _mlacp.InvalidArgument(f"{where}: {key!r}[{i}, {j}] is the e4m3fn NaN code 0x{int(codes[i, j]):02X}; "
                                     "expected a finite weight (e4m3fn has no infinity, and a NaN weight cannot be "
                                     "dequantised)")
    values = _VALUES[codes.long()]
    per_element = scale.float().repeat_interleave(BLOCK, 0)[:m].repeat_interleave(BLOCK, 1)[:, :n]
    return values * per_element


def scale_key(weight_key, checkpoint_format):
    """The key of the scale of ``weight_key`` (``<name>.weight``) in ``checkpoint_format`` ("hf" or "inference")."""
    return weight_key[:-len(".weight")] + SCALE_SUFFIX[checkpoint_format]
