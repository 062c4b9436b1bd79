"""TE's GEMM-swizzled block-scale layout (optimize_for_gemm / with_gemm_swizzled_scales) for MXFP8
and NVFP4: the byte order cuBLASLt's block-scaled GEMMs read scale factors in.

A scale grid [rows, blocks] (one byte per 1x32 MXFP8 or 1x16 NVFP4 block of a row) is padded to
[roundup(rows, 128), roundup(blocks, 4)] and cut into 128x4 tiles stored one after the other,
row-tile major; inside a tile, the byte of tile row r (r = 32 * r4 + r32) and tile column c sits
at r32 * 16 + r4 * 4 + c (cuBLAS's "32 rows x 4 groups x 4 columns" interleave). Bytes outside
[rows, blocks] are zero, as TE's swizzle kernels write them (common/swizzle/swizzle.cu zero the
padding past the tensor's rows and blocks). The permutation is exact (bytes moved, never
changed); unswizzle is its inverse.

Which grid a copy swizzles (TE's nvte_swizzle_scaling_factors): NVFP4 row-wise and column-wise
copies are both "row-wise" (the column-wise copy is stored transposed): rows = the copy's rows,
blocks = its columns / 16. MXFP8 row-wise: rows = the tensor's flattened rows, blocks =
ceil(cols / 32); MXFP8 column-wise grids are [blocks of rows, cols] and are swizzled transposed
(rows = cols), kept in TE's column-wise buffer shape [roundup(row blocks, 4), roundup(cols, 128)].
"""

from __future__ import annotations

import torch

__all__ = ["swizzle_grid", "unswizzle_grid", "swizzle_mxfp8_columnwise",
           "unswizzle_mxfp8_columnwise"]

_TILE_ROWS = 128
_TILE_COLS = 4


def _up(v: int, n: int) -> int:
    return (v + n - 1) // n * n


def _tile_permute(grid: torch.Tensor, rp: int, bp: int, inverse: bool) -> torch.Tensor:
    # Compact [row tiles, 4, 32, block tiles, 4] <-> swizzled [row tiles, block tiles, 32, 4, 4]:
    # the same axis swap (1 <-> 3) both ways, on the view of the layout given.
    mt, kt = rp // _TILE_ROWS, bp // _TILE_COLS
    view = (mt, kt, 32, 4, _TILE_COLS) if inverse else (mt, 4, 32, kt, _TILE_COLS)
    return grid.reshape(view).permute(0, 3, 2, 1, 4).reshape(rp, bp)


def _check(owner: str, scale: torch.Tensor, rows: int, blocks: int) -> None:
    if not isinstance(scale, torch.Tensor) or scale.dim() != 2:
        got = f"shape {tuple(scale.shape)}" if isinstance(scale, torch.Tensor) else type(scale)
        raise ValueError(f"{owner}: scale: expected a 2-D scale grid, got {got}")
    if scale.element_size() != 1:
        raise ValueError(f"{owner}: scale: expected one-byte scales (E4M3 / E8M0), got "
                         f"{scale.dtype}")
    if scale.shape[0] < rows or scale.shape[1] < blocks:
        raise ValueError(f"{owner}: scale: expected at least [{rows}, {blocks}] (rows, blocks), "
                         f"got {tuple(scale.shape)}")


def swizzle_grid(scale: torch.Tensor, rows: int, blocks: int) -> torch.Tensor:
    """Compact grid (its first `rows` x `blocks` entries; padding beyond them ignored) -> new
    swizzled buffer [roundup(rows, 128), roundup(blocks, 4)] of the same dtype."""
    _check("swizzle_grid", scale, rows, blocks)
    rp, bp = _up(rows, _TILE_ROWS), _up(blocks, _TILE_COLS)
    padded = torch.zeros((rp, bp), dtype=torch.uint8, device=scale.device)
    padded[:rows, :blocks] = scale[:rows, :blocks].view(torch.uint8)
    return _tile_permute(padded, rp, bp, False).contiguous().view(scale.dtype)


def unswizzle_grid(scale: torch.Tensor, rows: int, blocks: int) -> torch.Tensor:
    """Swizzled buffer of a [rows, blocks] grid (roundup(rows, 128) * roundup(blocks, 4) bytes,
    any 2-D shape) -> the compact padded grid [roundup(rows, 128), roundup(blocks, 4)]."""
    rp, bp = _up(rows, _TILE_ROWS), _up(blocks, _TILE_COLS)
    if not isinstance(scale, torch.Tensor) or scale.numel() != rp * bp:
        got = tuple(scale.shape) if isinstance(scale, torch.Tensor) else type(scale)
        raise ValueError(f"unswizzle_grid: scale: expected {rp * bp} bytes (a swizzled "
                         f"[{rp}, {bp}] grid for {rows} rows x {blocks} blocks), got {got}")
    return _tile_permute(scale.contiguous().view(torch.uint8), rp, bp, True).contiguous() \
        .view(scale.dtype)


def swizzle_mxfp8_columnwise(scale: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """MXFP8 column-wise grid [ceil(rows / 32), cols] of a [rows, cols] tensor -> TE's swizzled
    column-wise buffer [roundup(ceil(rows / 32), 4), roundup(cols, 128)] (the transposed grid's
    tiles)."""
    rb = -(-rows // 32)
    _check("swizzle_mxfp8_columnwise", scale, rb, cols)
    sw = swizzle_grid(scale[:rb, :cols].t(), cols, rb)
    return sw.reshape(_up(rb, _TILE_COLS), _up(cols, _TILE_ROWS))


def unswizzle_mxfp8_columnwise(scale: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """Inverse of swizzle_mxfp8_columnwise: the compact grid [ceil(rows / 32), cols]."""
    rb = -(-rows // 32)
    return unswizzle_grid(scale, cols, rb)[:cols, :rb].t().contiguous()
