"""Mocked-capability matrix for NVFP4 serving (native FP4 vs. weight-only Marlin).

Every cell drives SGLang's real code: ``initialize_fp4_gemm_config`` resolves
the FP4 GEMM backend, ``get_quant_config`` parses a realistic checkpoint
directory (``data/``), the model loader's minimum-capability check is applied
as the loader applies it, and ``get_quant_method`` picks the method/scheme for
a real ``ReplicatedLinear`` layer (dense) or a ``FusedMoE`` stand-in (MoE; the
real class needs initialised parallel groups).  Weight creation runs too,
with the cell's activation dtype; kernels and weight processing need CUDA and
are not run here.

The expected value of each cell comes from ``expected_cell`` below: the
series' intended behaviour written as a small table, not read from the code
under test.  The only input taken from the tree is whether FP4 Marlin has a
Turing (SM75, fp16) kernel path yet (``FP4_MARLIN_MIN_CAPABILITY``).

MoE layers follow ``--moe-runner-backend`` as upstream 0.5.13 does (issue 20):
``auto`` runs Marlin below SM100 and the native runner from SM100, ``marlin``
runs Marlin on any GPU that has it, a native runner below SM100 is refused
with a message naming ``--moe-runner-backend marlin``; ``--fp4-gemm-backend``
(the dense layers' choice) does not change them.  ``test_moe_runner_matrix``
drives that axis through a published ``ServerArgs``.
"""

from __future__ import annotations

import importlib
import re
import types
from dataclasses import dataclass

import pytest
import torch
from _sglang_cpu import (  # noqa: F401 (CHECKPOINTS, DATA_DIR, Checkpoint: imported by other tests)
    CHECKPOINTS,
    DATA_DIR,
    Checkpoint,
    create_moe_weights,
    moe_layer,
)
from _sglang_cpu import loader_capability_check as _loader_capability_check
from _sglang_cpu import quant_config as _quant_config
from sglang.srt.layers.linear import ReplicatedLinear
from sglang.srt.layers.moe import MoeRunnerBackend
from sglang.srt.layers.quantization import fp4_utils

# --------------------------------------------------------------------------
# The axes
# --------------------------------------------------------------------------

CAPABILITIES = [
    (7, 0),
    (7, 5),
    (8, 0),
    (8, 6),
    (8, 9),
    (9, 0),
    (10, 0),
    (10, 3),
    (12, 0),
    (12, 1),
]
# The FP4 GEMM backends the pin offers (fp4_utils.Fp4GemmRunnerBackend at
# v0.5.11), plus the series' "marlin".
NATIVE_BACKENDS = ["cutlass", "flashinfer_cudnn", "flashinfer_cutlass", "flashinfer_trtllm"]
BACKENDS = ["auto", "marlin", *NATIVE_BACKENDS]
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}


# --------------------------------------------------------------------------
# The spec: what the series intends, per cell
# --------------------------------------------------------------------------


def fp4_marlin_min_capability() -> int:
    """75 once FP4 Marlin has a Turing fp16 kernel path (patch 9), else 80.

    Read from the tree: ``marlin_utils_fp4.FP4_MARLIN_MIN_CAPABILITY`` when the
    module defines it, otherwise whether its support check accepts SM75 with
    fp16; 80 when the module does not exist (bare pin).
    """
    try:
        mod = importlib.import_module("sglang.srt.layers.quantization.marlin_utils_fp4")
    except ImportError:
        return 80
    value = getattr(mod, "FP4_MARLIN_MIN_CAPABILITY", None)
    if value is None:
        try:
            mod.check_fp4_marlin_supported(torch.float16, capability=(7, 5))
        except ValueError:
            return 80
        return 75
    if isinstance(value, tuple):
        value = value[0] * 10 + value[1]
    return int(value)


