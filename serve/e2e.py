"""End to end on one CUDA host (issue 13): the patched pin serves the NVFP4 checkpoints of
serve/make_checkpoints.py through SGLang's real engine; writes e2e.json and e2e.md.

What it measures, per checkpoint (models dense / dense-bias / moe x formats compressed-tensors /
modelopt x dtype float16 / bfloat16), each NVFP4 checkpoint and its exact dequantized reference
served by the same ``sglang.Engine`` with the same settings (SM90 defaults: Marlin chosen
automatically, CUDA graphs on):
  - held-out perplexity from ``input_token_logprobs`` (``return_logprob=True,
    logprob_start_len=0``, ``max_new_tokens=0``) over windows of heldout.txt;
  - teacher-forced top-1 agreement: the reference's greedy continuations (``--prompts`` x
    ``--new-tokens``) scored under both engines (``top_logprobs_num=1``); the fraction of
    continuation positions where both engines' top-1 tokens agree;
  - decode tokens/s and time per output token at ``--speed-batches``, and a ``--prefill-tokens``
    prefill (``--speed-dtypes`` only); the weight memory the scheduler reports after load
    (``get_server_info()["internal_states"][0]["memory_usage"]["weight"]``, GB = 2**30 bytes,
    two decimals), beside the checkpoint's bytes on disk;
  - the unquantized bf16 checkpoint's perplexity (ungated: the quantization error itself);
and once each: ``python -m sglang.launch_server`` on 127.0.0.1 asked by the ``openai`` client
(``/v1/completions``, temperature 0; then again with ``--fp4-gemm-backend marlin``), and the
negative control (the bare pin on a separate PYTHONPATH must refuse the ModelOpt checkpoint with
its minimum-capability error).

With ``--parallel`` on a host with two GPUs, the bf16 NVFP4 checkpoints are also served across
both (``tp_size=2``; the MoE also ``ep_size=2``) and scored like the one-GPU cases, against the
one-GPU NVFP4 run of the same checkpoint (its perplexity and top-1 ids over the same text, which
that case unit recorded); and ``dense-large`` decodes at batch 1 and 32 with ``tp_size=2`` beside
its one-GPU speed unit. NVLink multicast stays off in every worker and what it starts
(``NO_MULTICAST_ENV``).

How it runs: the work is cut into units (``negative``, ``case/MODEL/FORMAT/DTYPE``,
``unquantized/MODEL/DTYPE``, ``http/auto``, ``http/marlin``, ``speed/MODEL/VARIANT``; with
``--parallel`` ``parallel/FORMAT/MODEL/tp2|ep2``; ``plan`` lists them). Each unit
runs in its own worker process (serve/e2e_engine.py, the only code that imports SGLang), up to
``--workers`` at a time, so that a crashing engine (SGLang kills its whole process tree when a
child fails) costs one unit. Engines start in parallel (the speed models' one at a time, so
that each reports its own memory); timed work holds an exclusive GPU lock, and the speed
measurements also wait until no other engine is starting. A speed model's variants are timed in
alternation (``Rounds``: ``--speed-repeats`` rounds, each variant once per round, the order
rotated every round) while their engines stay up, idle ones asleep. Every unit writes its
results as it goes, and e2e.json / e2e.md are rewritten whenever a unit reports, so a run cut
short (``--deadline``, SIGINT from scripts/gpu-proof.sh, a lost machine) leaves a valid,
incomplete report. Results are kept under ``--work``: running the same command again skips the
units that are done (``--fresh`` forgets them); settings or checkpoint changes invalidate them.

Usually run as the ``e2e`` stage: ``scripts/gpu-proof.sh --stages e2e`` (it builds the Marlin
JIT modules first, puts the patched tree on PYTHONPATH, sets FP4SERIES_ACT_FALLBACK when the
pin's activation module does not build, and exports FP4SERIES_PIN_TREE and
FP4SERIES_DEADLINE_EPOCH). Extra options for the stage come from ``$FP4SERIES_E2E_ARGS``.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import fnmatch
import hashlib
import importlib.metadata
import importlib.util
import json
import math
import os
import re
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import time
import tomllib
import zipfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
if str(ROOT / "src") not in sys.path:
    sys.path.insert(0, str(ROOT / "src"))

from fp4series import report as report_mod  # noqa: E402

MODELS = report_mod.E2E_MODELS
DTYPES = report_mod.DTYPES
FORMATS = {  # format -> (NVFP4 checkpoint folder, its dequantized reference)
    "compressed-tensors": ("ct-nvfp4", "reference-ct"),
    "modelopt": ("modelopt-nvfp4", "reference-modelopt"),
}
assert tuple(FORMATS) == report_mod.E2E_FORMATS
# Speed models (random weights, make_checkpoints.py --models dense-large,moe-large): each
# checkpoint in its own engine; a speed row puts a format's NVFP4 and FP8 (W8A8, SGLang's
# native Hopper path) beside the bf16 model. A full run plans LARGE_MODELS; --speed-models
# plans others too (dense-8b: Llama-3.1-8B's 32 layers, five checkpoints of 34 GiB).
LARGE_MODELS = report_mod.E2E_LARGE_MODELS
SPEED_MODELS = report_mod.E2E_SPEED_MODELS
LARGE_FORMATS = {  # format -> (NVFP4 checkpoint folder, FP8 checkpoint folder)
    "modelopt": ("modelopt-nvfp4", "modelopt-fp8"),
    "compressed-tensors": ("ct-nvfp4", "ct-fp8"),
}
LARGE_VARIANTS = ("bf16", "modelopt-nvfp4", "modelopt-fp8", "ct-nvfp4", "ct-fp8")
HTTP_RUNS = {  # unit -> (model, format, --fp4-gemm-backend or None)
    "http/auto": ("dense", "compressed-tensors", None),
    "http/marlin": ("moe", "modelopt", "marlin"),
}
# Two GPUs (--parallel): unit suffix -> (tp_size, ep_size); each accuracy unit compares with
# the one-GPU case unit of its checkpoint, the speed unit with the one-GPU speed unit.
PARALLEL_LAYOUTS = {"tp2": (2, 1), "ep2": (2, 2)}
PARALLEL_GPUS = 2
# NVLink multicast (NVLS) off in every worker and in every process the engine starts (they
# inherit the worker's environment): on a shared host it can take the GPUs down.
NO_MULTICAST_ENV = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}
NEGATIVE = ("dense", "modelopt")  # the bare pin: ModelOptFp4Config.get_min_capability() == 100
HTTP_PROMPT = "def parse_args(argv=None):\n    parser = argparse.ArgumentParser("
WORKER = [sys.executable, str(HERE / "e2e_engine.py")]  # + job file (tests replace it)
ENV_ARGS = "FP4SERIES_E2E_ARGS"
ENV_DEADLINE = "FP4SERIES_DEADLINE_EPOCH"
ENV_PIN_TREE = "FP4SERIES_PIN_TREE"
MARLIN_PATTERNS = (
    "through FP4 Marlin",  # patches 6 and 7: the scheme serving an NVFP4 layer
    "fp4-gemm-backend=marlin",  # patch 5: auto picks marlin below SM100
)
DIST_VERSIONS = ("torch", "triton", "transformers", "tokenizers", "sglang-kernel",
                 "flashinfer-python", "apache-tvm-ffi", "openai", "safetensors",
                 "compressed-tensors", "nvidia-modelopt")  # fmt: skip
# How units measure beyond their settings; raise it when that changes, so that a resumed --work
# redoes the units instead of keeping records measured the old way (2: speed engines start
# alone and take turns, Rounds).
METHOD = 2
START = time.time()


def log(msg: str) -> None:
    print(f"[e2e {time.time() - START:6.0f}s] {msg}", flush=True)


# --------------------------------------------------------------------------- settings


def engine_kwargs(
    settings: Mapping[str, Any], model_path: str, dtype: str, tp_size: int = 1, ep_size: int = 1
) -> dict[str, Any]:
    """``sglang.Engine(**kwargs)``: ServerArgs field names of the pin (v0.5.11 server_args.py).
    ``tp_size`` / ``ep_size`` appear only above 1, so one-GPU engines keep the defaults."""
    kw: dict[str, Any] = {
        "model_path": model_path,
        "dtype": dtype,
        "log_level": "info",  # the scheduler's load and backend lines land in the unit's log
        "random_seed": 0,
        # several engines are alive at once (up to --workers); an idle one waits on its
        # sockets instead of spinning a CPU core, so a timed engine does not share the host
        # with others' busy loops (it wakes on a request; a running batch never sleeps)
        "sleep_on_idle": True,
    }
    if tp_size > 1:
        kw["tp_size"] = tp_size
    if ep_size > 1:
        kw["ep_size"] = ep_size  # the pin needs ep_size * moe_dp_size == tp_size
    if settings.get("attention_backend"):
        kw["attention_backend"] = settings["attention_backend"]
    for key in ("max_total_tokens", "cuda_graph_max_bs", "mem_fraction_static"):
        if settings.get(key) is not None:
            kw[key] = settings[key]
    if settings.get("disable_piecewise_cuda_graph"):
        kw["disable_piecewise_cuda_graph"] = True
    return kw


def server_command(
    settings: Mapping[str, Any], model_path: str, dtype: str, port: int, backend: str | None
) -> list[str]:
    """``python -m sglang.launch_server`` with the engine settings above, as CLI flags."""
    kw = engine_kwargs(settings, model_path, dtype)
    cmd = [sys.executable, "-m", "sglang.launch_server", "--host", "127.0.0.1",
           "--port", str(port)]  # fmt: skip
    for key, value in kw.items():
        if key == "random_seed":
            continue
        flag = "--" + key.replace("_", "-")
        cmd += [flag] if value is True else [flag, str(value)]
    if backend:
        cmd += ["--fp4-gemm-backend", backend]
    return cmd


def choose_attention_backend(requested: str, fa3_available: bool) -> str | None:
    """``auto``: the engine's own default (FA3 on SM90) when FA3 is there, else triton, which
    the minimal wheelhouse serves (serve/README.md). None means: let the engine choose."""
    if requested != "auto":
        return requested
    return None if fa3_available else "triton"


def fa3_available() -> bool:
    """Whether sgl_kernel carries FlashAttention-3 (``flash_ops``), without importing it."""
    spec = importlib.util.find_spec("sgl_kernel")
    if spec is None or not spec.submodule_search_locations:
        return False
    folder = Path(next(iter(spec.submodule_search_locations)))
    return any(folder.glob("flash_ops*.so"))


def settings_from_args(args: argparse.Namespace) -> dict[str, Any]:
    backend = choose_attention_backend(args.attention_backend, fa3_available())
    return {
        "attention_backend": backend,
        "max_total_tokens": args.max_total_tokens,
        "cuda_graph_max_bs": args.cuda_graph_max_bs,
        "mem_fraction_static": args.mem_fraction_static,
        "disable_piecewise_cuda_graph": args.disable_piecewise_cuda_graph,
        "ppl_windows": args.ppl_windows,
        "ppl_window_tokens": args.ppl_window_tokens,
        "prompts": args.prompts,
        "prompt_tokens": args.prompt_tokens,
        "new_tokens": args.new_tokens,
        "speed_dtypes": sorted(set(args.speed_dtypes.split(","))),
        "speed_batches": [int(b) for b in args.speed_batches.split(",")],
        "speed_new_tokens": args.speed_new_tokens,
        "speed_prompt_tokens": args.speed_prompt_tokens,
        "prefill_tokens": args.prefill_tokens,
        "speed_repeats": args.speed_repeats,
        "large_batches": [int(b) for b in args.large_batches.split(",")],
        "large_prefill_tokens": [int(t) for t in args.large_prefill_tokens.split(",")],
        "http_max_tokens": args.http_max_tokens,
        "http_ready_timeout": args.http_ready_timeout,
    }


# --------------------------------------------------------------------------- units


@dataclass
class Unit:
    id: str
    kind: str  # negative | case | unquantized | http | speed | parallel
    spec: dict[str, Any] = field(default_factory=dict)


def plan_units(
    ckpt: Path,
    settings: Mapping[str, Any],
    pin_tree: str | None,
    parallel: bool = False,
    speed_models: Sequence[str] = LARGE_MODELS,
) -> list[Unit]:
    """Every unit of a full run, in the order they start (the cheap negative control first;
    the first cases cover both dtypes, so the engine's JIT kernels build in parallel).
    ``parallel``: the two-GPU units too, last (each needs its one-GPU unit done first);
    ``speed_models``: whose speed units are planned."""
    units = [Unit("negative", "negative", {
        "path": str(ckpt / NEGATIVE[0] / FORMATS[NEGATIVE[1]][0]), "model": NEGATIVE[0],
        "format": NEGATIVE[1], "dtype": "bfloat16", "pin_tree": pin_tree})]  # fmt: skip
    for model in MODELS:
        for dtype in DTYPES:
            for fmt, (nv, ref) in FORMATS.items():
                units.append(Unit(f"case/{model}/{fmt}/{dtype}", "case", {
                    "model": model, "format": fmt, "dtype": dtype,
                    "nvfp4": str(ckpt / model / nv), "reference": str(ckpt / model / ref),
                    "speed": dtype in settings["speed_dtypes"]}))  # fmt: skip
        for dtype in DTYPES:
            units.append(Unit(f"unquantized/{model}/{dtype}", "unquantized", {
                "model": model, "dtype": dtype, "path": str(ckpt / model / "bf16")}))  # fmt: skip
    for uid, (model, fmt, backend) in HTTP_RUNS.items():
        units.append(Unit(uid, "http", {
            "model": model, "format": fmt, "dtype": "bfloat16", "backend": backend,
            "path": str(ckpt / model / FORMATS[fmt][0])}))  # fmt: skip
    for model in speed_models:  # last: each waits for a quiet GPU
        for variant in LARGE_VARIANTS:
            units.append(Unit(f"speed/{model}/{variant}", "speed", {
                "model": model, "variant": variant, "dtype": "bfloat16",
                "path": str(ckpt / model / variant)}))  # fmt: skip
    if parallel:
        units += plan_parallel(ckpt)
    return units


def plan_parallel(ckpt: Path) -> list[Unit]:
    """The two-GPU units: each bf16 NVFP4 checkpoint of the trained models with tp_size=2 (the
    MoE also with ep_size=2), then dense-large's NVFP4 checkpoints decoding with tp_size=2.
    ``after`` names the one-GPU unit whose recorded results a unit is compared with."""
    dtype = report_mod.E2E_PARALLEL_DTYPE
    units = []
    for model, tp, ep in report_mod.E2E_PARALLEL_RUNS:
        layout = next(k for k, v in PARALLEL_LAYOUTS.items() if v == (tp, ep))
        for fmt, (nv, ref) in FORMATS.items():
            units.append(Unit(f"parallel/{fmt}/{model}/{layout}", "parallel", {
                "measure": "accuracy", "model": model, "format": fmt, "dtype": dtype,
                "tp_size": tp, "ep_size": ep, "nvfp4": str(ckpt / model / nv),
                "reference": str(ckpt / model / ref),
                "after": f"case/{model}/{fmt}/{dtype}"}))  # fmt: skip
    model, tp = report_mod.E2E_PARALLEL_SPEED_MODEL, report_mod.E2E_PARALLEL_SPEED_TP
    layout = next(k for k, v in PARALLEL_LAYOUTS.items() if v == (tp, 1))
    for fmt, (nv, _fp8) in LARGE_FORMATS.items():
        units.append(Unit(f"parallel/{fmt}/{model}/{layout}", "parallel", {
            "measure": "speed", "model": model, "format": fmt, "variant": nv,
            "dtype": "bfloat16", "tp_size": tp, "ep_size": 1, "path": str(ckpt / model / nv),
            "batches": list(report_mod.E2E_PARALLEL_DECODE_BATCHES),
            "after": f"speed/{model}/{nv}"}))  # fmt: skip
    return units


def with_dependencies(todo: Sequence[Unit], planned: Sequence[Unit], done: set[str]) -> list[Unit]:
    """``todo`` plus the one-GPU units its parallel units compare with that are neither done
    nor chosen, in plan order (``--only parallel`` on a host without the one-GPU results)."""
    chosen = {u.id for u in todo}
    need = {u.spec["after"] for u in todo if u.spec.get("after")} - done - chosen
    return [u for u in planned if u.id in chosen or u.id in need]


def worker_env(env: Mapping[str, str]) -> dict[str, str]:
    """The environment of a worker: ``env`` with NVLink multicast off, whatever it said."""
    return {**env, **NO_MULTICAST_ENV}


def gpu_count() -> int:
    """``torch.cuda.device_count()`` of this host, asked in a child process (this one never
    initialises CUDA before it starts the workers); 0 when torch cannot say."""
    code = "import torch; print(torch.cuda.device_count())"
    try:
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              timeout=300)  # fmt: skip
        return int(proc.stdout.strip().splitlines()[-1]) if proc.returncode == 0 else 0
    except (OSError, ValueError, IndexError, subprocess.TimeoutExpired):
        return 0


def parallel_refusal(gpus: int) -> str:
    return (
        f"--parallel: this host has {gpus} CUDA GPU(s) (torch.cuda.device_count()); the "
        f"parallel units (tp_size=2, ep_size=2) need {PARALLEL_GPUS}. Run them on a CUDA host "
        f"with {PARALLEL_GPUS} GPUs (serve/gpu-host.sh --parallel), or leave --parallel out; "
        "--gpus N states the count where torch does not see it"
    )


def select_units(units: Sequence[Unit], only: str | None) -> list[Unit]:
    """``--only``: comma list of unit ids or fnmatch patterns; a bare prefix (``case``,
    ``case/moe``) selects what lies under it. ValueError when a pattern selects nothing."""
    if not only:
        return list(units)
    chosen: list[Unit] = []
    for pattern in (p.strip() for p in only.split(",") if p.strip()):
        hits = [
            u for u in units
            if fnmatch.fnmatchcase(u.id, pattern) or u.id.startswith(pattern.rstrip("/") + "/")
        ]  # fmt: skip
        if not hits:
            raise ValueError(f"--only {pattern!r} selects no unit (see `serve/e2e.py plan`)")
        chosen += [u for u in hits if u not in chosen]
    return [u for u in units if u in chosen]


def fingerprint(folder: str | Path) -> str:
    """Names, sizes and mtimes of a checkpoint's files: a remade checkpoint changes it."""
    h = hashlib.sha256()
    path = Path(folder)
    if path.is_dir():
        for f in sorted(path.iterdir()):
            if f.is_file():
                st = f.stat()
                h.update(f"{f.name}\0{st.st_size}\0{st.st_mtime_ns}\0".encode())
    else:
        h.update(b"absent")
    return h.hexdigest()[:16]


def unit_hash(unit: Unit, settings: Mapping[str, Any]) -> str:
    """What a unit's results depend on: the settings, the engine keywords they give, how units
    measure (``METHOD``) and its checkpoints' fingerprints."""
    folders = [unit.spec[k] for k in ("path", "nvfp4", "reference") if unit.spec.get(k)]
    engine = engine_kwargs(settings, "", unit.spec.get("dtype", ""))
    blob = json.dumps([unit.id, unit.spec, dict(settings), engine, METHOD,
                       [fingerprint(f) for f in folders]], sort_keys=True, default=str)  # fmt: skip
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


# --------------------------------------------------------------------------- tokens


def token_sets(ids: Sequence[int], settings: Mapping[str, Any]) -> dict[str, Any]:
    """Disjoint slices of the held-out ids: perplexity windows, agreement prompts, the speed
    prompts (the largest batch), the prefill prompt and the speed models' prefill prompts."""
    n, length = settings["ppl_windows"], settings["ppl_window_tokens"]
    p, plen = settings["prompts"], settings["prompt_tokens"]
    batches = [*settings["speed_batches"], *settings.get("large_batches", [])]
    b, blen = max(batches), settings["speed_prompt_tokens"]
    large = list(settings.get("large_prefill_tokens", []))
    need = n * length + p * plen + b * blen + settings["prefill_tokens"] + sum(large)
    if len(ids) < need:
        raise ValueError(
            f"held-out text has {len(ids)} tokens; these settings need {need} "
            "(fewer --ppl-windows, or a larger corpus in make_checkpoints.py)"
        )
    ids = list(ids)
    out: dict[str, Any] = {}
    pos = 0
    for key, count, size in (("ppl", n, length), ("prompts", p, plen), ("speed", b, blen)):
        out[key] = [ids[pos + i * size : pos + (i + 1) * size] for i in range(count)]
        pos += count * size
    out["prefill"] = ids[pos : pos + settings["prefill_tokens"]]
    pos += settings["prefill_tokens"]
    out["prefill_large"] = {}
    for size in large:
        out["prefill_large"][str(size)] = ids[pos : pos + size]
        pos += size
    return out


def heldout_ids(tokenizer_json: Path, heldout: Path) -> list[int]:
    """The held-out text as make_checkpoints.py tokenized it (no special tokens added)."""
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(tokenizer_json)).encode(heldout.read_text()).ids


