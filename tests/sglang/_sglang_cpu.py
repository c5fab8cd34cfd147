"""The CPU harness for SGLang's own code, one for every series line.

The pin's tests (tests/sglang) and a maintained line's (tests/sglang-<V>) run the real SGLang
of their line, imported from ``PYTHONPATH``, on a CPU machine. What such a machine cannot
answer is mocked here and nowhere else:

- which GPU this is: ``cuda_device`` makes SGLang see one CUDA GPU of a chosen compute
  capability (torch's device queries patched, SGLang's cached platform probes and resolved
  backends reset before and after);
- sgl_kernel's scalar type ids: ``import sgl_kernel`` needs a GPU driver, and without it
  ``get_scalar_types()`` falls back to placeholder strings the Marlin wrappers cannot use. The
  line's sglang-kernel wheel's ``sgl_kernel/scalar_type.py`` is stdlib-only, so it is loaded on
  its own and registered as ``sgl_kernel.scalar_type`` before SGLang is imported
  (``install_scalar_types``). Wheel: ``$<line's variable>`` (a .whl, a directory holding one, or
  an extracted scalar_type.py), else ``<repo>/.work/cache/wheels/``;
- the CUDA kernels: ``MarlinStubs`` stands in for the Marlin ops (tests that need them).

``LINES`` says what differs by line: the sglang-kernel wheel, whether SGLang publishes its
server arguments in a runtime context (0.5.23: ``published``), the modules imported once as a
CPU machine sees them, the custom ops also registered for CPU tensors. Everything else the
tests drive (config parsing, scheme selection, weight creation, loaders, processing after
loading) is SGLang's own code. The checkpoints (``CHECKPOINTS``: the configs under
tests/data/nvfp4-configs) and independent decoders of what the Marlin FP4 kernels read are
here too, so no line carries a copy. A line's conftest.py is one call: ``conftest(globals(),
LINE)`` defines its hooks and fixtures there.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import importlib.util
import json
import os
import sys
import types
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

HERE = Path(__file__).resolve().parent
DATA_DIR = HERE.parent / "data" / "nvfp4-configs"
WHEEL_DIR = HERE.parents[1] / ".work" / "cache" / "wheels"


@dataclass(frozen=True)
class Line:
    version: str
    kernel: str  # the sglang-kernel release the line's SGLang needs
    kernel_variable: str  # names a wheel (or scalar_type.py) holding its scalar_type.py
    matrix: str  # the capability matrix module: its cells are counted at the end
    runtime_context: bool = False  # ServerArgs published through sglang.srt.runtime_context
    preload: tuple[str, ...] = ()  # imported once as a CPU machine sees them (module doc)
    cpu_ops: tuple[tuple[str, str], ...] = ()  # (custom op, its module): also run on CPU


LINES = {
    "0.5.11": Line(
        "0.5.11",
        kernel="0.4.2",
        kernel_variable="SGL_KERNEL_SCALAR_TYPE_WHEEL",
        matrix="test_capability_matrix.py",
        # imports sgl_kernel when is_cuda() is true; moe_layer imports it under a mocked GPU
        preload=("sglang.srt.layers.moe.fused_moe_triton",),
    ),
    "0.5.23": Line(
        "0.5.23",
        kernel="0.4.10",
        kernel_variable="SGL_KERNEL_0523_SCALAR_TYPE_WHEEL",
        matrix="test_capability_matrix_0523.py",
        runtime_context=True,
        # several modules import CUDA-only packages at import time when is_cuda() is true
        preload=(
            "sglang.srt.layers.quantization",
            "sglang.srt.layers.quantization.marlin_utils_fp4",
            "sglang.srt.layers.quantization.modelopt_quant",
            "sglang.srt.layers.quantization.compressed_tensors.compressed_tensors",
            "sglang.srt.layers.linear",
            "sglang.srt.layers.moe.fused_moe_triton",
            "sglang.srt.layers.moe.moe_runner.marlin",
            "sglang.srt.model_loader.weight_utils",
            "sglang.srt.runtime_context",
            "sglang.srt.server_args",
        ),
        # SGLang registers its custom ops for the CUDA dispatch key only
        cpu_ops=(("apply_fp4_marlin_linear", "sglang.srt.layers.quantization.marlin_utils_fp4"),),
    ),
}

# ------------------------------------------------------------------- sgl_kernel's scalar types

SCALAR_TYPE_MODULE = "sgl_kernel.scalar_type"
SCALAR_TYPE_MEMBER = "sgl_kernel/scalar_type.py"
# float4_e2m1f's id (the same in sgl-kernel 0.4.2 and 0.4.10): proves the real module
FLOAT4_E2M1F_ID = 562949953487106


def _scalar_type_source(line: Line) -> tuple[str, str] | None:
    """(source text, origin) of the line's scalar_type.py, or None where there is none."""
    path = Path(os.environ.get(line.kernel_variable) or WHEEL_DIR)
    if path.is_file() and path.suffix == ".py":
        return path.read_text(), str(path)
    if path.is_dir():
        wheels = sorted(path.glob(f"sglang_kernel-{line.kernel}-*.whl"))
        if not wheels:
            return None
        path = wheels[-1]
    if not path.is_file():
        return None
    with zipfile.ZipFile(path) as wheel:
        return wheel.read(SCALAR_TYPE_MEMBER).decode(), f"{path}!{SCALAR_TYPE_MEMBER}"


