"""Mocked-capability matrix for NVFP4 on SGLang 0.5.23 with the 0.5.23 line applied.

Every cell drives 0.5.23's real code on a mocked CUDA GPU (conftest ``cuda_device``):
a real ``ServerArgs`` is published into the runtime context and 0.5.23's own
``initialize_fp4_gemm_config`` / ``initialize_moe_config`` resolve the backends from
it; ``get_quant_config`` parses a checkpoint directory (``data/``); the model loader's
minimum-capability check is applied as the loader applies it; ``get_quant_method``
picks the method/scheme for a real ``ReplicatedLinear`` (dense) or a ``FusedMoE``
stand-in (MoE: the real class needs initialised parallel groups), and the weights are
created with the cell's activation dtype. Marlin cells then run the real
``process_weights_after_loading`` with the CUDA repack stubbed (dense also checks that
upstream's native-below-SM100 refusal fires there); native Blackwell cells stop at
weight creation (their preparation needs CUDA and FlashInfer).

Axes: 10 capabilities (7.0 ... 12.1) x {fp16, bf16} x
  dense {ModelOpt, compressed-tensors} x ``--fp4-gemm-backend`` (0.5.23's 6 choices),
  MoE {ModelOpt, compressed-tensors} x ``--moe-runner-backend`` (auto, marlin and the
  three FlashInfer NVFP4 MoE runners).

The expected value of each cell comes from ``expected_cell``: the line's intended
behaviour as a small table, not read from the code under test. The one input taken from
the tree is whether FP4 Marlin has a Turing (SM75, fp16) kernel path yet
(``marlin_utils_fp4._HAS_TURING_FP16_PATH``; False when absent, as on bare 0.5.23);
``test_sm75_cells_with_turing_path`` checks the SM75 cells once it is True.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

import pytest
import torch
from _sglang_cpu import ALL_CHECKPOINTS as CHECKPOINTS
from _sglang_cpu import (
    MarlinStubs,
    create_moe_weights,
    loader_capability_check,
    moe_layer,
    quant_config,
)

CAPABILITIES = [(7, 0), (7, 5), (8, 0), (8, 6), (8, 9), (9, 0), (10, 0), (10, 3), (12, 0), (12, 1)]
FP4_BACKENDS = [
    "auto",
    "marlin",
    "flashinfer_cudnn",
    "flashinfer_cutedsl",
    "flashinfer_cutlass",
    "flashinfer_trtllm",
]
MOE_BACKENDS = ["auto", "marlin", "flashinfer_trtllm", "flashinfer_cutlass", "flashinfer_cutedsl"]
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}

MARLIN_FP4 = "sglang.srt.layers.quantization.marlin_utils_fp4"


def turing_path_in_tree() -> bool:
    return bool(getattr(importlib.import_module(MARLIN_FP4), "_HAS_TURING_FP16_PATH", False))


# --------------------------------------------------------------------------
# The spec: what the line intends, per cell
# --------------------------------------------------------------------------

# (exception type, message substring)
ERR_LOADER_MODELOPT = (ValueError, "Minimum capability: 75")
ERR_CT_SCHEME = (RuntimeError, "Min capability: 75")
ERR_NATIVE_DENSE = (ValueError, "--fp4-gemm-backend marlin")
ERR_NATIVE_MOE = (ValueError, "moe_runner_backend=marlin")
ERR_MARLIN_TOO_OLD = (ValueError, "NVFP4 Marlin needs compute capability")
ERR_NO_TURING_PATH = (ValueError, "Turing (SM75) Marlin kernel path is not available")
ERR_TURING_BF16 = (ValueError, "--dtype float16")


@dataclass(frozen=True)
class Expected:
    error: tuple[type, str] | None = None
    marlin: bool | None = None  # served weight-only through FP4 Marlin
    method: str | None = None
    scheme: str | None = None


def resolved_fp4_backend(cap: tuple[int, int], backend: str) -> str:
    """0.5.23's auto: flashinfer_cutedsl on SM100/103, marlin from SM75 below SM100."""
    if backend != "auto":
        return backend
    if cap[0] == 10:
        return "flashinfer_cutedsl"
    if (7, 5) <= cap < (10, 0):
        return "marlin"
    return "flashinfer_cutlass"


def _marlin_on(cap: tuple[int, int], dtype: torch.dtype, turing: bool) -> tuple | None:
    """The refusal of FP4 Marlin on this GPU/dtype, or None where it runs."""
    if cap >= (8, 0):
        return None
    if cap == (7, 5):
        if not turing:
            return ERR_NO_TURING_PATH
        return ERR_TURING_BF16 if dtype == torch.bfloat16 else None
    return ERR_MARLIN_TOO_OLD