# --------------------------------------------------------------------------- metrics (pure)


def _logprob(entry: Any) -> float | None:
    """One ``input_token_logprobs`` entry: (logprob, token_id, text) or its list form."""
    if entry is None:
        return None
    value = entry[0] if isinstance(entry, list | tuple) else entry
    return None if value is None else float(value)


def nll_of(input_token_logprobs: Sequence[Any]) -> tuple[float, int]:
    """(summed negative log-likelihood, tokens) of one request; the first token has no
    logprob (None) and is not scored."""
    values = [_logprob(e) for e in input_token_logprobs]
    scored = [v for v in values if v is not None]
    if any(not math.isfinite(v) for v in scored):
        return math.inf, len(scored)
    return -sum(scored), len(scored)


def perplexity(parts: Sequence[Sequence[float]]) -> tuple[float | None, int]:
    """exp(total nll / total tokens) over (nll, tokens) parts; None if nothing was scored or
    a value is not finite."""
    nll = sum(p[0] for p in parts)
    count = int(sum(p[1] for p in parts))
    if count == 0 or not math.isfinite(nll):
        return None, count
    return math.exp(nll / count), count


def top1_of(input_top_logprobs: Sequence[Any], start: int) -> list[int | None]:
    """The top-1 token id at every position from ``start`` on (``input_top_logprobs[i]`` is
    the distribution that predicts token i; entry i holds [(logprob, id, text)])."""
    out: list[int | None] = []
    for entry in list(input_top_logprobs)[start:]:
        if not entry:
            out.append(None)
            continue
        first = entry[0]
        out.append(int(first[1]) if isinstance(first, list | tuple) else None)
    return out


