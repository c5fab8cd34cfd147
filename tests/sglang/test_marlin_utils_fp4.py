"""CPU tests of the NVFP4 Marlin host helpers (patches 3, 4 and 10).

Every expectation is computed here, independently of the helper under test:
the kernel's scale/global-scale decode is re-implemented from its bit
operations (dequant.h ``dequant_fp8_scales``), the scale permutation from its
closed form, FP4 nibbles are unpacked by hand. Only what a CPU machine cannot
run is stubbed: the capability probe and the CUDA kernels (repack, GEMM,
workspace). Scales are non-uniform throughout: with uniform scales a wrong
layout would produce the same bytes.

Against the bare pin every test fails with ImportError (no marlin_utils_fp4,
no NVFP4 validation in fused_marlin_moe).
"""

from __future__ import annotations

import importlib
import types

import _sglang_cpu
import pytest
import torch
from _sglang_cpu import GLOBAL_BIAS
from _sglang_cpu import decode_16bit as _decode_16bit
from _sglang_cpu import effective_scales as _effective_scales
from _sglang_cpu import fp8_scales as _fp8_scales
from _sglang_cpu import kernel_scale_decode as _kernel_scale_decode
from _sglang_cpu import marlin_scale_layout as _marlin_scale_layout

FP16, BF16 = torch.float16, torch.bfloat16
BIAS = GLOBAL_BIAS


@pytest.fixture(scope="module")
def m():
    return importlib.import_module("sglang.srt.layers.quantization.marlin_utils_fp4")


# --------------------------------------------------------------------------
# Independent references
# --------------------------------------------------------------------------


def _swap_12(x: torch.Tensor) -> torch.Tensor:
    """Within every 4 consecutive columns exchange columns 1 and 2."""
    y = x.clone()
    y[..., 1::4], y[..., 2::4] = x[..., 2::4], x[..., 1::4]
    return y


def _unpack_gptq_int32(q: torch.Tensor, k: int) -> torch.Tensor:
    """int32 [K/8, N], 8 nibbles per int32 along K (low first) -> codes [N, K]."""
    shifts = torch.arange(8, dtype=torch.int64) * 4
    codes = (q.to(torch.int64).unsqueeze(1) >> shifts.view(1, 8, 1)) & 0xF
    return codes.reshape(k, -1).T


def _unpack_modelopt(w: torch.Tensor) -> torch.Tensor:
    """uint8 [N, K/2], element 2i in the low nibble -> codes [N, K]."""
    w = w.to(torch.int64)
    return torch.stack([w & 0xF, w >> 4], dim=-1).reshape(w.shape[0], -1)


# --------------------------------------------------------------------------
# Block scale processing
# --------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [FP16, BF16])
def test_process_scales_bytes_decode_to_fp8_values(m, dtype):
    # Codes 0x08..0x7E: every normal E4M3 value from 2^-6 up to 448.
    s = _fp8_scales((8, 128), 0x08, 0x7E, seed=1).float()
    out = m.nvfp4_marlin_process_scales(s)
    assert out.dtype == torch.float8_e4m3fn and out.shape == s.shape
    decoded = _kernel_scale_decode(out, dtype)
    # byte order: 0,2,1,3 within fours; value: the scale times 2^7
    expected = _swap_12(s.double()) * 2**7
    torch.testing.assert_close(decoded, expected, rtol=0, atol=0)
    assert not torch.equal(decoded, s.double() * 2**7)  # the reorder is real


def test_process_scales_fp16_keeps_small_scales(m):
    s = _fp8_scales((4, 64), 0x01, 0x30, seed=2).float()  # incl. subnormals
    decoded = _kernel_scale_decode(m.nvfp4_marlin_process_scales(s), FP16)
    torch.testing.assert_close(decoded, _swap_12(s.double()) * 2**7, rtol=0, atol=0)


def test_bf16_small_scales_need_rescale(m):
    s = _fp8_scales((4, 64), 0x01, 0x07, seed=3).float()  # all below 2^-6
    assert bool((s < 2**-6).all())
    ref = _swap_12(s.double()) * 2**7
    # the hazard: unscaled, bf16 reads them 2^-112 too small
    raw = _kernel_scale_decode(m.nvfp4_marlin_process_scales(s), BF16)
    torch.testing.assert_close(raw, ref * 2.0**-112, rtol=0, atol=0)
    # with the rescale factor the bytes decode to scale * factor exactly
    factor = m._nvfp4_rescale_factor(s, BF16)
    assert factor == 8.0  # 2^-9 (smallest E4M3) * 8 = 2^-6
    fixed = _kernel_scale_decode(m.nvfp4_marlin_process_scales(s, factor), BF16)
    torch.testing.assert_close(fixed, ref * factor, rtol=0, atol=0)


def test_rescale_factor_policy(m):
    mixed = torch.tensor([[2.0**-9, 0.0, 1.5, 6.0]])
    assert m._nvfp4_rescale_factor(mixed, FP16) == 1.0  # fp16 decodes all
    assert m._nvfp4_rescale_factor(mixed, BF16) == 8.0
    assert m._nvfp4_rescale_factor(torch.tensor([[0.5, 448.0]]), BF16) == 1.0
    assert m._nvfp4_rescale_factor(torch.zeros(1, 4), BF16) == 1.0
    # max 448 leaves no headroom: factor stays 1 (a warning names the loss)
    assert m._nvfp4_rescale_factor(torch.tensor([[2.0**-9, 448.0]]), BF16) == 1.0
    assert m._nvfp4_rescale_factor(torch.tensor([[2.0**-9, 100.0]]), BF16) == 4.0


