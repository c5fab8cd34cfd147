"""ctypes front end of the standalone NVFP4 kernels: build with nvcc, load, call on torch tensors.

No torch extension build and no SGLang module: ``build()`` runs nvcc on ``fp4_gemv.cu`` and
``fp4_dequant.cu`` (seconds) into one shared library whose ``extern "C"`` launchers take raw
pointers and a stream. ``Fp4Linear`` runs one prepared NVFP4 layer (the Marlin layout exactly
as ``prepare_nvfp4_layer_for_marlin`` leaves it) through them:

* ``gemv``: M <= 64, the mma.sync GEMV of fp4_gemv.cu with the fused epilogue
  (out = acc * g * col_scale + bias, rounded once); on SM90 its weights arrive by the copy
  engine and the k-splits of an n-group, one thread-block cluster, sum through each other's
  shared memory (``Kernels.loader`` selects the register ring instead, as below SM90, or
  round 3's global-workspace sum);
* ``prefill``: the layout dequantized into a bounded scratch, chunk by chunk over N, each chunk
  a cuBLAS GEMM (``torch.addmm``: alpha = the global scale, the bias in its epilogue; a
  column scale is folded into the chunk's weights);
* ``__call__``: the dispatch of ``DISPATCH`` (M ranges -> path), Marlin where it is faster.

SM80 to SM90 only: SM75 (Turing) keeps Marlin's fp16 path (``Fp4Linear`` refuses it).
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import os
import shutil
import subprocess
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
SOURCES = (HERE / "fp4_gemv.cu", HERE / "fp4_dequant.cu")
HEADERS = (HERE / "fp4_ptx.cuh",)
BUILD_INPUTS = (*SOURCES, *HEADERS)  # what the library is made of: its hash, a round's record
GLOBAL_SCALE_BIAS = {torch.float16: 14, torch.bfloat16: 126}
MAX_GEMV_M = 64
DEFAULT_SCRATCH_BYTES = 64 * 2**20

# Which path serves which M (inclusive upper bounds), per layer shape name or "*", as a
# benchmark run measured it (run_round.py's dispatch.json gives these lists; check-reports
# holds them equal), named in DISPATCH_SOURCE. Round 5 (H200): the gemv with its splits summed
# through the cluster ("gemv") or through the global workspace ("gemv_ws", faster at M = 1-8
# on the long-K and narrow shapes, where fewer blocks fit as clusters), Marlin in between,
# dequant + cuBLAS from M = 64-256. Each path holds up to the last M it won; M between
# measured points goes to the next path. "*" (shapes not timed) stays on Marlin to M = 64.
# Measured on SM90 only: SM80-89 run the gemv's register ring, slower.
OPEN_END = 1 << 30  # the last path's upper bound
DISPATCH: dict[str, list[tuple[int, str]]] = {
    "*": [(64, "marlin"), (OPEN_END, "prefill")],
    "qkv_8b": [(4, "gemv"), (16, "marlin"), (32, "gemv"), (64, "marlin"), (256, "prefill@64M"),
               (OPEN_END, "prefill_overlap@64M")],
    "o_8b": [(8, "gemv"), (32, "marlin"), (OPEN_END, "prefill@64M")],
    "gate_up_8b": [(16, "gemv"), (64, "marlin"), (256, "prefill@160M"),
                   (OPEN_END, "prefill_overlap@64M")],
    "down_8b": [(4, "gemv_ws"), (64, "marlin"), (256, "prefill@160M"),
                (OPEN_END, "prefill_overlap@64M")],
    "qkv_70b": [(2, "gemv_ws"), (64, "marlin"), (256, "prefill@160M"),
                (OPEN_END, "prefill_overlap@64M")],
    "o_70b": [(2, "gemv_ws"), (64, "marlin"), (256, "prefill@160M"), (OPEN_END, "prefill@64M")],
    "gate_up_70b": [(16, "gemv"), (64, "marlin"), (256, "prefill@160M"),
                    (OPEN_END, "prefill_overlap@64M")],
    "down_70b": [(8, "gemv_ws"), (64, "marlin"), (OPEN_END, "prefill@160M")],
}  # fmt: skip
DISPATCH_SOURCE = "measured: reports/h200/kernels/round-5/dispatch.json (H200, 2026-12-03)"


def dispatch_for(shape: str | None = None) -> list[tuple[int, str]]:
    """The measured dispatch of a shape DISPATCH names, else the one for shapes not timed."""
    return list(DISPATCH.get(shape or "*", DISPATCH["*"]))


def source_hashes() -> dict[str, str]:
    """sha256 of each file the library is built from: which kernels a report measured."""
    return {src.name: hashlib.sha256(src.read_bytes()).hexdigest() for src in BUILD_INPUTS}


def arch_flag(capability: tuple[int, int]) -> str:
    """nvcc target for a device: sm_90a on Hopper, sm_8x on Ampere/Ada; SM75 and older refused."""
    major, minor = capability
    if (major, minor) < (8, 0):
        raise RuntimeError(
            f"the FP4 kernels need compute capability 8.0 or newer (this GPU is {major}.{minor});"
            " SM75 keeps Marlin's fp16 path"
        )
    if major == 9:
        return "-gencode=arch=compute_90a,code=sm_90a"
    return f"-gencode=arch=compute_{major}{minor},code=sm_{major}{minor}"


def nvcc_path() -> str:
    for cand in (os.environ.get("NVCC"), shutil.which("nvcc"), "/usr/local/cuda/bin/nvcc"):
        if cand and Path(cand).is_file():
            return cand
    raise RuntimeError("nvcc not found: put CUDA's bin/ on PATH or set NVCC")


def build(out_dir: Path, capability: tuple[int, int], extra: Sequence[str] = ()) -> Path:
    """Compile the kernels into ``out_dir/libfp4k-<hash>.so`` (reused while sources match).

    The ptxas report (registers, spills, shared memory) lands beside it as ``ptxas-<hash>.txt``.
    """
    flag = arch_flag(capability)
    h = hashlib.sha256(flag.encode() + "\0".join(extra).encode())
    for src in BUILD_INPUTS:
        h.update(src.read_bytes())
    tag = h.hexdigest()[:12]
    out_dir.mkdir(parents=True, exist_ok=True)
    so = out_dir / f"libfp4k-{tag}.so"
    log = out_dir / f"ptxas-{tag}.txt"
    if so.is_file() and log.is_file():
        return so
    cmd = [nvcc_path(), "-O3", flag, "-std=c++17", "-shared", "-Xcompiler", "-fPIC",
           "-lineinfo", "-Xptxas", "-v", *extra, "-o", str(so), *map(str, SOURCES)]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True)
    log.write_text(" ".join(cmd) + "\n" + proc.stdout + proc.stderr)
    if proc.returncode != 0:
        raise RuntimeError(f"nvcc failed ({proc.returncode}); see {log}:\n{proc.stderr[-3000:]}")
    return so


class Kernels:
    """The shared library's launchers with their ctypes signatures."""

    def __init__(self, so: Path) -> None:
        lib = ctypes.CDLL(str(so))
        p, i, f, ll = ctypes.c_void_p, ctypes.c_int, ctypes.c_float, ctypes.c_longlong
        lib.fp4_gemv.argtypes = [p, i, i, i, p, p, p, p, p, p, i, i, i, i, p, ll, p, i, i, i, i, p]
        lib.fp4_gemv.restype = i
        lib.fp4_gemv_plan.argtypes = [i, i, i, i, ctypes.POINTER(i), ctypes.POINTER(i)]
        lib.fp4_gemv_plan.restype = i
        lib.fp4_gemv_loader.argtypes = [i]
        lib.fp4_gemv_loader.restype = i
        lib.fp4_gemv_end.argtypes = [i, i, i, i, i]
        lib.fp4_gemv_end.restype = i
        lib.fp4_dequant.argtypes = [p, p, p, f, i, i, i, i, i, p, i, i, p]
        lib.fp4_dequant.restype = i
        lib.fp4k_error_string.argtypes = [i]
        lib.fp4k_error_string.restype = ctypes.c_char_p
        self.lib = lib
        self.path = so
        self.asked = -1  # the loader asked for last (loader()): using() restores it
        # whether this GPU's gemv loads by the copy engine (its default loader; SM90)
        self.copy_engine = self.loader(-1) == "copy"

    def check(self, rc: int, what: str) -> None:
        if rc != 0:
            raise RuntimeError(f"{what}: {self.lib.fp4k_error_string(rc).decode()} (code {rc})")

    LOADERS = ("ring", "copy", "copy-ws")  # fp4_gemv_loader's answers, by number
    DEFAULT, RING, COPY, COPY_WS = -1, 0, 1, 2  # what loader() and using() take

    def loader(self, which: int = -1) -> str:
        """Select the gemv's weight loader: -1 (the default) or 1 the copy engine where the
        GPU has one (SM90; splits summed through the cluster), 0 the register ring, 2 the
        copy engine with round 3's end (splits summed through a global workspace); returns
        the one in effect, a name of ``LOADERS``."""
        self.asked = which
        return self.LOADERS[self.lib.fp4_gemv_loader(which)]

    @contextlib.contextmanager
    def using(self, which: int) -> Iterator[str]:
        """The loader ``which`` inside the block (yields the one in effect), the one asked for
        before it after (blocks nest)."""
        before = self.asked
        try:
            yield self.loader(which)
        finally:
            self.loader(before)

    ENDS = ("ring", "cluster", "workspace")

    def end(self, m: int, n: int, k: int, wn: int, splits: int) -> str:
        """How a gemv call of this shape and (wn, splits) would run with the loader in effect:
        a name of ``ENDS`` (the copy engine's split sum: through the cluster or the workspace)."""
        rc = self.lib.fp4_gemv_end(m, n, k, wn, splits)
        if rc < 0:
            raise ValueError(f"fp4_gemv refuses M={m}, N={n}, K={k}, wn={wn}, splits={splits}")
        return self.ENDS[rc]

    def plan(self, m: int, n: int, k: int, sms: int) -> tuple[int, int]:
        wn, splits = ctypes.c_int(), ctypes.c_int()
        self.check(self.lib.fp4_gemv_plan(m, n, k, sms, ctypes.byref(wn), ctypes.byref(splits)),
                   f"fp4_gemv_plan(M={m}, N={n}, K={k})")  # fmt: skip
        return wn.value, splits.value


