"""A stand-in for serve/e2e_engine.py in the CPU tests: plausible unit records, no engine.

``python _e2e_fake.py JOB`` writes the record serve/e2e.py expects; ``$FAKE_E2E_MODE``:
``ok`` (default), ``crash:UNIT`` (that unit exits 3 mid-way, its record left 'running'),
``sleep`` (every case unit sleeps until killed). Each start is appended to ``$FAKE_E2E_STARTS``.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "serve"))
import e2e  # noqa: E402

MIN_CAP = (
    "ValueError: The quantization method modelopt_fp4 is not supported for the current GPU. "
    "Minimum capability: 100. Current capability: 90."
)


def session(settings: dict[str, Any], nvfp4: bool, speed: bool, flips: int) -> dict[str, Any]:
    n, new = settings["prompts"], settings["new_tokens"]
    greedy = [[(i * 7 + j) % 97 for j in range(new)] for i in range(n)]
    top1 = [list(g) for g in greedy]
    if nvfp4:
        for k in range(flips):
            top1[k % n][k // n] = -1
    per_token = 2.0 + (math.log(1.002) if nvfp4 else 0.0)
    count = settings["ppl_window_tokens"] - 1
    d: dict[str, Any] = {
        "path": "x", "start_s": 12.5, "complete": True,
        "ppl_parts": [[per_token * count, count]] * settings["ppl_windows"],
        "memory": {"weight_gib": 0.06 if nvfp4 else 0.12, "kvcache_gib": 0.5},
        "top1": top1,
        "marlin_log": ["... through FP4 Marlin (activations are not quantized)."] if nvfp4 else [],
    }  # fmt: skip
    if not nvfp4:
        d["greedy"] = greedy
    if speed:
        f = 0.6 if nvfp4 else 1.0
        d["speed"] = {
            "decode": {str(b): {"full": [f * (1 + b / 64)] * 3, "one": [0.05] * 3,
                                "new_tokens": settings["speed_new_tokens"],
                                "prompt_tokens": settings["speed_prompt_tokens"]}
                       for b in settings["speed_batches"]},
            "prefill": {"tokens": settings["prefill_tokens"], "times": [0.02 * f] * 3},
        }  # fmt: skip
    return d


def unit_data(kind: str, spec: dict[str, Any], settings: dict[str, Any], flips: int = 0) -> dict:
    if kind == "case":
        return {
            "reference": session(settings, False, spec.get("speed", False), flips),
            "nvfp4": session(settings, True, spec.get("speed", False), flips),
        }
    if kind == "speed":
        f = {"bf16": 1.0, "modelopt-fp8": 0.7, "ct-fp8": 0.7}.get(spec["variant"], 0.5)
        return {
            "start_s": 40.0,
            "memory": {"weight_gib": {"bf16": 3.5, "modelopt-fp8": 1.8, "ct-fp8": 1.8}.get(
                spec["variant"], 1.0)},
            "speed": {
                "decode": {str(b): {"full": [f * (1 + b / 64)] * 3, "one": [0.05] * 3,
                                    "new_tokens": settings["speed_new_tokens"],
                                    "prompt_tokens": settings["speed_prompt_tokens"]}
                           for b in settings["large_batches"]},
                "prefill": {str(t): {"tokens": t, "times": [t * 1e-5 * f] * 3}
                            for t in settings["large_prefill_tokens"]},
            },
        }  # fmt: skip
    if kind == "unquantized":
        count = settings["ppl_window_tokens"] - 1
        return {"ppl_parts": [[1.9 * count, count]] * settings["ppl_windows"],
                "memory": {"weight_gib": 0.12}}  # fmt: skip
    if kind == "http":
        return {"ok": True, "fp4_gemm_backend": spec.get("backend") or "auto",
                "command": "python -m sglang.launch_server ...",
                "commands": [f"python -m sglang.launch_server --model-path {spec['path']}"],
                "request": {"endpoint": "/v1/completions", "model": "m", "prompt": "def f(",
                            "max_tokens": 8, "temperature": 0},
                "response": {"text": " x):", "usage": {"completion_tokens": 8}}}  # fmt: skip
    return {"refused": True, "message": MIN_CAP, "bare": True, "returncode": -9,
            "sglang_file": "/pin/sglang/__init__.py",
            "commands": ["PYTHONPATH=/pin:... python e2e_engine.py --probe-pin {}"]}  # fmt: skip


def record(job: dict[str, Any], status: str, data: dict[str, Any]) -> dict[str, Any]:
    return {"id": job["id"], "kind": job["kind"], "spec": job["spec"], "hash": job["hash"],
            "status": status, "error": None, "data": data, "started": time.time()}  # fmt: skip


def main(argv: list[str]) -> int:
    job = json.loads(Path(argv[0]).read_text())
    if os.environ.get("FAKE_E2E_STARTS"):
        with open(os.environ["FAKE_E2E_STARTS"], "a") as fh:
            fh.write(job["id"] + "\n")
    mode = os.environ.get("FAKE_E2E_MODE", "ok")
    result = Path(job["result"])
    e2e.write_json(result, record(job, "running", {}))
    print(f"[unit    0.0s] fake worker {job['id']}", flush=True)
    if mode == f"crash:{job['id']}":
        print("Received sigquit from a child process. It usually means the child failed.")
        return 3
    if mode == "sleep" and job["kind"] == "case":
        time.sleep(120)
    time.sleep(0.3)  # long enough for the runner to see the progress line
    assert job["kind"] != "case" or len(job["tokens"]["ppl"]) == job["settings"]["ppl_windows"]
    e2e.write_json(
        result, record(job, "done", unit_data(job["kind"], job["spec"], job["settings"]))
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