def test_bf16_scales_beyond_the_range_are_named_in_a_warning(m, monkeypatch):
    """The NVFP4 recipe puts the largest scale at 448: bf16 then holds down to 2^-6."""
    said = []
    monkeypatch.setattr(m, "print_warning_once", said.append)
    recipe = torch.tensor([[448.0, 2.0**-6, 0.1, 3.0]])
    assert m._nvfp4_rescale_factor(recipe, BF16) == 1.0 and not said
    subnormal = torch.tensor([[448.0, 2.0**-9, 2.0**-7, 2.0**-6]])
    assert m._nvfp4_rescale_factor(subnormal, BF16) == 1.0
    assert len(said) == 1 and "2 block scales" in said[0] and "--dtype float16" in said[0]
    said.clear()
    assert m._nvfp4_rescale_factor(subnormal, FP16) == 1.0 and not said


@pytest.mark.parametrize(
    "values, match",
    [
        ([-1.0, 1.0, 2.0, 3.0], "must be finite and >= 0"),
        ([float("nan"), 1.0, 2.0, 3.0], "must be finite and >= 0"),
        ([600.0, 1.0, 2.0, 3.0], "exceeds"),
        ([1.1, 1.0, 2.0, 3.0], "FP8-E4M3 values"),
    ],
)
def test_process_scales_rejects_bad_values(m, values, match):
    with pytest.raises(ValueError, match=match):
        m.nvfp4_marlin_process_scales(torch.tensor([values]))


def test_process_scales_rejects_bad_width(m):
    with pytest.raises(ValueError, match="divisible by 4"):
        m.nvfp4_marlin_process_scales(torch.ones(2, 6))


# --------------------------------------------------------------------------
# Global scale processing
# --------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [FP16, BF16])
def test_global_scale_values(m, dtype):
    g = torch.tensor([1.0, 0.0123, 3.5e-4, 7.25, 2.0**-12])
    out = m.nvfp4_marlin_process_global_scale(g, dtype)
    assert out.dtype == dtype and out.shape == (5,)
    decoded = _decode_16bit(out.view(torch.int16), dtype)
    expected = g.double() * 2.0 ** (BIAS[dtype] - 7)
    rtol = 2.0**-11 if dtype == FP16 else 2.0**-8
    torch.testing.assert_close(decoded, expected, rtol=rtol, atol=0)
    # 1.0 -> 2^7 (fp16 0x5800) / 2^119 (bf16 0x7B00), exactly
    assert int(out.view(torch.int16)[0]) == (0x5800 if dtype == FP16 else 0x7B00)


def test_global_scale_scalar_and_default_dtype(m):
    out = m.nvfp4_marlin_process_global_scale(torch.tensor(0.5, dtype=BF16))
    assert out.shape == (1,) and out.dtype == BF16
    assert _decode_16bit(out.view(torch.int16), BF16).item() == 2.0**118


@pytest.mark.parametrize(
    "g, dtype, match",
    [
        (1000.0, FP16, "overflows float16"),
        (1e-12, FP16, "underflows float16"),
        (1.0, torch.float32, "float16 or bfloat16"),
    ],
)
def test_global_scale_errors(m, g, dtype, match):
    with pytest.raises(ValueError, match=match):
        m.nvfp4_marlin_process_global_scale(torch.tensor([g]), dtype)


# --------------------------------------------------------------------------
# Support check (only the capability probe is mocked)
# --------------------------------------------------------------------------

SUPPORTED = [(8, 0), (8, 6), (8, 9), (9, 0), (10, 0), (10, 3), (12, 0), (12, 1)]


@pytest.mark.parametrize("cap", SUPPORTED)
@pytest.mark.parametrize("dtype", [FP16, BF16, None])
def test_supported_from_sm80(m, monkeypatch, cap, dtype):
    monkeypatch.setattr(m, "get_device_capability", lambda device_id=0: cap)
    m.check_fp4_marlin_supported(dtype)  # no raise
    m.check_fp4_marlin_supported(dtype, capability=cap)
    # upstream's helper API has no is_fp4_marlin_supported
    assert not hasattr(m, "is_fp4_marlin_supported")


@pytest.mark.parametrize("sm", [80, 86, 89, 90, 100, 120])
def test_check_marlin_supported_fp4_like_upstream(sm):
    """Upstream's check_marlin_supported: FP4 with group 16 (NVFP4) or 32 (MXFP4) from SM80."""
    from sglang.srt.layers.quantization.marlin_utils import check_marlin_supported
    from sglang.srt.layers.quantization.utils import get_scalar_types

    _, types_ = get_scalar_types()
    fp4 = types_.float4_e2m1f
    assert check_marlin_supported(fp4, group_size=16, has_zp=False, device_capability=sm)
    assert check_marlin_supported(fp4, group_size=32, has_zp=False, device_capability=sm)
    assert not check_marlin_supported(fp4, group_size=128, has_zp=False, device_capability=sm)
    # the integer types keep their group sizes: 16 is FP4-only
    assert not check_marlin_supported(types_.uint4b8, group_size=16, device_capability=sm)
    assert check_marlin_supported(types_.uint4b8, group_size=128, device_capability=sm)
    # below SM80 Marlin reports nothing supported, as upstream does (the series'
    # Turing fp16 path is gated by check_fp4_marlin_supported, which knows the dtype)
    assert not check_marlin_supported(fp4, group_size=16, has_zp=False, device_capability=75)


@pytest.mark.parametrize("dtype", [FP16, BF16, None])
def test_sm75_refused_until_turing_path(m, monkeypatch, dtype):
    # Without the Turing kernel path (patch 9) SM75 must be refused whatever the dtype.
    monkeypatch.setattr(m, "_HAS_TURING_FP16_PATH", False)
    monkeypatch.setattr(m, "get_device_capability", lambda device_id=0: (7, 5))
    with pytest.raises(ValueError, match=r"Turing \(SM75\) Marlin kernel path is not"):
        m.check_fp4_marlin_supported(dtype)