def _ptr(t: torch.Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


def _stream(stream: torch.cuda.Stream | None = None) -> int:
    return (stream or torch.cuda.current_stream()).cuda_stream


@dataclass
class PreparedTensors:
    """One layer's tensors as prepare_nvfp4_layer_for_marlin leaves them (read, never copied)."""

    weight: torch.Tensor  # int32 [K/16, 2N] (N, K padded to Marlin tiles)
    weight_scale: torch.Tensor  # float8_e4m3fn bytes [K/16, N]
    weight_global_scale: torch.Tensor  # act dtype [1]: g * 2^(bias - 7)
    size_n: int
    size_k: int
    weight_output_scale: torch.Tensor | None = None  # float32 [size_n]
    bias: torch.Tensor | None = None  # act dtype [size_n]

    @classmethod
    def from_layer(cls, layer: torch.nn.Module) -> PreparedTensors:
        bias = getattr(layer, "bias", None)
        return cls(layer.weight.data, layer.weight_scale.data, layer.weight_global_scale.data,
                   layer.output_size_per_partition, layer.input_size_per_partition,
                   getattr(layer, "weight_output_scale", None),
                   None if bias is None else bias.data)  # fmt: skip

    @property
    def padded_n(self) -> int:
        return self.weight.shape[1] // 2

    @property
    def padded_k(self) -> int:
        return self.weight.shape[0] * 16

    @property
    def act_dtype(self) -> torch.dtype:
        return self.weight_global_scale.dtype


class Buffers:
    """Workspace, counters, scratch and side stream: shareable by layers whose calls are
    sequential on one stream (the kernels reset the counters they use)."""

    def __init__(self, device: torch.device, n_counters: int) -> None:
        self.device = device
        self.counters = torch.zeros(n_counters, dtype=torch.int32, device=device)
        self.ws = torch.empty(0, dtype=torch.float32, device=device)
        self.scratch = torch.empty(0, dtype=torch.uint8, device=device)
        self.side: torch.cuda.Stream | None = None
        # buffers outgrown: kept, since a graph captured before may still write them
        self.retired: list[torch.Tensor] = []

    def workspace(self, floats: int) -> torch.Tensor:
        if floats > self.ws.numel():
            if torch.cuda.is_current_stream_capturing():
                raise RuntimeError("gemv workspace too small inside a graph capture: reserve()")
            self.retired.append(self.ws)
            self.ws = torch.empty(floats, dtype=torch.float32, device=self.device)
        return self.ws

    def scratch_views(self, count: int, rows: int, k: int, dtype: torch.dtype) -> list:
        need = count * rows * k * 2
        if need > self.scratch.numel():
            if torch.cuda.is_current_stream_capturing():
                raise RuntimeError("prefill scratch too small inside a graph capture")
            self.retired.append(self.scratch)
            self.scratch = torch.empty(need, dtype=torch.uint8, device=self.device)
        flat = self.scratch[:need].view(dtype)
        return [flat[i * rows * k : (i + 1) * rows * k].view(rows, k) for i in range(count)]


class Fp4Linear:
    """out = x @ W^T * col_scale + bias for one prepared layer, through the new kernels."""

    def __init__(self, kernels: Kernels, t: PreparedTensors,
                 scratch_bytes: int = DEFAULT_SCRATCH_BYTES,
                 dispatch: Sequence[tuple[int, str]] | None = None,
                 marlin: Callable[[torch.Tensor], torch.Tensor] | None = None,
                 buffers: Buffers | None = None) -> None:  # fmt: skip
        dev = t.weight.device
        if t.act_dtype not in GLOBAL_SCALE_BIAS:
            raise ValueError(f"activation dtype {t.act_dtype}: the kernels run fp16 and bf16")
        arch_flag(torch.cuda.get_device_capability(dev))
        if t.weight.dtype != torch.int32 or t.weight_scale.element_size() != 1:
            raise ValueError("expected the Marlin NVFP4 layout (int32 weight, byte scales)")
        self.k, self.t = kernels, t
        self.sms = torch.cuda.get_device_properties(dev).multi_processor_count
        self.is_bf16 = int(t.act_dtype == torch.bfloat16)
        # The multiplier g itself (host float): the prefill GEMM's alpha.
        bias_exp = GLOBAL_SCALE_BIAS[t.act_dtype] - 7
        self.g = float(t.weight_global_scale.float().reshape(-1)[0]) * 2.0**-bias_exp
        if t.bias is not None and (t.bias.dtype != t.act_dtype or t.bias.numel() != t.size_n):
            raise ValueError(f"bias must be {t.act_dtype} [{t.size_n}]")
        cs = t.weight_output_scale
        if cs is not None and (cs.dtype != torch.float32 or cs.numel() != t.size_n):
            raise ValueError(f"weight_output_scale must be float32 [{t.size_n}]")
        # The dequant kernel reads a row scale for every (padded) row.
        self.row_scale = None if cs is None else torch.nn.functional.pad(
            cs.contiguous(), (0, t.padded_n - t.size_n), value=1.0)  # fmt: skip
        self.buf = buffers or Buffers(dev, t.padded_n // 64)
        if self.buf.counters.numel() < t.padded_n // 64:
            raise ValueError("shared buffers hold too few counters for this layer")
        self.chunk_n = self.rows_for(scratch_bytes)
        self.dispatch = list(dispatch or dispatch_for())
        self.marlin = marlin

    def rows_for(self, scratch_bytes: int) -> int:
        """Rows of one prefill chunk for a scratch budget (multiple of 64, at most N)."""
        rows = max(64, (scratch_bytes // (2 * self.t.size_k)) // 64 * 64)
        return min(rows, self.t.padded_n)

    # ------------------------------------------------------------------ gemv (M <= 64)

    def plan(self, m: int) -> tuple[int, int]:
        return self.k.plan(m, self.t.padded_n, self.t.padded_k, self.sms)

    def reserve(self, ms: Sequence[int], configs: Sequence[tuple[int, int]] = ()) -> None:
        """Allocate the workspace the given M (and explicit (wn, splits)) need, before capture:
        for the loader in effect and, where the dispatch takes it, the workspace end's plan."""
        takes_ws = any(p == "gemv_ws" for _, p in self.dispatch)
        ends = [self.k.asked] + ([Kernels.COPY_WS] if takes_ws else [])
        need = 0
        for which in ends:
            with self.k.using(which):
                for m in ms:
                    if m <= MAX_GEMV_M:
                        for _, splits in [self.plan(m), *configs]:
                            need = max(need, splits * m * self.t.padded_n if splits > 1 else 0)
        self.buf.workspace(need)

    def gemv(self, x: torch.Tensor, out: torch.Tensor | None = None, wn: int | None = None,
             splits: int | None = None, epilogue: bool = True) -> torch.Tensor:  # fmt: skip
        t = self.t
        m = x.shape[0]
        if x.dim() != 2 or x.shape[1] != t.size_k or x.dtype != t.act_dtype or x.stride(1) != 1:
            raise ValueError(f"x must be [M, {t.size_k}] {t.act_dtype} with unit column stride")
        if wn is None or splits is None:
            wn, splits = self.plan(m)
        if out is None:
            out = torch.empty(m, t.size_n, dtype=t.act_dtype, device=x.device)
        ws = self.buf.workspace(splits * m * t.padded_n if splits > 1 else 0)
        cs = t.weight_output_scale if epilogue else None
        bias = t.bias if epilogue else None
        rc = self.k.lib.fp4_gemv(
            _ptr(x), x.stride(0), m, t.size_k, _ptr(t.weight), _ptr(t.weight_scale),
            _ptr(t.weight_global_scale), _ptr(cs), _ptr(bias), _ptr(out), out.stride(0),
            t.padded_n, t.padded_k, t.size_n, _ptr(ws), ws.numel(),
            _ptr(self.buf.counters), self.buf.counters.numel(), self.is_bf16, wn, splits,
            _stream(),
        )  # fmt: skip
        self.k.check(rc, f"fp4_gemv(M={m}, N={t.padded_n}, K={t.padded_k}, wn={wn}, "
                         f"splits={splits})")  # fmt: skip
        return out

    # ------------------------------------------------------------------ prefill (large M)

    def scratch_size(self, chunk_n: int | None = None, overlap: bool = False) -> int:
        """Bytes of scratch the prefill path holds (one chunk, two when overlapped)."""
        return (2 if overlap else 1) * (chunk_n or self.chunk_n) * self.t.size_k * 2

    def _dequant(self, n0: int, n1: int, dst: torch.Tensor, epilogue: bool,
                 stream: torch.cuda.Stream | None = None) -> None:  # fmt: skip
        t = self.t
        cs = self.row_scale if epilogue else None
        rc = self.k.lib.fp4_dequant(
            _ptr(t.weight), _ptr(t.weight_scale), _ptr(cs), 1.0, t.padded_n, t.padded_k, n0, n1,
            t.size_k, _ptr(dst), dst.stride(0), self.is_bf16, _stream(stream),
        )  # fmt: skip
        self.k.check(rc, f"fp4_dequant(rows {n0}:{n1})")

    def dequant_all(self, epilogue: bool = False) -> torch.Tensor:
        """The whole weight as [N, K] of the act dtype (checks; no global scale)."""
        t = self.t
        out = torch.empty(t.padded_n, t.size_k, dtype=t.act_dtype, device=t.weight.device)
        self._dequant(0, t.padded_n, out, epilogue)
        return out[: t.size_n]

    def _gemm(self, x: torch.Tensor, w: torch.Tensor, out: torch.Tensor, n0: int, n1: int,
              epilogue: bool) -> None:  # fmt: skip
        bias = self.t.bias if epilogue else None
        dst = out[:, n0:n1]
        if bias is None:
            torch.addmm(dst, x, w.t(), beta=0, alpha=self.g, out=dst)
        else:
            torch.addmm(bias[n0:n1], x, w.t(), alpha=self.g, out=dst)

    def chunks(self, chunk_n: int | None = None) -> list[tuple[int, int]]:
        c = chunk_n or self.chunk_n
        return [(n0, min(n0 + c, self.t.padded_n)) for n0 in range(0, self.t.padded_n, c)]

    def prefill(self, x: torch.Tensor, out: torch.Tensor | None = None, overlap: bool = False,
                epilogue: bool = True, chunk_n: int | None = None) -> torch.Tensor:  # fmt: skip
        """Dequantize chunk by chunk into the scratch; one cuBLAS GEMM per chunk.

        ``overlap``: two scratch buffers, the next chunk dequantized on a side stream while
        the current chunk's GEMM runs (stream fork/join: capturable in a CUDA graph).
        """
        t = self.t
        rows = chunk_n or self.chunk_n
        if out is None:
            out = torch.empty(x.shape[0], t.size_n, dtype=t.act_dtype, device=x.device)
        chunks = [(n0, n1, min(n1, t.size_n)) for n0, n1 in self.chunks(rows) if n0 < t.size_n]
        if not overlap or len(chunks) == 1:
            (buf,) = self.buf.scratch_views(1, rows, t.size_k, t.act_dtype)
            for n0, n1, e in chunks:
                self._dequant(n0, n1, buf, epilogue)
                self._gemm(x, buf[: e - n0], out, n0, e, epilogue)
            return out
        bufs = self.buf.scratch_views(2, rows, t.size_k, t.act_dtype)
        main = torch.cuda.current_stream()
        if self.buf.side is None:
            self.buf.side = torch.cuda.Stream(device=x.device)
        side = self.buf.side
        side.wait_stream(main)
        ready = [torch.cuda.Event() for _ in chunks]
        free = [torch.cuda.Event() for _ in chunks]
        for i, (n0, n1, e) in enumerate(chunks):
            buf = bufs[i % 2]
            with torch.cuda.stream(side):
                if i >= 2:
                    side.wait_event(free[i - 2])
                self._dequant(n0, n1, buf, epilogue, side)
                ready[i].record(side)
            main.wait_event(ready[i])
            self._gemm(x, buf[: e - n0], out, n0, e, epilogue)
            free[i].record(main)
        main.wait_stream(side)
        return out

    # ------------------------------------------------------------------ dispatch

    def path_for(self, m: int) -> str:
        for upper, path in self.dispatch:
            if m <= upper:
                return path
        return "prefill"

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """Dispatch: "gemv", "gemv_ws", "marlin", "prefill[@<MiB>M]", "prefill_overlap[@<MiB>M]".

        "gemv_ws" is the gemv with round 3's end (splits summed through the global workspace),
        selected for the call through the process-wide loader (a benchmark's switch, not
        thread-safe: the version for the series takes the end per call)."""
        path = self.path_for(x.shape[0])
        if path == "gemv" and x.shape[0] <= MAX_GEMV_M:
            return self.gemv(x)
        if path == "gemv_ws" and x.shape[0] <= MAX_GEMV_M:
            with self.k.using(Kernels.COPY_WS):
                return self.gemv(x)
        if path == "marlin" and self.marlin is not None:
            return self.marlin(x)
        kind, _, budget = path.partition("@")
        rows = self.rows_for(int(budget[:-1]) << 20) if budget else None
        return self.prefill(x, overlap=kind == "prefill_overlap", chunk_n=rows)


# ---------------------------------------------------------------------- for torch.compile

# Layers reachable from ``torch.ops.fp4k.linear`` by an integer handle: the op's arguments
# must be tensors and plain values, so a layer is registered once and the graph holds its
# handle (a constant). The kernels run through ctypes, which torch.compile cannot trace: the
# op is opaque to it, with a fake implementation that gives the output's shape and dtype.
_LAYERS: dict[int, tuple[Callable[[torch.Tensor], torch.Tensor], int]] = {}


def register(layer: Callable[[torch.Tensor], torch.Tensor], size_n: int) -> int:
    """A handle for ``torch.ops.fp4k.linear`` (the layer stays registered for the process)."""
    handle = len(_LAYERS)
    _LAYERS[handle] = (layer, size_n)
    return handle


@torch.library.custom_op("fp4k::linear", mutates_args=())
def linear(x: torch.Tensor, handle: int) -> torch.Tensor:
    """The registered layer applied to ``x`` [M, K]: a new [M, N] tensor of x's dtype."""
    return _LAYERS[handle][0](x)


@linear.register_fake
def _linear_fake(x: torch.Tensor, handle: int) -> torch.Tensor:
    return x.new_empty(x.shape[0], _LAYERS[handle][1])


class Fp4Module(torch.nn.Module):
    """An ``Fp4Linear`` (its dispatch) as a module whose forward torch.compile(fullgraph=True)
    and CUDA graphs take whole: one ``fp4k::linear`` call."""

    def __init__(self, lin: Fp4Linear) -> None:
        super().__init__()
        self.lin = lin
        self.handle = register(lin, lin.t.size_n)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.fp4k.linear(x, self.handle)