def install_scalar_types(line: Line) -> bool:
    """Register the wheel's scalar_type module; True if the real ids are available. A no-op
    when it is importable already (a GPU machine with sgl_kernel, or an earlier call)."""
    loaded = sys.modules.get(SCALAR_TYPE_MODULE)
    if loaded is not None:
        return hasattr(loaded, "scalar_types")
    if "sglang.srt.layers.quantization.utils" in sys.modules:
        return False  # sglang cached the placeholder types at import: too late
    if importlib.util.find_spec("sgl_kernel") is not None:
        try:
            importlib.import_module(SCALAR_TYPE_MODULE)
            return True
        except Exception:  # no GPU driver: "Could not load any common_ops library"
            for name in [m for m in sys.modules if m.split(".")[0] == "sgl_kernel"]:
                del sys.modules[name]
    found = _scalar_type_source(line)
    if found is None:
        return False
    source, origin = found
    module = types.ModuleType(SCALAR_TYPE_MODULE)
    module.__file__ = origin
    # dataclasses resolve the defining module through sys.modules while executing
    sys.modules[SCALAR_TYPE_MODULE] = module
    try:
        exec(compile(source, origin, "exec"), module.__dict__)
    except BaseException:
        del sys.modules[SCALAR_TYPE_MODULE]
        raise
    return True


def real_scalar_types_loaded() -> bool:
    """Whether sglang will see the real float4_e2m1f id (not the CPU placeholder)."""
    module = sys.modules.get(SCALAR_TYPE_MODULE)
    scalar_types = getattr(module, "scalar_types", None)
    return getattr(getattr(scalar_types, "float4_e2m1f", None), "id", None) == FLOAT4_E2M1F_ID


# ---------------------------------------------------------------------------- the session


def check_sglang_version(line: Line) -> None:
    """A maintained line's tests refuse another SGLang (the pin's tree is checked by build)."""
    try:
        from sglang._version import __version__
    except ImportError as exc:
        raise pytest.UsageError(
            f"tests/sglang-{line.version} need SGLang {line.version} on the path "
            "(PYTHONPATH=<checkout of the line>/python)"
        ) from exc
    if __version__ != line.version:
        raise pytest.UsageError(
            f"tests/sglang-{line.version} run against SGLang {line.version}, found "
            f"{__version__}: set PYTHONPATH=<checkout of the {line.version} line>/python "
            f"and use a virtual environment with SGLang {line.version}'s requirements"
        )


_CPU_LIBRARY: list = []  # a torch.library registration lives as long as its Library
_STATE: dict[str, object] = {"scalar_types": False}


def start_session(line: Line, *, check_version: bool) -> None:
    """pytest_sessionstart of a line's conftest: before SGLang is imported."""
    if check_version:
        check_sglang_version(line)
    _STATE["scalar_types"] = install_scalar_types(line)
    for name in line.preload:
        importlib.import_module(name)
    if line.cpu_ops:
        library = torch.library.Library("sglang", "IMPL")
        for op_name, module_name in line.cpu_ops:
            wrapper = getattr(importlib.import_module(module_name), op_name)
            library.impl(op_name, getattr(wrapper, "__wrapped__", wrapper), "CPU")
        _CPU_LIBRARY.append(library)


def report_header(line: Line) -> str:
    source = f"real (sglang-kernel {line.kernel} wheel)"
    state = source if _STATE["scalar_types"] else "placeholder"
    return f"sgl_kernel scalar types ({line.version}): {state}"