@pytest.mark.parametrize("turing_path", [False, True])
@pytest.mark.parametrize("cap", [(7, 0), (6, 1)])
def test_below_sm75_refused(m, monkeypatch, cap, turing_path):
    monkeypatch.setattr(m, "_HAS_TURING_FP16_PATH", turing_path)
    monkeypatch.setattr(m, "get_device_capability", lambda device_id=0: cap)
    minimum = "7.5" if turing_path else "8.0"
    with pytest.raises(ValueError, match=f"capability {minimum} or newer"):
        m.check_fp4_marlin_supported(FP16)


def test_sm75_with_turing_path_needs_fp16(m, monkeypatch):
    monkeypatch.setattr(m, "_HAS_TURING_FP16_PATH", True)
    monkeypatch.setattr(m, "get_device_capability", lambda device_id=0: (7, 5))
    m.check_fp4_marlin_supported(FP16)  # no raise
    with pytest.raises(ValueError, match="--dtype float16"):
        m.check_fp4_marlin_supported(BF16)


def test_support_check_dtype_and_no_gpu(m, monkeypatch):
    monkeypatch.setattr(m, "get_device_capability", lambda device_id=0: (9, 0))
    with pytest.raises(ValueError, match="--dtype float16 or --dtype bfloat16"):
        m.check_fp4_marlin_supported(torch.float32)
    monkeypatch.setattr(m, "get_device_capability", lambda device_id=0: (None, None))
    with pytest.raises(ValueError, match="no CUDA device"):
        m.check_fp4_marlin_supported(BF16)


# --------------------------------------------------------------------------
# The linear op: bias after the GEMM, padding, fake impl
# --------------------------------------------------------------------------


class _GemmStub:
    """Stands in for the CUDA gptq_marlin_gemm: returns a known tensor."""

    def __init__(self, out: torch.Tensor):
        self.out, self.kwargs = out, None

    def __call__(self, **kwargs):
        self.kwargs = kwargs
        return self.out.clone()