# Error expectations: (exception type, regular expression the message must match).
ERR_MIN_CAPABILITY_MODELOPT = (ValueError, re.escape("Minimum capability: 75"))
ERR_NATIVE_WITHOUT_FP4_CORES = (ValueError, re.escape("--fp4-gemm-backend marlin"))
ERR_MARLIN_TOO_OLD = (ValueError, re.escape("NVFP4 Marlin needs compute capability"))
ERR_MARLIN_NO_TURING_KERNEL = (ValueError, re.escape("Turing (SM75)"))
ERR_MARLIN_TURING_BF16 = (ValueError, re.escape("--dtype float16"))
# A native MoE runner below SM100: upstream says "use moe_runner_backend=marlin".
ERR_NATIVE_MOE = (ValueError, r"moe[-_]runner[-_]backend[ =]marlin")

# Selected class per checkpoint: (native, marlin).  For compressed-tensors the
# method class is fixed and the scheme differs; ModelOpt keeps its method
# classes and switches them to Marlin (``use_marlin``).
SELECTION = {
    "modelopt-dense": (
        ("ModelOptFp4LinearMethod", None, False),
        ("ModelOptFp4LinearMethod", None, True),
    ),
    "modelopt-moe": (
        ("ModelOptNvFp4FusedMoEMethod", None, False),
        ("ModelOptNvFp4FusedMoEMethod", None, True),
    ),
    "ct-dense": (
        ("CompressedTensorsLinearMethod", "CompressedTensorsW4A4Fp4", None),
        ("CompressedTensorsLinearMethod", "CompressedTensorsW4A16Fp4", None),
    ),
    "ct-moe": (
        ("CompressedTensorsFusedMoEMethod", "CompressedTensorsW4A4Nvfp4MoE", None),
        ("CompressedTensorsFusedMoEMethod", "CompressedTensorsW4A16Nvfp4MoE", None),
    ),
}


def resolved_backend(cap: tuple[int, int], backend: str) -> str:
    """``auto``: cudnn on SM12x, marlin below SM100, flashinfer_cutlass otherwise."""
    if backend != "auto":
        return backend
    if cap[0] == 12:
        return "flashinfer_cudnn"
    if cap < (10, 0):
        return "marlin"
    return "flashinfer_cutlass"


@dataclass(frozen=True)
class Expected:
    backend: str  # resolved FP4 GEMM backend
    error: tuple[type, str] | None = None
    method: str | None = None
    scheme: str | None = None
    use_marlin: bool | None = None


def _marlin_refusal(cap: tuple[int, int], dtype: torch.dtype, marlin_min: int) -> tuple | None:
    """Why FP4 Marlin cannot run on this GPU / dtype (None: it can)."""
    if cap >= (8, 0):
        return None
    if cap == (7, 5) and marlin_min <= 75:
        return ERR_MARLIN_TURING_BF16 if dtype == torch.bfloat16 else None
    if cap == (7, 5):
        return ERR_MARLIN_NO_TURING_KERNEL
    return ERR_MARLIN_TOO_OLD


def expected_fp4_backend_cell(
    cap: tuple[int, int], ckpt: str, backend: str, dtype: torch.dtype, marlin_min: int
) -> Expected:
    """A layer that follows ``--fp4-gemm-backend`` (the dense layers)."""
    resolved = resolved_backend(cap, backend)
    has_fp4_cores = cap >= (10, 0)
    sm = cap[0] * 10 + cap[1]
    if ckpt.startswith("modelopt") and sm < 75:
        # ModelOptFp4Config.get_min_capability() == 75, checked by the loader.
        return Expected(resolved, ERR_MIN_CAPABILITY_MODELOPT)
    use_marlin = resolved == "marlin"
    if not use_marlin and not has_fp4_cores:
        return Expected(resolved, ERR_NATIVE_WITHOUT_FP4_CORES)
    refusal = _marlin_refusal(cap, dtype, marlin_min) if use_marlin else None
    if refusal is not None:
        return Expected(resolved, refusal)
    method, scheme, marlin_flag = SELECTION[ckpt][use_marlin]
    return Expected(resolved, None, method, scheme, marlin_flag)