def agreement(a: Sequence[Sequence[Any]], b: Sequence[Sequence[Any]]) -> tuple[float | None, int]:
    """Fraction of positions where two engines' top-1 ids agree (a None never agrees)."""
    same = total = 0
    if len(a) != len(b):
        raise ValueError(f"{len(a)} vs {len(b)} sequences")
    for x, y in zip(a, b, strict=True):
        if len(x) != len(y):
            raise ValueError(f"sequence lengths differ: {len(x)} vs {len(y)}")
        total += len(x)
        same += sum(1 for i, j in zip(x, y, strict=True) if i is not None and i == j)
    return (same / total if total else None), total


def decode_rate(batch: int, new_tokens: int, full: Sequence[float], one: Sequence[float]) -> dict:
    """Decode throughput from wall times of the same batch with ``new_tokens`` and with 1 new
    token (medians): the difference is ``new_tokens - 1`` decode steps."""
    if not full or not one or new_tokens < 2:
        return {"tok_s": None, "ms_per_token": None}
    steps = statistics.median(full) - statistics.median(one)
    if steps <= 0:
        return {"tok_s": None, "ms_per_token": None}
    return {
        "tok_s": batch * (new_tokens - 1) / steps,
        "ms_per_token": 1000.0 * steps / (new_tokens - 1),
    }


def ratio_range(times: Sequence[float] | None, base: Sequence[float] | None) -> list[float] | None:
    """[min, max] of the per-round speed ratios (``base[r] / times[r]``) of two variants timed
    in the same rounds (``Rounds``), over the rounds both finished (a run stopped mid-round)."""
    n = min(len(times or []), len(base or []))
    pairs = list(zip((times or [])[:n], (base or [])[:n], strict=True))
    if not pairs or min(min(p) for p in pairs) <= 0:
        return None
    ratios = [b / t for t, b in pairs]
    return [_round(min(ratios), 3), _round(max(ratios), 3)]


def prefill_rate(tokens: int, times: Sequence[float]) -> dict:
    if not times:
        return {"tok_s": None, "ms": None}
    t = statistics.median(times)
    return {"tok_s": tokens / t if t > 0 else None, "ms": 1000.0 * t}


def weight_gib(server_info: Mapping[str, Any]) -> dict[str, Any]:
    """The scheduler's memory numbers after load (GB of 2**30 bytes, rounded to 0.01)."""
    states = server_info.get("internal_states") or [{}]
    usage = (states[0] if isinstance(states, list) and states else {}).get("memory_usage") or {}
    return {
        "weight_gib": usage.get("weight"),
        "kvcache_gib": usage.get("kvcache"),
        "graph_gib": usage.get("graph"),
        "token_capacity": usage.get("token_capacity"),
    }


def checkpoint_gib(folder: str | Path) -> float | None:
    path = Path(folder)
    files = list(path.glob("*.safetensors")) if path.is_dir() else []
    return sum(f.stat().st_size for f in files) / 2**30 if files else None


def marlin_evidence(text: str, limit: int = 4) -> list[str]:
    """Log lines saying that an NVFP4 layer is served through FP4 Marlin."""
    lines = [ln.strip() for ln in text.splitlines() if any(p in ln for p in MARLIN_PATTERNS)]
    return list(dict.fromkeys(lines))[:limit]


def refusal(output: str, returncode: int | None) -> tuple[bool, str]:
    """(refused, message) of the bare pin's attempt: refused means it did not start and said
    why in terms of the minimum capability."""
    lines = [ln.strip() for ln in output.splitlines() if "Minimum capability" in ln]
    started = "PROBE: engine started" in output
    refused = bool(lines) and not started and returncode != 0
    return refused, (lines[-1] if lines else "")


def pin_env(env: Mapping[str, str], pin_tree: str, cache: str) -> dict[str, str]:
    """The environment with the bare pin's tree instead of any sglang tree on PYTHONPATH (a
    patched wheel in site-packages is shadowed by PYTHONPATH)."""
    rest = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    rest = [p for p in rest if not (Path(p) / "sglang" / "__init__.py").is_file()]
    out = dict(env)
    out["PYTHONPATH"] = os.pathsep.join([pin_tree, *rest])
    out["TVM_FFI_CACHE_DIR"] = cache
    return out


def tail(text: str, lines: int = 40) -> str:
    return "\n".join(text.splitlines()[-lines:])


def error_lines(text: str, limit: int = 6) -> list[str]:
    """The last lines of a log that name an error (a scheduler's traceback ends in one)."""
    keys = ("Error", "Exception", "error:", "Traceback", "Killed", "FAILED")
    lines = [ln.strip() for ln in text.splitlines() if any(k in ln for k in keys)]
    return list(dict.fromkeys(lines))[-limit:]


# --------------------------------------------------------------------------- GPU gate


class Gate:
    """Cross-process locks (flock) of one run's workers:

    - ``starting()``: shared; held while an engine or server starts or shuts down;
    - ``working()``: exclusive; held while an engine does accuracy work;
    - ``quiet()``: exclusive on both, behind a turnstile so that starts queued after it wait:
      speed runs alone on the GPU, with no other engine starting, stopping or working.
    """

    def __init__(self, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.turn, self.start, self.work = (folder / f"{n}.lock" for n in ("turn", "start", "work"))

    @staticmethod
    @contextlib.contextmanager
    def _lock(path: Path, mode: int) -> Iterator[None]:
        with path.open("a") as fh:
            fcntl.flock(fh, mode)
            try:
                yield
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)

    @contextlib.contextmanager
    def starting(self, alone: bool = False) -> Iterator[None]:
        """``alone``: no other engine starts, stops or works meanwhile (exclusive, as quiet()),
        so the memory an engine reports after load (free-memory differences) is its own."""
        if alone:
            with self.quiet():
                yield
            return
        with self._lock(self.turn, fcntl.LOCK_EX):
            pass
        with self._lock(self.start, fcntl.LOCK_SH):
            yield

    @contextlib.contextmanager
    def working(self) -> Iterator[None]:
        with self._lock(self.work, fcntl.LOCK_EX):
            yield

    @contextlib.contextmanager
    def quiet(self) -> Iterator[None]:
        with (
            self._lock(self.turn, fcntl.LOCK_EX),
            self._lock(self.start, fcntl.LOCK_EX),
            self._lock(self.work, fcntl.LOCK_EX),
        ):
            yield


class Rounds:
    """The speed units of one model take turns: round ``r`` times every variant once, in the
    roster's order rotated by ``r``, so that a drift of the host or the GPU over the run falls
    on every variant alike instead of on the ones timed last.

    Files in ``folder`` (``locks/rounds/MODEL.K``, written by the runner as it starts the
    variants together): ``roster.json`` (those variants, in order, and when they started: the
    rounds' id), ``VARIANT.alive`` (locked by its worker for its whole life), ``VARIANT.hello``
    (written once that lock is held), ``VARIANT.gone`` (written by the runner when the unit
    ends), ``R.VARIANT.done`` (its turn of round R is over). A variant whose worker has ended
    (gone, or hello written and lock free), or that has not said hello within ``hello_wait``
    seconds of its start, is passed over: a failed engine costs its own rows only.
    """

    def __init__(self, folder: Path, variant: str, hello_wait: float = 300.0) -> None:
        self.folder, self.variant, self.hello_wait = folder, variant, hello_wait
        roster = read_json(folder / "roster.json") or {}
        self.roster: list[str] = list(roster.get("variants") or [variant])
        if variant not in self.roster:
            self.roster.append(variant)
        self.written = float(roster.get("written") or time.time())
        self._alive: Any = None

    @staticmethod
    def write_roster(folder: Path, variants: Sequence[str]) -> None:
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        write_json(folder / "roster.json", {"variants": list(variants), "written": time.time()})

    @staticmethod
    def mark_gone(folder: Path, variant: str) -> None:
        if folder.is_dir():
            (folder / f"{variant}.gone").touch()

    def join(self) -> None:
        """Hold this worker's alive lock until it exits, then say hello."""
        self.folder.mkdir(parents=True, exist_ok=True)
        self._alive = (self.folder / f"{self.variant}.alive").open("a")
        fcntl.flock(self._alive, fcntl.LOCK_EX)
        (self.folder / f"{self.variant}.hello").write_text(str(os.getpid()))

    def order(self, rnd: int) -> list[str]:
        k = rnd % len(self.roster)
        return self.roster[k:] + self.roster[:k]

    def _gone(self, variant: str) -> bool:
        if (self.folder / f"{variant}.gone").exists():
            return True
        if not (self.folder / f"{variant}.hello").exists():
            return time.time() > self.written + self.hello_wait
        with (self.folder / f"{variant}.alive").open("a") as fh:
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return False
            fcntl.flock(fh, fcntl.LOCK_UN)
            return True

    def wait_turn(self, rnd: int, poll: float = 0.05) -> None:
        """Until every earlier turn (rounds before ``rnd``, then the variants before this one
        in round ``rnd``) is done or its variant gone."""
        before = [(r, v) for r in range(rnd) for v in self.order(r)]
        mine = self.order(rnd)
        before += [(rnd, v) for v in mine[: mine.index(self.variant)]]
        while True:
            left = [(r, v) for r, v in before if not (self.folder / f"{r}.{v}.done").exists()]
            if all(self._gone(v) for v in {v for _, v in left}):
                return
            time.sleep(poll)

    def done(self, rnd: int) -> None:
        (self.folder / f"{rnd}.{self.variant}.done").touch()


# --------------------------------------------------------------------------- report (pure)


def _round(value: Any, digits: int = 6) -> Any:
    return round(value, digits) if isinstance(value, float) and math.isfinite(value) else value


def _agree(a: Any, b: Any) -> tuple[float | None, int]:
    """agreement() of two recorded lists, or (None, 0) where one is missing or they differ in
    shape (a partial record)."""
    if not a or not b:
        return None, 0
    try:
        return agreement(a, b)
    except ValueError:
        return None, 0


