"""TE's NVFP4 reference (custom_recipes.reference_nvfp4): NVFP4QuantizerRef, a pure-torch NVFP4
quantizer (the oracle the native kernels are compared against) with its GEMM (qgemm), the tensor it
returns (NVFP4TensorRef), and TE's reference factory.

The arithmetic is _reference_nvfp4_math.py's (written from the format's definition; its bytes
equal NVFP4Quantizer's, tests/pytorch/test_nvfp4_reference.py), the GEMM
_reference_nvfp4_gemm.py's. Layouts, as TE's reference: data uint8 [M, N / 2] (two E2M1 codes per
byte), scale float8_e4m3fn [M, ceil(N / 16)] (16x16 blocks: M rounded up to 16, each row holding
its block's scale), no 128x4 padding or swizzle; the column-wise copy (data_t / scale_t) is the
quantized transpose x^T [N, M], random-Hadamard-transformed along M first with with_rht; fp32
global amaxes per copy (global_amax_row / global_amax_col; [rows] when row-scaled).

Under a CustomRecipe the modules run these quantizers' qgemm for their GEMMs (custom_gemm; the
quantizer and tensor say `custom`). stochastic_rounding (not in TE's reference, which has no SR)
rounds the elements stochastically with torch's generator (_reference_nvfp4_math
.encode_e2m1_stochastic): the native kernel's rule on another random stream, so it matches the
native SR bytes in distribution only, and it is tested statistically (unbiased, neighbours only);
the native Philox stream is tested in tests/pytorch/test_nvfp4_sr_stream.py.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from ..tensor.quantized_tensor import QuantizedTensorStorage, Quantizer
from . import _reference_nvfp4_math as m
from . import gemm, reference_utils
from ._reference_nvfp4_gemm import nvfp4_qgemm

__all__ = ["NVFP4QuantizerRef", "NVFP4TensorRef", "nvfp4_ref_rht_2d_factory"]


def nvfp4_ref_rht_2d_factory(role: Any) -> Any:
    """TE's reference factory: linear / grouped-linear weights 16x16 blocks without RHT, every other
    role 1x16 blocks with the RHT of the column-wise copy.

    transformer_engine_lite returns the native NVFP4Quantizer with those settings (TE returns
    NVFP4QuantizerRef): the same bytes (test_nvfp4_reference.py) at native speed, and module
    GEMMs on the NVFP4 recipe's path. A recipe that wants the reference GEMM itself builds
    NVFP4QuantizerRef in its own factory (tests/pytorch/test_custom_gemm.py)."""
    from ..tensor.nvfp4_tensor import NVFP4Quantizer

    weight = (role is not None and getattr(role, "module_type", None) in ("linear", "grouped_linear")
              and getattr(role, "tensor_type", None) == "weight")
    if weight:
        return NVFP4Quantizer(with_2d_quantization=True)
    return NVFP4Quantizer(with_rht=True, with_post_rht_amax=True)


@dataclasses.dataclass
class NVFP4TensorRef(QuantizedTensorStorage):
    """One reference-quantized tensor (see the module docstring for the layouts). dtype: the
    input's (nominal) dtype; quant_dtype: Fp4Formats.E2M1; original_shape: the input's shape
    (3-D inputs are quantized as [prod(leading), last])."""

    data: torch.Tensor | None = None
    scale: torch.Tensor | None = None
    data_t: torch.Tensor | None = None
    scale_t: torch.Tensor | None = None
    global_amax_row: torch.Tensor | None = None
    global_amax_col: torch.Tensor | None = None
    nvfp4_use_4over6: bool = False
    nvfp4_e4m3_max: int = 448
    dtype: torch.dtype | None = None
    device: torch.device | None = None
    quant_dtype: Any = None
    original_shape: tuple[int, ...] | None = None
    _quantizer: Any = None

    @property
    def custom(self) -> bool:
        """Custom tensors go to custom_gemm (the quantizer's qgemm) in general_gemm."""
        return True

    # TE's names of the row-wise buffers
    @property
    def _data(self) -> torch.Tensor | None:
        return self.data

    @_data.setter
    def _data(self, value: torch.Tensor | None) -> None:
        self.data = value

    @property
    def _scale_inv(self) -> torch.Tensor | None:
        return self.scale

    @_scale_inv.setter
    def _scale_inv(self, value: torch.Tensor | None) -> None:
        self.scale = value

    def __repr__(self) -> str:
        return (f"NVFP4TensorRef(dtype={self.dtype}, device={self.device}, "
                f"quant_dtype={self.quant_dtype}, original_shape={self.original_shape})")

    def size(self, *args: Any, **kwargs: Any) -> torch.Size:
        """The logical shape (the packed data halves the last dim)."""
        if self.original_shape is None:
            raise RuntimeError("NVFP4TensorRef.size(): original_shape is not set")
        return torch.Size(self.original_shape)

    @property
    def shape(self) -> torch.Size:
        return self.size()

    def prepare_for_saving(self) -> tuple[list[torch.Tensor | None], NVFP4TensorRef]:
        """(the buffers, self emptied of them): TE's save-for-backward protocol."""
        tensors = [self.data, self.data_t, self.scale, self.scale_t]
        self.data = self.data_t = self.scale = self.scale_t = None
        return tensors, self

    def restore_from_saved(self, tensors: list[torch.Tensor | None]) -> list[torch.Tensor | None]:
        self.data, self.data_t, self.scale, self.scale_t = tensors[:4]
        return tensors[4:]

    def get_usages(self) -> dict[str, bool]:
        return {"rowwise": self.data is not None, "columnwise": self.data_t is not None}

    def update_usage(self, rowwise_usage: bool | None = None,
                     columnwise_usage: bool | None = None) -> None:
        """Drop copies no longer needed. A missing copy cannot be made from the other (E2M1 codes
        do not transpose into another block layout): RuntimeError, as TE's reference."""
        if rowwise_usage and self.data is None:
            raise RuntimeError("NVFP4TensorRef.update_usage: rowwise_usage=True needs the "
                               "row-wise data, which this tensor does not hold")
        if columnwise_usage and self.data_t is None:
            raise RuntimeError("NVFP4TensorRef.update_usage: columnwise_usage=True needs the "
                               "column-wise data, which this tensor does not hold (quantize with "
                               "columnwise=True)")
        if rowwise_usage is False:
            self.data = self.scale = None
        if columnwise_usage is False:
            self.data_t = self.scale_t = None

    def dequantize(self, dtype: torch.dtype | None = None) -> torch.Tensor:
        """The values the row-wise copy holds (else the column-wise copy's, transposed back with
        the RHT undone in fp64): e2m1 * ((e4m3 scale * amax) * (1 / (6 * e4m3_max))) in fp32."""
        q = self._quantizer
        if self.data is not None:
            vals = self._copy_values(self.data, self.scale, self.global_amax_row)
        elif self.data_t is not None:
            vals = self._copy_values(self.data_t, self.scale_t, self.global_amax_col)
            if q is not None and q.with_rht:
                vals = m.rht16(vals.double(), q.with_random_sign_mask, torch.float64,
                               inverse=True).float()
            vals = vals.t()
        else:
            raise ValueError("NVFP4TensorRef.dequantize: no row-wise or column-wise data")
        return vals.reshape(self.original_shape).to(dtype or self.dtype)

    def _copy_values(self, data: torch.Tensor, scale: torch.Tensor,
                     amax: torch.Tensor) -> torch.Tensor:
        rows, cols = data.shape[0], data.shape[1] * 2
        vals = m.decode_e2m1(m.unpack_e2m1(data))
        q = self._quantizer
        if q is not None and q.pow_2_scales:
            s = scale[:rows].repeat_interleave(32, dim=1)[:, :cols]
            return vals * s
        inv = torch.tensor(1.0 / (6.0 * self.nvfp4_e4m3_max), dtype=torch.float32)
        a = amax.reshape(-1, 1) if amax.numel() > 1 else amax.reshape(())
        s = (scale[:rows].to(torch.float32) * a) * inv
        return vals * s.repeat_interleave(16, dim=1)[:, :cols]


class NVFP4QuantizerRef(Quantizer):
    """TE's reference NVFP4 quantizer, with TE's arguments and defaults.

    dtype: Fp4Formats.E2M1. rowwise / columnwise: which copies quantize() makes. pow_2_scales:
    MXFP4 (1x32 blocks, power-of-two fp32 scales, no global scale; quant_tile_shape (1, 32)).
    eps: accepted for TE's signature; NVFP4 scaling has no amax epsilon (TE's reference ignores
    it as well), so only 0.0 is taken. quant_tile_shape: (1, 16) or (16, 16). row_scaled_nvfp4:
    one global amax per row (1x16, rowwise). nvfp4_use_4over6 with nvfp4_e4m3_max (448 or 256),
    nvfp4_4over6_err_mode ("MAE" / "MSE") and nvfp4_4over6_err_use_fast_math: 4over6 block
    scale selection. with_rht / with_random_sign_mask: the RHT of the column-wise copy (TE's
    signs, or none). stochastic_rounding (keyword, ours; see the module docstring): stochastic
    rounding of the E2M1 elements, not with 4over6 or pow_2_scales."""

    def __init__(
        self,
        dtype: reference_utils.Fp4Formats,
        rowwise: bool = True,
        columnwise: bool = True,
        pow_2_scales: bool = False,
        eps: float = 0.0,
        quant_tile_shape: tuple[int, int] = (1, 16),
        row_scaled_nvfp4: bool = False,
        nvfp4_use_4over6: bool = False,
        nvfp4_e4m3_max: int = 448,
        nvfp4_4over6_err_mode: str = "MAE",
        nvfp4_4over6_err_use_fast_math: bool = False,
        with_rht: bool = False,
        with_random_sign_mask: bool = True,
        *,
        stochastic_rounding: bool = False,
    ) -> None:
        super().__init__(rowwise=rowwise, columnwise=columnwise)
        if dtype != reference_utils.Fp4Formats.E2M1:
            raise ValueError(f"NVFP4QuantizerRef: dtype: expected Fp4Formats.E2M1, got {dtype!r}")
        if eps != 0.0:
            raise NotImplementedError(f"NVFP4QuantizerRef: eps: NVFP4 scaling has no amax "
                                      f"epsilon (TE's reference does not use it); got {eps!r}")
        tile = tuple(quant_tile_shape)
        if tile not in ((1, 16), (16, 16), (1, 32)):
            raise ValueError(f"NVFP4QuantizerRef: quant_tile_shape: expected (1, 16), (16, 16) "
                             f"or (1, 32) (pow_2_scales), got {quant_tile_shape!r}")
        if pow_2_scales != (tile == (1, 32)):
            raise ValueError(f"NVFP4QuantizerRef: quant_tile_shape: expected (1, 32) with "
                             f"pow_2_scales=True (MXFP4) and (1, 16) / (16, 16) without, got "
                             f"{tile} with pow_2_scales={pow_2_scales}")
        err_mode = str(nvfp4_4over6_err_mode).upper()
        # TE's refusals, with its messages
        if row_scaled_nvfp4 and not rowwise:
            raise ValueError("Row-scaled NVFP4 reference quantization requires rowwise usage.")
        if row_scaled_nvfp4 and (pow_2_scales or tile != (1, 16)):
            raise ValueError(f"Row-scaled NVFP4 only supports NVFP4 1x16 tile shape, got {tile}")
        if nvfp4_use_4over6:
            if err_mode not in ("MAE", "MSE"):
                raise ValueError(f"Unsupported NVFP4 4over6 error mode: {err_mode}.")
            if pow_2_scales:
                raise ValueError("4over6 is only supported for NVFP4 (non-pow2) mode.")
        self.nvfp4_e4m3_max = int(nvfp4_e4m3_max) if nvfp4_use_4over6 else 448
        if self.nvfp4_e4m3_max not in (448, 256):
            raise ValueError("nvfp4_e4m3_max must be 448 or 256.")
        if stochastic_rounding and (nvfp4_use_4over6 or pow_2_scales):
            raise ValueError("NVFP4QuantizerRef: stochastic_rounding=True expects plain NVFP4, got "
                             f"nvfp4_use_4over6={nvfp4_use_4over6}, pow_2_scales={pow_2_scales}")
        if with_rht and pow_2_scales:
            raise NotImplementedError("NVFP4QuantizerRef: with_rht=True with pow_2_scales=True "
                                      "(MXFP4) is not implemented by transformer_engine_lite")
        self.internal = True
        self.dtype = dtype
        self.pow_2_scales = bool(pow_2_scales)
        self.eps = float(eps)
        self.quant_tile_shape = tile
        self.row_scaled_nvfp4 = bool(row_scaled_nvfp4)
        self.nvfp4_use_4over6 = bool(nvfp4_use_4over6)
        self.nvfp4_4over6_err_mode = err_mode
        self.nvfp4_4over6_err_use_fast_math = bool(nvfp4_4over6_err_use_fast_math)
        self.with_rht = bool(with_rht)
        self.with_random_sign_mask = bool(with_random_sign_mask)
        self.stochastic_rounding = bool(stochastic_rounding)

    @property
    def custom(self) -> bool:
        """Custom quantizers' tensors go to custom_gemm (this qgemm) in general_gemm."""
        return True

    def state(self) -> dict[str, Any]:
        return {"kind": "nvfp4_ref", "rowwise": self.rowwise_usage,
                "columnwise": self.columnwise_usage, "pow_2_scales": self.pow_2_scales,
                "quant_tile_shape": self.quant_tile_shape,
                "row_scaled_nvfp4": self.row_scaled_nvfp4,
                "nvfp4_use_4over6": self.nvfp4_use_4over6, "nvfp4_e4m3_max": self.nvfp4_e4m3_max,
                "nvfp4_4over6_err_mode": self.nvfp4_4over6_err_mode,
                "nvfp4_4over6_err_use_fast_math": self.nvfp4_4over6_err_use_fast_math,
                "with_rht": self.with_rht, "with_random_sign_mask": self.with_random_sign_mask,
                "stochastic_rounding": self.stochastic_rounding}

    # ------------------------------------------------------------------ quantization
    def _apply_rht(self, x: torch.Tensor) -> torch.Tensor:
        """The RHT along x's last dim (a multiple of 16), in x's dtype; x itself without
        with_rht."""
        if not self.with_rht:
            return x
        return m.rht16(x.to(torch.float32), self.with_random_sign_mask, x.dtype).to(x.dtype)

    def _quantize_copy(self, t: torch.Tensor, amax: torch.Tensor) -> tuple[torch.Tensor, ...]:
        if self.pow_2_scales:
            return m.quantize_blocks_pow2(t)
        return m.quantize_blocks(
            t, amax, self.quant_tile_shape == (16, 16), self.row_scaled_nvfp4,
            self.nvfp4_e4m3_max, self.nvfp4_4over6_err_mode if self.nvfp4_use_4over6 else None,
            self.nvfp4_4over6_err_use_fast_math, self.stochastic_rounding)

    @staticmethod
    def _amax(t: torch.Tensor, per_row: bool) -> torch.Tensor:
        # torch.amax propagates NaN, as the kernels' amax
        if t.numel() == 0:
            return torch.zeros(t.shape[0] if per_row else 1, dtype=torch.float32, device=t.device)
        return t.abs().amax(dim=1) if per_row else t.abs().amax().reshape(1)

    def _quantize_2d(self, x: torch.Tensor) -> dict[str, Any]:
        if not (self.rowwise_usage or self.columnwise_usage):
            raise ValueError("NVFP4QuantizerRef: expected rowwise or columnwise usage, got neither")
        rows, cols = x.shape
        if cols % 2:
            raise ValueError(f"NVFP4QuantizerRef: expected an even last dim (two E2M1 values per "
                             f"byte), got shape {tuple(x.shape)}")
        if self.columnwise_usage and rows % 2:
            raise ValueError(f"NVFP4QuantizerRef: columnwise=True: expected an even number of "
                             f"rows (the transpose packs them two per byte), got {rows}")
        if self.with_rht and self.columnwise_usage and rows % 16:
            raise ValueError(f"NVFP4QuantizerRef: with_rht=True: expected rows divisible by 16 "
                             f"(the Hadamard size), got {rows}")
        xf = x.to(torch.float32)
        per_row = self.row_scaled_nvfp4
        out: dict[str, Any] = dict.fromkeys(("data", "scale", "data_t", "scale_t"))
        amax_row = self._amax(xf, per_row)
        amax_col = amax_row
        if self.columnwise_usage:
            xt = xf.t().contiguous()
            if self.with_rht:
                xt = m.rht16(xt, self.with_random_sign_mask, x.dtype)
            amax_col = self._amax(xt, per_row)
            out["data_t"], out["scale_t"] = self._quantize_copy(xt, amax_col)
        if self.rowwise_usage:
            out["data"], out["scale"] = self._quantize_copy(xf, amax_row)
        if self.pow_2_scales:  # MXFP4 has no global scale
            amax_row = amax_col = None
        out["global_amax_row"], out["global_amax_col"] = amax_row, amax_col
        return out

    def quantize(self, tensor: torch.Tensor, **kwargs: Any) -> NVFP4TensorRef:
        """Quantize a float32 / float16 / bfloat16 tensor (N-D: as [prod(leading), last])."""
        if not isinstance(tensor, torch.Tensor) \
                or tensor.dtype not in reference_utils.HIGH_PRECISION_FLOAT_DTYPES:
            got = tensor.dtype if isinstance(tensor, torch.Tensor) else type(tensor).__name__
            raise TypeError(f"Unsupported input dtype {got}, expected one of "
                            f"{reference_utils.HIGH_PRECISION_FLOAT_DTYPES}")
        if tensor.dim() < 1:
            raise ValueError("NVFP4QuantizerRef.quantize: tensor: expected at least 1 dim, got a "
                             "scalar")
        x = tensor.detach().reshape(-1, tensor.shape[-1]) if tensor.dim() != 2 else tensor.detach()
        return NVFP4TensorRef(
            **self._quantize_2d(x), nvfp4_use_4over6=self.nvfp4_use_4over6,
            nvfp4_e4m3_max=self.nvfp4_e4m3_max, dtype=tensor.dtype, device=tensor.device,
            quant_dtype=self.dtype, original_shape=tuple(tensor.shape), _quantizer=self)

    __call__ = quantize

    def update_quantized(self, src: torch.Tensor, dst: NVFP4TensorRef, *,
                         noop_flag: torch.Tensor | None = None) -> NVFP4TensorRef:
        """Quantize src into dst (its fields replaced); noop_flag holding a nonzero value skips."""
        if not isinstance(dst, NVFP4TensorRef):
            raise TypeError(f"NVFP4QuantizerRef.update_quantized: dst: expected an "
                            f"NVFP4TensorRef, got {type(dst).__name__}")
        if noop_flag is not None and noop_flag.item() != 0:
            return dst
        new = self.quantize(src)
        for f in dataclasses.fields(NVFP4TensorRef):
            setattr(dst, f.name, getattr(new, f.name))
        return dst

    def make_empty(self, shape: Any, *, dtype: torch.dtype = torch.float32, device: Any = None,
                   requires_grad: bool = False) -> NVFP4TensorRef:
        """A quantized zero tensor of `shape` (fill it with update_quantized)."""
        return self.quantize(torch.zeros(tuple(shape), dtype=dtype, device=device))

    @property
    def supports_allgather_fp8(self) -> bool:
        return False

    @property
    def supports_dequantize(self) -> bool:
        """TE's flag: whether modules may dequantize this quantizer's tensors for a
        high-precision GEMM (they run qgemm instead)."""
        return False

    def transpose_qresult(self, qresult: Any) -> Any:
        raise NotImplementedError("Transpose qresult is not implemented for FP4.")

    @property
    def is_data_t_transposed_in_memory(self) -> bool:
        raise NotImplementedError("NVFP4QuantizerRef.is_data_t_transposed_in_memory is not "
                                  "implemented for FP4 quantization")

    # ------------------------------------------------------------------ GEMM
    def qgemm(
        self,
        qx: torch.Tensor,
        qw: torch.Tensor,
        m_params: gemm.MMParams | None,
        out_dtype: torch.dtype,
        sx: torch.Tensor,
        sw: torch.Tensor,
        bias: torch.Tensor | None = None,
        out: torch.Tensor | None = None,
        accumulate: bool = False,
        gemm_type: gemm.GEMMType | None = gemm.GEMMType.FPROP,
        qresult_x: NVFP4TensorRef | None = None,
        qresult_w: NVFP4TensorRef | None = None,
    ) -> torch.Tensor:
        """y[M, N] = qx[M, K] x qw[N, K]^T as the FP4 tensor cores form it (see
        _reference_nvfp4_gemm.nvfp4_qgemm). m_params is not used (the reference has one
        accumulation mode); gemm_type picks the global amaxes (WGRAD: both column-wise copies')."""
        if m_params is not None and not isinstance(m_params, gemm.MMParams):
            raise TypeError(f"qgemm: m_params: expected an MMParams or None, got "
                            f"{type(m_params).__name__}")
        return nvfp4_qgemm(self, qx, qw, out_dtype, sx, sw, bias, out, accumulate, gemm_type,
                           qresult_x, qresult_w)