def expected_moe_cell(
    cap: tuple[int, int],
    ckpt: str,
    moe_backend: str,
    dtype: torch.dtype,
    marlin_min: int,
    fp4_backend: str = "auto",
) -> Expected:
    """MoE follows ``--moe-runner-backend`` (upstream 0.5.13), whatever ``--fp4-gemm-backend``."""
    resolved = resolved_backend(cap, fp4_backend)
    sm = cap[0] * 10 + cap[1]
    if ckpt.startswith("modelopt") and sm < 75:
        return Expected(resolved, ERR_MIN_CAPABILITY_MODELOPT)
    marlin = moe_backend == "marlin" or (moe_backend == "auto" and cap < (10, 0))
    if not marlin and cap < (10, 0):
        return Expected(resolved, ERR_NATIVE_MOE)  # an explicit native runner: never replaced
    refusal = _marlin_refusal(cap, dtype, marlin_min) if marlin else None
    if refusal is not None:
        return Expected(resolved, refusal)
    method, scheme, marlin_flag = SELECTION[ckpt][marlin]
    return Expected(resolved, None, method, scheme, marlin_flag)


def expected_cell(
    cap: tuple[int, int], ckpt: str, backend: str, dtype: torch.dtype, marlin_min: int
) -> Expected:
    """The cell of ``--fp4-gemm-backend BACKEND`` (``--moe-runner-backend auto``)."""
    if CHECKPOINTS[ckpt].moe:
        return expected_moe_cell(cap, ckpt, "auto", dtype, marlin_min, fp4_backend=backend)
    return expected_fp4_backend_cell(cap, ckpt, backend, dtype, marlin_min)


# --------------------------------------------------------------------------
# Driving SGLang
# --------------------------------------------------------------------------


# The native ModelOpt NVFP4 MoE method swizzles block scales on the GPU inside
# create_weights; on the CPU machine those cells stop at method selection.
CREATE_WEIGHTS_NEEDS_CUDA = {("modelopt-moe", False)}


def _build(quant_config, ckpt: Checkpoint, dtype: torch.dtype, create_weights: bool = True):
    """Select the quant method for one layer and create its weights (CPU tensors)."""
    if not ckpt.moe:
        layer = ReplicatedLinear(
            1024,
            512,
            bias=False,
            params_dtype=dtype,
            quant_config=quant_config,
            prefix=ckpt.prefix,
        )
        return layer, layer.quant_method
    layer = moe_layer(dtype)
    method = quant_config.get_quant_method(layer, prefix=ckpt.prefix)
    assert method is not None, "the MoE layer was treated as excluded"
    layer.params_dtype = dtype
    if not create_weights:
        return layer, method
    create_moe_weights(layer, method, dtype)
    return layer, method


def run_cell(ckpt: Checkpoint, backend: str, dtype: torch.dtype, create_weights: bool = True):
    """Everything a server start does for an NVFP4 layer up to weight loading."""
    fp4_utils.initialize_fp4_gemm_config(types.SimpleNamespace(fp4_gemm_runner_backend=backend))
    resolved = fp4_utils.get_fp4_gemm_runner_backend().value
    quant_config = _quant_config(ckpt)
    _loader_capability_check(quant_config, ckpt.quantization)
    assert dtype in quant_config.get_supported_act_dtypes()
    layer, method = _build(quant_config, ckpt, dtype, create_weights)
    return resolved, layer, method


MARLIN_MIN = fp4_marlin_min_capability()


def _check_cell(record_cell, cuda_device, ckpt_key, backend, dtype_name) -> None:
    ckpt = CHECKPOINTS[ckpt_key]
    dtype = DTYPES[dtype_name]
    exp = expected_cell(cuda_device.capability, ckpt_key, backend, dtype, MARLIN_MIN)
    if exp.error is not None:
        err_type, needle = exp.error
        with pytest.raises(err_type) as info:
            fp4_utils.initialize_fp4_gemm_config(
                types.SimpleNamespace(fp4_gemm_runner_backend=backend)
            )
            assert fp4_utils.get_fp4_gemm_runner_backend().value == exp.backend
            quant_config = _quant_config(ckpt)
            _loader_capability_check(quant_config, ckpt.quantization)
            _build(quant_config, ckpt, dtype)
        assert re.search(needle, str(info.value)), f"wrong error: {info.value!r}"
    else:
        create = (ckpt_key, bool(exp.use_marlin)) not in CREATE_WEIGHTS_NEEDS_CUDA
        resolved, layer, method = run_cell(ckpt, backend, dtype, create)
        assert resolved == exp.backend
        assert type(method).__name__ == exp.method
        if exp.scheme is not None:
            assert type(layer.scheme).__name__ == exp.scheme
        if exp.use_marlin is not None:
            assert getattr(method, "use_marlin", False) is exp.use_marlin
        marlin_selected = exp.use_marlin or (exp.scheme or "").startswith("CompressedTensorsW4A16")
        if ckpt.moe and marlin_selected:
            # The weight-only MoE path must run on the Marlin MoE runner.
            method.create_moe_runner(layer, layer.moe_runner_config)
            runner = getattr(method, "runner", None) or layer.scheme.runner
            assert runner.runner_backend is MoeRunnerBackend.MARLIN
    record_cell()