_CELLS_KEY = pytest.StashKey[list]()


def record_cell_fixture(request: pytest.FixtureRequest) -> Callable[[], None]:
    """Call after a matrix cell's assertions passed; the count is printed at the end."""

    def record() -> None:
        request.config.stash.setdefault(_CELLS_KEY, []).append(request.node.nodeid)

    return record


def terminal_summary(line: Line, terminalreporter, config) -> None:
    cells = config.stash.get(_CELLS_KEY, [])
    failed = [
        r.nodeid for r in terminalreporter.stats.get("failed", []) if f"{line.matrix}::" in r.nodeid
    ]
    if cells or failed:
        terminalreporter.write_line(
            f"capability matrix ({line.version}): {len(cells)} cells asserted, "
            f"{len(failed)} cells failed"
        )


# -------------------------------------------------------------------------- the mocked GPU

# Capability -> a device name of that generation (only used for messages/logs).
DEVICE_NAMES: dict[tuple[int, int], str] = {
    (7, 0): "Tesla V100-SXM2-32GB",
    (7, 5): "Tesla T4",
    (8, 0): "NVIDIA A100-SXM4-80GB",
    (8, 6): "NVIDIA GeForce RTX 3090",
    (8, 9): "NVIDIA L40S",
    (9, 0): "NVIDIA H200",
    (10, 0): "NVIDIA B200",
    (10, 3): "NVIDIA B300",
    (12, 0): "NVIDIA GeForce RTX 5090",
    (12, 1): "NVIDIA GB10",
}


@dataclass(frozen=True)
class FakeCudaDevice:
    """What the mocked CUDA device reports."""

    capability: tuple[int, int]
    name: str

    @property
    def sm(self) -> int:
        return self.capability[0] * 10 + self.capability[1]


_CACHED_PROBES: dict[str, list] = {}


def clear_sglang_caches() -> None:
    """Clear every functools cache of the loaded SGLang modules: platform probes (is_cuda,
    is_sm100_supported, is_flashinfer_available, ...) are lru_cached, and an answer cached
    for an earlier capability would make the next test see the wrong GPU."""
    for name, module in list(sys.modules.items()):
        if not (name == "sglang" or name.startswith("sglang.")) or module is None:
            continue
        if name not in _CACHED_PROBES:
            found = []
            for value in list(vars(module).values()):
                # Type checks only: some attributes are lazy importers.
                if isinstance(value, functools._lru_cache_wrapper) or (
                    isinstance(value, types.FunctionType) and "cache_clear" in vars(value)
                ):
                    found.append(value)
            _CACHED_PROBES[name] = found
        for fn in _CACHED_PROBES[name]:
            fn.cache_clear()


def reset_backends(line: Line) -> None:
    """Forget the FP4 GEMM / MoE runner backends SGLang resolved (module globals at the pin,
    the runtime context's flags on a line that has one)."""
    from sglang.srt.layers.quantization import fp4_utils

    fp4_utils.FP4_GEMM_RUNNER_BACKEND = None
    if line.runtime_context:
        from sglang.srt.runtime_context import get_flags

        moe = get_flags().moe
        for attr in ("runner_backend", "a2a_backend", "speculative_runner_backend"):
            if hasattr(moe, attr):
                setattr(moe, attr, None)
    else:
        importlib.import_module("sglang.srt.layers.moe.utils").MOE_RUNNER_BACKEND = None


def mock_cuda_device(
    line: Line, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> Iterator[FakeCudaDevice]:
    """The ``cuda_device`` fixture: SGLang sees one CUDA GPU of a chosen capability
    (parametrize indirectly with ``(major, minor)``; default (9, 0)). flashinfer's and
    sgl_kernel's availability stay what this machine really has."""
    capability = tuple(getattr(request, "param", (9, 0)))
    dev = FakeCudaDevice(capability, DEVICE_NAMES.get(capability, f"sm{capability}"))
    props = types.SimpleNamespace(
        name=dev.name,
        major=capability[0],
        minor=capability[1],
        multi_processor_count=132,
        total_memory=80 * 1024**3,
        L2_cache_size=50 * 1024**2,
        warp_size=32,
    )
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    if line.runtime_context:  # its platform probes ask whether CUDA was initialized
        monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device=None: props)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: dev.name)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    # A CUDA build of torch reports its CUDA version; a CPU build does not.
    monkeypatch.setattr(torch.version, "cuda", torch.version.cuda or "12.8")
    monkeypatch.setattr(torch.version, "hip", None)
    clear_sglang_caches()
    reset_backends(line)
    try:
        yield dev
    finally:
        monkeypatch.undo()
        clear_sglang_caches()
        reset_backends(line)


