"""Group-wise wire quantization of blocks (pure tensor functions).

int8 symmetric:  x ~= code * scale,                 scale = max|x| / 127 per group
uint4 asymmetric: x ~= (code - zero) * scale, code in [0, 15], per group along the last axis
"""

import torch


def _groups(x: torch.Tensor, group_size: int) -> torch.Tensor:
    return x.reshape(-1, group_size).float()  # [num_groups, group_size]


def quantize_int8(x: torch.Tensor, group_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """-> (codes int8 shaped like x, scales float32 [num_groups])."""
    g = _groups(x, group_size)
    scales = g.abs().amax(dim=1) / 127.0
    scales = torch.where(scales > 0, scales, torch.ones_like(scales))
    codes = torch.round(g / scales[:, None]).clamp(-127, 127).to(torch.int8)
    return codes.reshape(x.shape), scales


def dequantize_int8(codes: torch.Tensor, scales: torch.Tensor, group_size: int) -> torch.Tensor:
    return (_groups(codes, group_size) * scales[:, None]).reshape(codes.shape)


def quantize_uint4(x: torch.Tensor, group_size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """-> (packed uint8 [numel / 2], scales float32 [num_groups], zero points uint8 [num_groups])."""
    g = _groups(x, group_size)
    lo, hi = g.amin(dim=1), g.amax(dim=1)
    scales = (hi - lo) / 15.0
    scales = torch.where(scales > 0, scales, torch.ones_like(scales))
    zeros = torch.round(-lo / scales).clamp(0, 15)
    codes = torch.round(g / scales[:, None] + zeros[:, None]).clamp(0, 15).to(torch.uint8).reshape(-1)
    packed = codes[0::2] | (codes[1::2] << 4)  # low nibble first
    return packed, scales, zeros.to(torch.uint8)


def dequantize_uint4(packed: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, group_size: int,
                     shape: tuple[int, ...]) -> torch.Tensor:
    codes = torch.stack([packed & 0x0F, packed >> 4], dim=1).reshape(-1)  # unpack, low nibble first
    g = _groups(codes, group_size) - zeros.float()[:, None]
    return (g * scales[:, None]).reshape(shape)