METHODS = {
    "modelopt-dense": ("ModelOptFp4LinearMethod", None, None),
    "modelopt-moe": ("ModelOptNvFp4FusedMoEMethod", None, None),
    "ct-dense": (
        "CompressedTensorsLinearMethod",
        "CompressedTensorsW4A4Fp4",
        "CompressedTensorsW4A16Fp4",
    ),
    "ct-moe": (
        "CompressedTensorsFusedMoEMethod",
        "CompressedTensorsW4A4Nvfp4MoE",
        "CompressedTensorsW4A16Nvfp4MoE",
    ),
}


def expected_cell(cap, ckpt: str, backend: str, dtype, turing: bool) -> Expected:
    sm = cap[0] * 10 + cap[1]
    blackwell = cap >= (10, 0)
    method, native_scheme, marlin_scheme = METHODS[ckpt]

    def served(marlin: bool) -> Expected:
        return Expected(None, marlin, method, marlin_scheme if marlin else native_scheme)

    if ckpt.startswith("modelopt") and sm < 75:
        return Expected(ERR_LOADER_MODELOPT)  # ModelOptFp4Config.get_min_capability()
    if ckpt == "modelopt-dense":
        if resolved_fp4_backend(cap, backend) == "marlin":
            refusal = _marlin_on(cap, dtype, turing)
            return Expected(refusal) if refusal else served(True)
        return served(False) if blackwell else Expected(ERR_NATIVE_DENSE)
    if ckpt == "ct-dense":
        # --fp4-gemm-backend marlin takes the weight-only scheme on SM100 too.
        if blackwell and resolved_fp4_backend(cap, backend) != "marlin":
            return served(False)
        if sm < 75:
            return Expected(ERR_CT_SCHEME)  # the W4A16 scheme's minimum capability
        refusal = _marlin_on(cap, dtype, turing)
        if refusal:
            return Expected(refusal)
        if backend in ("flashinfer_cudnn", "flashinfer_cutedsl"):
            # bf16 x fp4 FlashInfer GEMMs need SM100 (0.5.23's own refusal).
            return Expected(ERR_NATIVE_DENSE)
        return served(True)
    # MoE: --moe-runner-backend decides (auto: Marlin below SM100, native from SM100).
    if ckpt == "modelopt-moe":
        marlin = backend == "marlin" or (backend == "auto" and not blackwell)
        if not marlin:
            return served(False) if blackwell else Expected(ERR_NATIVE_MOE)
    else:  # ct-moe: below SM100 every runner request is served weight-only (a warning)
        marlin = backend == "marlin" or not blackwell
        if not marlin:
            return served(False)
    refusal = _marlin_on(cap, dtype, turing)
    return Expected(refusal) if refusal else served(True)


# --------------------------------------------------------------------------
# Driving SGLang
# --------------------------------------------------------------------------

# the sizes of _build's layers, read when it runs (other tests of this line set them)
HIDDEN, INTER, EXPERTS = 256, 128, 8


def _build(ckpt, dtype, create_weights: bool):
    from sglang.srt.layers.linear import ReplicatedLinear

    config = quant_config(ckpt)
    loader_capability_check(config, ckpt.quantization)
    assert dtype in config.get_supported_act_dtypes()
    if not ckpt.moe:
        if not create_weights:
            return None, config.get_quant_method(
                ReplicatedLinear.__new__(ReplicatedLinear), prefix=ckpt.prefix
            )
        layer = ReplicatedLinear(
            HIDDEN,
            2 * INTER,
            bias=False,
            params_dtype=dtype,
            quant_config=config,
            prefix=ckpt.prefix,
        )
        return layer, layer.quant_method
    layer = moe_layer(dtype, experts=EXPERTS, hidden=HIDDEN, inter=INTER)
    method = config.get_quant_method(layer, prefix=ckpt.prefix)
    assert method is not None, "the MoE layer was treated as excluded"
    layer.quant_method = method
    layer.params_dtype = dtype
    if create_weights:
        create_moe_weights(layer, method, dtype)
    return layer, method


def _fill_for_marlin(layer, moe: bool) -> None:
    """Checkpoint-like values (positive global scales) so the preparation can run."""
    for name, param in list(layer.named_parameters()):
        if "global_scale" in name or "scale_2" in name or "input_scale" in name:
            param.data.fill_(0.5 if "input" in name else 2.0)
        elif param.dtype == torch.float8_e4m3fn:
            param.data.copy_(torch.full(param.shape, 0.75).to(torch.float8_e4m3fn))