@contextlib.contextmanager
def published(line: Line, **server_args_fields: object) -> Iterator[object]:
    """Publish a real ``ServerArgs`` into the runtime context (as
    ``sglang.test.test_utils.published_topology`` does) and run the line's own
    ``initialize_fp4_gemm_config`` / ``initialize_moe_config`` from it."""
    from sglang.srt.layers.moe.utils import initialize_moe_config
    from sglang.srt.layers.quantization.fp4_utils import initialize_fp4_gemm_config
    from sglang.srt.runtime_context import SpawnRanks, publish, reset_context
    from sglang.srt.server_args import ServerArgs

    server_args = ServerArgs(model_path="dummy", **server_args_fields)
    reset_context()
    try:
        publish(server_args, role="test", ranks=SpawnRanks(world_rank=0, dp_rank=None))
        reset_backends(line)
        initialize_fp4_gemm_config()
        initialize_moe_config()
        yield server_args
    finally:
        reset_context()
        reset_backends(line)


# ------------------------------------------------------------------- checkpoints, the loader


@dataclass(frozen=True)
class Checkpoint:
    key: str
    quantization: str  # what SGLang's model config detects for this checkpoint
    directory: str  # under tests/data/nvfp4-configs
    moe: bool
    prefix: str  # a realistic layer prefix of that model


DOWN = "model.layers.0.mlp.down_proj"
EXPERTS = "model.layers.0.mlp.experts"
ALL_CHECKPOINTS = {
    c.key: c
    for c in (
        # nvidia/Llama-3.1-8B-Instruct-FP4 (hf_quant_config.json)
        Checkpoint("modelopt-dense", "modelopt_fp4", "modelopt-nvfp4-dense", False, DOWN),
        # nvidia/Qwen3-30B-A3B-FP4 style (hf_quant_config.json)
        Checkpoint("modelopt-moe", "modelopt_fp4", "modelopt-nvfp4-moe", True, EXPERTS),
        # a ModelOpt W4A16_NVFP4 (weight-only) export of the same model
        Checkpoint("modelopt-a16-dense", "modelopt_fp4", "modelopt-nvfp4a16-dense", False, DOWN),
        # RedHatAI/Meta-Llama-3.1-8B-Instruct-NVFP4 style (config.json)
        Checkpoint("ct-dense", "compressed-tensors", "ct-nvfp4-dense", False, DOWN),
        # RedHatAI/Qwen3-30B-A3B-NVFP4 style (config.json)
        Checkpoint("ct-moe", "compressed-tensors", "ct-nvfp4-moe", True, EXPERTS),
    )
}
# the W4A4 checkpoints of both producers, dense and MoE: the pin's capability matrix
CHECKPOINTS = {k: c for k, c in ALL_CHECKPOINTS.items() if k != "modelopt-a16-dense"}


def quant_config(ckpt: Checkpoint, packed_modules_mapping: dict | None = None):
    """Parse the checkpoint directory the way the model loader does (get_quant_config)."""
    from sglang.srt.model_loader.weight_utils import get_quant_config
    from transformers import PretrainedConfig

    directory = DATA_DIR / ckpt.directory
    hf = json.loads((directory / "config.json").read_text())
    hf_config = PretrainedConfig(
        architectures=hf["architectures"], quantization_config=hf.get("quantization_config")
    )
    model_config = types.SimpleNamespace(
        quantization=ckpt.quantization,
        hf_config=hf_config,
        model_path=str(directory),
        revision=None,
        is_draft_model=False,
        is_draft_quantization_explicit=False,
    )
    load_config = types.SimpleNamespace(download_dir=None, model_loader_extra_config={})
    return get_quant_config(
        model_config, load_config, packed_modules_mapping=packed_modules_mapping or {}
    )


def loader_capability_check(quant_config, quantization: str) -> None:
    """The model loader's check (model_loader/loader.py, _get_quantization_config)."""
    major, minor = torch.cuda.get_device_capability()
    capability = major * 10 + minor
    if capability < quant_config.get_min_capability():
        raise ValueError(
            f"The quantization method {quantization} is not supported for the "
            f"current GPU. Minimum capability: {quant_config.get_min_capability()}. "
            f"Current capability: {capability}."
        )