def _cells(caps, ckpts):
    return [
        pytest.param(
            cap,
            ckpt,
            backend,
            dtype,
            id=f"sm{cap[0]}{cap[1]}-{ckpt}-{backend}-{dtype}",
        )
        for cap in caps
        for ckpt in ckpts
        for backend in BACKENDS
        for dtype in DTYPES
    ]


def _indirect(cells):
    return pytest.mark.parametrize(
        "cuda_device,ckpt_key,backend,dtype_name", cells, indirect=["cuda_device"]
    )


PRE_BLACKWELL = [c for c in CAPABILITIES if c < (10, 0)]
BLACKWELL = [c for c in CAPABILITIES if c >= (10, 0)]


# --------------------------------------------------------------------------
# The tests
# --------------------------------------------------------------------------


@_indirect(_cells(CAPABILITIES, ["ct-dense", "ct-moe"]))
def test_ct_matrix(record_cell, cuda_device, ckpt_key, backend, dtype_name):
    """compressed-tensors W4A4 NVFP4: native scheme or weight-only Marlin scheme."""
    _check_cell(record_cell, cuda_device, ckpt_key, backend, dtype_name)


@_indirect(_cells(BLACKWELL, ["modelopt-dense", "modelopt-moe"]))
def test_modelopt_matrix_blackwell(record_cell, cuda_device, ckpt_key, backend, dtype_name):
    """ModelOpt NVFP4 on FP4-tensor-core GPUs: an explicit marlin request is honoured."""
    _check_cell(record_cell, cuda_device, ckpt_key, backend, dtype_name)


@_indirect(_cells(PRE_BLACKWELL, ["modelopt-dense", "modelopt-moe"]))
def test_modelopt_matrix_pre_blackwell(record_cell, cuda_device, ckpt_key, backend, dtype_name):
    """ModelOpt NVFP4 below SM100: Marlin, or the clear capability errors."""
    _check_cell(record_cell, cuda_device, ckpt_key, backend, dtype_name)


@pytest.mark.parametrize(
    "cuda_device,backend",
    [pytest.param(cap, b, id=f"sm{cap[0]}{cap[1]}-{b}") for cap in CAPABILITIES for b in BACKENDS],
    indirect=["cuda_device"],
)
def test_backend_resolution(record_cell, cuda_device, backend):
    """--fp4-gemm-backend: auto resolution and the NVFP4 Marlin decision per GPU."""
    cap = cuda_device.capability
    fp4_utils.initialize_fp4_gemm_config(types.SimpleNamespace(fp4_gemm_runner_backend=backend))
    resolved = fp4_utils.get_fp4_gemm_runner_backend()
    assert resolved.value == resolved_backend(cap, backend)
    assert resolved.is_marlin() is (resolved.value == "marlin")
    if resolved.value != "marlin" and cap < (10, 0):
        with pytest.raises(ValueError, match="--fp4-gemm-backend marlin"):
            fp4_utils.should_use_fp4_marlin()
    else:
        assert fp4_utils.should_use_fp4_marlin() is (resolved.value == "marlin")
    record_cell()