def _run(ckpt_key, fp4_backend, moe_backend, dtype, exp: Expected, published, monkeypatch):
    ckpt = CHECKPOINTS[ckpt_key]
    fields = dict(fp4_gemm_runner_backend=fp4_backend, moe_runner_backend=moe_backend)
    with published(**fields):
        # Native Blackwell ModelOpt MoE weights are swizzled on the GPU at creation.
        create = not (ckpt_key == "modelopt-moe" and exp.marlin is False)
        layer, method = _build(ckpt, dtype, create)
        if exp.error is None:
            assert type(method).__name__ == exp.method
            if exp.scheme is not None:
                assert type(layer.scheme).__name__ == exp.scheme
        stubs = MarlinStubs(importlib.import_module(MARLIN_FP4), monkeypatch)
        if ckpt.moe and exp.marlin:
            method.create_moe_runner(layer, layer.moe_runner_config)
            runner = getattr(method, "runner", None) or layer.scheme.runner
            from sglang.srt.layers.moe import MoeRunnerBackend

            assert runner.runner_backend is MoeRunnerBackend.MARLIN
        if exp.marlin or (exp.marlin is None and not ckpt.moe):
            # Marlin cells, and dense cells expected to be refused after loading.
            _fill_for_marlin(layer, ckpt.moe)
            method.process_weights_after_loading(layer)
        if exp.marlin:
            assert stubs.repacks, "the Marlin preparation did not run"
        elif exp.marlin is False:
            assert not stubs.repacks


def _check_cell(
    record_cell, cuda_device, published, monkeypatch, ckpt_key, backend, dtype_name, turing
):
    dtype = DTYPES[dtype_name]
    exp = expected_cell(cuda_device.capability, ckpt_key, backend, dtype, turing)
    moe = CHECKPOINTS[ckpt_key].moe
    fp4_backend, moe_backend = ("auto", backend) if moe else (backend, "auto")
    run = (ckpt_key, fp4_backend, moe_backend, dtype, exp, published, monkeypatch)
    if exp.error is not None:
        err_type, needle = exp.error
        with pytest.raises(err_type) as info:
            _run(*run)
        assert needle in str(info.value), f"wrong error: {info.value!r}"
    else:
        _run(*run)
    record_cell()


def _cells(caps, ckpts):
    return [
        pytest.param(cap, ckpt, backend, dtype, id=f"sm{cap[0]}{cap[1]}-{ckpt}-{backend}-{dtype}")
        for cap in caps
        for ckpt in ckpts
        for backend in (MOE_BACKENDS if CHECKPOINTS[ckpt].moe else FP4_BACKENDS)
        for dtype in DTYPES
    ]


def _indirect(cells):
    return pytest.mark.parametrize(
        "cuda_device,ckpt_key,backend,dtype_name", cells, indirect=["cuda_device"]
    )


TURING = turing_path_in_tree()


# --------------------------------------------------------------------------
# The tests
# --------------------------------------------------------------------------


PRE_BLACKWELL = [c for c in CAPABILITIES if c < (10, 0)]
BLACKWELL = [c for c in CAPABILITIES if c >= (10, 0)]
DENSE, MOE = ["modelopt-dense", "ct-dense"], ["modelopt-moe", "ct-moe"]


@_indirect(_cells(PRE_BLACKWELL, DENSE))
def test_dense_matrix_pre_blackwell(
    record_cell, cuda_device, published, monkeypatch, ckpt_key, backend, dtype_name
):
    """Dense NVFP4 linears below SM100: FP4 Marlin, or the clear refusals."""
    _check_cell(
        record_cell, cuda_device, published, monkeypatch, ckpt_key, backend, dtype_name, TURING
    )


@_indirect(_cells(BLACKWELL, DENSE))
def test_dense_matrix_blackwell(
    record_cell, cuda_device, published, monkeypatch, ckpt_key, backend, dtype_name
):
    """Dense NVFP4 linears on FP4-tensor-core GPUs: native unless marlin is asked for."""
    _check_cell(
        record_cell, cuda_device, published, monkeypatch, ckpt_key, backend, dtype_name, TURING
    )


@_indirect(_cells(PRE_BLACKWELL, MOE))
def test_moe_matrix_pre_blackwell(
    record_cell, cuda_device, published, monkeypatch, ckpt_key, backend, dtype_name
):
    """NVFP4 MoE experts below SM100: the Marlin MoE runner, or the clear refusals."""
    _check_cell(
        record_cell, cuda_device, published, monkeypatch, ckpt_key, backend, dtype_name, TURING
    )


@_indirect(_cells(BLACKWELL, MOE))
def test_moe_matrix_blackwell(
    record_cell, cuda_device, published, monkeypatch, ckpt_key, backend, dtype_name
):
    """NVFP4 MoE experts on FP4-tensor-core GPUs: native unless marlin is asked for."""
    _check_cell(
        record_cell, cuda_device, published, monkeypatch, ckpt_key, backend, dtype_name, TURING
    )