def assemble_case(unit: Mapping[str, Any]) -> dict[str, Any]:
    """A ``cases`` row from a case unit's record (partial records give a partial row)."""
    spec, data = unit.get("spec", {}), unit.get("data") or {}
    ref, nv = data.get("reference") or {}, data.get("nvfp4") or {}
    ppl_ref, n_ref = perplexity(ref.get("ppl_parts") or [])
    ppl_nv, n_nv = perplexity(nv.get("ppl_parts") or [])
    top1, n_agree = _agree(ref.get("top1"), nv.get("top1"))
    self_ref, _ = _agree(ref.get("top1"), ref.get("greedy"))
    self_nv, _ = _agree(nv.get("top1"), ref.get("greedy"))
    case = {
        "format": spec.get("format"),
        "model": spec.get("model"),
        "dtype": spec.get("dtype"),
        "ppl_nvfp4": _round(ppl_nv),
        "ppl_reference": _round(ppl_ref),
        "ppl_rel_diff": _round(ppl_nv / ppl_ref - 1.0) if ppl_nv and ppl_ref else None,
        "top1_agreement": _round(top1),
        "tokens_scored": min(n_ref, n_nv) if n_ref and n_nv else (n_ref or n_nv or None),
        "agreement_prompts": len(ref.get("greedy") or []) or None,
        "agreement_new_tokens": len((ref.get("greedy") or [[]])[0]) or None,
        "agreement_tokens": n_agree or None,
        "reference_top1_is_its_greedy": _round(self_ref),
        "nvfp4_top1_is_reference_greedy": _round(self_nv),
        "marlin_log": nv.get("marlin_log") or [],
        "engine_start_s": {k: v.get("start_s") for k, v in (("reference", ref), ("nvfp4", nv))},
        "checkpoint": spec.get("nvfp4"),
        "reference": spec.get("reference"),
        "status": unit.get("status"),
    }
    if unit.get("status") != "done":
        case["error"] = unit.get("error") or f"unit {unit.get('status')}"
    return case


def speed_rows(unit: Mapping[str, Any]) -> list[dict[str, Any]]:
    spec, data = unit.get("spec", {}), unit.get("data") or {}
    ref, nv = (data.get(k, {}).get("speed") or {} for k in ("reference", "nvfp4"))
    if not ref or not nv:
        return []
    rows = []
    base = {"format": spec.get("format"), "model": spec.get("model"), "dtype": spec.get("dtype")}
    for batch in sorted(set(ref.get("decode", {})) & set(nv.get("decode", {})), key=int):
        r, n = ref["decode"][batch], nv["decode"][batch]
        rr = decode_rate(int(batch), r["new_tokens"], r["full"], r["one"])
        nr = decode_rate(int(batch), n["new_tokens"], n["full"], n["one"])
        rows.append({**base, "kind": "decode", "batch": int(batch),
                     "prompt_tokens": r["prompt_tokens"], "new_tokens": r["new_tokens"],
                     "nvfp4_tok_s": _round(nr["tok_s"], 1),
                     "reference_tok_s": _round(rr["tok_s"], 1),
                     "nvfp4_ms_per_token": _round(nr["ms_per_token"], 4),
                     "reference_ms_per_token": _round(rr["ms_per_token"], 4),
                     "speedup": _round(nr["tok_s"] / rr["tok_s"], 3)
                     if nr["tok_s"] and rr["tok_s"] else None})  # fmt: skip
    if ref.get("prefill") and nv.get("prefill"):
        tokens = ref["prefill"]["tokens"]
        rr, nr = (
            prefill_rate(tokens, ref["prefill"]["times"]),
            prefill_rate(tokens, nv["prefill"]["times"]),
        )
        rows.append({**base, "kind": "prefill", "batch": 1, "prompt_tokens": tokens,
                     "new_tokens": 1, "nvfp4_tok_s": _round(nr["tok_s"], 1),
                     "reference_tok_s": _round(rr["tok_s"], 1), "nvfp4_ms": _round(nr["ms"], 3),
                     "reference_ms": _round(rr["ms"], 3),
                     "speedup": _round(nr["tok_s"] / rr["tok_s"], 3)
                     if nr["tok_s"] and rr["tok_s"] else None})  # fmt: skip
    return rows


def memory_row(unit: Mapping[str, Any]) -> dict[str, Any] | None:
    spec, data = unit.get("spec", {}), unit.get("data") or {}
    ref, nv = (data.get(k, {}).get("memory") or {} for k in ("reference", "nvfp4"))
    if not ref and not nv:
        return None
    return {
        "format": spec.get("format"),
        "model": spec.get("model"),
        "dtype": spec.get("dtype"),
        "nvfp4_weight_gib": nv.get("weight_gib"),
        "reference_weight_gib": ref.get("weight_gib"),
        "nvfp4_checkpoint_gib": _round(checkpoint_gib(spec.get("nvfp4", "")), 4),
        "reference_checkpoint_gib": _round(checkpoint_gib(spec.get("reference", "")), 4),
        "source": "scheduler memory_usage.weight after load (get_server_info; GB = 2**30 "
        "bytes, 2 decimals); checkpoint: safetensors bytes on disk",
    }


def _ratio(a: Any, b: Any) -> float | None:
    return _round(a / b, 3) if a and b else None


def round_ranges(
    runs: Mapping[str, Mapping[str, Any]], times: Mapping[str, Sequence[float] | None]
) -> dict[str, list[float] | None]:
    """``nvfp4_over_reference_rounds`` / ``nvfp4_over_fp8_rounds``: the per-round range of a
    row's ratio, where NVFP4 and the other variant took turns in the same rounds (the same
    rounds id; records of earlier runs, or of another part of a resumed run, have none or
    another)."""
    ids = {key: (d.get("rounds") or {}).get("id") for key, d in runs.items()}
    return {
        f"nvfp4_over_{other}_rounds": ratio_range(times.get("nvfp4"), times.get(other))
        if ids["nvfp4"] is not None and ids["nvfp4"] == ids.get(other)
        else None
        for other in ("reference", "fp8")
    }