# The NVFP4 MoE runners of the pin's --moe-runner-backend, plus auto and marlin.
MOE_RUNNER_BACKENDS = [
    "auto",
    "marlin",
    "flashinfer_trtllm",
    "flashinfer_cutlass",
    "flashinfer_cutedsl",
]
MOE_CKPTS = ["modelopt-moe", "ct-moe"]


def _moe_runner_cells():
    def cell(cap, ckpt, fp4, moe, dtype):
        return pytest.param(
            cap,
            ckpt,
            fp4,
            moe,
            dtype,
            id=f"sm{cap[0]}{cap[1]}-{ckpt}-fp4_{fp4}-moe_{moe}-{dtype}",
        )

    cells = [
        cell(cap, ckpt, "auto", moe, dtype)
        for cap in CAPABILITIES
        for ckpt in MOE_CKPTS
        for moe in MOE_RUNNER_BACKENDS
        for dtype in DTYPES
    ]
    # --fp4-gemm-backend (the dense layers' choice) does not move the MoE layers
    cells += [
        cell(cap, ckpt, fp4, moe, "bf16")
        for cap in ((9, 0), (10, 0))
        for ckpt in MOE_CKPTS
        for fp4 in ("marlin", "flashinfer_cutlass")
        for moe in ("auto", "marlin", "flashinfer_trtllm")
    ]
    return cells


@pytest.mark.parametrize(
    "cuda_device,ckpt_key,fp4_backend,moe_backend,dtype_name",
    _moe_runner_cells(),
    indirect=["cuda_device"],
)
def test_moe_runner_matrix(
    record_cell, cuda_device, parallel_ranks, ckpt_key, fp4_backend, moe_backend, dtype_name
):
    """NVFP4 MoE follows --moe-runner-backend (upstream 0.5.13): Marlin, native, or refused."""
    ckpt = CHECKPOINTS[ckpt_key]
    dtype = DTYPES[dtype_name]
    exp = expected_moe_cell(
        cuda_device.capability, ckpt_key, moe_backend, dtype, MARLIN_MIN, fp4_backend
    )

    def run(create: bool):
        parallel_ranks(fp4_gemm_runner_backend=fp4_backend, moe_runner_backend=moe_backend)
        assert fp4_utils.get_fp4_gemm_runner_backend().value == exp.backend
        quant_config = _quant_config(ckpt)
        _loader_capability_check(quant_config, ckpt.quantization)
        return _build(quant_config, ckpt, dtype, create)

    if exp.error is not None:
        err_type, pattern = exp.error
        with pytest.raises(err_type) as info:
            run(create=True)
        assert re.search(pattern, str(info.value)), f"wrong error: {info.value!r}"
        record_cell()
        return
    layer, method = run(create=(ckpt_key, bool(exp.use_marlin)) not in CREATE_WEIGHTS_NEEDS_CUDA)
    assert type(method).__name__ == exp.method
    if exp.scheme is not None:
        assert type(layer.scheme).__name__ == exp.scheme
    if exp.use_marlin is not None:
        assert getattr(method, "use_marlin", False) is exp.use_marlin
    marlin = exp.use_marlin or (exp.scheme or "").startswith("CompressedTensorsW4A16")
    if marlin:
        method.create_moe_runner(layer, layer.moe_runner_config)
        runner = getattr(method, "runner", None) or layer.scheme.runner
        assert runner.runner_backend is MoeRunnerBackend.MARLIN
    record_cell()


def test_fp4_gemm_backend_server_arg():
    """`--fp4-gemm-backend marlin` parses and its help says what it does."""
    import argparse

    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    ns = parser.parse_args(["--model-path", "x", "--fp4-gemm-backend", "marlin"])
    assert ns.fp4_gemm_runner_backend == "marlin"
    action = next(a for a in parser._actions if "--fp4-gemm-backend" in a.option_strings)
    assert "marlin" in action.choices
    assert "'marlin'" in action.help and "below SM100" in action.help
    assert fp4_utils.Fp4GemmRunnerBackend("marlin").is_marlin()