@_indirect(_cells([(7, 5)], DENSE + MOE))
def test_sm75_cells_with_turing_path(
    record_cell, cuda_device, published, monkeypatch, ckpt_key, backend, dtype_name
):
    """SM75 once the kernels have a Turing fp16 path (the flag the Turing patch sets):
    fp16 is served by Marlin, bf16 refused with the --dtype float16 hint."""
    monkeypatch.setattr(importlib.import_module(MARLIN_FP4), "_HAS_TURING_FP16_PATH", True)
    _check_cell(
        record_cell, cuda_device, published, monkeypatch, ckpt_key, backend, dtype_name, True
    )


@pytest.mark.parametrize(
    "cuda_device,backend",
    [
        pytest.param(cap, b, id=f"sm{cap[0]}{cap[1]}-{b}")
        for cap in CAPABILITIES
        for b in FP4_BACKENDS
    ],
    indirect=["cuda_device"],
)
def test_fp4_backend_resolution(record_cell, cuda_device, published, backend):
    """--fp4-gemm-backend auto: FP4 Marlin from SM75 up to SM100 (the Turing refusal is
    the Marlin support check's, not the backend choice's)."""
    from sglang.srt.layers.quantization import fp4_utils

    with published(fp4_gemm_runner_backend=backend):
        resolved = fp4_utils.get_fp4_gemm_runner_backend().value
    assert resolved == resolved_fp4_backend(cuda_device.capability, backend)
    record_cell()


def test_min_capability():
    """The loader gates for NVFP4 Marlin are 75; native W4A4 schemes still need SM100."""
    from sglang.srt.layers.quantization.compressed_tensors import schemes
    from sglang.srt.layers.quantization.modelopt_quant import (
        ModelOptFp4Config,
        ModelOptMixedPrecisionConfig,
    )
    from sglang.srt.layers.quantization.nvfp4_online import _ModelOptFp4OnlineConfig

    assert ModelOptFp4Config.get_min_capability() == 75
    # Not part of the Marlin SM75 path: unchanged from 0.5.23.
    assert ModelOptMixedPrecisionConfig.get_min_capability() == 80
    assert _ModelOptFp4OnlineConfig.get_min_capability() == 80
    assert schemes.CompressedTensorsW4A16Fp4.get_min_capability() == 75
    assert schemes.CompressedTensorsW4A16Nvfp4MoE.get_min_capability() == 75
    assert schemes.CompressedTensorsW4A4Fp4.get_min_capability() == 100
    assert schemes.CompressedTensorsW4A4Nvfp4MoE.get_min_capability() == 100


@pytest.mark.parametrize("turing", [False, True], ids=["no-turing-path", "turing-path"])
@pytest.mark.parametrize(
    "dtype", [torch.float16, torch.bfloat16, None], ids=["fp16", "bf16", "none"]
)
@pytest.mark.parametrize("cap", [(6, 1), (7, 0), (7, 5), (8, 0), (9, 0), (10, 0), (12, 1)])
def test_check_fp4_marlin_supported(monkeypatch, cap, dtype, turing):
    """The support check's answers and messages, given as a tuple, an int, or probed."""
    m = importlib.import_module(MARLIN_FP4)
    monkeypatch.setattr(m, "_HAS_TURING_FP16_PATH", turing)
    monkeypatch.setattr(m, "get_device_capability", lambda device_id=0: cap)
    expected = _marlin_on(cap, dtype or torch.float16, turing)
    if cap == (7, 5) and turing and dtype is None:
        expected = None  # the dtype is not known yet: fp16 may still run
    for given in (cap, cap[0] * 10 + cap[1], None):
        if expected is None:
            m.check_fp4_marlin_supported(dtype, given)
        else:
            with pytest.raises(
                expected[0], match=expected[1].replace("(", r"\(").replace(")", r"\)")
            ):
                m.check_fp4_marlin_supported(dtype, given)
    if expected == ERR_MARLIN_TOO_OLD:
        minimum = "7.5" if turing else "8.0"
        with pytest.raises(ValueError, match=f"capability {minimum} or newer"):
            m.check_fp4_marlin_supported(dtype, cap)


def test_fp4_gemm_backend_help():
    """`--fp4-gemm-backend marlin` parses; its help says where auto picks marlin."""
    import argparse

    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    ns = parser.parse_args(["--model-path", "x", "--fp4-gemm-backend", "marlin"])
    assert ns.fp4_gemm_runner_backend == "marlin"
    action = next(a for a in parser._actions if "--fp4-gemm-backend" in a.option_strings)
    assert "marlin on SM75-SM90" in action.help and "Turing path" in action.help