@pytest.mark.parametrize(
    "size_n, padded_n, k, padded_k", [(128, 128, 256, 256), (96, 128, 256, 256), (96, 128, 80, 128)]
)
def test_apply_adds_unpermuted_bias_after_gemm(m, monkeypatch, size_n, padded_n, k, padded_k):
    dtype = BF16
    x = torch.randn(2, 3, k, dtype=dtype)
    known = (torch.arange(6 * padded_n, dtype=torch.float32) % 97).view(6, padded_n)
    stub = _GemmStub(known.to(dtype))
    monkeypatch.setattr(m, "gptq_marlin_gemm", stub, raising=False)
    weight = torch.zeros(padded_k // 16, 2 * padded_n, dtype=torch.int32)
    scales = torch.zeros(padded_k // 16, padded_n, dtype=torch.float8_e4m3fn)
    gscale = torch.ones(1, dtype=dtype)
    bias = torch.linspace(-3, 5, size_n).to(dtype)

    out = m._apply_fp4_marlin_linear(
        x, weight, scales, gscale, torch.zeros(4, dtype=torch.int32), size_n, k, bias
    )

    expected = (known[:, :size_n] + bias.float()).to(dtype).view(2, 3, size_n)
    assert out.shape == (2, 3, size_n) and out.dtype == dtype
    torch.testing.assert_close(out, expected, rtol=0, atol=0)
    kw = stub.kwargs
    assert kw["a"].shape == (6, padded_k) and kw["size_m"] == 6
    assert torch.equal(kw["a"][:, :k], x.view(6, k)) and not kw["a"][:, k:].any()
    assert kw["size_n"] == padded_n and kw["size_k"] == padded_k
    assert kw["global_scale"] is gscale and kw["b_zeros"] is None
    assert kw["is_k_full"] is True
    if _sglang_cpu.real_scalar_types_loaded():
        assert kw["b_q_type"].id == _sglang_cpu.FLOAT4_E2M1F_ID
    # Adding a Marlin-permuted bias instead would be wrong:
    from sglang.srt.layers.quantization.marlin_utils import marlin_permute_bias

    if size_n % 64 == 0:
        wrong = (known[:, :size_n] + marlin_permute_bias(bias).float()).to(dtype)
        assert not torch.equal(out.view(6, size_n), wrong)


def test_apply_input_errors(m, monkeypatch):
    monkeypatch.setattr(m, "gptq_marlin_gemm", _GemmStub(torch.zeros(1)), raising=False)
    w = torch.zeros(8, 256, dtype=torch.int32)
    s = torch.zeros(8, 128, dtype=torch.float8_e4m3fn)
    ws = torch.zeros(1, dtype=torch.int32)
    with pytest.raises(ValueError, match="expects size_k=128"):
        m._apply_fp4_marlin_linear(
            torch.zeros(2, 64, dtype=FP16), w, s, torch.ones(1, dtype=FP16), ws, 128, 128
        )
    with pytest.raises(ValueError, match="differs from the prepared global scale"):
        m._apply_fp4_marlin_linear(
            torch.zeros(2, 128, dtype=FP16), w, s, torch.ones(1, dtype=BF16), ws, 128, 128
        )


@pytest.mark.parametrize("dtype", [FP16, BF16])
def test_custom_op_fake_impl(m, dtype):
    op = torch.ops.sglang.apply_fp4_marlin_linear
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        x = torch.empty(5, 7, 256, dtype=dtype)
        w = torch.empty(16, 2 * 192, dtype=torch.int32)
        s = torch.empty(16, 192, dtype=torch.float8_e4m3fn)
        g = torch.empty(1, dtype=dtype)
        ws = torch.empty(132, dtype=torch.int32)
        out = op(x, w, s, g, ws, 160, 256, None)
        out_b = op(x, w, s, g, ws, 160, 256, torch.empty(160, dtype=dtype))
    for o in (out, out_b):
        assert o.shape == (5, 7, 160) and o.dtype == dtype
    schema = str(op.default._schema)
    assert "Tensor? bias=None" in schema and "SymInt size_n" in schema


# --------------------------------------------------------------------------
# Layer preparation (CUDA kernels stubbed, everything else real)
# --------------------------------------------------------------------------


def _stub_kernels(m, monkeypatch, cap=(9, 0)):
    calls = []

    def repack(b_q_weight, perm, size_k, size_n, num_bits):
        calls.append((b_q_weight.clone(), perm, size_k, size_n, num_bits))
        return torch.full((size_k // 16, size_n * 2), len(calls), dtype=torch.int32)

    monkeypatch.setattr(m, "gptq_marlin_repack", repack, raising=False)
    monkeypatch.setattr(
        m, "marlin_make_workspace", lambda device, max_blocks_per_sm=1: torch.zeros(7)
    )
    monkeypatch.setattr(m, "get_device_capability", lambda device_id=0: cap)
    return calls


def _linear(n, k, dtype, seed, scale_lo=0x01, scale_hi=0x7E, bias=True):
    g = torch.Generator().manual_seed(seed)
    layer = torch.nn.Module()
    layer.output_size_per_partition, layer.input_size_per_partition = n, k
    layer.params_dtype = dtype
    w = torch.randint(0, 256, (n, k // 2), generator=g, dtype=torch.int32)
    layer.weight = torch.nn.Parameter(w.to(torch.uint8), requires_grad=False)
    scales = _fp8_scales((n, k // 16), scale_lo, scale_hi, seed)
    layer.weight_scale = torch.nn.Parameter(scales, requires_grad=False)
    layer.bias = torch.nn.Parameter(torch.randn(n, generator=g).to(dtype)) if bias else None
    return layer


@pytest.mark.parametrize("dtype", [FP16, BF16])
@pytest.mark.parametrize(
    "n, k, padded_n, padded_k",
    [
        (128, 256, 128, 256),
        (96, 256, 128, 256),  # N padded to 64 ...
        (64, 192, 128, 192),  # ... or to 128 when K % 128 != 0
        (128, 80, 128, 128),  # K padded
        (1000, 2080, 1024, 2112),  # both
    ],
)
def test_prepare_linear(m, monkeypatch, dtype, n, k, padded_n, padded_k):
    calls = _stub_kernels(m, monkeypatch)
    layer = _linear(n, k, dtype, seed=n + k, scale_hi=0x5F)  # incl. < 2^-6
    w0, s0, b0 = layer.weight.clone(), layer.weight_scale.clone(), layer.bias.clone()
    g = torch.tensor(0.0123)
    layer.weight_global_scale = torch.nn.Parameter(g.clone(), requires_grad=False)

    m.prepare_nvfp4_layer_for_marlin(layer)

    # weight: repacked once from GPTQ-packed int32 [padded K/8, padded N]
    ((qweight, perm, size_k, size_n, bits),) = calls
    assert (size_k, size_n, bits, perm.numel()) == (padded_k, padded_n, 4, 0)
    codes = _unpack_gptq_int32(qweight, padded_k)
    assert torch.equal(codes[:n, :k], _unpack_modelopt(w0))
    assert not codes[n:].any() and not codes[:, k:].any()
    assert layer.weight.shape == (padded_k // 16, 2 * padded_n)
    # scales * global: what the kernel applies == S * g in the Marlin order
    assert layer.weight_scale.dtype == torch.float8_e4m3fn
    assert layer.weight_scale.shape == (padded_k // 16, padded_n)
    assert layer.weight_global_scale.shape == (1,)
    assert layer.weight_global_scale.dtype == dtype
    s_pad = torch.zeros(padded_n, padded_k // 16, dtype=torch.float64)
    s_pad[:n, : k // 16] = s0.double()
    expected = _marlin_scale_layout(s_pad) * g.to(dtype).double()
    got = _effective_scales(layer.weight_scale, layer.weight_global_scale, dtype)
    rtol = 2.0**-11 if dtype == FP16 else 2.0**-8  # global scale rounding
    torch.testing.assert_close(got, expected, rtol=rtol, atol=0)
    # bias untouched (original order, added after the GEMM)
    assert torch.equal(layer.bias, b0)
    assert layer.workspace.shape == (7,)
    assert getattr(layer, "weight_output_scale", None) is None  # one global scale


@pytest.mark.parametrize(
    "n, k, kwargs, match",
    [
        (128, 200, {}, "not a multiple of the NVFP4 group 16"),
        (128, 256, {"wshape": (128, 64)}, r"packed FP4 weight uint8 \[..., 128, 128\]"),
        (128, 256, {"sdtype": BF16}, "block scales float8_e4m3fn"),
        # fused shards with different scales and no shard sizes: never served
        (128, 256, {"g": torch.tensor([1.0, 2.0, 1.0])}, r"global scales \[1, 2, 1\]"),
        (128, 256, {"group_size": 32}, "requires group_size=16, got 32"),
        (128, 256, {"dtype": torch.float32}, "--dtype float16 or --dtype bfloat16"),
        (128, 256, {"cap": (7, 5)}, "Turing"),
    ],
)
def test_prepare_linear_errors(m, monkeypatch, n, k, kwargs, match):
    calls = _stub_kernels(m, monkeypatch, kwargs.get("cap", (9, 0)))
    layer = _linear(n, k, kwargs.get("dtype", BF16), seed=0)
    if "wshape" in kwargs:
        layer.weight = torch.nn.Parameter(
            torch.zeros(kwargs["wshape"], dtype=torch.uint8), requires_grad=False
        )
    if "sdtype" in kwargs:
        layer.weight_scale = torch.nn.Parameter(layer.weight_scale.to(kwargs["sdtype"]))
    if "group_size" in kwargs:
        layer.quant_config = types.SimpleNamespace(group_size=kwargs["group_size"])
    layer.weight_global_scale = kwargs.get("g", torch.tensor(1.0))
    with pytest.raises(ValueError, match=match):
        m.prepare_nvfp4_layer_for_marlin(layer)
    assert not calls  # nothing was repacked


def _moe(e, hidden, inter, dtype, seed):
    layer = torch.nn.Module()
    layer.params_dtype = dtype
    gen = torch.Generator().manual_seed(seed)
    w13 = torch.randint(0, 256, (e, 2 * inter, hidden // 2), generator=gen, dtype=torch.int32)
    w2 = torch.randint(0, 256, (e, hidden, inter // 2), generator=gen, dtype=torch.int32)
    layer.w13_weight = torch.nn.Parameter(w13.to(torch.uint8), requires_grad=False)
    layer.w2_weight = torch.nn.Parameter(w2.to(torch.uint8), requires_grad=False)
    # expert 0: tiny scales (needs a bf16 rescale); others: 2^-6 .. 448
    s13 = [_fp8_scales((2 * inter, hidden // 16), 0x01, 0x10, seed)]
    s13 += [_fp8_scales((2 * inter, hidden // 16), 0x08, 0x7E, seed + i) for i in range(1, e)]
    s2 = [_fp8_scales((hidden, inter // 16), 0x08, 0x6F, seed + 10 + i) for i in range(e)]
    layer.w13_weight_scale = torch.nn.Parameter(torch.stack(s13), requires_grad=False)
    layer.w2_weight_scale = torch.nn.Parameter(torch.stack(s2), requires_grad=False)
    return layer


@pytest.mark.parametrize("dtype", [FP16, BF16])
def test_prepare_moe(m, monkeypatch, dtype):
    e, hidden, inter = 3, 128, 64
    calls = _stub_kernels(m, monkeypatch)
    layer = _moe(e, hidden, inter, dtype, seed=5)
    w13_0, w2_0 = layer.w13_weight.clone(), layer.w2_weight.clone()
    s13_0, s2_0 = layer.w13_weight_scale.clone(), layer.w2_weight_scale.clone()
    g13 = torch.tensor([0.5, 0.0123, 2.0**-10])
    g2 = torch.tensor([1.0, 3.0e-3, 0.25])
    # w13 as ModelOpt loads it ([E, 2]: w1, w3; equal here), w2 as [E]
    layer.w13_weight_scale_2 = torch.nn.Parameter(g13[:, None].repeat(1, 2))
    layer.w2_weight_scale_2 = torch.nn.Parameter(g2.clone())

    m.prepare_moe_nvfp4_layer_for_marlin(layer)

    assert len(calls) == 2 * e
    for i in range(e):
        assert torch.equal(_unpack_gptq_int32(calls[i][0], hidden), _unpack_modelopt(w13_0[i]))
        assert torch.equal(_unpack_gptq_int32(calls[e + i][0], inter), _unpack_modelopt(w2_0[i]))
    assert [c[2:] for c in calls] == [(hidden, 2 * inter, 4)] * e + [(inter, hidden, 4)] * e
    assert layer.w13_weight.shape == (e, hidden // 16, 4 * inter)
    assert layer.w2_weight.shape == (e, inter // 16, 2 * hidden)
    rtol = 2.0**-11 if dtype == FP16 else 2.0**-8
    for name, s0, g in (("w13", s13_0, g13), ("w2", s2_0, g2)):
        scales = getattr(layer, f"{name}_weight_scale")
        gs = getattr(layer, f"{name}_weight_scale_2")
        assert scales.dtype == torch.float8_e4m3fn and scales.shape == (
            e,
            s0.shape[2],
            s0.shape[1],
        )
        assert gs.shape == (e,) and gs.dtype == dtype
        block = _kernel_scale_decode(scales, dtype)
        glob = _decode_16bit(gs.view(torch.int16), dtype)
        for i in range(e):
            got = block[i] * glob[i] * 2.0 ** -BIAS[dtype]
            expected = _marlin_scale_layout(s0[i].double()) * g[i].to(dtype).double()
            torch.testing.assert_close(got, expected, rtol=rtol, atol=0)
    assert layer.workspace.shape == (7,)
    # bf16: expert 0 of w13 was rescaled (per expert), the others were not
    if dtype == BF16:
        glob13 = _decode_16bit(layer.w13_weight_scale_2.view(torch.int16), BF16)
        assert glob13[0].item() == pytest.approx(0.5 * 2.0**119 / 8, rel=2.0**-8)
        assert glob13[1].item() == pytest.approx(0.0123 * 2.0**119, rel=2.0**-8)


@pytest.mark.parametrize(
    "hidden, inter, g13, match",
    [
        (96, 64, torch.ones(2), r"w13 with N=128, K=96"),  # the hidden size is not padded
        (128, 64, torch.ones(3), r"w13_weight_scale_2 needs one value per expert \(2\)"),
        # w3's scale is 0: never served, whatever the kernel can fold
        (
            128,
            64,
            torch.tensor([[1.0, 1.0], [0.5, 0.0]]),
            r"expert 1 \(w1 global scale 0\.5, w3 global scale 0\)",
        ),
        (128, 64, "non-gated", "non-gated experts are not supported"),
    ],
)
def test_prepare_moe_errors(m, monkeypatch, hidden, inter, g13, match):
    calls = _stub_kernels(m, monkeypatch)
    layer = _moe(2, hidden, inter, BF16, seed=1)
    if isinstance(g13, str):
        layer.moe_runner_config = types.SimpleNamespace(is_gated=False)
        g13 = torch.ones(2)
    layer.w13_weight_scale_2 = torch.nn.Parameter(g13)
    layer.w2_weight_scale_2 = torch.nn.Parameter(torch.ones(2))
    with pytest.raises(ValueError, match=match):
        m.prepare_moe_nvfp4_layer_for_marlin(layer)
    assert not calls


@pytest.mark.parametrize("dtype", [FP16, BF16])
def test_prepare_moe_pads_the_intermediate_size(m, monkeypatch, dtype):
    """An intermediate size that misses Marlin's tiles (tensor parallelism: 768 / 8 = 96)
    is zero-padded per w1/w3 half and along w2's K; the kernel sizes follow."""
    e, hidden, inter, padded = 2, 128, 48, 64
    calls = _stub_kernels(m, monkeypatch)
    layer = _moe(e, hidden, inter, dtype, seed=8)
    layer.w13_weight_scale_2 = torch.nn.Parameter(torch.tensor([[0.5, 0.5], [0.25, 0.25]]))
    layer.w2_weight_scale_2 = torch.nn.Parameter(torch.tensor([1.0, 0.125]))
    w13_0, w2_0 = layer.w13_weight.clone(), layer.w2_weight.clone()
    s13_0, s2_0 = layer.w13_weight_scale.clone(), layer.w2_weight_scale.clone()

    m.prepare_moe_nvfp4_layer_for_marlin(layer)

    assert [c[2:] for c in calls] == [(hidden, 2 * padded, 4)] * e + [(padded, hidden, 4)] * e
    zeros13 = torch.zeros(padded - inter, hidden, dtype=torch.int64)
    zeros2 = torch.zeros(hidden, padded - inter, dtype=torch.int64)
    for i in range(e):
        w13 = _unpack_gptq_int32(calls[i][0], hidden)  # codes [2 * padded, hidden]
        gate, up = _unpack_modelopt(w13_0[i][:inter]), _unpack_modelopt(w13_0[i][inter:])
        assert torch.equal(w13, torch.cat([gate, zeros13, up, zeros13]))
        w2 = _unpack_gptq_int32(calls[e + i][0], padded)  # codes [hidden, padded]
        assert torch.equal(w2, torch.cat([_unpack_modelopt(w2_0[i]), zeros2], dim=1))
    # block scales: the padded rows / columns decode to 0, the others are kept
    block13 = _kernel_scale_decode(layer.w13_weight_scale, dtype)  # [E, K/16, 2 * padded]
    block2 = _kernel_scale_decode(layer.w2_weight_scale, dtype)  # [E, padded/16, hidden]
    for i in range(e):
        pad = torch.zeros(padded - inter, hidden // 16)
        s13 = torch.cat([s13_0[i][:inter].float(), pad, s13_0[i][inter:].float(), pad])
        assert torch.equal(block13[i] != 0, _marlin_scale_layout(s13) != 0)
        s2 = torch.cat([s2_0[i].float(), torch.zeros(hidden, (padded - inter) // 16)], dim=1)
        assert torch.equal(block2[i] != 0, _marlin_scale_layout(s2) != 0)


@pytest.mark.parametrize(
    "hidden, inter, padded",
    [
        (2048, 96, 128),  # Qwen3-30B-A3B at --tp 8 (768 / 8)
        (4096, 192, 192),  # Qwen3-235B-A22B at --tp 8 (1536 / 8): no padding
        (4096, 96, 128),  # Qwen3-235B-A22B at --tp 16
        (4096, 1792, 1792),  # Mixtral-8x7B at --tp 8 (14336 / 8): no padding
        (2048, 768, 768),  # Qwen3-30B-A3B at --tp 1
    ],
)
def test_moe_padded_intermediate_real_models(m, hidden, inter, padded):
    assert m._moe_padded_intermediate(hidden, inter) == padded


@pytest.mark.parametrize("names", [("w13_bias",), ("w2_bias",), ("w13_bias", "w2_bias")])
def test_prepare_moe_refuses_expert_biases(m, monkeypatch, names):
    """fused_marlin_moe has no bias input: biased experts are refused, never dropped."""
    calls = _stub_kernels(m, monkeypatch)
    layer = _moe(2, 128, 64, BF16, seed=4)
    layer.w13_weight_scale_2 = torch.nn.Parameter(torch.ones(2))
    layer.w2_weight_scale_2 = torch.nn.Parameter(torch.ones(2))
    for name in names:
        setattr(layer, name, torch.nn.Parameter(torch.randn(2, 128)))
    with pytest.raises(ValueError, match=r"expert biases \(" + ", ".join(names) + r"\)"):
        m.prepare_moe_nvfp4_layer_for_marlin(layer)
    assert not calls
    layer.w13_bias = None  # an unset optional bias is no bias
    layer.w2_bias = None
    m.prepare_moe_nvfp4_layer_for_marlin(layer)


# --------------------------------------------------------------------------
# Fused shards with different global scales (patch 10)
# --------------------------------------------------------------------------

SHARDS = (128, 64, 64)  # a QKV-like fused layer: q, k, v


def _shard_scales(ratio: float) -> torch.Tensor:
    """q = g, k = ratio * g, v = g / 2 (ModelOpt multipliers)."""
    g = 0.0123
    return torch.tensor([g, ratio * g, g / 2])


@pytest.mark.parametrize("dtype", [FP16, BF16])
@pytest.mark.parametrize("ratio", [2.0, 0.5, 1e-3])
def test_fused_shards_dense(m, monkeypatch, dtype, ratio):
    _stub_kernels(m, monkeypatch)
    n, k = sum(SHARDS), 256
    layer = _linear(n, k, dtype, seed=11, scale_lo=0x30, scale_hi=0x5F)
    layer.output_partition_sizes = list(SHARDS)
    g = _shard_scales(ratio)
    layer.weight_global_scale = torch.nn.Parameter(g.clone(), requires_grad=False)
    s0 = layer.weight_scale.clone()
    per_row = torch.cat([torch.full((n,), v) for n, v in zip(SHARDS, g.tolist(), strict=True)])

    m.prepare_nvfp4_layer_for_marlin(layer)

    rtol = 2.0**-11 if dtype == FP16 else 2.0**-8
    if dtype == FP16:  # (bf16 may fold its small-scale rescale into it)
        # the kernel applies the largest shard scale ...
        kernel_g = _decode_16bit(layer.weight_global_scale.view(torch.int16), dtype)
        assert kernel_g.item() * 2.0 ** (7 - BIAS[dtype]) == pytest.approx(g.max().item(), rel=rtol)
    # ... and block scale * global * column scale is each shard's own S * g
    col = layer.weight_output_scale
    if dtype == FP16:  # powers of two are folded whole, the rest leaves [1, 2)
        assert (col is None) == (ratio in (2.0, 0.5))
        col = torch.ones(n) if col is None else col
        assert bool(((col >= 1) & (col < 2)).all())
    else:  # bf16: the column scale is the ratio to the largest shard scale
        torch.testing.assert_close(col, per_row / g.max(), rtol=1e-6, atol=0)
    assert col.dtype == torch.float32
    got = _effective_scales(layer.weight_scale, layer.weight_global_scale, dtype)
    got = got * col.double()[None, :]
    expected = _marlin_scale_layout(s0.double()) * per_row.double()[None, :]
    torch.testing.assert_close(got, expected, rtol=rtol, atol=0)


def test_apply_scales_output_columns_before_bias(m, monkeypatch):
    known = (torch.arange(3 * 128, dtype=torch.float32) % 13 - 6).view(3, 128).to(BF16)
    monkeypatch.setattr(m, "gptq_marlin_gemm", _GemmStub(known), raising=False)
    w = torch.zeros(8, 256, dtype=torch.int32)
    s = torch.zeros(8, 128, dtype=torch.float8_e4m3fn)
    col = torch.linspace(1.0, 1.99, 128)
    bias = torch.linspace(-1, 1, 128).to(BF16)
    args = (torch.zeros(3, 128, dtype=BF16), w, s, torch.ones(1, dtype=BF16))
    out = m._apply_fp4_marlin_linear(
        *args, torch.zeros(1, dtype=torch.int32), 128, 128, bias, output_scale=col
    )
    expected = (known.float() * col + bias.float()).to(BF16)
    torch.testing.assert_close(out, expected, rtol=0, atol=0)


@pytest.mark.parametrize(
    "g, sizes, match",
    [
        (torch.tensor([1.0, 1e-4, 1.0]), SHARDS, r"ratio below 2\^-12"),  # fp16 only
        (torch.tensor([1.0, 2.0]), SHARDS, r"one global scale per fused shard"),
        (torch.tensor([1.0, 0.0, 1.0]), SHARDS, r"must be > 0"),
    ],
)
def test_fused_shards_dense_refused(m, monkeypatch, g, sizes, match):
    calls = _stub_kernels(m, monkeypatch)
    layer = _linear(sum(SHARDS), 256, FP16, seed=3)
    layer.output_partition_sizes = list(sizes)
    layer.weight_global_scale = g
    with pytest.raises(ValueError, match=match) as err:
        m.prepare_nvfp4_layer_for_marlin(layer)
    assert "global scales [" in str(err.value)  # names the scales
    assert not calls


# w3's global scale over w1's, per expert: powers of two either way, a
# non-power of two either way, 1e-3 (fp16: 2^-10 folded, residual 1.024) and 1.
MOE_W3_OVER_W1 = (2.0, 0.25, 3.0, 1.0 / 3.0, 1e-3, 1.0)


@pytest.mark.parametrize("dtype", [FP16, BF16])
def test_fused_shards_moe(m, monkeypatch, dtype):
    ratios = torch.tensor(MOE_W3_OVER_W1, dtype=torch.float64)
    e, hidden, inter = len(MOE_W3_OVER_W1), 128, 64
    _stub_kernels(m, monkeypatch)
    layer = _moe(e, hidden, inter, dtype, seed=9)
    # scales that leave bf16 room (see the flush warning test above)
    layer.w13_weight_scale.data = _fp8_scales((e, 2 * inter, hidden // 16), 0x30, 0x5F, 9)
    s13_0 = layer.w13_weight_scale.clone()
    g1 = 0.01 * (1.0 + torch.arange(e, dtype=torch.float64) / e)
    g13 = torch.stack([g1, g1 * ratios], dim=1).float()  # multipliers [E, 2]
    layer.w13_weight_scale_2 = torch.nn.Parameter(g13.clone())
    layer.w2_weight_scale_2 = torch.nn.Parameter(torch.full((e,), 0.25))

    m.prepare_moe_nvfp4_layer_for_marlin(layer)

    rtol = 2.0**-11 if dtype == FP16 else 2.0**-8
    # the kernel applies w1's own scale to the whole of w13 ...
    glob = _decode_16bit(layer.w13_weight_scale_2.view(torch.int16), dtype)
    torch.testing.assert_close(
        glob * 2.0 ** (7 - BIAS[dtype]), g1.to(dtype).double(), rtol=rtol, atol=0
    )
    # ... and w3's half carries the rest: folded powers of two (fp16, r < 1)
    # times the per-expert factor that fused_marlin_moe applies
    w3 = layer.w3_output_scale
    assert w3.dtype == torch.float32 and w3.shape == (e,)
    if dtype == FP16:
        small = ratios < 1
        assert bool(((w3[small] >= 1) & (w3[small] < 2)).all())
        torch.testing.assert_close(w3[~small].double(), ratios[~small], rtol=1e-6, atol=0)
    else:  # bf16 keeps its block scales; the factor is the ratio itself
        torch.testing.assert_close(w3.double(), ratios, rtol=1e-6, atol=0)
    block = _kernel_scale_decode(layer.w13_weight_scale, dtype)
    for i in range(e):
        half = torch.cat([torch.ones(inter), torch.full((inter,), w3[i].item())]).double()
        got = block[i] * glob[i] * 2.0 ** -BIAS[dtype] * half[None, :]
        per_row = torch.cat([torch.full((inter,), v) for v in g13[i].tolist()]).double()
        expected = _marlin_scale_layout(s13_0[i].double() * per_row[:, None])
        torch.testing.assert_close(got, expected, rtol=rtol, atol=0)


@pytest.mark.parametrize("dtype", [FP16, BF16])
def test_fused_shards_moe_no_factor_when_halves_agree(m, monkeypatch, dtype):
    _stub_kernels(m, monkeypatch)
    layer = _moe(2, 128, 64, dtype, seed=4)
    layer.w13_weight_scale_2 = torch.nn.Parameter(torch.tensor([[0.5, 0.5], [0.02, 0.02]]))
    layer.w2_weight_scale_2 = torch.nn.Parameter(torch.ones(2))
    m.prepare_moe_nvfp4_layer_for_marlin(layer)
    assert layer.w3_output_scale is None


def test_fused_shards_moe_fp16_ratio_beyond_the_scale_format_refused(m, monkeypatch):
    calls = _stub_kernels(m, monkeypatch)
    layer = _moe(2, 128, 64, FP16, seed=6)
    layer.w13_weight_scale_2 = torch.nn.Parameter(torch.tensor([[0.5, 0.5], [0.5, 5e-6]]))
    layer.w2_weight_scale_2 = torch.nn.Parameter(torch.ones(2))
    with pytest.raises(
        ValueError, match=r"expert 1 \(w1 global scale 0\.5, w3 global scale 5e-06\).*2\^-12"
    ):
        m.prepare_moe_nvfp4_layer_for_marlin(layer)
    assert not calls
    # bf16 needs no fold: the same scales are served
    layer = _moe(2, 128, 64, BF16, seed=6)
    layer.w13_weight_scale_2 = torch.nn.Parameter(torch.tensor([[0.5, 0.5], [0.5, 5e-6]]))
    layer.w2_weight_scale_2 = torch.nn.Parameter(torch.ones(2))
    m.prepare_moe_nvfp4_layer_for_marlin(layer)
    assert layer.w3_output_scale[1].item() == pytest.approx(1e-5, rel=1e-6)


def test_fused_marlin_moe_router_weights_carry_the_w3_factor():
    """w3_output_scale reaches the w2 GEMM as router weights x factor[expert].

    (fused_marlin_moe itself needs the CUDA kernels: the GPU test of fused
    shards serves such layers against an fp32 reference.)
    """
    mod = importlib.import_module("sglang.srt.layers.moe.fused_moe_triton.fused_marlin_moe")
    gen = torch.Generator().manual_seed(2)
    weights = torch.rand(5, 2, generator=gen)
    ids = torch.randint(0, 4, (5, 2), generator=gen)
    ids[3, 1] = -1  # an expert of another rank (expert parallelism)
    factor = torch.tensor([1.0, 3.0, 0.001, 1.5])
    got = mod._router_weights_with_w3_scale(weights, ids, factor)
    expected = weights * factor[ids.clamp(min=0)]
    torch.testing.assert_close(got, expected, rtol=0, atol=0)
    assert got[0, 0] == weights[0, 0] * factor[ids[0, 0]]


# --------------------------------------------------------------------------
# Patch 3: fused_marlin_moe global-scale validation
# --------------------------------------------------------------------------


def test_fused_marlin_moe_global_scale_validation():
    mod = importlib.import_module("sglang.srt.layers.moe.fused_moe_triton.fused_marlin_moe")
    check = mod._check_nvfp4_global_scales
    x = torch.zeros(4, 128, dtype=BF16)
    fp8 = torch.zeros(3, 8, 128, dtype=torch.float8_e4m3fn)
    g = torch.ones(3, dtype=BF16)

    def call(**kw):
        args = dict(
            hidden_states=x,
            num_experts=3,
            num_bits=4,
            w1_scale=fp8,
            w2_scale=fp8,
            w1_zeros=None,
            w2_zeros=None,
            w1_global_scale=g,
            w2_global_scale=g,
        )
        args.update(kw)
        return check(**args)

    assert call() is True
    assert call(w1_global_scale=None, w2_global_scale=None, w1_scale=x) is False
    cases = [
        (dict(w2_global_scale=None), "needs both w1_global_scale and w2_global_scale"),
        (dict(num_bits=8), "num_bits=4, no zero points.*num_bits=8"),
        (dict(w1_zeros=torch.zeros(1)), "zero points given: True"),
        (dict(w2_scale=torch.zeros(3, 8, 128, dtype=BF16)), "w2_scale must be the float8"),
        (dict(w1_global_scale=g.float()), "w1_global_scale must have the activation dtype"),
        (dict(w2_global_scale=torch.ones(2, dtype=BF16)), r"shape \(3,\).*got \(2,\)"),
        (dict(w1_global_scale=torch.ones(3, 1, dtype=BF16)), r"got \(3, 1\)"),
        (dict(w2_global_scale=torch.ones(6, dtype=BF16)[::2]), "must be contiguous"),
    ]
    for kw, match in cases:
        with pytest.raises(ValueError, match=match):
            call(**kw)
    # the NVFP4 weight type is chosen only when global scales are present
    if _sglang_cpu.real_scalar_types_loaded():
        # upstream's signature: get_scalar_type(num_bits, has_zp, scales, global_scale)
        nvfp4 = mod.get_scalar_type(4, False, fp8, g)
        assert nvfp4.id == _sglang_cpu.FLOAT4_E2M1F_ID
        assert mod.get_scalar_type(4, False).id != _sglang_cpu.FLOAT4_E2M1F_ID
        assert mod.get_scalar_type(4, False, fp8, None).id != _sglang_cpu.FLOAT4_E2M1F_ID
        assert mod.get_scalar_type(4, True, fp8, g).id != _sglang_cpu.FLOAT4_E2M1F_ID