@pytest.mark.parametrize(
    "cuda_device,backend",
    [
        pytest.param(cap, b, id=f"sm{cap[0]}{cap[1]}-{b}")
        for cap in CAPABILITIES
        for b in ["auto", "marlin", "flashinfer_trtllm", "flashinfer_cutlass", "flashinfer_cutedsl"]
    ],
    indirect=["cuda_device"],
)
def test_moe_runner_backend_resolution(record_cell, cuda_device, backend):
    """--moe-runner-backend decides NVFP4 MoE: marlin on request, auto below SM100, a native
    runner below SM100 refused (never replaced); --fp4-gemm-backend has no say."""
    from sglang.srt.layers.moe import utils as moe_utils

    cap = cuda_device.capability
    wanted = backend == "marlin" or (backend == "auto" and cap < (10, 0))
    for fp4_backend in ("auto", "marlin"):  # the dense flag does not move MoE
        fp4_utils.initialize_fp4_gemm_config(
            types.SimpleNamespace(fp4_gemm_runner_backend=fp4_backend)
        )
        moe_utils.MOE_RUNNER_BACKEND = MoeRunnerBackend(backend)
        if not wanted and cap < (10, 0):
            with pytest.raises(ValueError, match="--moe-runner-backend marlin"):
                fp4_utils.should_use_nvfp4_marlin_moe()
        else:
            assert fp4_utils.should_use_nvfp4_marlin_moe() is wanted
    record_cell()


def test_moe_runner_backend_server_arg():
    """`--moe-runner-backend marlin` parses (upstream 0.5.13 offers it too)."""
    import argparse

    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    ns = parser.parse_args(["--model-path", "x", "--moe-runner-backend", "marlin"])
    assert ns.moe_runner_backend == "marlin"
    assert MoeRunnerBackend(ns.moe_runner_backend).is_marlin()


def test_min_capability():
    """The loader gate for NVFP4 is 75; native W4A4 schemes still need SM100."""
    from sglang.srt.layers.quantization.compressed_tensors import schemes
    from sglang.srt.layers.quantization.modelopt_quant import (
        ModelOptFp4Config,
        ModelOptMixedPrecisionConfig,
    )

    assert ModelOptFp4Config.get_min_capability() == 75
    # Mixed FP8/NVFP4 checkpoints are not part of the Marlin path: unchanged.
    assert ModelOptMixedPrecisionConfig.get_min_capability() == 100
    assert schemes.CompressedTensorsW4A16Fp4.get_min_capability() == 75
    assert schemes.CompressedTensorsW4A16Nvfp4MoE.get_min_capability() == 75
    assert schemes.CompressedTensorsW4A4Fp4.get_min_capability() == 100
    assert schemes.CompressedTensorsW4A4Nvfp4MoE.get_min_capability() == 100


# --------------------------------------------------------------------------
# What the Marlin paths hand to the Marlin preparation (global-scale meaning)
# --------------------------------------------------------------------------

_PREPARE_MODULES = {
    "modelopt-dense": "sglang.srt.layers.quantization.modelopt_quant",
    "modelopt-moe": "sglang.srt.layers.quantization.modelopt_quant",
    "ct-dense": (
        "sglang.srt.layers.quantization.compressed_tensors.schemes.compressed_tensors_w4a16_nvfp4"
    ),
    "ct-moe": (
        "sglang.srt.layers.quantization.compressed_tensors.schemes."
        "compressed_tensors_w4a16_nvfp4_moe"
    ),
}


def _fill(param: torch.nn.Parameter, gen: torch.Generator) -> torch.Tensor:
    """Non-uniform positive values (as float32) written into a checkpoint tensor."""
    values = torch.rand(param.shape, generator=gen) * 3.0 + 0.25
    param.data.copy_(values.to(param.dtype))
    return param.data.clone()