def large_rows(
    records: Mapping[str, Mapping[str, Any]], planned: Sequence[Unit]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """``speed_large`` and ``memory_large``: per speed model x format, its NVFP4 and FP8
    checkpoints beside the bf16 model (one engine each, the same settings)."""
    data = {
        (u.spec["model"], u.spec["variant"]): (records.get(u.id) or {}).get("data") or {}
        for u in planned
        if u.kind == "speed"
    }
    paths = {(u.spec["model"], u.spec["variant"]): u.spec["path"] for u in planned
             if u.kind == "speed"}  # fmt: skip
    speed, memory = [], []
    for model in SPEED_MODELS:
        if (model, "bf16") not in data:
            continue
        ref = data[(model, "bf16")]
        for fmt, (nv_name, fp8_name) in LARGE_FORMATS.items():
            nv, fp8 = data.get((model, nv_name), {}), data.get((model, fp8_name), {})
            base = {"format": fmt, "model": model, "dtype": "bfloat16"}
            runs = {"nvfp4": nv, "reference": ref, "fp8": fp8}
            batches = sorted({int(b) for d in runs.values()
                              for b in ((d.get("speed") or {}).get("decode") or {})})  # fmt: skip
            for batch in batches:
                row: dict[str, Any] = {**base, "kind": "decode", "batch": batch}
                steps: dict[str, list[float]] = {}  # per round: the new_tokens - 1 steps' time
                for key, d in runs.items():
                    m = ((d.get("speed") or {}).get("decode") or {}).get(str(batch))
                    rate = decode_rate(batch, m["new_tokens"], m["full"], m["one"]) if m else {}
                    if m:
                        steps[key] = [f - o for f, o in zip(m["full"], m["one"], strict=False)]
                    row[f"{key}_tok_s"] = _round(rate.get("tok_s"), 1)
                    row[f"{key}_ms_per_token"] = _round(rate.get("ms_per_token"), 4)
                    if m:
                        row["prompt_tokens"], row["new_tokens"] = (
                            m["prompt_tokens"],
                            m["new_tokens"],
                        )
                row["nvfp4_over_reference"] = _ratio(row["nvfp4_tok_s"], row["reference_tok_s"])
                row["nvfp4_over_fp8"] = _ratio(row["nvfp4_tok_s"], row["fp8_tok_s"])
                row.update(round_ranges(runs, steps))
                speed.append(row)
            sizes = sorted({int(t) for d in runs.values()
                            for t in ((d.get("speed") or {}).get("prefill") or {})})  # fmt: skip
            for tokens in sizes:
                row = {**base, "kind": "prefill", "batch": 1, "prompt_tokens": tokens}
                for key, d in runs.items():
                    m = ((d.get("speed") or {}).get("prefill") or {}).get(str(tokens))
                    rate = prefill_rate(tokens, m["times"]) if m else {}
                    row[f"{key}_tok_s"] = _round(rate.get("tok_s"), 1)
                    row[f"{key}_ms"] = _round(rate.get("ms"), 3)
                row["nvfp4_over_reference"] = _ratio(row["nvfp4_tok_s"], row["reference_tok_s"])
                row["nvfp4_over_fp8"] = _ratio(row["nvfp4_tok_s"], row["fp8_tok_s"])
                times = {key: ((d.get("speed") or {}).get("prefill") or {}).get(str(tokens), {})
                         .get("times") for key, d in runs.items()}  # fmt: skip
                row.update(round_ranges(runs, times))
                speed.append(row)
            mem = {**base}
            for key, d, name in (("nvfp4", nv, nv_name), ("reference", ref, "bf16"),
                                 ("fp8", fp8, fp8_name)):  # fmt: skip
                mem[f"{key}_weight_gib"] = (d.get("memory") or {}).get("weight_gib")
                mem[f"{key}_checkpoint_gib"] = _round(
                    checkpoint_gib(paths.get((model, name), "")), 4
                )
            mem["marlin_log"] = nv.get("marlin_log") or []
            memory.append(mem)
    return speed, memory


def assemble_parallel(unit: Mapping[str, Any]) -> dict[str, Any]:
    """A ``parallel`` record from a two-GPU accuracy unit: its perplexity and top-1 ids beside
    the one-GPU NVFP4 run's, which the unit copied from that case unit's record."""
    spec, data = unit.get("spec", {}), unit.get("data") or {}
    tp1 = data.get("tp1") or {}
    ppl_nv, n_nv = perplexity(data.get("ppl_parts") or [])
    ppl_tp1, n_tp1 = perplexity(tp1.get("ppl_parts") or [])
    top1, n_agree = _agree(tp1.get("top1"), data.get("top1"))
    rec = {
        "format": spec.get("format"),
        "model": spec.get("model"),
        "dtype": spec.get("dtype"),
        "tp_size": spec.get("tp_size"),
        "ep_size": spec.get("ep_size"),
        "ppl_nvfp4": _round(ppl_nv),
        "ppl_tp1": _round(ppl_tp1),
        "ppl_rel_diff": _round(ppl_nv / ppl_tp1 - 1.0) if ppl_nv and ppl_tp1 else None,
        "top1_agreement": _round(top1),
        "tokens_scored": min(n_nv, n_tp1) if n_nv and n_tp1 else (n_nv or n_tp1 or None),
        "agreement_tokens": n_agree or None,
        "compared_with": spec.get("after"),
        "marlin_log": data.get("marlin_log") or [],
        "engine_start_s": data.get("start_s"),
        "weight_gib": (data.get("memory") or {}).get("weight_gib"),
        "checkpoint": spec.get("nvfp4"),
        "status": unit.get("status"),
    }
    if unit.get("status") != "done":
        rec["error"] = unit.get("error") or f"unit {unit.get('status')}"
    return rec


def parallel_speed_rows(unit: Mapping[str, Any]) -> list[dict[str, Any]]:
    """``parallel_speed``: decode rates of a two-GPU speed unit beside its one-GPU unit's."""
    spec, data = unit.get("spec", {}), unit.get("data") or {}
    mine = (data.get("speed") or {}).get("decode") or {}
    theirs = (data.get("tp1") or {}).get("decode") or {}
    rows = []
    for batch in spec.get("batches") or []:
        row: dict[str, Any] = {
            "format": spec.get("format"), "model": spec.get("model"),
            "variant": spec.get("variant"), "dtype": spec.get("dtype"),
            "tp_size": spec.get("tp_size"), "kind": "decode", "batch": batch}  # fmt: skip
        for prefix, runs in (("", mine), ("tp1_", theirs)):
            m = runs.get(str(batch))
            rate = decode_rate(batch, m["new_tokens"], m["full"], m["one"]) if m else {}
            row[f"{prefix}tok_s"] = _round(rate.get("tok_s"), 1)
            row[f"{prefix}ms_per_token"] = _round(rate.get("ms_per_token"), 4)
            if m:
                row["prompt_tokens"], row["new_tokens"] = m["prompt_tokens"], m["new_tokens"]
        row["over_tp1"] = _ratio(row["tok_s"], row["tp1_tok_s"])
        row["status"] = unit.get("status")
        rows.append(row)
    return rows


def read_train_ppl(folder: str | Path) -> float | None:
    """The bf16 model's held-out perplexity by transformers (make_checkpoints' train.json)."""
    try:
        record = json.loads((Path(folder).parent / "train.json").read_text())
    except (OSError, json.JSONDecodeError):
        return None
    return (record.get("heldout_ppl") or {}).get("bf16")


def assemble_report(
    records: Mapping[str, Mapping[str, Any]],
    planned: Sequence[Unit],
    meta: Mapping[str, Any],
    settings: Mapping[str, Any],
    commands: Sequence[str],
    versions: Mapping[str, Any],
) -> dict[str, Any]:
    """e2e.json from the unit records (the checker's shape: fp4series.report.check_e2e)."""
    cases, unquantized, speed, memory = [], [], [], []
    parallel: list[dict[str, Any]] = []
    parallel_speed: list[dict[str, Any]] = []
    report: dict[str, Any] = dict(meta)
    cmds = list(commands)
    for unit in planned:
        rec = records.get(unit.id)
        if rec is None:
            continue
        data = rec.get("data") or {}
        if unit.kind == "case":
            cases.append(assemble_case(rec))
            speed += speed_rows(rec)
            row = memory_row(rec)
            if row:
                memory.append(row)
        elif unit.kind == "unquantized":
            ppl, count = perplexity(data.get("ppl_parts") or [])
            unquantized.append({
                "model": unit.spec["model"], "dtype": unit.spec["dtype"], "ppl": _round(ppl),
                "tokens_scored": count, "ppl_transformers_bf16": read_train_ppl(unit.spec["path"]),
                "weight_gib": (data.get("memory") or {}).get("weight_gib"),
                "status": rec.get("status")})  # fmt: skip
        elif unit.kind == "http":
            key = "http" if unit.id == "http/auto" else "http_marlin"
            report[key] = {**data, "status": rec.get("status"), "error": rec.get("error")}
            if data.get("ok") is None:
                report[key]["ok"] = False
        elif unit.kind == "speed":
            pass  # assembled below, per model x format (large_rows)
        elif unit.kind == "parallel":
            if unit.spec.get("measure") == "speed":
                parallel_speed += parallel_speed_rows(rec)
            else:
                parallel.append(assemble_parallel(rec))
        elif unit.kind == "negative":
            report["negative_control"] = {**data, "status": rec.get("status"),
                                          "error": rec.get("error")}  # fmt: skip
            report["negative_control"].setdefault("refused", False)
        for cmd in data.get("commands") or []:
            if cmd not in cmds:
                cmds.append(cmd)
    by_key = {(u["model"], u["dtype"]): u["ppl"] for u in unquantized}
    for case in cases:
        case["ppl_unquantized"] = by_key.get((case["model"], case["dtype"]))
    speed_large, memory_large = large_rows(records, planned)
    done = [u.id for u in planned if (records.get(u.id) or {}).get("status") == "done"]
    report.update(
        complete=len(done) == len(planned),
        commands=cmds,
        versions=dict(versions),
        settings=dict(settings),
        gates={"ppl_rel": report_mod.E2E_PPL_REL, "top1_min": report_mod.E2E_TOP1_MIN},
        cases=cases,
        unquantized=unquantized,
        speed=speed,
        memory=memory,
        speed_large=speed_large,
        memory_large=memory_large,
        units={
            u.id: {k: (records.get(u.id) or {}).get(k) for k in ("status", "seconds", "error")}
            for u in planned
        },  # fmt: skip
    )
    if any(u.kind == "parallel" for u in planned):  # absent otherwise: pending, not failed
        report["gates"].update(parallel_ppl_rel=report_mod.E2E_PARALLEL_PPL_REL,
                               parallel_top1_min=report_mod.E2E_PARALLEL_TOP1_MIN)  # fmt: skip
        report.update(parallel=parallel, parallel_speed=parallel_speed)
    return report


def _fmt(value: Any, spec: str = ".4f") -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return format(value, spec)
    return str(value)


def portable(value: Any, root: Path) -> Any:
    """The report with the repository's own folder left out of every path in it: a committed
    report names the project's files (``.work/checkpoints/...``), not the host's layout."""
    prefix = str(root).rstrip("/") + "/"
    if isinstance(value, str):
        return value.replace(prefix, "")
    if isinstance(value, list):
        return [portable(v, root) for v in value]
    if isinstance(value, dict):
        return {k: portable(v, root) for k, v in value.items()}
    return value


def render_markdown(report: Mapping[str, Any]) -> str:
    """e2e.md: the report's tables and what its check says."""
    problems: list[str] = []
    units = report.get("units") or {}
    speed_alone = bool(report_mod.e2e_speed_models_ran(units))
    if speed_alone:  # serve/gpu-host.sh --speed: checked as reports/h200/e2e-speed*/ are
        report_mod.check_e2e_speed_rerun(report, problems, f"{report_mod.E2E_SPEED_RERUN}*")
    else:
        report_mod.check_e2e(report, problems)
    rev = report.get("series_revision") or {}
    pin = report.get("pin") or {}
    out = [
        "# End to end: NVFP4 checkpoints through SGLang's engine (issue 13)",
        "",
        f"{report.get('date')} on {report.get('device')}; series `{rev.get('git')}` "
        f"(`patches/series` sha256 `{str(rev.get('series_sha256'))[:12]}…`), pin "
        f"{pin.get('tag')}; torch {report.get('torch')}; complete: {report.get('complete')}.",
        "",
        f"Command: `{report.get('command')}`",
        "",
    ]
    if problems:
        out += [f"**Check: {len(problems)} problem(s)** (`python -m fp4series check-reports`):", ""]
        out += [f"- {p}" for p in problems[:40]]
        if len(problems) > 40:
            out.append(f"- … and {len(problems) - 40} more")
    else:
        out.append("**Check: OK** (every gate of `python -m fp4series check-reports` passes)")
    if speed_alone:
        out += ["", "The speed models' units alone (`serve/gpu-host.sh --speed`); the other "
                "units were not run here and are checked in the full report."]  # fmt: skip
    gates = report.get("gates") or {}
    out += ["", f"## Accuracy (gates: perplexity within {_fmt(gates.get('ppl_rel'), '.0%')} of the "
            f"reference, top-1 agreement >= {_fmt(gates.get('top1_min'), '.0%')})", "",
            "| format | model | dtype | ppl NVFP4 | ppl reference | diff | ppl bf16 (unquantized) "
            "| top-1 agreement | tokens (ppl / top-1) | status |",
            "|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for c in report.get("cases") or []:
        out.append(
            f"| {c.get('format')} | {c.get('model')} | {c.get('dtype')} | "
            f"{_fmt(c.get('ppl_nvfp4'))} | {_fmt(c.get('ppl_reference'))} | "
            f"{_fmt(c.get('ppl_rel_diff'), '+.3%')} | "
            f"{_fmt(c.get('ppl_unquantized'))} | {_fmt(c.get('top1_agreement'), '.4f')} | "
            f"{_fmt(c.get('tokens_scored'))} / {_fmt(c.get('agreement_tokens'))} | "
            f"{c.get('status')} |"
        )
    out += ["", "## Speed (decode: batch x new tokens after a short prompt; prefill: one prompt)",
            "", "| format | model | dtype | kind | batch | NVFP4 tok/s | reference tok/s | NVFP4 / "
            "reference | NVFP4 ms/token | reference ms/token |",
            "|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in report.get("speed") or []:
        per = ("nvfp4_ms_per_token", "reference_ms_per_token")
        if r.get("kind") == "prefill":
            per = ("nvfp4_ms", "reference_ms")
        label = r.get("batch") if r.get("kind") == "decode" else f"{r.get('prompt_tokens')} tok"
        out.append(
            f"| {r.get('format')} | {r.get('model')} | {r.get('dtype')} | {r.get('kind')} | "
            f"{label} | {_fmt(r.get('nvfp4_tok_s'), '.0f')} | "
            f"{_fmt(r.get('reference_tok_s'), '.0f')} | {_fmt(r.get('speedup'), '.2f')} | "
            f"{_fmt(r.get(per[0]), '.3f')} | "
            f"{_fmt(r.get(per[1]), '.3f')} |"
        )
    out += ["", "## Weight memory (GiB)", "",
            "| format | model | dtype | NVFP4 (engine) | reference (engine) | NVFP4 (file) | "
            "reference (file) |", "|---|---|---|---|---|---|---|"]  # fmt: skip
    for m in report.get("memory") or []:
        out.append(
            f"| {m.get('format')} | {m.get('model')} | {m.get('dtype')} | "
            f"{_fmt(m.get('nvfp4_weight_gib'), '.2f')} | "
            f"{_fmt(m.get('reference_weight_gib'), '.2f')} | "
            f"{_fmt(m.get('nvfp4_checkpoint_gib'), '.3f')} | "
            f"{_fmt(m.get('reference_checkpoint_gib'), '.3f')} |"
        )
    if report.get("memory"):
        out += ["", f"Engine: {(report['memory'][0] or {}).get('source')}."]
    out += ["", "## Speed models: NVFP4 beside bf16 and FP8 (tok/s; one engine per checkpoint)",
            "", "Rates from the median times; in brackets the lowest and highest ratio of one "
            "round (the variants of a model timed in turn, once each per round).",
            "", "| format | model | kind | batch / prompt | NVFP4 | bf16 | FP8 | NVFP4 / bf16 "
            "| NVFP4 / FP8 |", "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip

    def with_rounds(r: Mapping[str, Any], other: str) -> str:
        span = r.get(f"nvfp4_over_{other}_rounds")
        cell = _fmt(r.get(f"nvfp4_over_{other}"), ".2f")
        return f"{cell} ({span[0]:.2f}-{span[1]:.2f})" if span else cell

    for r in report.get("speed_large") or []:
        label = r.get("batch") if r.get("kind") == "decode" else f"{r.get('prompt_tokens')} tok"
        out.append(
            f"| {r.get('format')} | {r.get('model')} | {r.get('kind')} | {label} | "
            f"{_fmt(r.get('nvfp4_tok_s'), '.0f')} | {_fmt(r.get('reference_tok_s'), '.0f')} | "
            f"{_fmt(r.get('fp8_tok_s'), '.0f')} | {with_rounds(r, 'reference')} | "
            f"{with_rounds(r, 'fp8')} |"
        )
    out += ["", "Weight memory of the speed models (GiB, engine / file):", "",
            "| format | model | NVFP4 | bf16 | FP8 |", "|---|---|---|---|---|"]  # fmt: skip
    for m in report.get("memory_large") or []:
        cells = [
            f"{_fmt(m.get(k + '_weight_gib'), '.2f')} / {_fmt(m.get(k + '_checkpoint_gib'), '.2f')}"
            for k in ("nvfp4", "reference", "fp8")
        ]
        out.append(f"| {m.get('format')} | {m.get('model')} | " + " | ".join(cells) + " |")
    if report.get("parallel") is not None:
        out += ["", "## Two GPUs: tensor and expert parallel, against the one-GPU NVFP4 run "
                f"(gates: perplexity within {_fmt(gates.get('parallel_ppl_rel'), '.1%')}, "
                f"top-1 agreement >= {_fmt(gates.get('parallel_top1_min'), '.0%')})", "",
                "| format | model | dtype | tp | ep | ppl NVFP4 | ppl one GPU | diff | top-1 "
                "agreement | tokens (ppl / top-1) | status |",
                "|---|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
        for r in report["parallel"]:
            out.append(
                f"| {r.get('format')} | {r.get('model')} | {r.get('dtype')} | "
                f"{r.get('tp_size')} | {r.get('ep_size')} | {_fmt(r.get('ppl_nvfp4'))} | "
                f"{_fmt(r.get('ppl_tp1'))} | {_fmt(r.get('ppl_rel_diff'), '+.3%')} | "
                f"{_fmt(r.get('top1_agreement'), '.4f')} | {_fmt(r.get('tokens_scored'))} / "
                f"{_fmt(r.get('agreement_tokens'))} | {r.get('status')} |"
            )
        out += ["", "Decode (tok/s), one GPU and two:", "",
                "| format | model | checkpoint | batch | tp 1 | tp 2 | tp 2 / tp 1 |",
                "|---|---|---|---|---|---|---|"]  # fmt: skip
        for r in report.get("parallel_speed") or []:
            out.append(
                f"| {r.get('format')} | {r.get('model')} | {r.get('variant')} | "
                f"{r.get('batch')} | {_fmt(r.get('tp1_tok_s'), '.0f')} | "
                f"{_fmt(r.get('tok_s'), '.0f')} | {_fmt(r.get('over_tp1'), '.2f')} |"
            )
    out += ["", "## Server and negative control", ""]
    for key, what in (("http", "launch_server, auto backend"),
                      ("http_marlin", "launch_server, --fp4-gemm-backend marlin")):  # fmt: skip
        h = report.get(key) or {}
        req = h.get("request") or {}
        out.append(
            f"- {what}: ok={h.get('ok')}; {req.get('endpoint')} prompt {req.get('prompt')!r} -> "
            f"{(h.get('response') or {}).get('text')!r}"
            + (f"; error: {str(h['error']).splitlines()[0]}" if h.get("error") else "")
        )
    neg = report.get("negative_control") or {}
    out.append(f"- bare pin ({neg.get('sglang_file')}): refused={neg.get('refused')}: "
               f"{neg.get('message')!r}")  # fmt: skip
    out += ["", "## Units", "", "| unit | status | seconds |", "|---|---|---|"]
    for uid, u in (report.get("units") or {}).items():
        out.append(f"| {uid} | {u.get('status') or 'not run'} | {_fmt(u.get('seconds'), '.0f')} |")
    out += ["", "## Settings and versions", "", "```",
            json.dumps({"settings": report.get("settings"), "versions": report.get("versions"),
                        "commands": report.get("commands")}, indent=1),
            "```", ""]  # fmt: skip
    return "\n".join(out)


# --------------------------------------------------------------------------- host facts


def sglang_tree() -> Path | None:
    """The folder holding the ``sglang`` package this interpreter would import (no import)."""
    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations))).parent


def versions() -> dict[str, Any]:
    out: dict[str, Any] = {"python": sys.version.split()[0]}
    for dist in DIST_VERSIONS:
        try:
            out[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            out[dist] = "absent"
    tree = sglang_tree()
    if tree is not None:
        out["sglang"] = tree_version(tree)
        out["sglang_tree"] = str(tree)
        fp4 = tree / "sglang" / "srt" / "layers" / "quantization" / "fp4_utils.py"
        out["sglang_patched"] = fp4.is_file() and "should_use_fp4_marlin" in fp4.read_text()
    return out


def tree_version(tree: Path) -> str:
    """``__version__`` of a python tree's sglang (the build writes sglang/_version.py)."""
    for name in ("_version.py", "version.py"):
        path = tree / "sglang" / name
        text = path.read_text() if path.is_file() else ""
        found = re.search(r"^__version__\s*=\s*(?:version\s*=\s*)?['\"]([^'\"]+)", text, re.M)
        if found:
            return found.group(1)
    return "unknown"


def device_name() -> str:
    try:
        proc = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=30)  # fmt: skip
        return proc.stdout.strip().splitlines()[0] if proc.returncode == 0 else "unknown"
    except (OSError, IndexError, subprocess.TimeoutExpired):
        return "unknown"


def pin_lock() -> dict[str, str]:
    return tomllib.loads((ROOT / "upstream.lock").read_text())["pin"]


def resolve_pin(pin: Path | None, work: Path) -> str:
    """A complete tree of the bare pin: ``--pin`` (a tree or the pin's wheel), else
    $FP4SERIES_PIN_TREE, .work/upstream/<tag>/python, or the pin's wheel in .work/cache/wheels
    (sha256 checked against upstream.lock, unpacked under ``work``)."""
    lock = pin_lock()
    candidates = [pin] if pin else []
    if not pin:
        if os.environ.get(ENV_PIN_TREE):
            candidates.append(Path(os.environ[ENV_PIN_TREE]))
        candidates += [ROOT / ".work" / "upstream" / lock["tag"] / "python",
                       ROOT / ".work" / "cache" / "wheels" / lock["wheel_filename"]]  # fmt: skip
    for c in candidates:
        if c.is_dir() and (c / "sglang" / "srt" / "entrypoints" / "engine.py").is_file():
            return str(c.resolve())
        if c.is_file() and c.suffix == ".whl":
            digest = hashlib.sha256(c.read_bytes()).hexdigest()
            if digest != lock["sha256"]:
                raise SystemExit(f"{c}: sha256 {digest} is not the pin's {lock['sha256']}")
            dest = work / "pin-tree"
            if not (dest / "sglang" / "srt" / "entrypoints" / "engine.py").is_file():
                shutil.rmtree(dest, ignore_errors=True)
                with zipfile.ZipFile(c) as zf:
                    zf.extractall(dest, [n for n in zf.namelist() if n.startswith("sglang/")])
            return str(dest.resolve())
    raise SystemExit(
        "no complete tree of the bare pin for the negative control: pass --pin TREE|WHEEL "
        f"(looked at {', '.join(map(str, candidates))}); scripts/fetch-upstream.sh fetches it"
    )


# --------------------------------------------------------------------------- running units


def _pdeathsig() -> None:  # runs in the worker after fork: it dies with this process
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL("libc.so.6").prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None
    return data if isinstance(data, dict) else None


def write_json(path: Path, data: Mapping[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    tmp.replace(path)


def kill_group(pid: int, grace: float = 10.0, proc: subprocess.Popen[Any] | None = None) -> None:
    """SIGTERM the process group, SIGKILL what is left after ``grace`` seconds. ``proc``: our
    child leading the group, reaped while waiting (a zombie leader would look alive)."""
    kill_groups([(pid, proc)], grace)


def kill_groups(groups: Sequence[tuple[int, subprocess.Popen[Any] | None]], grace: float) -> None:
    """kill_group() of several groups at once: one grace period for all."""
    for pid, _ in groups:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGTERM)
    alive = list(groups)
    end = time.time() + grace
    while alive and time.time() < end:
        for pid, proc in list(alive):
            if proc is not None:
                proc.poll()
            try:
                os.killpg(pid, 0)
            except (ProcessLookupError, PermissionError):
                alive.remove((pid, proc))
        time.sleep(0.1)
    for pid, _ in alive:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)


@dataclass
class Running:
    unit: Unit
    proc: subprocess.Popen[bytes]
    result: Path
    log: Path
    started: float
    seen: int = 0  # bytes of the log already scanned for progress lines

    def progress(self) -> list[str]:
        """The worker's own progress lines ("[unit ...]") written since the last call."""
        try:
            with self.log.open("rb") as fh:
                fh.seek(self.seen)
                chunk = fh.read()
        except OSError:
            return []
        end = chunk.rfind(b"\n") + 1
        self.seen += end
        lines = chunk[:end].decode(errors="replace").splitlines()
        return [ln for ln in lines if ln.startswith("[unit ")]


class Runner:
    """Runs units in worker processes, keeps their records, rewrites the report."""

    def __init__(
        self,
        args: argparse.Namespace,
        settings: dict[str, Any],
        planned: list[Unit],
        meta: dict[str, Any],
        commands: list[str],
        vers: dict[str, Any],
    ) -> None:
        self.args, self.settings, self.planned = args, settings, planned
        self.meta, self.commands, self.versions = meta, commands, vers
        self.work: Path = args.work
        self.records: dict[str, dict[str, Any]] = {}
        self.running: dict[str, Running] = {}
        self.stop_reason: str | None = None
        self.deadline = deadline_from(args)
        self.tokens: dict[str, Any] | None = None
        self.rounds: dict[str, Path] = {}  # speed unit -> the turns it takes (Rounds)
        self.groups: dict[str, int] = {}  # speed model -> groups started

    # records ----------------------------------------------------------------------------
    def record_path(self, unit: Unit) -> Path:
        return self.work / "units" / (unit.id.replace("/", "__") + ".json")

    def load_records(self) -> None:
        for unit in self.planned:
            rec = read_json(self.record_path(unit))
            if rec and rec.get("hash") == unit_hash(unit, self.settings):
                if rec.get("status") == "running":  # a worker of an earlier run died
                    rec["status"] = "failed"
                    rec.setdefault("error", "worker ended before it finished (earlier run)")
                self.records[unit.id] = rec

    def write_report(self) -> None:
        report = assemble_report(self.records, self.planned, self.meta, self.settings,
                                 self.commands, self.versions)  # fmt: skip
        if self.stop_reason:
            report["stopped"] = self.stop_reason
        report = portable(report, ROOT)
        self.args.out.mkdir(parents=True, exist_ok=True)
        write_json(self.args.out / "e2e.json", report)
        (self.args.out / "e2e.md").write_text(render_markdown(report))

    # units ------------------------------------------------------------------------------
    def job(self, unit: Unit) -> dict[str, Any]:
        job: dict[str, Any] = {
            "id": unit.id, "kind": unit.kind, "spec": unit.spec, "settings": self.settings,
            "hash": unit_hash(unit, self.settings), "locks": str(self.work / "locks")}  # fmt: skip
        prev = self.records.get(unit.id)
        if prev and prev.get("data"):
            job["previous"] = prev["data"]  # finished sessions of a case are kept
        if unit.kind in ("case", "unquantized", "speed", "parallel"):
            if self.tokens is None:
                self.tokens = self.load_tokens()
            job["tokens"] = self.tokens
        if unit.kind == "negative":
            pin = unit.spec.get("pin_tree") or ""
            job["pin_env"] = pin_env(worker_env(os.environ), pin, str(self.work / "cache-pin"))
        if unit.kind == "parallel":
            job["tp1"] = self.tp1_results(unit)
        if unit.id in self.rounds:
            job["rounds"] = str(self.rounds[unit.id])
        return job

    def speed_group(self, unit: Unit, pending: Sequence[Unit]) -> list[Unit] | None:
        """The speed units of ``unit``'s model still pending, to start together (they take
        turns); None while fewer workers are free than they need. A model with more variants
        than ``--workers`` starts in parts of ``--workers`` (all of them free), each part taking
        turns within itself."""
        group = [u for u in pending
                 if u.kind == "speed" and u.spec["model"] == unit.spec["model"]]  # fmt: skip
        free = self.args.workers - len(self.running)
        if len(group) > free:
            if len(group) <= self.args.workers or free < self.args.workers:
                return None
            log(f"speed/{unit.spec['model']}: {len(group)} variants, {self.args.workers} "
                "workers: timed in parts, each part in alternation")  # fmt: skip
            group = group[:free]
        model = unit.spec["model"]
        folder = self.work / "locks" / "rounds" / f"{model}.{self.groups.get(model, 0)}"
        self.groups[model] = self.groups.get(model, 0) + 1
        Rounds.write_roster(folder, [u.spec["variant"] for u in group])
        for u in group:
            self.rounds[u.id] = folder
        return group

    def tp1_results(self, unit: Unit) -> dict[str, Any]:
        """What a two-GPU unit is compared with, from its one-GPU unit's record: the NVFP4
        session's perplexity parts and top-1 ids and the reference's greedy text they were
        scored on (accuracy), or the decode timings (speed)."""
        after = unit.spec["after"]
        data = (self.records.get(after) or {}).get("data") or {}
        if unit.spec.get("measure") == "speed":
            return {"unit": after, "decode": (data.get("speed") or {}).get("decode")}
        nv, ref = data.get("nvfp4") or {}, data.get("reference") or {}
        return {"unit": after, "ppl_parts": nv.get("ppl_parts"), "top1": nv.get("top1"),
                "greedy": ref.get("greedy")}  # fmt: skip

    def blocked(self, unit: Unit, pending: Sequence[Unit]) -> str | None:
        """None: ``unit`` can start; "wait": its one-GPU unit is still to run, or (a parallel
        unit) any one-GPU unit is; else why it cannot run at all. A tensor-parallel engine
        refuses to start when its GPUs' free memory differs by more than 10 % (the pin's
        SGLANG_ENABLE_TP_MEMORY_INBALANCE_CHECK, on by default), and one-GPU engines occupy
        GPU 0 only: the parallel units run after them, among themselves."""
        after = unit.spec.get("after")
        if after and (self.records.get(after) or {}).get("status") != "done":
            if after in self.running or any(u.id == after for u in pending):
                return "wait"
            status = (self.records.get(after) or {}).get("status") or "not run"
            return f"needs the one-GPU unit {after}, which is {status}"
        if unit.kind == "parallel" and (
            any(r.unit.kind != "parallel" for r in self.running.values())
            or any(u.kind != "parallel" for u in pending)
        ):
            return "wait"
        return None

    def skip(self, unit: Unit, why: str) -> None:
        """A unit that cannot start: recorded as failed with the reason, no worker."""
        rec = {"id": unit.id, "kind": unit.kind, "spec": unit.spec, "status": "failed",
               "hash": unit_hash(unit, self.settings), "data": {}, "error": why,
               "seconds": 0.0}  # fmt: skip
        self.records[unit.id] = rec
        write_json(self.record_path(unit), rec)
        log(f"{unit.id}: failed ({why})")

    def load_tokens(self) -> dict[str, Any]:
        cache = self.work / "tokens.json"
        ckpt = self.args.checkpoints
        used = {k: v for k, v in self.settings.items()
                if k.startswith(("ppl", "prompt", "speed", "prefill"))}  # fmt: skip
        key = fingerprint(ckpt) + json.dumps(used, sort_keys=True)
        cached = read_json(cache)
        if cached and cached.get("key") == key:
            return cached["tokens"]
        tokenizer = next(iter(sorted(ckpt.glob("*/bf16/tokenizer.json"))), None)
        if tokenizer is None:
            raise SystemExit(f"no */bf16/tokenizer.json under {ckpt}: run make_checkpoints.py")
        ids = heldout_ids(tokenizer, ckpt / "heldout.txt")
        tokens = token_sets(ids, self.settings)
        write_json(cache, {"key": key, "tokens": tokens})
        log(f"held-out text: {len(ids)} tokens ({tokenizer})")
        return tokens

    def launch(self, unit: Unit) -> None:
        job = self.job(unit)
        jobs, logs = self.work / "jobs", self.work / "logs"
        jobs.mkdir(parents=True, exist_ok=True)
        logs.mkdir(parents=True, exist_ok=True)
        stem = unit.id.replace("/", "__")
        job_path, log_path = jobs / f"{stem}.json", logs / f"{stem}.log"
        job["result"] = str(self.record_path(unit))
        job["log"] = str(log_path)
        write_json(job_path, job)
        with log_path.open("ab") as fh:
            fh.write(f"\n===== {time.strftime('%H:%M:%S')} {unit.id}\n".encode())
            proc = subprocess.Popen([*WORKER, str(job_path)], cwd=ROOT, stdout=fh,
                                    stderr=subprocess.STDOUT, start_new_session=True,
                                    env=worker_env(os.environ),
                                    preexec_fn=_pdeathsig)  # fmt: skip
        run = Running(unit, proc, self.record_path(unit), log_path, time.time())
        run.seen = log_path.stat().st_size
        self.running[unit.id] = run
        log(f"start {unit.id} (pid {proc.pid}, log {log_path.relative_to(self.work)})")

    def refresh(self, run: Running) -> None:
        rec = read_json(run.result)
        if rec and rec.get("hash") == unit_hash(run.unit, self.settings):
            self.records[run.unit.id] = rec

    def finish(self, run: Running, rc: int | None, why: str | None = None) -> None:
        self.refresh(run)
        rec = self.records.get(run.unit.id)
        if rec is None or rec.get("hash") != unit_hash(run.unit, self.settings):
            rec = {"id": run.unit.id, "kind": run.unit.kind, "spec": run.unit.spec,
                   "hash": unit_hash(run.unit, self.settings), "data": {}}  # fmt: skip
        if rec.get("status") != "done":
            rec["status"] = "failed"
            text = run.log.read_text(errors="replace") if run.log.is_file() else ""
            rec["error"] = "\n".join(
                [
                    why or rec.get("error") or f"worker exit {rc}",
                    *error_lines(text),
                    "--- log tail:",
                    tail(text, 25),
                ]
            )
        rec["seconds"] = round(time.time() - run.started, 1)
        self.records[run.unit.id] = rec
        write_json(run.result, rec)
        if run.unit.id in self.rounds:  # its peers no longer wait for its turns
            Rounds.mark_gone(self.rounds[run.unit.id], run.unit.spec["variant"])
        pids = read_json(run.result.with_suffix(".pids")) or {}
        for pgid in pids.get("groups", []):  # servers a killed worker left behind
            kill_group(int(pgid), grace=2)
        log(
            f"{run.unit.id}: {rec['status']} in {rec['seconds']:.0f} s"
            + ("" if rec["status"] == "done" else f" ({str(rec.get('error')).splitlines()[0]})")
        )

    def stop_all(self, why: str) -> None:
        runs = list(self.running.values())
        kill_groups([(r.proc.pid, r.proc) for r in runs], grace=5)
        for run in runs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                run.proc.wait(timeout=5)
            self.finish(run, run.proc.returncode, why)
        self.running.clear()

    def run(self, todo: list[Unit]) -> int:
        pending = list(todo)
        timeout = self.args.unit_timeout
        last_write = 0.0
        while pending or self.running:
            now = time.time()
            if self.stop_reason is None and now >= self.deadline - self.args.stop_margin:
                self.stop_reason = "deadline"
            if self.stop_reason:
                self.stop_all(f"stopped: {self.stop_reason}")
                break
            while (pending and len(self.running) < self.args.workers
                   and now < self.deadline - self.args.launch_margin):  # fmt: skip
                unit = next((u for u in pending if self.blocked(u, pending) != "wait"), None)
                if unit is None:  # every one left waits for a one-GPU unit still running
                    break
                if unit.kind == "speed":
                    group = self.speed_group(unit, pending)
                    if group is None:  # a model's variants start together
                        break
                    for member in group:
                        pending.remove(member)
                        self.launch(member)
                    continue
                pending.remove(unit)
                why = self.blocked(unit, pending)
                if why:
                    self.skip(unit, why)
                else:
                    self.launch(unit)
            if pending and not self.running and now >= self.deadline - self.args.launch_margin:
                self.stop_reason = "deadline: too little time left to start another unit"
                break
            for uid, run in list(self.running.items()):
                rc = run.proc.poll()
                if rc is not None:
                    self.finish(run, rc)
                    del self.running[uid]
                elif now - run.started > timeout:
                    kill_group(run.proc.pid, proc=run.proc)
                    run.proc.wait()
                    self.finish(run, run.proc.returncode, f"timed out after {timeout:.0f} s")
                    del self.running[uid]
                else:
                    self.refresh(run)
                    for line in run.progress():
                        log(f"{uid}: {line}")
            if now - last_write > self.args.report_every or not self.running:
                self.write_report()
                last_write = now
            time.sleep(self.args.poll)
        self.write_report()
        left = [u.id for u in todo if (self.records.get(u.id) or {}).get("status") != "done"]
        if left:
            log(f"not done: {', '.join(left)}")
        return 0 if not left else 1


def deadline_from(args: argparse.Namespace) -> float:
    """``--deadline`` seconds after this run began, or ``$FP4SERIES_DEADLINE_EPOCH``: the
    earlier; inf without either."""
    ends = [args.t0 + args.deadline] if args.deadline else []
    if os.environ.get(ENV_DEADLINE):
        ends.append(float(os.environ[ENV_DEADLINE]))
    return min(ends) if ends else math.inf


# --------------------------------------------------------------------------- CLI


def parse_args(argv: list[str]) -> argparse.Namespace:
    class Formatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
        pass

    p = argparse.ArgumentParser(
        prog="serve/e2e.py",
        description=__doc__,
        epilog="Commands: run (default), plan (list the units and settings; starts nothing), "
        "render E2E_JSON [MD] (rewrite e2e.md). Extra arguments also come from "
        f"${ENV_ARGS} (shell words, appended). See serve/README.md section 3.",
        formatter_class=Formatter,
    )
    p.add_argument("command", nargs="?", default="run", choices=("run", "plan", "render"))
    p.add_argument("paths", nargs="*", help="render: E2E_JSON [MD]")
    p.add_argument(
        "--checkpoints",
        type=Path,
        default=ROOT / ".work/checkpoints/full",
        help="make_checkpoints.py output (MODEL/{bf16,ct-nvfp4,...}, heldout.txt)",
    )
    p.add_argument("--out", type=Path, default=ROOT / "reports/h200",
                   help="where e2e.json and e2e.md go")  # fmt: skip
    p.add_argument("--work", type=Path, default=ROOT / ".work/e2e",
                   help="unit records, jobs, logs, locks (kept: a rerun resumes)")  # fmt: skip
    p.add_argument("--fresh", action="store_true", help="forget the results kept in --work")
    p.add_argument("--only", help="comma list of unit ids / fnmatch patterns / prefixes "
                   "(negative, case, case/moe, case/*/modelopt/*, unquantized, http, speed, "
                   "parallel)")  # fmt: skip
    p.add_argument(
        "--parallel",
        action="store_true",
        help=f"also the units on {PARALLEL_GPUS} GPUs (tp_size=2; the MoE also ep_size=2), each "
        "compared with its one-GPU unit (run first when not done); refused on a host with "
        f"fewer than {PARALLEL_GPUS} GPUs",
    )
    p.add_argument("--gpus", type=int, metavar="N",
                   help="the host's GPU count for --parallel (default: "
                   "torch.cuda.device_count())")  # fmt: skip
    p.add_argument(
        "--pin",
        type=Path,
        help="the bare pin: its python tree or its wheel "
        f"(default ${ENV_PIN_TREE}, .work/upstream/<tag>/python, the cached wheel)",
    )
    p.add_argument("--speed-models", default=",".join(LARGE_MODELS),
                   help=f"the speed models planned, from {','.join(SPEED_MODELS)}")  # fmt: skip
    p.add_argument("--workers", type=int, default=len(LARGE_VARIANTS),
                   help="units running at a time (a speed model's variants take turns when all "
                   "of them fit)")  # fmt: skip
    p.add_argument(
        "--deadline",
        type=float,
        metavar="S",
        help=f"stop at S seconds (also ${ENV_DEADLINE}, an absolute time)",
    )
    p.add_argument("--launch-margin", type=float, default=150.0,
                   help="start no unit later than this before the deadline (s)")  # fmt: skip
    p.add_argument("--stop-margin", type=float, default=15.0,
                   help="stop the workers this long before the deadline (s)")  # fmt: skip
    p.add_argument("--unit-timeout", type=float, default=900.0, help="per unit (s)")
    p.add_argument("--poll", type=float, default=1.0, help=argparse.SUPPRESS)
    p.add_argument("--report-every", type=float, default=10.0, help=argparse.SUPPRESS)
    g = p.add_argument_group("engine (the same for every engine and server of the run)")
    g.add_argument("--attention-backend", default="auto",
                   help="auto: the engine's default (fa3 on SM90) when sgl_kernel has "
                   "FlashAttention-3, else triton (the minimal wheelhouse); or a name")  # fmt: skip
    g.add_argument("--max-total-tokens", type=int, default=131072,
                   help="KV-cache cap, so that --workers engines fit on one GPU (no effect on "
                   "the kernels); 0: the engine's own sizing")  # fmt: skip
    g.add_argument("--cuda-graph-max-bs", type=int, help="default: the engine's (256 on H200)")
    g.add_argument("--mem-fraction-static", type=float, help="default: the engine's")
    g.add_argument("--disable-piecewise-cuda-graph", action="store_true",
                   help="the prefill CUDA graphs (on by default in the pin) off")  # fmt: skip
    g = p.add_argument_group("measurements")
    g.add_argument("--ppl-windows", type=int, default=64)
    g.add_argument("--ppl-window-tokens", type=int, default=512)
    g.add_argument("--prompts", type=int, default=16, help="agreement prompts (>= 8 gated)")
    g.add_argument("--prompt-tokens", type=int, default=64)
    g.add_argument("--new-tokens", type=int, default=128, help="greedy tokens per prompt")
    g.add_argument("--speed-dtypes", default="bfloat16", help="comma list")
    g.add_argument("--speed-batches", default="1,8,32")
    g.add_argument("--speed-new-tokens", type=int, default=128)
    g.add_argument("--speed-prompt-tokens", type=int, default=64)
    g.add_argument("--prefill-tokens", type=int, default=1024)
    g.add_argument("--speed-repeats", type=int, default=3)
    g.add_argument(
        "--large-batches",
        default="1,8,32,128",
        help="decode batches of the speed models (dense-large, moe-large)",
    )
    g.add_argument(
        "--large-prefill-tokens",
        default="1024,8192",
        help="prefill prompt lengths of the speed models",
    )
    g.add_argument("--http-max-tokens", type=int, default=32)
    g.add_argument("--http-ready-timeout", type=float, default=600.0)
    args = p.parse_args(argv)
    args.t0 = time.time()
    if args.max_total_tokens == 0:
        args.max_total_tokens = None
    for name in ("checkpoints", "out", "work"):
        setattr(args, name, getattr(args, name).resolve())
    return args


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if os.environ.get(ENV_ARGS):
        argv += shlex.split(os.environ[ENV_ARGS])
    args = parse_args(argv)
    if args.command == "render":
        if not args.paths:
            raise SystemExit("render needs E2E_JSON [MD]")
        src = Path(args.paths[0])
        dst = Path(args.paths[1]) if len(args.paths) > 1 else src.with_suffix(".md")
        dst.write_text(render_markdown(json.loads(src.read_text())))
        print(f"wrote {dst}")
        return 0
    settings = settings_from_args(args)
    if args.fresh and args.command == "run":
        shutil.rmtree(args.work / "units", ignore_errors=True)
    args.work.mkdir(parents=True, exist_ok=True)
    pin_tree, pin_problem = None, ""
    try:
        pin_tree = resolve_pin(args.pin, args.work)
    except SystemExit as exc:
        pin_problem = str(exc)
    gpus, parallel_note = None, "not asked for (--parallel)"
    if args.parallel:
        gpus = args.gpus if args.gpus is not None else gpu_count()
        parallel_note = (
            f"planned ({gpus} GPUs)" if gpus >= PARALLEL_GPUS else parallel_refusal(gpus)
        )
        if gpus < PARALLEL_GPUS and args.command == "run":
            raise SystemExit(parallel_note)
    with_parallel = args.parallel and (gpus or 0) >= PARALLEL_GPUS
    speed_models = [m for m in args.speed_models.split(",") if m]
    if set(speed_models) - set(SPEED_MODELS):
        raise SystemExit(f"--speed-models {args.speed_models!r}: choose from {SPEED_MODELS}")
    planned = plan_units(args.checkpoints, settings, pin_tree, parallel=with_parallel,
                         speed_models=speed_models)  # fmt: skip
    try:
        todo = select_units(planned, args.only)
    except ValueError as exc:
        hint = "" if with_parallel or "parallel" not in (args.only or "") else (
            f"; the parallel units: {parallel_note}")  # fmt: skip
        raise SystemExit(f"{exc}{hint}") from None
    recorded = os.environ.get("FP4SERIES_REPORT_COMMAND") or shlex.join(["serve/e2e.py", *argv])
    if os.environ.get("FP4SERIES_REPORT_COMMAND") and os.environ.get(ENV_ARGS):
        recorded = f"{ENV_ARGS}={shlex.quote(os.environ[ENV_ARGS])} {recorded}"  # as run
    meta = report_mod.run_metadata(recorded, device=device_name())
    runner = Runner(args, settings, planned, meta, [recorded], versions())
    runner.load_records()
    done = {uid for uid, rec in runner.records.items() if rec.get("status") == "done"}
    chosen = [u for u in todo if u.id not in done]
    todo = with_dependencies(chosen, planned, done)
    added = [u.id for u in todo if u not in chosen]
    if added and args.command == "run":
        log(f"also running {', '.join(added)}: the one-GPU units the parallel units compare with")
    missing = sorted({str(Path(f)) for u in todo for k in ("path", "nvfp4", "reference")
                      if (f := u.spec.get(k)) and not Path(f).is_dir()})  # fmt: skip
    if pin_problem and any(u.kind == "negative" for u in todo) and args.command == "run":
        raise SystemExit(pin_problem)
    if args.command == "plan":
        print(json.dumps({"settings": settings, "pin_tree": pin_tree or pin_problem,
                          "parallel": parallel_note,
                          "units": [u.id for u in planned], "to_run": [u.id for u in todo],
                          "missing_checkpoints": missing,
                          "engine_kwargs_example": engine_kwargs(settings, "MODEL", "bfloat16"),
                          "worker_env": NO_MULTICAST_ENV}, indent=1))  # fmt: skip
        return 0
    if missing:
        raise SystemExit(f"checkpoints missing (serve/make_checkpoints.py): {missing}")
    log(
        f"{len(todo)} of {len(planned)} units to run, {args.workers} at a time; attention "
        f"backend {settings['attention_backend'] or 'the engine default'}; parallel units "
        f"{parallel_note}; report in {args.out}"
    )

    def on_signal(signum: int, _frame: Any) -> None:
        runner.stop_reason = f"signal {signal.Signals(signum).name}"
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    try:
        return runner.run(todo)
    except KeyboardInterrupt:
        log(f"stopping ({runner.stop_reason}): workers killed, report written")
        runner.stop_all(f"stopped: {runner.stop_reason}")
        runner.write_report()
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
