"""A stand-in for serve/e2e_engine.py in the CPU tests: plausible unit records, no engine.

``python _e2e_fake.py JOB`` writes the record serve/e2e.py expects; ``$FAKE_E2E_MODE``:
``ok`` (default), ``crash:UNIT`` (that unit exits 3 mid-way, its record left 'running'),
``sleep`` (every case unit sleeps until killed), ``drift`` / ``flips`` (the two-GPU units'
perplexity 0.5 % off the one-GPU run's / 5 % of their top-1 ids changed); the unit
``$FAKE_E2E_SLOW`` takes 3 s more. Each start is appended to ``$FAKE_E2E_STARTS``, each start
and end to ``$FAKE_E2E_EVENTS``; every record holds the NVLink multicast variables it saw.
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


PARALLEL_MODES = {  # mode -> (perplexity ratio to one GPU, top-1 ids changed per 1000)
    "ok": (1.0003, 1),
    "drift": (1.005, 1),
    "flips": (1.0003, 50),
}


def parallel_data(
    spec: dict[str, Any], settings: dict[str, Any], tp1: dict[str, Any] | None, mode: str = "ok"
) -> dict[str, Any]:
    """A two-GPU unit's data from the one-GPU results it was given (``tp1``: the job's); a
    stand-in for them when there is no job (report tests)."""
    if spec["measure"] == "speed":
        base = tp1 or {"decode": unit_data("speed", {"variant": spec["variant"]},
                                           settings)["speed"]["decode"]}  # fmt: skip
        decode = {str(b): {"full": [0.7 * (1 + b / 64)] * 3, "one": [0.05] * 3,
                           "new_tokens": settings["speed_new_tokens"],
                           "prompt_tokens": settings["speed_prompt_tokens"]}
                  for b in spec["batches"]}  # fmt: skip
        return {"tp_size": spec["tp_size"], "ep_size": spec["ep_size"], "start_s": 60.0,
                "memory": {"weight_gib": 0.5}, "speed": {"decode": decode},
                "tp1": {"decode": {str(b): base["decode"].get(str(b))
                                   for b in spec["batches"]}}}  # fmt: skip
    base = tp1 or session(settings, True, False, 2)
    ratio, per_mille = PARALLEL_MODES[mode]
    parts = [[nll + math.log(ratio) * n, n] for nll, n in base["ppl_parts"]]
    top1 = [list(row) for row in base["top1"]]
    flat = [(i, j) for i in range(len(top1)) for j in range(len(top1[i]))]
    for i, j in flat[:: max(1, 1000 // per_mille)]:
        top1[i][j] = -2
    return {"tp_size": spec["tp_size"], "ep_size": spec["ep_size"], "start_s": 70.0,
            "ppl_parts": parts, "top1": top1, "memory": {"weight_gib": 0.03},
            "marlin_log": ["... through FP4 Marlin (activations are not quantized)."],
            "tp1": {"ppl_parts": base["ppl_parts"], "top1": base["top1"]}}  # fmt: skip


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
    if kind == "parallel":
        return parallel_data(spec, settings, None)
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


def rank_env(path: str, rank: int) -> None:
    """A stand-in engine rank (a spawned process, as SGLang's schedulers are): appends the
    NVLink multicast variables it inherited to ``path``."""
    env = {k: os.environ.get(k) for k in e2e.NO_MULTICAST_ENV}
    with open(path, "a") as fh:
        fh.write(json.dumps({"rank": rank, "env": env}) + "\n")


def take_turns(
    folder: str, variant: str, rounds: int, log: str, leave_after: int, killed: bool = False
) -> None:
    """A stand-in speed worker (its own process, as the runner's are): joins the roster's
    rounds, appends ``ROUND VARIANT`` to ``log`` in each of its turns, and ends after
    ``leave_after`` rounds (a worker whose engine failed); ``killed``: dies inside its turn."""
    turns = e2e.Rounds(Path(folder), variant, hello_wait=1.0)
    turns.join()
    for rnd in range(min(rounds, leave_after)):
        turns.wait_turn(rnd, poll=0.01)
        with open(log, "a") as fh:
            fh.write(f"{rnd} {variant}\n")
        if killed:
            os._exit(9)  # no done(), no cleanup: as SIGKILL leaves it
        time.sleep(0.02)
        turns.done(rnd)


def record(job: dict[str, Any], status: str, data: dict[str, Any]) -> dict[str, Any]:
    return {"id": job["id"], "kind": job["kind"], "spec": job["spec"], "hash": job["hash"],
            "status": status, "error": None, "data": data, "started": time.time()}  # fmt: skip


def event(what: str, uid: str) -> None:
    if os.environ.get("FAKE_E2E_EVENTS"):
        with open(os.environ["FAKE_E2E_EVENTS"], "a") as fh:
            fh.write(f"{what} {uid}\n")


def main(argv: list[str]) -> int:
    job = json.loads(Path(argv[0]).read_text())
    if os.environ.get("FAKE_E2E_STARTS"):
        with open(os.environ["FAKE_E2E_STARTS"], "a") as fh:
            fh.write(job["id"] + "\n")
    event("start", job["id"])
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
    if os.environ.get("FAKE_E2E_SLOW") == job["id"]:
        time.sleep(3)
    assert job["kind"] != "case" or len(job["tokens"]["ppl"]) == job["settings"]["ppl_windows"]
    if job["kind"] == "parallel":  # what the runner hands it: its one-GPU unit's results
        tp1 = job["tp1"]
        assert tp1["unit"] == job["spec"]["after"]
        if job["spec"]["measure"] == "accuracy":
            assert len(tp1["greedy"]) == len(tp1["top1"]) == job["settings"]["prompts"]
        data = parallel_data(job["spec"], job["settings"], tp1, mode if mode in
                             PARALLEL_MODES else "ok")  # fmt: skip
    else:
        data = unit_data(job["kind"], job["spec"], job["settings"])
    data["env"] = {k: os.environ.get(k) for k in e2e.NO_MULTICAST_ENV}
    e2e.write_json(result, record(job, "done", data))
    event("end", job["id"])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