@pytest.mark.parametrize("cuda_device", [pytest.param((10, 0), id="sm100")], indirect=True)
@pytest.mark.parametrize(
    "ckpt_key,trtllm_order",
    [pytest.param(key, False, id=key) for key in CHECKPOINTS]
    + [pytest.param("modelopt-moe", True, id="modelopt-moe-w31-loaded")],
)
def test_marlin_prepare_receives_multipliers(
    cuda_device, monkeypatch, record_cell, ckpt_key, trtllm_order
):
    """ModelOpt weight_scale_2 is passed as is; compressed-tensors scales are inverted.

    The Marlin repack needs CUDA, so the preparation functions are replaced by
    recorders of the layer attributes they read (upstream's helper API:
    ``weight_global_scale``; MoE ``w13_weight_scale_2`` / ``w2_weight_scale_2``);
    everything before them (checkpoint tensors created by the real method,
    after-loading processing) is SGLang's code. Per-shard / per-half values are
    handed over as they are: the preparation serves or refuses them.
    """
    ckpt = CHECKPOINTS[ckpt_key]
    calls: list[dict] = []
    module = importlib.import_module(_PREPARE_MODULES[ckpt_key])
    name = "prepare_moe_nvfp4_layer_for_marlin" if ckpt.moe else "prepare_nvfp4_layer_for_marlin"
    read = ("w13_weight_scale_2", "w2_weight_scale_2") if ckpt.moe else ("weight_global_scale",)

    def recorder(layer):
        calls.append({"layer": layer, **{a: getattr(layer, a).data.clone() for a in read}})

    monkeypatch.setattr(module, name, recorder)

    # SM100 with an explicit marlin request (upstream issue #43988's set-up; MoE asks with
    # --moe-runner-backend); below SM100 auto reaches the same code (see the matrix).
    if ckpt.moe:
        from sglang.srt.layers.moe import utils as moe_utils

        monkeypatch.setattr(moe_utils, "MOE_RUNNER_BACKEND", MoeRunnerBackend.MARLIN)
    _, layer, method = run_cell(ckpt, "marlin", torch.bfloat16)
    gen = torch.Generator().manual_seed(7)
    if ckpt_key == "modelopt-dense":
        scale_2 = _fill(layer.weight_scale_2, gen)
        method.process_weights_after_loading(layer)
        (call,) = calls
        torch.testing.assert_close(call["weight_global_scale"], scale_2)
    elif ckpt_key == "ct-dense":
        divisor = _fill(layer.weight_global_scale, gen)
        method.process_weights_after_loading(layer)
        (call,) = calls
        torch.testing.assert_close(call["weight_global_scale"], 1.0 / divisor)
        assert call["layer"].weight.shape == (512, 1024 // 2)
        assert not hasattr(layer, "input_global_scale")
    elif ckpt_key == "modelopt-moe":
        layer.use_flashinfer_trtllm_moe = trtllm_order
        w13 = layer.w13_weight.data
        w13.copy_(torch.arange(w13.shape[1], dtype=torch.int32).view(1, -1, 1).expand_as(w13))
        scale_13 = _fill(layer.w13_weight_scale_2, gen)
        scale_13[:, 1] = scale_13[:, 0] * 2  # w3's scale differs: both are handed over
        layer.w13_weight_scale_2.data.copy_(scale_13)
        scale_2 = _fill(layer.w2_weight_scale_2, gen)
        method.process_weights_after_loading(layer)
        (call,) = calls
        # [w1, w3] order, whatever order the loader stored them in
        expected_13 = scale_13 if not trtllm_order else scale_13.flip(1)
        torch.testing.assert_close(call["w13_weight_scale_2"], expected_13)
        torch.testing.assert_close(call["w2_weight_scale_2"], scale_2)
        # Marlin wants [w1, w3]; a [w3, w1] load is swapped back.
        rows = call["layer"].w13_weight[0, :, 0].to(torch.int64)
        half = w13.shape[1] // 2
        expected = torch.arange(w13.shape[1])
        if trtllm_order:
            expected = torch.cat([expected[half:], expected[:half]])
        assert torch.equal(rows, expected)
    else:  # ct-moe
        div_13 = _fill(layer.w13_weight_global_scale, gen)
        div_2 = _fill(layer.w2_weight_global_scale, gen)
        method.process_weights_after_loading(layer)
        (call,) = calls
        torch.testing.assert_close(call["w13_weight_scale_2"], 1.0 / div_13)
        torch.testing.assert_close(call["w2_weight_scale_2"], 1.0 / div_2)
        assert not hasattr(layer, "w13_input_global_scale")
    record_cell()