def load(layer, name: str, tensor: torch.Tensor, shard) -> None:
    """One shard of parameter NAME through the layer's own weight_loader."""
    param = getattr(layer, name)
    param.weight_loader(param, tensor, shard)


def load_shards(
    layer, shards: dict, multipliers: list[float], ckpt_key: str, seed: int, hidden: int
):
    """Each shard of a fused layer through its weight_loader, with its own global scale
    (MULTIPLIERS: ModelOpt's multipliers; compressed-tensors stores their divisors); returns
    the block scales [N, HIDDEN/16] in shard order."""
    gen = torch.Generator().manual_seed(seed)
    modelopt = ckpt_key.startswith("modelopt")
    blocks = []
    for (shard, size), mult in zip(shards.items(), multipliers, strict=True):
        packed = torch.randint(0, 256, (size, hidden // 2), generator=gen).to(torch.uint8)
        scales = fp8_scales((size, hidden // 16), 0x30, 0x5F, seed + len(blocks))
        blocks.append(scales)
        load(layer, "weight" if modelopt else "weight_packed", packed, shard)
        load(layer, "weight_scale", scales, shard)
        if modelopt:
            load(layer, "weight_scale_2", torch.tensor(mult), shard)
            load(layer, "input_scale", torch.tensor(0.5), shard)
        else:  # compressed-tensors stores the divisor
            load(layer, "weight_global_scale", torch.tensor(1.0 / mult), shard)
            load(layer, "input_global_scale", torch.tensor(2.0), shard)
    return torch.cat(blocks)


def moe_layer(dtype: torch.dtype, *, experts: int = 8, hidden: int = 256, inter: int = 128):
    """A FusedMoE instance without its parallel-group set-up (the CPU has none), top-2.

    It carries what FusedMoE.__init__ sets before it asks the quant config for a method: the
    sizes, EP rank and size, the runner config (gated SiLU, as in Qwen3-MoE) and the FlashInfer
    TRT-LLM weight-order flag.
    """
    from sglang.srt.layers.moe import MoeRunnerConfig
    from sglang.srt.layers.moe.fused_moe_triton import FusedMoE

    layer = FusedMoE.__new__(FusedMoE)
    torch.nn.Module.__init__(layer)
    layer.num_experts = layer.num_local_experts = experts
    layer.hidden_size = hidden
    layer.intermediate_size_per_partition = inter
    layer.moe_ep_rank, layer.moe_ep_size, layer.moe_tp_size = 0, 1, 1
    layer.top_k = 2
    layer.layer_id = 0
    layer.use_flashinfer_trtllm_moe = False
    layer.params_dtype = dtype
    layer.moe_runner_config = MoeRunnerConfig(
        num_experts=experts,
        num_local_experts=experts,
        hidden_size=hidden,
        intermediate_size_per_partition=inter,
        layer_id=0,
        top_k=2,
        params_dtype=dtype,
        activation="silu",
        is_gated=True,
    )
    return layer


def create_moe_weights(layer, method, dtype: torch.dtype) -> None:
    """METHOD's ``create_weights`` for a ``moe_layer``'s sizes; nothing is loaded."""
    method.create_weights(
        layer,
        num_experts=layer.num_experts,
        hidden_size=layer.hidden_size,
        intermediate_size_per_partition=layer.intermediate_size_per_partition,
        params_dtype=dtype,
        weight_loader=lambda *args, **kwargs: None,
        intermediate_size_full=layer.intermediate_size_per_partition,
    )


# ---------------------------------------------------------------------- the Marlin kernels


class MarlinStubs:
    """Stand-ins for the CUDA ops marlin_utils_fp4 calls.

    ``gptq_marlin_repack`` records its input and returns a tensor of the Marlin shape;
    ``gptq_marlin_gemm`` returns a known [M, N] tensor and records its arguments;
    ``marlin_make_workspace`` returns a small tensor.
    """

    def __init__(self, module, monkeypatch):
        self.repacks: list[tuple] = []
        self.gemm_calls: list[dict] = []
        self.gemm_out: torch.Tensor | None = None

        def repack(b_q_weight, perm, size_k, size_n, num_bits):
            self.repacks.append((b_q_weight.clone(), size_k, size_n, num_bits))
            return torch.zeros((size_k // 16, size_n * 2), dtype=torch.int32)

        def gemm(**kwargs):
            self.gemm_calls.append(kwargs)
            m, n = kwargs["size_m"], kwargs["size_n"]
            if self.gemm_out is None:
                out = (torch.arange(m * n, dtype=torch.float32) % 61 - 30).view(m, n) / 8
            else:
                out = self.gemm_out[:m, :n].float()
            return out.to(kwargs["a"].dtype)

        monkeypatch.setattr(module, "gptq_marlin_repack", repack, raising=False)
        monkeypatch.setattr(module, "gptq_marlin_gemm", gemm, raising=False)
        monkeypatch.setattr(
            module, "marlin_make_workspace", lambda device, max_blocks_per_sm=1: torch.zeros(4)
        )


def prepare_nvfp4_dense(module, monkeypatch, n: int, k: int, dtype: torch.dtype, *,
                        smallest: float, g: float, scale_div: float = 1.0):  # fmt: skip
    """A dense NVFP4 layer [N, K] through the real ``prepare_nvfp4_layer_for_marlin`` of MODULE
    (marlin_utils_fp4), only the CUDA repack replaced by the layout model (_marlin_layout.py,
    proven equal to the repack kernel on the GPU) and SM90 reported. The checkpoint: every FP4
    code, block scales spread over [SMALLEST, 448] (non-uniform), divided by SCALE_DIV, global
    multiplier G. Returns (checkpoint: packed, scales, codes; the prepared layer)."""
    import _marlin_layout

    monkeypatch.setattr(
        module, "gptq_marlin_repack", _marlin_layout.gptq_marlin_repack_model, raising=False
    )
    monkeypatch.setattr(
        module, "marlin_make_workspace", lambda d, max_blocks_per_sm=1: torch.zeros(1)
    )
    monkeypatch.setattr(module, "get_device_capability", lambda device_id=0: (9, 0))
    gen = torch.Generator().manual_seed(n * 31 + k)
    codes = torch.randint(0, 16, (n, k), generator=gen, dtype=torch.uint8)
    lo = int(torch.tensor(smallest).to(torch.float8_e4m3fn).view(torch.uint8))
    scales = fp8_scales((n, k // 16), lo, 0x7E, seed=n + k)  # 0x7E: 448
    if scale_div != 1.0:  # the checkpoint's scales, all below 448 / scale_div
        scales = (scales.float() / scale_div).to(torch.float8_e4m3fn)
    packed = (codes[:, 0::2] | (codes[:, 1::2] << 4)).contiguous()
    layer = torch.nn.Module()
    layer.weight = torch.nn.Parameter(packed.clone(), requires_grad=False)
    layer.weight_scale = torch.nn.Parameter(scales.clone(), requires_grad=False)
    layer.weight_global_scale = torch.nn.Parameter(torch.tensor(g), requires_grad=False)
    layer.output_size_per_partition, layer.input_size_per_partition = n, k
    layer.params_dtype = dtype
    module.prepare_nvfp4_layer_for_marlin(layer)
    return types.SimpleNamespace(packed=packed, scales=scales, codes=codes), layer


FP4_E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


def nvfp4_weight(codes: torch.Tensor, scales: torch.Tensor, g: float) -> torch.Tensor:
    """fp64 [N, K] a checkpoint stands for: E2M1 code (sign in bit 3) x its block scale
    (one per 16 along K) x the global multiplier G. Straight from the checkpoint's tensors."""
    c = codes.long()
    value = torch.tensor(FP4_E2M1, dtype=torch.float64)[c & 7] * torch.where(c >= 8, -1.0, 1.0)
    return value * scales.double().repeat_interleave(16, dim=-1) * g


def rel_l2(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref|| / ||ref|| in fp64."""
    ref = ref.double()
    return float((out.double() - ref).norm() / ref.norm())


# ------------------------- independent decoders of what the Marlin FP4 kernels read (bit ops)

FP16, BF16 = torch.float16, torch.bfloat16
# exponent bias moved into the activation dtype: the kernel reads global * 2^(bias - 7)
GLOBAL_BIAS = {FP16: 14, BF16: 126}


def fp8_scales(shape, lo: int, hi: int, seed: int) -> torch.Tensor:
    """Random non-negative FP8-E4M3 values with byte codes in [lo, hi]."""
    g = torch.Generator().manual_seed(seed)
    codes = torch.randint(lo, hi + 1, shape, generator=g, dtype=torch.int32)
    return codes.to(torch.uint8).view(torch.float8_e4m3fn)


def decode_16bit(bits: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """IEEE decode of fp16 (e5m10) / bf16 (e8m7) bit patterns, by hand."""
    bits = bits.to(torch.int64) & 0xFFFF
    ebits, mbits = (5, 10) if dtype == FP16 else (8, 7)
    bias = 2 ** (ebits - 1) - 1
    sign = torch.where(bits >> 15 == 1, -1.0, 1.0).double()
    e = (bits >> mbits) & (2**ebits - 1)
    mant = (bits & (2**mbits - 1)).double() / 2**mbits
    normal = (1 + mant) * torch.pow(2.0, (e - bias).double())
    sub = mant * 2.0 ** (1 - bias)
    return sign * torch.where(e == 0, sub, normal)


def kernel_scale_decode(byte: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """What the kernel's dequant_fp8_scales makes of one Marlin NVFP4 scale byte."""
    b = byte.view(torch.uint8).to(torch.int64)
    fp16_bits = b << 7
    bf16_bits = ((b & 0x80) << 7) | ((b & 0x7F) << 4)
    return decode_16bit(fp16_bits if dtype == FP16 else bf16_bits, dtype)


def effective_scales(scale_bytes, global_scale, dtype) -> torch.Tensor:
    """block scale x global scale as the kernel applies them (the 2^-bias undone)."""
    block = kernel_scale_decode(scale_bytes, dtype)
    glob = decode_16bit(global_scale.reshape(-1)[:1].view(torch.int16), dtype)
    return block * glob.item() * 2.0 ** -GLOBAL_BIAS[dtype]


def marlin_scale_layout(s_nk: torch.Tensor) -> torch.Tensor:
    """Closed form of the kernel's NVFP4 scale order, from S [N, K/16] -> [K/16, N].

    out[g, 64c + p] = S[64c + i + 8j, g], q = p with 1<->2 swapped in fours,
    i = q // 8, j = q % 8.
    """
    n, groups = s_nk.shape
    out = torch.empty(groups, n, dtype=s_nk.dtype)
    for p in range(64):
        q = 4 * (p // 4) + [0, 2, 1, 3][p % 4]
        src = q // 8 + 8 * (q % 8)
        out[:, p::64] = s_nk[src::64, :].T
    return out


# ------------------------------------------------------------------------ a line's conftest


def conftest(namespace: dict, line: Line, *, check_version: bool) -> None:
    """Define LINE's hooks and fixtures in a conftest module's NAMESPACE (its globals()):
    session start (version check, scalar types, preloads, CPU ops), the report header and the
    matrix's closing count, ``record_cell``, ``cuda_device`` and, on a line with a runtime
    context, ``published``."""

    def pytest_sessionstart(session: pytest.Session) -> None:
        start_session(line, check_version=check_version)

    def pytest_report_header(config) -> str:
        return report_header(line)

    def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
        terminal_summary(line, terminalreporter, config)

    @pytest.fixture
    def record_cell(request: pytest.FixtureRequest) -> Callable[[], None]:
        """Call after a matrix cell's assertions passed; the count is printed at the end."""
        return record_cell_fixture(request)

    @pytest.fixture
    def cuda_device(request: pytest.FixtureRequest, monkeypatch) -> Iterator[FakeCudaDevice]:
        """Make all of SGLang see one CUDA GPU of a chosen capability: parametrize indirectly
        with ``(major, minor)``; default (9, 0) (mock_cuda_device)."""
        yield from mock_cuda_device(line, request, monkeypatch)

    namespace.update(
        pytest_sessionstart=pytest_sessionstart,
        pytest_report_header=pytest_report_header,
        pytest_terminal_summary=pytest_terminal_summary,
        record_cell=record_cell,
        cuda_device=cuda_device,
        FakeCudaDevice=FakeCudaDevice,
        DATA_DIR=DATA_DIR,
        DEVICE_NAMES=DEVICE_NAMES,
        LINE=line,
    )
    if line.runtime_context:

        def published_fixture(cuda_device):
            """``published(fp4_gemm_runner_backend=..., moe_runner_backend=...)``: a context
            manager that publishes those server args on the mocked GPU."""
            return functools.partial(published, line)

        namespace["published"] = pytest.fixture(name="published")(published_fixture)
