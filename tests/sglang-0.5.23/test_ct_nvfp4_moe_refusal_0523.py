"""Compressed-tensors NVFP4 MoE refuses a GPU that FP4 Marlin cannot serve, on SGLang 0.5.23.

The weight-only NVFP4 MoE scheme (CompressedTensorsW4A16Nvfp4MoE) is picked below SM100 for
every MoE runner request, and the model loader checks only the checkpoint config's minimum
capability, not the MoE scheme's: on SM70 and SM75 it was created and loaded with no error
although the Marlin kernels have no body there. These tests drive 0.5.23's real code on a
mocked CUDA GPU (conftest ``cuda_device``): the checkpoint config parsed by
``get_quant_config``, the loader's capability check, ``get_quant_method`` and
``create_weights`` with the activation dtype, and ``check_fp4_marlin_supported`` itself.

SM75 is served later in fp16 once the kernels have a Turing path
(``marlin_utils_fp4._HAS_TURING_FP16_PATH``, absent or False until then); the expectations
follow that flag so the tests hold on every later tree.
"""

from __future__ import annotations

import importlib

import pytest
import torch
from _sglang_cpu import (
    ALL_CHECKPOINTS,
    create_moe_weights,
    loader_capability_check,
    moe_layer,
    quant_config,
)

MARLIN_FP4 = "sglang.srt.layers.quantization.marlin_utils_fp4"
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}


def _turing() -> bool:
    return bool(getattr(importlib.import_module(MARLIN_FP4), "_HAS_TURING_FP16_PATH", False))


def _refusal(cap: tuple[int, int], dtype: torch.dtype) -> str | None:
    """A substring of the expected refusal, or None where FP4 Marlin runs."""
    if cap >= (8, 0):
        return None
    if cap == (7, 5) and _turing():
        return "--dtype float16" if dtype == torch.bfloat16 else None
    return f"needs compute capability {'7.5' if _turing() else '8.0'} or newer"


@pytest.mark.parametrize("moe_backend", ["auto", "marlin", "flashinfer_cutlass"])
@pytest.mark.parametrize("dtype_name", list(DTYPES))
@pytest.mark.parametrize(
    "cuda_device", [(7, 0), (7, 5), (8, 0), (9, 0)], ids=lambda c: f"sm{c[0]}{c[1]}", indirect=True
)
def test_ct_nvfp4_moe_refuses_what_marlin_cannot_serve(
    cuda_device, published, dtype_name, moe_backend
):
    """Below SM80 the scheme is refused at weight creation, before any weight is read."""
    ckpt = ALL_CHECKPOINTS["ct-moe"]
    dtype = DTYPES[dtype_name]
    with published(moe_runner_backend=moe_backend):
        config = quant_config(ckpt)
        loader_capability_check(config, ckpt.quantization)  # passes: the config allows SM70
        layer = moe_layer(dtype)
        method = config.get_quant_method(layer, prefix=ckpt.prefix)
        layer.quant_method = method
        assert type(layer.scheme).__name__ == "CompressedTensorsW4A16Nvfp4MoE"
        expected = _refusal(cuda_device.capability, dtype)
        if expected is None:
            create_moe_weights(layer, method, dtype)
            assert layer.w13_weight_packed.dtype == torch.uint8
        else:
            with pytest.raises(ValueError, match=expected.replace(".", r"\.")) as info:
                create_moe_weights(layer, method, dtype)
            assert "NVFP4 Marlin" in str(info.value)
            assert not hasattr(layer, "w13_weight_packed"), "weights were created first"


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize(
    "cap",
    [(6, 1), (7, 0), (7, 5), (8, 0), (8, 9), (9, 0), (10, 0), (12, 1)],
    ids=lambda c: f"sm{c[0]}{c[1]}",
)
def test_check_fp4_marlin_supported_by_capability(monkeypatch, cap, dtype):
    """The support check's answer and message, the capability given as a tuple, an int
    (75) or probed from the current GPU."""
    m = importlib.import_module(MARLIN_FP4)
    monkeypatch.setattr(m, "get_device_capability", lambda device_id=0: cap)
    expected = _refusal(cap, dtype)
    for given in (cap, cap[0] * 10 + cap[1], None):
        if expected is None:
            m.check_fp4_marlin_supported(dtype, given)
        else:
            with pytest.raises(ValueError, match=expected.replace(".", r"\.")) as info:
                m.check_fp4_marlin_supported(dtype, given)
            if cap != (7, 5):
                assert f"this GPU is {cap[0]}.{cap[1]}" in str(info.value)


def test_check_fp4_marlin_supported_dtype_and_no_gpu(monkeypatch):
    m = importlib.import_module(MARLIN_FP4)
    with pytest.raises(ValueError, match="--dtype float16 or --dtype bfloat16"):
        m.check_fp4_marlin_supported(torch.float32, (9, 0))
    monkeypatch.setattr(m, "get_device_capability", lambda device_id=0: (None, None))
    with pytest.raises(ValueError, match="no CUDA device"):
        m.check_fp4_marlin_supported(torch.bfloat16)
