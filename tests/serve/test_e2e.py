"""serve/e2e.py on CPU: the arithmetic, the unit plan, the locks, the report, the runner with a
stand-in worker, and serve/e2e_engine.py against stand-ins of SGLang's engine, server and the
bare pin. What only a GPU shows (the real engine's numbers) is serve/README.md section 3's."""

from __future__ import annotations

import ast
import json
import math
import os
import signal
import sys
import textwrap
import threading
import time
import types
from pathlib import Path
from typing import Any

import e2e
import e2e_engine
import pytest

from fp4series import report

HERE = Path(__file__).resolve().parent
FAKE = HERE / "_e2e_fake.py"
sys.path.insert(0, str(HERE))
import _e2e_fake  # noqa: E402

SMALL = ["--ppl-windows", "4", "--prompts", "8", "--new-tokens", "128", "--speed-new-tokens", "16",
         "--speed-repeats", "2"]  # fmt: skip


def settings(*extra: str) -> dict[str, Any]:
    return e2e.settings_from_args(e2e.parse_args(["run", *SMALL, *extra]))


# --------------------------------------------------------------------------- arithmetic


def test_perplexity_from_input_logprobs_skips_the_first_token() -> None:
    entries = [(None, 5, None), (-1.0, 6, None), [-3.0, 7, None]]  # tuples, or lists over IPC
    assert e2e.nll_of(entries) == (4.0, 2)
    ppl, n = e2e.perplexity([e2e.nll_of(entries), (2.0, 2)])
    assert n == 4 and ppl == pytest.approx(math.exp(6.0 / 4))
    assert e2e.perplexity([]) == (None, 0)
    assert e2e.perplexity([e2e.nll_of([(None, 1, None), (float("-inf"), 2, None)])])[0] is None


def test_top1_and_agreement() -> None:
    tops = [None, [(-0.1, 4, None)], [[-0.2, 9, None]], []]
    assert e2e.top1_of(tops, 1) == [4, 9, None]
    frac, n = e2e.agreement([[1, 2, 3], [4, None]], [[1, 0, 3], [4, None]])
    assert (frac, n) == (pytest.approx(3 / 5), 5)  # None never agrees
    with pytest.raises(ValueError):
        e2e.agreement([[1]], [[1, 2]])


def test_speed_and_memory_helpers() -> None:
    rate = e2e.decode_rate(8, 129, [2.2, 2.0, 2.1], [0.1, 0.12, 0.1])
    assert rate["tok_s"] == pytest.approx(8 * 128 / 2.0)
    assert rate["ms_per_token"] == pytest.approx(2000.0 / 128)
    assert e2e.decode_rate(8, 129, [0.1], [0.2])["tok_s"] is None  # noise: no rate, not a lie
    assert e2e.prefill_rate(1024, [0.02, 0.03, 0.025])["tok_s"] == pytest.approx(1024 / 0.025)
    info = {"internal_states": [{"memory_usage": {"weight": 0.06, "kvcache": 0.5, "graph": 0.1,
                                                  "token_capacity": 131072}}]}  # fmt: skip
    assert e2e.weight_gib(info)["weight_gib"] == 0.06
    assert e2e.weight_gib({})["weight_gib"] is None


def test_log_evidence_and_refusal() -> None:
    log = ("[x] SM90 has no FP4 tensor cores: auto-selecting fp4-gemm-backend=marlin (W4A16)\n"
           "noise\n[y] ModelOptFp4LinearMethod: ...; serving NVFP4 weight-only through FP4 "
           "Marlin (activations are not quantized).\n")  # fmt: skip
    assert len(e2e.marlin_evidence(log)) == 2
    out = f"PROBE: {{}}\n{_e2e_fake.MIN_CAP}\nRuntimeError: Initialization failed."
    assert e2e.refusal(out, -9) == (True, _e2e_fake.MIN_CAP)
    assert e2e.refusal(out + "\nPROBE: engine started", 0)[0] is False
    assert e2e.refusal("ImportError: no module", 1) == (False, "")


def test_error_lines_pick_the_traceback_end() -> None:
    log = "ok\nTraceback (most recent call last):\n  File x\nValueError: bad scale\nok\n"
    assert e2e.error_lines(log) == ["Traceback (most recent call last):", "ValueError: bad scale"]


def test_pin_env_replaces_every_sglang_tree(tmp_path: Path) -> None:
    patched = tmp_path / "patched"
    (patched / "sglang").mkdir(parents=True)
    (patched / "sglang" / "__init__.py").write_text("")
    env = {"PYTHONPATH": f"/site:{patched}:/src", "X": "1"}
    out = e2e.pin_env(env, "/pin", "/cache")
    assert out["PYTHONPATH"] == "/pin:/site:/src" and out["X"] == "1"
    assert out["TVM_FFI_CACHE_DIR"] == "/cache"


def test_token_sets_are_disjoint_and_sized() -> None:
    s = settings()
    sets = e2e.token_sets(list(range(40000)), s)
    assert [len(w) for w in sets["ppl"]] == [512] * 4
    assert len(sets["prompts"]) == 8 and len(sets["speed"]) == 128  # the speed models' batch
    assert len(sets["prefill"]) == 1024
    assert {k: len(v) for k, v in sets["prefill_large"].items()} == {"1024": 1024, "8192": 8192}
    flat = [t for k in ("ppl", "prompts", "speed") for w in sets[k] for t in w] + sets["prefill"]
    flat += [t for v in sets["prefill_large"].values() for t in v]
    assert len(flat) == len(set(flat))
    with pytest.raises(ValueError, match="held-out text has 100 tokens"):
        e2e.token_sets(list(range(100)), s)


# --------------------------------------------------------------------------- settings, units


def test_engine_settings_and_server_command() -> None:
    s = settings("--cuda-graph-max-bs", "32", "--disable-piecewise-cuda-graph",
                 "--attention-backend", "triton")  # fmt: skip
    kw = e2e.engine_kwargs(s, "/m", "float16")
    assert kw == {"model_path": "/m", "dtype": "float16", "log_level": "info", "random_seed": 0,
                  "sleep_on_idle": True, "attention_backend": "triton", "max_total_tokens": 131072,
                  "cuda_graph_max_bs": 32, "disable_piecewise_cuda_graph": True}  # fmt: skip
    cmd = e2e.server_command(s, "/m", "bfloat16", 30001, "marlin")
    assert cmd[1:3] == ["-m", "sglang.launch_server"]
    joined = " ".join(cmd)
    for part in ("--host 127.0.0.1", "--port 30001", "--model-path /m", "--dtype bfloat16",
                 "--attention-backend triton", "--disable-piecewise-cuda-graph",
                 "--fp4-gemm-backend marlin", "--max-total-tokens 131072",
                 "--sleep-on-idle"):  # fmt: skip
        assert part in joined
    assert e2e.choose_attention_backend("auto", fa3_available=False) == "triton"
    assert e2e.choose_attention_backend("auto", fa3_available=True) is None  # engine: fa3
    assert e2e.choose_attention_backend("flashinfer", fa3_available=True) == "flashinfer"
    assert e2e.settings_from_args(e2e.parse_args(["--max-total-tokens", "0"]))[
        "max_total_tokens"] is None  # fmt: skip


def test_plan_and_selection(tmp_path: Path) -> None:
    units = e2e.plan_units(tmp_path, settings(), "/pin")
    ids = [u.id for u in units]
    assert len(ids) == 1 + 12 + 6 + 2 + 10 and ids[0] == "negative"
    speed = [u for u in units if u.kind == "speed"]
    assert ids[-10:] == [u.id for u in speed]  # last: each waits for a quiet GPU
    assert {(u.spec["model"], u.spec["variant"]) for u in speed} == {
        (m, v) for m in report.E2E_LARGE_MODELS for v in e2e.LARGE_VARIANTS
    }
    assert {u.spec["dtype"] for u in units[1:4]} == set(report.DTYPES)  # JIT builds overlap
    cases = [u for u in units if u.kind == "case"]
    assert {(u.spec["format"], u.spec["model"], u.spec["dtype"]) for u in cases} == {
        (f, m, d) for f in report.E2E_FORMATS for m in report.E2E_MODELS for d in report.DTYPES
    }
    assert all(u.spec["speed"] == (u.spec["dtype"] == "bfloat16") for u in cases)
    pick = e2e.select_units(units, "case/moe, http, case/*/modelopt/float16")
    assert [u.id for u in pick] == [
        "case/dense/modelopt/float16", "case/dense-bias/modelopt/float16",
        "case/moe/compressed-tensors/float16", "case/moe/modelopt/float16",
        "case/moe/compressed-tensors/bfloat16", "case/moe/modelopt/bfloat16",
        "http/auto", "http/marlin",
    ]  # fmt: skip
    with pytest.raises(ValueError, match="selects no unit"):
        e2e.select_units(units, "cases")
    assert not any("dense-8b" in u for u in ids)  # planned only when asked for
    with pytest.raises(SystemExit, match="--speed-models 'dense-9b'"):
        e2e.main(["plan", "--checkpoints", str(tmp_path), "--speed-models", "dense-9b"])
    deep = e2e.plan_units(tmp_path, settings(), "/pin", speed_models=["dense-8b"])
    assert [u.id for u in deep if u.kind == "speed"] == [
        f"speed/dense-8b/{v}" for v in e2e.LARGE_VARIANTS
    ]


def test_unit_hash_follows_settings_and_checkpoints(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "dense" / "bf16").mkdir(parents=True)
    unit = next(u for u in e2e.plan_units(tmp_path, settings(), None) if u.kind == "unquantized")
    first = e2e.unit_hash(unit, settings())
    assert e2e.unit_hash(unit, settings()) == first
    assert e2e.unit_hash(unit, settings("--ppl-windows", "5")) != first
    monkeypatch.setattr(e2e, "METHOD", e2e.METHOD + 1)  # units measure another way
    assert e2e.unit_hash(unit, settings()) != first
    monkeypatch.undo()
    engine_kwargs = e2e.engine_kwargs
    monkeypatch.setattr(e2e, "engine_kwargs", lambda *a, **k: {**engine_kwargs(*a, **k), "x": 1})
    assert e2e.unit_hash(unit, settings()) != first  # an engine keyword the settings do not name
    monkeypatch.undo()
    (tmp_path / "dense" / "bf16" / "model.safetensors").write_bytes(b"x")  # a remade checkpoint
    assert e2e.unit_hash(unit, settings()) != first


def test_parallel_units_are_planned_only_when_asked(tmp_path: Path) -> None:
    s = settings()
    one_gpu = e2e.plan_units(tmp_path, s, "/pin")
    units = e2e.plan_units(tmp_path, s, "/pin", parallel=True)
    assert [u.id for u in units[: len(one_gpu)]] == [u.id for u in one_gpu]  # unchanged, first
    par = units[len(one_gpu) :]
    assert all(u.kind == "parallel" for u in par) and len(par) == 10
    acc = [u for u in par if u.spec["measure"] == "accuracy"]
    assert {(u.spec["format"], u.spec["model"], u.spec["tp_size"], u.spec["ep_size"])
            for u in acc} == {(f, m, tp, ep) for f in report.E2E_FORMATS
                              for m, tp, ep in report.E2E_PARALLEL_RUNS}  # fmt: skip
    moe_ep = next(u for u in acc if u.id == "parallel/modelopt/moe/ep2")
    assert moe_ep.spec["after"] == "case/moe/modelopt/bfloat16"
    assert moe_ep.spec["nvfp4"] == str(tmp_path / "moe" / "modelopt-nvfp4")
    ids = {u.id for u in one_gpu}
    assert all(u.spec["after"] in ids for u in par)  # each compares with a planned unit
    fast = [u for u in par if u.spec["measure"] == "speed"]
    assert [(u.id, u.spec["after"], u.spec["batches"]) for u in fast] == [
        ("parallel/modelopt/dense-large/tp2", "speed/dense-large/modelopt-nvfp4", [1, 32]),
        ("parallel/compressed-tensors/dense-large/tp2", "speed/dense-large/ct-nvfp4", [1, 32]),
    ]
    assert [u.id for u in e2e.select_units(units, "parallel/*/moe/*")] == [
        "parallel/compressed-tensors/moe/tp2", "parallel/modelopt/moe/tp2",
        "parallel/compressed-tensors/moe/ep2", "parallel/modelopt/moe/ep2"]  # fmt: skip
    # a chosen parallel unit brings its one-GPU unit along unless that is done
    pick = e2e.select_units(units, "parallel/modelopt/moe/ep2,parallel/modelopt/dense-large")
    todo = e2e.with_dependencies(pick, units, done={"case/moe/modelopt/bfloat16"})
    assert [u.id for u in todo] == ["speed/dense-large/modelopt-nvfp4",
                                    "parallel/modelopt/moe/ep2",
                                    "parallel/modelopt/dense-large/tp2"]  # fmt: skip
    # the engine's keywords: tp_size / ep_size only on two GPUs
    kw = e2e.engine_kwargs(s, "/m", "bfloat16")
    assert "tp_size" not in kw and "ep_size" not in kw
    assert e2e.engine_kwargs(s, "/m", "bfloat16", tp_size=2, ep_size=2) == {
        **kw, "tp_size": 2, "ep_size": 2}  # fmt: skip


def test_workers_get_nvlink_multicast_off_whatever_the_host_says() -> None:
    env = e2e.worker_env({"NCCL_NVLS_ENABLE": "1", "PATH": "/bin"})
    assert env == {
        "PATH": "/bin",
        "NCCL_NVLS_ENABLE": "0",
        "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
        "NVSHMEM_DISABLE_NVLS": "1",
    }
    pinned = e2e.pin_env(env, "/pin", "/cache")  # the bare pin's child keeps it too
    assert all(pinned[k] == v for k, v in e2e.NO_MULTICAST_ENV.items())


def test_gate_alone_start_excludes_starts_and_work(tmp_path: Path) -> None:
    """Gate.starting(alone=True): no other engine starts or works while it holds (the memory
    the engine reports after its load is its own)."""
    gate, events = e2e.Gate(tmp_path), []

    def alone() -> None:
        with gate.starting(alone=True):
            events.append("a+")
            time.sleep(0.3)
            events.append("a-")

    def other(kind: str) -> None:
        time.sleep(0.05)
        with gate.starting() if kind == "s" else gate.working():
            events.append(kind)

    threads = [threading.Thread(target=alone), threading.Thread(target=other, args=("s",)),
               threading.Thread(target=other, args=("w",))]  # fmt: skip
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert events[:2] == ["a+", "a-"] and sorted(events[2:]) == ["s", "w"]


def test_gate_speed_runs_alone() -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        gate, events, lock = e2e.Gate(Path(tmp)), [], threading.Lock()

        def note(what: str) -> None:
            with lock:
                events.append(what)

        def starting(delay: float, hold: float, name: str) -> None:
            time.sleep(delay)
            with gate.starting():
                note(f"{name}+")
                time.sleep(hold)
                note(f"{name}-")

        def quiet() -> None:
            time.sleep(0.05)
            with gate.quiet():
                note("q+")
                time.sleep(0.3)
                note("q-")

        def working() -> None:
            time.sleep(0.1)
            with gate.working():
                note("w")

        threads = [threading.Thread(target=starting, args=(0, 0.3, "s1")),
                   threading.Thread(target=starting, args=(0.01, 0.1, "s2")),
                   threading.Thread(target=quiet), threading.Thread(target=working),
                   threading.Thread(target=starting, args=(0.15, 0.01, "s3"))]  # fmt: skip
        for t in threads:
            t.start()
        for t in threads:
            t.join(10)
    assert events.index("s2+") < events.index("s1-")  # starts overlap each other
    q_on, q_off = events.index("q+"), events.index("q-")
    assert q_on > events.index("s1-") and q_on > events.index("s2-")  # speed waits for starts
    assert events.index("s3+") > q_off  # a start queued behind speed waits for it
    assert events.index("w") > q_off or events.index("w") < q_on


def test_speed_variants_take_turns_round_by_round(tmp_path: Path) -> None:
    """e2e.Rounds: every round times each variant once, in the roster's order rotated by the
    round, whichever worker gets there first; a worker that ends early (its engine failed) and
    one that never starts are passed over, so the others still finish."""
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    folder, log = tmp_path / "rounds", tmp_path / "turns.txt"
    e2e.Rounds.write_roster(folder, ["a", "b", "c", "never", "killed", "failed"])
    e2e.Rounds.mark_gone(folder, "failed")  # the runner's word: its unit ended before its turn
    leave = {"a": 3, "b": 1, "c": 3, "killed": 1}  # b's engine fails after its first round
    procs = [ctx.Process(target=_e2e_fake.take_turns,
                         args=(str(folder), v, 3, str(log), leave[v], v == "killed"))
             for v in ("c", "b", "a", "killed")]  # fmt: skip
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(60)
    assert [p.exitcode for p in procs] == [0, 0, 0, 9]
    turns = log.read_text().split("\n")[:-1]
    assert turns == ["0 a", "0 b", "0 c", "0 killed", "1 c", "1 a", "2 c", "2 a"]
    assert e2e.Rounds(folder, "a").order(2) == ["c", "never", "killed", "failed", "a", "b"]


# --------------------------------------------------------------------------- report


def full_records(
    s: dict[str, Any], ckpt: Path, parallel: bool = False
) -> tuple[list[e2e.Unit], dict[str, Any]]:
    units = e2e.plan_units(ckpt, s, "/pin", parallel=parallel)
    records = {u.id: {"id": u.id, "kind": u.kind, "spec": u.spec, "status": "done",
                      "seconds": 30.0, "data": _e2e_fake.unit_data(u.kind, u.spec, s, flips=2)}
               for u in units}  # fmt: skip
    return units, records


def assemble(units: list[e2e.Unit], records: dict[str, Any], s: dict[str, Any]) -> dict[str, Any]:
    meta = report.run_metadata("serve/e2e.py run", device="NVIDIA H200")
    return e2e.assemble_report(records, units, meta, s, ["serve/e2e.py run"],
                               {"sglang": "0.5.11", "torch": "2.11.0"})  # fmt: skip


def test_assembled_report_passes_the_ci_check_and_renders(tmp_path: Path) -> None:
    s = settings()
    units, records = full_records(s, tmp_path)
    rep = assemble(units, records, s)
    problems: list[str] = []
    report.check_e2e(rep, problems)
    assert problems == []
    case = rep["cases"][0]
    assert case["ppl_rel_diff"] == pytest.approx(0.002, rel=1e-3)
    assert case["top1_agreement"] == pytest.approx(1 - 2 / (8 * 128))
    assert case["agreement_tokens"] == 8 * 128 and case["reference_top1_is_its_greedy"] == 1.0
    assert case["ppl_unquantized"] == pytest.approx(math.exp(1.9))
    decode = [r for r in rep["speed"] if r["kind"] == "decode" and r["batch"] == 8]
    assert len(decode) == 6 and decode[0]["speedup"] == pytest.approx(1 / 0.6, rel=0.1)
    assert len(rep["memory"]) == 12 and rep["complete"] is True
    large = [r for r in rep["speed_large"] if r["model"] == "dense-large"]
    assert {(r["kind"], r["batch"] if r["kind"] == "decode" else r["prompt_tokens"])
            for r in large if r["format"] == "modelopt"} == {
        ("decode", 1), ("decode", 8), ("decode", 32), ("decode", 128),
        ("prefill", 1024), ("prefill", 8192)}  # fmt: skip
    row = next(r for r in large if r["kind"] == "decode" and r["batch"] == 8)
    assert row["nvfp4_over_reference"] == pytest.approx(2.0, rel=0.1)
    assert row["nvfp4_over_fp8"] == pytest.approx(1.4, rel=0.1)
    assert len(rep["memory_large"]) == 4 and rep["memory_large"][0]["fp8_weight_gib"] == 1.8
    assert "## Speed models" in e2e.render_markdown(rep)
    md = e2e.render_markdown(rep)
    assert "**Check: OK**" in md and "| compressed-tensors | dense | float16 |" in md
    rep["cases"][0]["top1_agreement"] = 0.9
    assert "top-1 agreement 0.9000 < 0.98" in e2e.render_markdown(rep)
    # the speed units alone (serve/gpu-host.sh --speed): checked as e2e-speed/e2e.json is
    speed = {u.id for u in units if u.kind == "speed"}
    alone = assemble(units, {k: v for k, v in records.items() if k in speed}, s)
    md = e2e.render_markdown(alone)
    assert "**Check: OK**" in md and "`serve/gpu-host.sh --speed`" in md
    assert "| modelopt | dense-large | decode | 8 |" in md
    alone["units"]["speed/moe-large/ct-fp8"]["status"] = "failed"
    assert "unit speed/moe-large/ct-fp8 is 'failed', not done" in e2e.render_markdown(alone)


def test_speed_rows_give_the_per_round_range_of_variants_timed_in_turn(tmp_path: Path) -> None:
    """A ratio's per-round range comes from the same round's times of both variants, and only
    where both were timed in rounds (earlier records timed each variant's repeats together)."""
    s = settings()
    units, records = full_records(s, tmp_path)
    row = next(
        r
        for r in assemble(units, records, s)["speed_large"]
        if (r["format"], r["model"], r["kind"]) == ("modelopt", "dense-large", "decode")
    )
    assert row["nvfp4_over_fp8_rounds"] is None and row["nvfp4_over_reference_rounds"] is None
    for variant in ("modelopt-nvfp4", "modelopt-fp8", "bf16"):
        data = records[f"speed/dense-large/{variant}"]["data"]
        data["rounds"] = {"roster": ["bf16", "modelopt-nvfp4", "modelopt-fp8"], "rounds": 3,
                          "id": 1.5}  # fmt: skip
    nv = records["speed/dense-large/modelopt-nvfp4"]["data"]["speed"]
    nv["decode"]["1"]["full"] = [0.55, 0.45, 0.5]  # rounds 1 and 2 slower and faster
    nv["prefill"]["1024"]["times"] = [0.01, 0.02, 0.005]
    rep = assemble(units, records, s)
    rows = {(r["kind"], r["batch"], r.get("prompt_tokens")): r for r in rep["speed_large"]
            if (r["format"], r["model"]) == ("modelopt", "dense-large")}  # fmt: skip
    one = rows[("decode", 1, s["speed_prompt_tokens"])]
    fp8_steps = 0.7 * (1 + 1 / 64) - 0.05  # the NVFP4 steps: 0.5, 0.4, 0.45
    assert one["nvfp4_over_fp8_rounds"] == [round(fp8_steps / 0.5, 3), round(fp8_steps / 0.4, 3)]
    prefill = rows[("prefill", 1, 1024)]
    assert prefill["nvfp4_over_reference_rounds"] == [0.512, 2.048]  # 1024e-5 / 0.02, / 0.005
    assert "| modelopt | dense-large | prefill | 1024 tok |" in e2e.render_markdown(rep)
    assert "(0.51-2.05) |" in e2e.render_markdown(rep)
    assert e2e.ratio_range([1.0, 2.0, 4.0], [2.0, 2.0]) == [1.0, 2.0]  # a run stopped mid-round
    assert e2e.ratio_range([1.0, 0.0], [2.0, 2.0]) is None  # a step that took no time: no ratio
    # a resumed run redid the FP8 unit: its rounds are not the NVFP4 unit's
    records["speed/dense-large/modelopt-fp8"]["data"]["rounds"]["id"] = 2.5
    again = next(r for r in assemble(units, records, s)["speed_large"]
                 if (r["format"], r["model"], r["kind"], r["batch"])
                 == ("modelopt", "dense-large", "decode", 1))  # fmt: skip
    assert again["nvfp4_over_fp8_rounds"] is None and again["nvfp4_over_reference_rounds"]


def test_partial_records_give_a_valid_incomplete_report(tmp_path: Path) -> None:
    s = settings()
    units, records = full_records(s, tmp_path)
    crashed = "case/moe/modelopt/bfloat16"
    records[crashed]["status"] = "failed"
    records[crashed]["error"] = "worker exit -9"
    del records[crashed]["data"]["nvfp4"]
    del records["http/marlin"]
    records["case/dense/modelopt/float16"]["data"]["nvfp4"]["top1"][0].pop()  # shapes differ
    rep = json.loads(json.dumps(assemble(units, records, s)))  # JSON round trip
    assert rep["complete"] is False and rep["units"]["http/marlin"]["status"] is None
    problems: list[str] = []
    report.check_e2e(rep, problems)
    text = "\n".join(problems)
    assert "modelopt moe bfloat16: failed: worker exit -9" in text
    assert "ppl_nvfp4 is None" in text and "http_marlin: missing" in text
    assert "top1_agreement is None" in text  # the case whose lists differ in shape
    assert "speed for modelopt moe lacks 1, 8, 32, prefill" in text
    del records["speed/moe-large/ct-fp8"]
    problems = []
    report.check_e2e(json.loads(json.dumps(assemble(units, records, s))), problems)
    text = "\n".join(problems)
    assert "speed_large compressed-tensors moe-large decode batch 1: fp8_tok_s missing" in text
    assert "no weight memory (nvfp4, bf16 and fp8) for compressed-tensors moe-large" in text


def test_parallel_records_assembled_and_gated(tmp_path: Path) -> None:
    s = settings()
    units, records = full_records(s, tmp_path, parallel=True)
    rep = json.loads(json.dumps(assemble(units, records, s)))
    problems: list[str] = []
    pending: list[str] = []
    report.check_e2e(rep, problems, pending)
    assert problems == [] and pending == [] and rep["complete"] is True
    assert len(rep["parallel"]) == 8 and rep["gates"]["parallel_ppl_rel"] == 0.001
    ep2 = next(r for r in rep["parallel"] if r["model"] == "moe" and r["ep_size"] == 2)
    assert (ep2["tp_size"], ep2["dtype"], ep2["compared_with"]) == (
        2, "bfloat16", "case/moe/compressed-tensors/bfloat16")  # fmt: skip
    assert ep2["ppl_nvfp4"] / ep2["ppl_tp1"] == pytest.approx(1.0003, rel=1e-6)
    assert ep2["top1_agreement"] == pytest.approx(1 - 2 / 1024)
    assert ep2["agreement_tokens"] == 8 * 128 and ep2["tokens_scored"] == 4 * 511
    fast = [(r["format"], r["batch"]) for r in rep["parallel_speed"]]
    assert fast == [("modelopt", 1), ("modelopt", 32), ("compressed-tensors", 1),
                    ("compressed-tensors", 32)]  # fmt: skip
    row = rep["parallel_speed"][1]
    assert row["tp1_tok_s"] == pytest.approx(32 * 15 / (0.5 * 1.5 - 0.05), rel=1e-3)
    assert row["over_tp1"] == pytest.approx(row["tok_s"] / row["tp1_tok_s"], rel=1e-2)
    md = e2e.render_markdown(rep)
    assert "## Two GPUs" in md and "| modelopt | moe | bfloat16 | 2 | 2 |" in md
    # the one-GPU report has no parallel part: pending, and its markdown has no such section
    one = assemble(*full_records(s, tmp_path), s)
    problems, pending = [], []
    report.check_e2e(json.loads(json.dumps(one)), problems, pending)
    assert problems == [] and "parallel" not in one and len(pending) == 1
    assert "## Two GPUs" not in e2e.render_markdown(one)
    # a failed two-GPU unit and a drifting one fail the check, with what happened
    bad = "parallel/modelopt/dense/tp2"
    records[bad].update(status="failed", error="RuntimeError: NCCL error\n--- log tail:\nx")
    del records[bad]["data"]["top1"]
    drift = records["parallel/compressed-tensors/moe/tp2"]["data"]
    drift["ppl_parts"] = [[nll + 0.01 * n, n] for nll, n in drift["ppl_parts"]]
    problems = []
    report.check_e2e(json.loads(json.dumps(assemble(units, records, s))), problems)
    text = "\n".join(problems)
    assert "parallel modelopt dense bfloat16 tp 2 ep 1: failed: RuntimeError: NCCL error" in text
    assert "parallel modelopt dense bfloat16 tp 2 ep 1: top1_agreement is None" in text
    assert "compressed-tensors moe bfloat16 tp 2 ep 1: perplexity" in text and "(gate 0.1%)" in text


# --------------------------------------------------------------------------- the runner


@pytest.fixture()
def ckpt(tmp_path: Path) -> Path:
    root = tmp_path / "ckpt"
    for model in report.E2E_MODELS:
        for sub in ("bf16", "ct-nvfp4", "reference-ct", "modelopt-nvfp4", "reference-modelopt"):
            (root / model / sub).mkdir(parents=True)
            (root / model / sub / "model.safetensors").write_bytes(b"\0" * 4096)
    for model in report.E2E_LARGE_MODELS:
        for sub in e2e.LARGE_VARIANTS:
            (root / model / sub).mkdir(parents=True)
            (root / model / sub / "model.safetensors").write_bytes(b"\0" * 8192)
        (root / model / "bf16" / "tokenizer.json").write_text("{}")
        (root / model / "train.json").write_text(json.dumps({"heldout_ppl": {"bf16": 6.7}}))
    (root / "heldout.txt").write_text("x")
    return root


@pytest.fixture()
def pin(tmp_path: Path) -> Path:
    tree = tmp_path / "pin"
    (tree / "sglang" / "srt" / "entrypoints").mkdir(parents=True)
    (tree / "sglang" / "srt" / "entrypoints" / "engine.py").write_text("")
    return tree


@pytest.fixture()
def fake_worker(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    starts = tmp_path / "starts.txt"
    monkeypatch.setattr(e2e, "WORKER", [sys.executable, str(FAKE)])
    monkeypatch.setattr(e2e, "heldout_ids", lambda _tok, _txt: list(range(40000)))
    real = e2e.versions()
    assert real["python"] and "torch" in real and "sglang-kernel" in real
    monkeypatch.setattr(e2e, "versions", lambda: {**real, "sglang": "0.5.11+test"})
    monkeypatch.setenv("FAKE_E2E_STARTS", str(starts))
    monkeypatch.delenv(e2e.ENV_ARGS, raising=False)
    monkeypatch.delenv(e2e.ENV_DEADLINE, raising=False)
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    yield starts
    for sig, handler in handlers.items():
        signal.signal(sig, handler)


def run_main(ckpt: Path, pin: Path, tmp: Path, *extra: str) -> int:
    return e2e.main(["run", "--checkpoints", str(ckpt), "--out", str(tmp / "out"), "--work",
                     str(tmp / "work"), "--pin", str(pin), "--poll", "0.05", "--report-every",
                     "0.2", *SMALL, *extra])  # fmt: skip


def starts_of(path: Path) -> list[str]:
    return path.read_text().split() if path.is_file() else []


def test_full_run_with_a_stand_in_worker_then_resume(
    ckpt: Path,
    pin: Path,
    tmp_path: Path,
    fake_worker: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("FP4SERIES_REPORT_COMMAND", "scripts/gpu-proof.sh --stages e2e")
    monkeypatch.setenv(e2e.ENV_ARGS, "--workers 3")  # recorded as it was given
    assert run_main(ckpt, pin, tmp_path, "--only", "negative,case/dense") == 0
    assert len(starts_of(fake_worker)) == 5
    first = json.loads((tmp_path / "out" / "e2e.json").read_text())
    assert first["commands"][0] == (
        "FP4SERIES_E2E_ARGS='--workers 3' scripts/gpu-proof.sh --stages e2e"
    )
    monkeypatch.delenv(e2e.ENV_ARGS)
    out = capsys.readouterr().out
    assert "negative: [unit    0.0s] fake worker negative" in out  # the workers' progress
    assert "case/dense/modelopt/bfloat16: done in" in out
    partial = json.loads((tmp_path / "out" / "e2e.json").read_text())
    assert partial["complete"] is False and len(partial["cases"]) == 4
    assert run_main(ckpt, pin, tmp_path, "--workers", "4") == 0
    started = starts_of(fake_worker)
    assert len(started) == 31 and len(set(started)) == 31  # the first five were not redone
    rep = json.loads((tmp_path / "out" / "e2e.json").read_text())
    assert rep["complete"] is True and rep["versions"]["sglang"] == "0.5.11+test"
    problems = report.check_report_dir(tmp_path / "out")
    assert [p for p in problems if p.startswith("e2e.json")] == []  # the other reports: absent
    assert "**Check: OK**" in (tmp_path / "out" / "e2e.md").read_text()
    assert (tmp_path / "work" / "tokens.json").is_file()
    assert run_main(ckpt, pin, tmp_path, "--ppl-windows", "5", "--only", "unquantized/moe") == 0
    assert sorted(starts_of(fake_worker)[31:]) == [
        "unquantized/moe/bfloat16",
        "unquantized/moe/float16",
    ]  # other settings: redone


def test_a_speed_models_variants_start_together_and_take_turns(
    ckpt: Path, pin: Path, tmp_path: Path, fake_worker: Path
) -> None:
    """The runner starts a model's speed units together, once as many workers are free, each
    group with a roster of its own; a unit that ends is marked gone for its peers. With fewer
    workers than variants, the model is timed in parts (each part taking turns)."""
    assert run_main(ckpt, pin, tmp_path, "--only", "speed", "--workers", "5") == 0
    started = starts_of(fake_worker)
    assert [u.split("/")[1] for u in started] == ["dense-large"] * 5 + ["moe-large"] * 5
    rounds = tmp_path / "work" / "locks" / "rounds"
    assert sorted(p.name for p in rounds.iterdir()) == ["dense-large.0", "moe-large.0"]
    roster = json.loads((rounds / "dense-large.0" / "roster.json").read_text())
    assert roster["variants"] == list(e2e.LARGE_VARIANTS)
    assert sorted(p.name for p in (rounds / "moe-large.0").glob("*.gone")) == sorted(
        f"{v}.gone" for v in e2e.LARGE_VARIANTS
    )
    assert run_main(ckpt, pin, tmp_path, "--only", "speed/dense-large", "--workers", "3",
                    "--speed-repeats", "3") == 0  # fmt: skip
    assert sorted(p.name for p in rounds.iterdir()) == [
        "dense-large.0", "dense-large.1", "moe-large.0"]  # fmt: skip
    assert json.loads((rounds / "dense-large.0" / "roster.json").read_text())["variants"] == list(
        e2e.LARGE_VARIANTS[:3]
    )


def test_a_crashing_worker_costs_one_unit(
    ckpt: Path, pin: Path, tmp_path: Path, fake_worker: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_E2E_MODE", "crash:case/moe/modelopt/float16")
    assert run_main(ckpt, pin, tmp_path, "--only", "case/moe") == 1
    rep = json.loads((tmp_path / "out" / "e2e.json").read_text())
    bad = [c for c in rep["cases"] if c["status"] != "done"]
    assert [(c["model"], c["format"], c["dtype"]) for c in bad] == [("moe", "modelopt", "float16")]
    assert "worker exit 3" in bad[0]["error"] and "Received sigquit" in bad[0]["error"]
    monkeypatch.setenv("FAKE_E2E_MODE", "ok")
    assert run_main(ckpt, pin, tmp_path, "--only", "case/moe") == 0  # only the failed one again
    assert starts_of(fake_worker)[4:] == ["case/moe/modelopt/float16"]


def test_deadline_stops_workers_and_leaves_a_valid_report(
    ckpt: Path, pin: Path, tmp_path: Path, fake_worker: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_E2E_MODE", "sleep")
    t = time.time()
    rc = run_main(ckpt, pin, tmp_path, "--only", "negative,case/dense", "--deadline", "12",
                  "--stop-margin", "1", "--launch-margin", "0")  # fmt: skip
    assert rc == 1 and time.time() - t < 30
    rep = json.loads((tmp_path / "out" / "e2e.json").read_text())
    assert rep["stopped"] == "deadline" and rep["negative_control"]["refused"] is True
    assert {c["status"] for c in rep["cases"]} == {"failed"}
    assert all("stopped: deadline" in c["error"] for c in rep["cases"])


def test_plan_lists_units_and_missing_checkpoints(
    ckpt: Path, pin: Path, tmp_path: Path, fake_worker: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import shutil

    shutil.rmtree(ckpt / "moe" / "modelopt-nvfp4")
    assert e2e.main(["plan", "--checkpoints", str(ckpt), "--work", str(tmp_path / "w"),
                     "--pin", str(pin)]) == 0  # fmt: skip
    plan = json.loads(capsys.readouterr().out)
    assert len(plan["units"]) == 31 and plan["missing_checkpoints"] == [
        str(ckpt / "moe" / "modelopt-nvfp4")
    ]
    with pytest.raises(SystemExit, match="checkpoints missing"):
        run_main(ckpt, pin, tmp_path)
    with pytest.raises(SystemExit, match="no complete tree of the bare pin"):
        e2e.main(["run", "--checkpoints", str(ckpt), "--work", str(tmp_path / "w"),
                  "--pin", str(tmp_path), "--only", "negative"])  # fmt: skip


def _records(work: Path) -> dict[str, dict[str, Any]]:
    return {r["id"]: r for r in map(json.loads, map(Path.read_text,
                                                    (work / "units").glob("*.json")))}  # fmt: skip


def test_parallel_dry_run_with_a_stand_in_worker(
    ckpt: Path, pin: Path, tmp_path: Path, fake_worker: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    monkeypatch.setenv("NCCL_NVLS_ENABLE", "1")  # the host's environment says otherwise
    monkeypatch.delenv("NVSHMEM_DISABLE_NVLS", raising=False)
    events = tmp_path / "events.txt"
    monkeypatch.setenv("FAKE_E2E_EVENTS", str(events))
    monkeypatch.setenv("FAKE_E2E_SLOW", "speed/dense-large/ct-nvfp4")  # the last one-GPU unit
    # only the two-GPU units asked for: their one-GPU units come along, and run first
    assert run_main(ckpt, pin, tmp_path, "--parallel", "--gpus", "2", "--only", "parallel") == 0
    started = starts_of(fake_worker)
    one_gpu = [f"case/{m}/{f}/bfloat16" for m in report.E2E_MODELS for f in report.E2E_FORMATS]
    one_gpu += ["speed/dense-large/modelopt-nvfp4", "speed/dense-large/ct-nvfp4"]
    assert sorted(started[:8]) == sorted(one_gpu) and len(started) == 18
    assert "also running case/dense/compressed-tensors/bfloat16, " in capsys.readouterr().out
    # no parallel unit starts before every one-GPU unit has ended, although most of them could
    # (their own one-GPU unit done): a TP engine refuses GPUs whose free memory differs by more
    # than 10 %, and one-GPU engines sit on GPU 0
    lines = [ln.split() for ln in events.read_text().splitlines()]
    first = next(i for i, (what, uid) in enumerate(lines) if uid.startswith("parallel/"))
    ends = [i for i, (what, uid) in enumerate(lines) if what == "end" and "parallel/" not in uid]
    assert len(ends) == 8 and max(ends) < first
    recs = _records(tmp_path / "work")
    for uid in started:  # NVLink multicast off in every worker, whatever the host said
        assert recs[uid]["data"]["env"] == e2e.NO_MULTICAST_ENV, uid
    # the worker got the one-GPU results (the stand-in asserts their shape); they are kept
    ep2 = recs["parallel/modelopt/moe/ep2"]["data"]
    case = recs["case/moe/modelopt/bfloat16"]["data"]["nvfp4"]
    assert ep2["tp1"] == {"ppl_parts": case["ppl_parts"], "top1": case["top1"]}
    rep = json.loads((tmp_path / "out" / "e2e.json").read_text())
    assert len(rep["parallel"]) == 8 and len(rep["parallel_speed"]) == 4
    problems = report.check_report_dir(tmp_path / "out")
    assert [p for p in problems if p.startswith("e2e.json: parallel")] == []  # one GPU: partial
    assert "## Two GPUs" in (tmp_path / "out" / "e2e.md").read_text()
    # the rest of the run: every unit done, the whole report passes, nothing pending
    assert run_main(ckpt, pin, tmp_path, "--parallel", "--gpus", "2", "--workers", "4") == 0
    assert len(starts_of(fake_worker)) == 18 + 31 - 8
    pending: list[str] = []
    problems = report.check_report_dir(tmp_path / "out", pending=pending)
    assert [p for p in problems if p.startswith("e2e.json")] == [] and pending == []
    rep = json.loads((tmp_path / "out" / "e2e.json").read_text())
    assert rep["complete"] is True and len(rep["units"]) == 41
    # without --parallel the same records give the one-GPU report, its parallel part pending
    assert run_main(ckpt, pin, tmp_path) == 0
    assert len(starts_of(fake_worker)) == 41
    pending = []
    problems = report.check_report_dir(tmp_path / "out", pending=pending)
    assert [p for p in problems if p.startswith("e2e.json")] == []
    assert pending == [f"e2e.json: {report.E2E_PARALLEL_PENDING}"]


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("drift", "e2e.json: parallel modelopt dense bfloat16 tp 2 ep 1: perplexity "),
        ("flips", "e2e.json: parallel compressed-tensors moe bfloat16 tp 2 ep 2: top-1 agreement "
                  "with one GPU 0.949"),
    ],
)  # fmt: skip
def test_parallel_dry_run_gates_bad_numbers(
    ckpt: Path, pin: Path, tmp_path: Path, fake_worker: Path, monkeypatch: pytest.MonkeyPatch,
    mode: str, expected: str,
) -> None:  # fmt: skip
    monkeypatch.setenv("FAKE_E2E_MODE", mode)
    assert run_main(ckpt, pin, tmp_path, "--parallel", "--gpus", "2", "--only",
                    "parallel/*/dense/*,parallel/*/moe/*") == 0  # fmt: skip
    problems = [p for p in report.check_report_dir(tmp_path / "out")
                if p.startswith("e2e.json: parallel")]  # fmt: skip
    assert any(expected in p for p in problems), problems
    gate = "(gate 0.1%)" if mode == "drift" else "< 0.99"
    assert len([p for p in problems if gate in p]) == 6  # every unit run, nothing else
    assert "**Check: " in (tmp_path / "out" / "e2e.md").read_text()


def test_parallel_units_need_two_gpus(
    ckpt: Path, pin: Path, tmp_path: Path, fake_worker: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    assert isinstance(e2e.gpu_count(), int)  # torch's own answer here (0 on a CPU machine)
    with pytest.raises(SystemExit, match=r"this host has 1 CUDA GPU\(s\).*need 2.*a CUDA host "
                       r"with 2 GPUs \(serve/gpu-host.sh --parallel\)"):  # fmt: skip
        run_main(ckpt, pin, tmp_path, "--parallel", "--gpus", "1")
    monkeypatch.setattr(e2e, "gpu_count", lambda: 0)  # what torch says on this host
    with pytest.raises(SystemExit, match="this host has 0 CUDA GPU"):
        run_main(ckpt, pin, tmp_path, "--parallel")
    assert starts_of(fake_worker) == []  # refused before anything ran
    with pytest.raises(SystemExit, match="selects no unit.*need 2"):
        e2e.main(["plan", "--checkpoints", str(ckpt), "--work", str(tmp_path / "w"),
                  "--pin", str(pin), "--parallel", "--only", "parallel"])  # fmt: skip
    plan_args = ["plan", "--checkpoints", str(ckpt), "--work", str(tmp_path / "w"), "--pin",
                 str(pin), "--parallel"]  # fmt: skip
    assert e2e.main(plan_args) == 0
    plan = json.loads(capsys.readouterr().out)
    assert len(plan["units"]) == 31 and "this host has 0 CUDA GPU(s)" in plan["parallel"]
    assert plan["worker_env"] == e2e.NO_MULTICAST_ENV
    assert e2e.main([*plan_args, "--gpus", "2"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert len(plan["units"]) == 41 and plan["parallel"] == "planned (2 GPUs)"


def test_gpu_host_parallel_option(tmp_path: Path) -> None:
    """serve/gpu-host.sh --parallel: refused up front where torch sees fewer than 2 GPUs (this
    machine), before it installs or writes anything; multicast off for all it starts."""
    import subprocess

    if e2e.gpu_count() >= 2:
        pytest.skip("this host has 2 GPUs: --parallel would start the run")
    script = e2e.ROOT / "serve" / "gpu-host.sh"
    exports = [ln.split()[1:] for ln in script.read_text().splitlines()
               if ln.startswith("export NCCL_NVLS_ENABLE=")]  # fmt: skip
    assert [dict(a.split("=", 1) for a in line) for line in exports] == [e2e.NO_MULTICAST_ENV]
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "python3").symlink_to(sys.executable)
    env = {**os.environ, "PATH": f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}"}
    out = tmp_path / "out"
    proc = subprocess.run(["bash", str(script), "--parallel", "--out", str(out)], env=env,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "--parallel needs a CUDA host with 2 GPUs; torch.cuda.device_count() is 0" in proc.stderr
    assert not out.exists()
    help_text = subprocess.run(["bash", str(script), "--help"], capture_output=True, text=True,
                               timeout=30).stdout  # fmt: skip
    assert "--parallel (a host with 2 GPUs)" in help_text and "set -e" not in help_text


STUB_PYTHON = """#!/usr/bin/env bash
# python3 of a stand-in 2-GPU host: torch counts 2 GPUs; the checkpoint maker of the speed
# models ends once the first e2e pass has begun
case "$*" in
  *device_count*) echo 2 ;;
  *serve/make_checkpoints.py*)
    for _ in $(seq 600); do [ -f .work/calls.txt ] && exit; sleep 0.1; done ;;
  *) echo "unexpected python3 $*" >&2; exit 9 ;;
esac
"""
STUB_PROOF = """#!/usr/bin/env bash
multicast="$NCCL_NVLS_ENABLE $TORCH_SYMM_MEM_DISABLE_MULTICAST $NVSHMEM_DISABLE_NVLS"
echo "$FP4SERIES_E2E_ARGS|$multicast|$*" >> .work/calls.txt
"""


def stand_in_host(tmp_path: Path, python3: str, *done: str) -> tuple[Path, dict[str, str]]:
    """A copy of serve/gpu-host.sh with stand-ins for scripts/gpu-proof.sh (it records its
    calls) and python3 (the script PYTHON3), the results DONE already there under .work/;
    returns the repository and the environment to run it in."""
    import shutil

    repo = tmp_path / "repo"
    (repo / "serve").mkdir(parents=True)
    shutil.copy(e2e.ROOT / "serve" / "gpu-host.sh", repo / "serve" / "gpu-host.sh")
    proof = repo / "scripts" / "gpu-proof.sh"
    proof.parent.mkdir()
    proof.write_text(STUB_PROOF)
    proof.chmod(0o755)
    unpacked = "checkout/python/sglang/srt/layers/quantization/marlin_utils_fp4.py"
    for f in ("gpu-site/.installed", "logs/builds.started", "revision.json", unpacked, *done):
        (repo / ".work" / f).parent.mkdir(parents=True, exist_ok=True)
        (repo / ".work" / f).write_text("{}")
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "python3").write_text(python3)
    (tmp_path / "bin" / "python3").chmod(0o755)
    env = {**os.environ, "PATH": f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}"}
    env.pop("FP4SERIES_E2E_ARGS", None)
    return repo, env


def test_gpu_host_parallel_flow_with_stand_ins(tmp_path: Path) -> None:
    """serve/gpu-host.sh --parallel on a stand-in 2-GPU host whose speed-model checkpoints are
    still being made: the gated one-GPU units first (no parallel unit beside the checkpoint
    maker on GPU 0), then, once the checkpoints are there, the rest with --parallel; NVLink
    multicast off in what it starts."""
    import subprocess

    repo, env = stand_in_host(tmp_path, STUB_PYTHON, "checkpoints/full/made-trained",
                              "gpu-host-out/fused_shards/numerics.json")  # fmt: skip
    env["NCCL_NVLS_ENABLE"] = "1"
    work = repo / ".work"
    proc = subprocess.run(["bash", str(repo / "serve" / "gpu-host.sh"), "--parallel"], env=env,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (work / "checkpoints" / "full" / "made-large").is_file()
    calls = [ln.split("|") for ln in (work / "calls.txt").read_text().splitlines()]
    assert calls == [
        [" --parallel --only negative,case,unquantized,http", "0 1 1",
         "--stages e2e --deadline 100000 --out .work/gpu-host-out"],
        [" --parallel", "0 1 1", "--stages e2e --deadline 100000 --out .work/gpu-host-out"],
    ]  # fmt: skip


SPEED_PYTHON = """#!/usr/bin/env bash
# python3 of a stand-in 1-GPU host: the checkpoint maker records what it was asked for
case "$*" in
  *serve/make_checkpoints.py*) echo "$*" >> .work/makes.txt; mkdir -p .work/checkpoints/full ;;
  *) echo "unexpected python3 $*" >&2; exit 9 ;;
esac
"""


def test_gpu_host_speed_flow_with_stand_ins(tmp_path: Path) -> None:
    """serve/gpu-host.sh --speed: only the named speed models are made (not the trained ones),
    no fused_shards stage, one e2e pass with --only speed/MODEL...; unknown models and
    --speed with --parallel refused before anything runs."""
    import subprocess

    repo, env = stand_in_host(tmp_path, SPEED_PYTHON)
    work = repo / ".work"

    def host(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["bash", str(repo / "serve" / "gpu-host.sh"), *args], env=env,
                              capture_output=True, text=True, timeout=120)  # fmt: skip

    says_models = "give dense-large, moe-large, dense-8b or several"
    refusals = (
        (["--speed", "dense-large,moe"], says_models),
        (["--speed", "dense-large,"], says_models),
        (["--speed", "dense-large moe-large"], says_models),
        (["--speed", "dense-8b,dense-large,moe-large,dense-8b"], says_models),
        (["--speed", "dense-large", "--parallel"], "--speed and --parallel"),
    )
    for bad, says in refusals:
        proc = host(*bad)
        assert proc.returncode == 2 and says in proc.stderr, proc.stdout + proc.stderr
    assert not (work / "makes.txt").exists() and not (work / "calls.txt").exists()
    proc = host("--speed", "moe-large,dense-large", "--out", ".work/speed-out")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (work / "makes.txt").read_text().split("\n")[:-1] == [
        "serve/make_checkpoints.py --models dense-large,moe-large"
    ]
    assert (work / "checkpoints" / "full" / "made-speed-dense-large+moe-large").is_file()
    assert not (work / "checkpoints" / "full" / "made-trained").exists()
    calls = [ln.split("|") for ln in (work / "calls.txt").read_text().splitlines()]
    assert calls == [
        [" --speed-models dense-large,moe-large --only speed/dense-large,speed/moe-large",
         "0 1 1",
         "--stages e2e --deadline 100000 --out .work/speed-out"],
    ]  # fmt: skip
    # a full run's marker serves dense-large and moe-large, not dense-8b: that one is made
    (work / "checkpoints" / "full" / "made-large").touch()
    proc = host("--speed", "dense-8b,dense-large", "--out", ".work/speed-out")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (work / "makes.txt").read_text().split("\n")[1:-1] == [
        "serve/make_checkpoints.py --models dense-8b,dense-large"
    ]
    assert (work / "checkpoints" / "full" / "made-speed-dense-8b+dense-large").is_file()


def test_a_failed_one_gpu_unit_fails_its_parallel_units_without_a_worker(
    ckpt: Path, pin: Path, tmp_path: Path, fake_worker: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_E2E_MODE", "crash:case/moe/modelopt/bfloat16")
    assert run_main(ckpt, pin, tmp_path, "--parallel", "--gpus", "2", "--only",
                    "parallel/modelopt/moe") == 1  # fmt: skip
    assert starts_of(fake_worker) == ["case/moe/modelopt/bfloat16"]
    rep = json.loads((tmp_path / "out" / "e2e.json").read_text())
    assert [(r["ep_size"], r["status"], r["error"]) for r in rep["parallel"]
            if r["format"] == "modelopt" and r["model"] == "moe"] == [
        (1, "failed", "needs the one-GPU unit case/moe/modelopt/bfloat16, which is failed"),
        (2, "failed", "needs the one-GPU unit case/moe/modelopt/bfloat16, which is failed"),
    ]  # fmt: skip
    monkeypatch.setenv("FAKE_E2E_MODE", "ok")  # the next run redoes the case, then them
    assert run_main(ckpt, pin, tmp_path, "--parallel", "--gpus", "2", "--only",
                    "parallel/modelopt/moe") == 0  # fmt: skip
    assert starts_of(fake_worker)[1:] == ["case/moe/modelopt/bfloat16",
                                          "parallel/modelopt/moe/tp2",
                                          "parallel/modelopt/moe/ep2"]  # fmt: skip


def test_pin_wheel_is_checked_and_unpacked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import hashlib
    import zipfile

    wheel = tmp_path / "sglang-0.5.11-cp311-cp311-manylinux_2_34_x86_64.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("sglang/srt/entrypoints/engine.py", "")
        zf.writestr("sglang-0.5.11.dist-info/RECORD", "")
    lock = {"tag": "v0.5.11", "wheel_filename": wheel.name,
            "sha256": hashlib.sha256(wheel.read_bytes()).hexdigest()}  # fmt: skip
    monkeypatch.setattr(e2e, "pin_lock", lambda: lock)
    tree = Path(e2e.resolve_pin(wheel, tmp_path / "work"))
    assert (tree / "sglang" / "srt" / "entrypoints" / "engine.py").is_file()
    assert not (tree / "sglang-0.5.11.dist-info").exists()
    lock["sha256"] = "0" * 64
    with pytest.raises(SystemExit, match="is not the pin's"):
        e2e.resolve_pin(wheel, tmp_path / "work2")


def test_render_command(tmp_path: Path) -> None:
    s = settings()
    units, records = full_records(s, tmp_path)
    src = tmp_path / "e2e.json"
    src.write_text(json.dumps(assemble(units, records, s)))
    assert e2e.main(["render", str(src)]) == 0
    assert "**Check: OK**" in (tmp_path / "e2e.md").read_text()


# --------------------------------------------------------------------------- e2e_engine.py


class FakeEngine:
    """The Engine surface the worker uses, with the pin's keyword names (a misnamed argument
    fails); NVFP4 engines predict a different token at every 50th position."""

    log: Path | None = None
    started: list[str] = []
    server_args: list[dict[str, Any]] = []
    rank_env: Path | None = None  # where the stand-in ranks write the environment they got

    def __init__(self, *, model_path: str, dtype: str, log_level: str, random_seed: int,
                 **server_args: Any) -> None:  # fmt: skip
        assert dtype in report.DTYPES and log_level == "info"
        self.nvfp4 = "nvfp4" in model_path
        self.started.append(Path(model_path).name)
        self.server_args.append(server_args)
        if server_args.get("tp_size", 1) > 1:  # SGLang spawns one scheduler per rank
            import multiprocessing

            ctx = multiprocessing.get_context("spawn")
            ranks = [ctx.Process(target=_e2e_fake.rank_env, args=(str(self.rank_env), r))
                     for r in range(server_args["tp_size"])]  # fmt: skip
            for proc in ranks:
                proc.start()
            for proc in ranks:
                proc.join(60)
                assert proc.exitcode == 0
        if self.log and self.nvfp4:
            with self.log.open("a") as fh:
                fh.write("x: ...; serving NVFP4 weight-only through FP4 Marlin (activations ...)\n")

    def _next(self, ids: list[int]) -> int:
        token = (ids[-1] * 3 + 1) % 1000
        return token + 1 if self.nvfp4 and len(ids) % 50 == 0 else token

    def generate(self, prompt: Any = None, sampling_params: Any = None, input_ids: Any = None,
                 return_logprob: bool = False, logprob_start_len: Any = None,
                 top_logprobs_num: Any = None) -> list[dict[str, Any]]:  # fmt: skip
        n = sampling_params.get("max_new_tokens", 128)
        outs = []
        for ids in input_ids:
            gen = list(ids)
            for _ in range(n):
                gen.append(self._next(gen))
            meta: dict[str, Any] = {}
            if return_logprob:
                assert logprob_start_len == 0
                lp = -1.01 if self.nvfp4 else -1.0
                meta["input_token_logprobs"] = [(None, ids[0], None)] + [
                    (lp, t, None) for t in ids[1:]
                ]
                if top_logprobs_num:
                    meta["input_top_logprobs"] = [None] + [
                        [(-0.1, self._next(list(ids[:i])), None)] for i in range(1, len(ids))
                    ]
            outs.append({"output_ids": gen[len(ids) :], "meta_info": meta})
        return outs

    def flush_cache(self) -> bool:
        return True

    def get_server_info(self) -> dict[str, Any]:
        weight = 0.06 if self.nvfp4 else 0.12
        return {"internal_states": [{"memory_usage": {"weight": weight, "kvcache": 0.5}}]}

    def shutdown(self) -> None:
        pass


def stand_in_engine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """SGLang's Engine replaced by FakeEngine for e2e_engine's workers; the unit's log."""
    names = ("sglang", "sglang.srt", "sglang.srt.entrypoints", "sglang.srt.entrypoints.engine")
    for name in names:
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    sys.modules["sglang.srt.entrypoints.engine"].Engine = FakeEngine  # type: ignore[attr-defined]
    log = tmp_path / "unit.log"
    log.write_text("")
    monkeypatch.setattr(FakeEngine, "log", log)
    return log


def worker_job(unit: e2e.Unit, s: dict[str, Any], tmp_path: Path, log: Path) -> dict[str, Any]:
    """The job file the runner would hand e2e_engine for UNIT."""
    job = {"id": unit.id, "kind": unit.kind, "spec": unit.spec, "settings": s, "hash": "h",
           "locks": str(tmp_path / "locks"), "result": str(tmp_path / "rec.json"),
           "log": str(log), "tokens": e2e.token_sets(list(range(40000)), s)}  # fmt: skip
    if unit.kind == "speed":
        job["rounds"] = str(tmp_path / "locks" / "rounds" / unit.spec["model"])
    return job


def test_engines_shut_down_only_while_no_engine_is_timed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An engine's shutdown holds the gate's start lock (shared), which Gate.quiet takes
    exclusively: no engine stops on the GPU while another's speed is measured."""
    import fcntl

    log = stand_in_engine(tmp_path, monkeypatch)
    seen: list[str] = []

    def shutdown(self: FakeEngine) -> None:
        with (tmp_path / "locks" / "start.lock").open("a") as fh:  # as quiet() would take it
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
                seen.append("free")
            except BlockingIOError:
                seen.append("held")

    monkeypatch.setattr(FakeEngine, "shutdown", shutdown)
    s = settings()
    unit = next(u for u in e2e.plan_units(tmp_path, s, None) if u.kind == "speed")
    job = worker_job(unit, s, tmp_path, log)
    with e2e_engine.Session(job, "/m/modelopt-nvfp4", e2e.Gate(tmp_path / "locks")):
        pass
    assert seen == ["held"]


def test_worker_case_against_a_stand_in_engine(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = stand_in_engine(tmp_path, monkeypatch)
    s = settings("--speed-batches", "1,8")
    unit = next(u for u in e2e.plan_units(tmp_path, s, None)
                if u.id == "case/dense/modelopt/bfloat16")  # fmt: skip
    job = worker_job(unit, s, tmp_path, log)
    job_path = tmp_path / "job.json"
    job_path.write_text(json.dumps(job))
    assert e2e_engine.main([str(job_path)]) == 0
    rec = json.loads((tmp_path / "rec.json").read_text())
    assert rec["status"] == "done" and rec["data"]["reference"]["complete"]
    case = e2e.assemble_case(rec)
    assert case["ppl_rel_diff"] == pytest.approx(math.exp(0.01) - 1, rel=1e-4)
    assert case["reference_top1_is_its_greedy"] == 1.0  # teacher forcing == its own greedy
    assert 0.95 < case["top1_agreement"] < 1.0 and case["agreement_tokens"] == 8 * 128
    assert case["marlin_log"] and case["tokens_scored"] == 4 * 511
    rows = e2e.speed_rows(rec)
    assert [(r["kind"], r["batch"]) for r in rows] == [("decode", 1), ("decode", 8),
                                                       ("prefill", 1)]  # fmt: skip
    assert e2e.memory_row(rec)["nvfp4_weight_gib"] == 0.06
    # a rerun keeps the finished reference session (its greedy text) and redoes the rest
    del rec["data"]["nvfp4"]
    job["previous"] = rec["data"]
    job_path.write_text(json.dumps(job))
    assert e2e_engine.main([str(job_path)]) == 0
    again = json.loads((tmp_path / "rec.json").read_text())
    assert again["data"]["reference"] == rec["data"]["reference"]
    assert e2e.assemble_case(again)["top1_agreement"] == case["top1_agreement"]
    # a redone reference (new greedy text) means the NVFP4 session is redone too
    job["previous"] = json.loads(json.dumps(again["data"]))
    job["previous"]["reference"]["complete"] = False
    job_path.write_text(json.dumps(job))
    FakeEngine.started.clear()
    assert e2e_engine.main([str(job_path)]) == 0
    assert FakeEngine.started == ["reference-modelopt", "modelopt-nvfp4"]


def test_worker_speed_unit_against_a_stand_in_engine(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = stand_in_engine(tmp_path, monkeypatch)
    s = settings("--large-batches", "1,8", "--large-prefill-tokens", "1024,2048")
    unit = next(u for u in e2e.plan_units(tmp_path, s, None)
                if u.id == "speed/dense-large/modelopt-nvfp4")  # fmt: skip
    job = worker_job(unit, s, tmp_path, log)
    job_path = tmp_path / "job.json"
    job_path.write_text(json.dumps(job))
    assert e2e_engine.main([str(job_path)]) != 0  # no checkpoint there: a clear failure
    rec = json.loads((tmp_path / "rec.json").read_text())
    assert "make_checkpoints.py --models dense-large)" in rec["error"]
    Path(unit.spec["path"]).mkdir(parents=True)
    (Path(unit.spec["path"]) / "config.json").write_text("{}")
    assert e2e_engine.main([str(job_path)]) == 0
    rec = json.loads((tmp_path / "rec.json").read_text())
    speed = rec["data"]["speed"]
    assert sorted(speed["decode"], key=int) == ["1", "8"]
    assert {k: v["tokens"] for k, v in speed["prefill"].items()} == {"1024": 1024, "2048": 2048}
    assert rec["data"]["memory"]["weight_gib"] in (0.06, 0.12)
    reps = s["speed_repeats"]
    assert rec["data"]["rounds"]["roster"] == ["modelopt-nvfp4"]
    assert rec["data"]["rounds"]["rounds"] == reps and rec["data"]["rounds"]["id"] > 0
    assert all(len(d["full"]) == len(d["one"]) == reps for d in speed["decode"].values())
    assert all(len(p["times"]) == reps for p in speed["prefill"].values())
    assert len(speed["turns"]) == reps and all(a <= b for a, b in speed["turns"])
    assert sorted(p.name for p in Path(job["rounds"]).iterdir()) == sorted(
        [f"{r}.modelopt-nvfp4.done" for r in range(reps)]
        + ["modelopt-nvfp4.alive", "modelopt-nvfp4.hello"]
    )


def test_worker_parallel_units_against_a_stand_in_engine(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = stand_in_engine(tmp_path, monkeypatch)
    monkeypatch.setattr(FakeEngine, "rank_env", tmp_path / "ranks.jsonl")
    monkeypatch.setattr(FakeEngine, "server_args", [])
    for key in e2e.NO_MULTICAST_ENV:  # the worker's own environment says otherwise
        monkeypatch.setenv(key, "7")
    s = settings()
    units = {u.id: u for u in e2e.plan_units(tmp_path, s, None, parallel=True)}
    # the one-GPU case first, as the runner does; its record is what the unit compares with
    job = worker_job(units["case/moe/modelopt/bfloat16"], s, tmp_path, log)
    (tmp_path / "case.json").write_text(json.dumps(job))
    assert e2e_engine.main([str(tmp_path / "case.json")]) == 0
    case = json.loads((tmp_path / "rec.json").read_text())["data"]
    unit = units["parallel/modelopt/moe/ep2"]
    job = worker_job(unit, s, tmp_path, log)
    job["tp1"] = {
        "unit": unit.spec["after"],
        "greedy": case["reference"]["greedy"],
        "ppl_parts": case["nvfp4"]["ppl_parts"],
        "top1": case["nvfp4"]["top1"],
    }
    (tmp_path / "job.json").write_text(json.dumps(job))
    assert e2e_engine.main([str(tmp_path / "job.json")]) != 0  # no checkpoint there
    assert "no checkpoint" in json.loads((tmp_path / "rec.json").read_text())["error"]
    Path(unit.spec["nvfp4"]).mkdir(parents=True)
    (Path(unit.spec["nvfp4"]) / "config.json").write_text("{}")
    assert e2e_engine.main([str(tmp_path / "job.json")]) == 0
    assert FakeEngine.server_args[-1]["tp_size"] == 2 and FakeEngine.server_args[-1]["ep_size"] == 2
    assert "tp_size" not in FakeEngine.server_args[0]  # the one-GPU engines: defaults
    ranks = [json.loads(ln) for ln in (tmp_path / "ranks.jsonl").read_text().splitlines()]
    assert sorted(r["rank"] for r in ranks) == [0, 1]
    assert all(r["env"] == e2e.NO_MULTICAST_ENV for r in ranks)  # what the engine's ranks got
    rec = json.loads((tmp_path / "rec.json").read_text())
    row = e2e.assemble_parallel(rec)
    assert (row["tp_size"], row["ep_size"], row["status"]) == (2, 2, "done")
    assert row["ppl_nvfp4"] == pytest.approx(row["ppl_tp1"])  # the same stand-in numerics
    assert row["top1_agreement"] == 1.0 and row["agreement_tokens"] == 8 * 128
    assert row["marlin_log"] and rec["data"]["compared_with"] == "case/moe/modelopt/bfloat16"
    problems: list[str] = []
    report.check_e2e_parallel_record("e2e.json", row, problems)
    assert problems == []
    # no one-GPU results: a clear failure, not a row of Nones
    job["tp1"] = {"unit": unit.spec["after"], "greedy": None, "ppl_parts": None, "top1": None}
    (tmp_path / "job.json").write_text(json.dumps(job))
    assert e2e_engine.main([str(tmp_path / "job.json")]) != 0
    error = json.loads((tmp_path / "rec.json").read_text())["error"]
    assert (
        "no one-GPU results to compare with: case/moe/modelopt/bfloat16 has no ppl_parts" in error
    )
    assert "serve/e2e.py --only case/moe/modelopt/bfloat16" in error
    # the speed unit: decode at batch 1 and 32 with tp_size=2, beside the one-GPU timings
    unit = units["parallel/compressed-tensors/dense-large/tp2"]
    job = worker_job(unit, s, tmp_path, log)
    tp1 = _e2e_fake.unit_data("speed", {"variant": "ct-nvfp4"}, s)["speed"]["decode"]
    job["tp1"] = {"unit": unit.spec["after"], "decode": tp1}
    (tmp_path / "job.json").write_text(json.dumps(job))
    Path(unit.spec["path"]).mkdir(parents=True)
    (Path(unit.spec["path"]) / "config.json").write_text("{}")
    assert e2e_engine.main([str(tmp_path / "job.json")]) == 0
    rec = json.loads((tmp_path / "rec.json").read_text())
    assert sorted(rec["data"]["speed"]["decode"], key=int) == ["1", "32"]
    assert rec["data"]["tp1"]["decode"] == {"1": tp1["1"], "32": tp1["32"]}
    rows = e2e.parallel_speed_rows(rec)
    assert [(r["batch"], r["tp_size"], r["variant"]) for r in rows] == [
        (1, 2, "ct-nvfp4"), (32, 2, "ct-nvfp4")]  # fmt: skip
    assert all(r["tp1_tok_s"] and r["tok_s"] for r in rows)


def _tree(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return root


PIN_FILES = {
    "sglang/__init__.py": "",
    "sglang/srt/__init__.py": "",
    "sglang/srt/layers/__init__.py": "",
    "sglang/srt/layers/quantization/__init__.py": "",
    "sglang/srt/layers/quantization/fp4_utils.py": """\
        import enum
        class Fp4GemmRunnerBackend(enum.Enum):
            AUTO = "auto"
        """,
    "sglang/srt/entrypoints/__init__.py": "",
    "sglang/srt/entrypoints/engine.py": """\
        import sys
        class Engine:
            def __init__(self, **kwargs):
                print("ValueError: The quantization method modelopt_fp4 is not supported for "
                      "the current GPU. Minimum capability: 100. Current capability: 90.",
                      file=sys.stderr, flush=True)
                raise RuntimeError("Initialization failed. Please see the error messages above.")
        """,
}


def test_negative_control_runs_the_bare_pin_in_a_child(tmp_path: Path) -> None:
    pin = _tree(tmp_path / "pin", PIN_FILES)
    job = {"id": "negative", "kind": "negative", "hash": "h", "locks": str(tmp_path / "locks"),
           "result": str(tmp_path / "rec.json"), "log": str(tmp_path / "log"),
           "spec": {"path": "/ckpt/dense/modelopt-nvfp4", "dtype": "bfloat16",
                    "pin_tree": str(pin)},
           "settings": settings("--attention-backend", "triton"),
           "pin_env": e2e.pin_env(os.environ, str(pin), str(tmp_path / "cache"))}  # fmt: skip
    rec = e2e_engine.Record(job)
    e2e_engine.run_negative(job, rec)
    d = rec.data
    assert d["refused"] is True and d["bare"] is True and d["returncode"] == 3
    assert "Minimum capability: 100" in d["message"]
    assert d["sglang_file"].startswith(str(pin))
    # a tree that starts the engine (and has MARLIN) is no refusal
    patched = _tree(tmp_path / "patched", {
        **PIN_FILES,
        "sglang/srt/layers/quantization/fp4_utils.py": """\
            import enum
            class Fp4GemmRunnerBackend(enum.Enum):
                MARLIN = "marlin"
            """,
        "sglang/srt/entrypoints/engine.py": """\
            class Engine:
                def __init__(self, **kwargs):
                    pass
                def shutdown(self):
                    pass
            """,
    })  # fmt: skip
    job["pin_env"] = e2e.pin_env(os.environ, str(patched), str(tmp_path / "cache"))
    rec = e2e_engine.Record(job)
    e2e_engine.run_negative(job, rec)
    assert rec.data["refused"] is False and rec.data["bare"] is False


SERVER = """\
    import argparse, json, sys
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
    p = argparse.ArgumentParser()
    p.add_argument("--host"); p.add_argument("--port", type=int); p.add_argument("--model-path")
    args, _ = p.parse_known_args()
    print("Using CompressedTensorsW4A16Fp4 for W4A4 NVFP4: no FP4 tensor cores; serving it "
          "weight-only through FP4 Marlin, activations are not quantized.", flush=True)
    class H(BaseHTTPRequestHandler):
        def _send(self, body):
            data = json.dumps(body).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        def do_GET(self):
            self._send({"object": "list", "data": [{"id": args.model_path, "object": "model",
                        "created": 0, "owned_by": "sglang"}]})
        def do_POST(self):
            req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            assert req["temperature"] == 0 and req["model"] == args.model_path
            self._send({"id": "c", "object": "text_completion", "created": 0,
                        "model": req["model"], "choices": [{"index": 0, "text": " x, y):",
                        "finish_reason": "length", "logprobs": None}],
                        "usage": {"prompt_tokens": 9, "completion_tokens": req["max_tokens"],
                                  "total_tokens": 9 + req["max_tokens"]}})
        def log_message(self, *a):
            pass
    ThreadingHTTPServer((args.host, args.port), H).serve_forever()
    """


def test_http_unit_against_a_stand_in_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("openai")
    tree = _tree(tmp_path / "srv", {"sglang/__init__.py": "", "sglang/launch_server.py": SERVER})
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tree), os.environ.get("PYTHONPATH",
                                                                                 "")]))  # fmt: skip
    log = tmp_path / "unit.log"
    job = {"id": "http/marlin", "kind": "http", "hash": "h", "locks": str(tmp_path / "locks"),
           "result": str(tmp_path / "rec.json"), "log": str(log),
           "spec": {"path": "/ckpt/moe/modelopt-nvfp4", "dtype": "bfloat16",
                    "backend": "marlin"},
           "settings": settings("--http-max-tokens", "8")}  # fmt: skip
    rec = e2e_engine.Record(job)
    e2e_engine.run_http(job, rec)
    d = rec.data
    assert d["ok"] is True and d["response"]["text"] == " x, y):"
    assert d["request"] == {
        "endpoint": "/v1/completions", "model": "/ckpt/moe/modelopt-nvfp4",
        "prompt": e2e.HTTP_PROMPT, "max_tokens": 8, "temperature": 0,
    }  # fmt: skip
    assert "--fp4-gemm-backend marlin" in d["command"] and d["fp4_gemm_backend"] == "marlin"
    assert d["marlin_log"] and d["server_exit"] is not None  # stopped, its output in the log
    pids = json.loads((tmp_path / "rec.pids").read_text())["groups"]
    with pytest.raises(ProcessLookupError):
        os.killpg(pids[0], 0)


# --------------------------------------------------------------------------- the pin's API


def _sglang_source() -> Path:
    tree = e2e.sglang_tree()
    if tree is None or not (tree / "sglang" / "srt" / "server_args.py").is_file():
        pytest.skip("no SGLang tree on PYTHONPATH (CI puts the patched pin there)")
    return tree / "sglang"


def _class(path: Path, name: str) -> ast.ClassDef:
    tree = ast.parse(path.read_text())
    return next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == name)


def test_engine_and_server_names_are_the_pins() -> None:
    src = _sglang_source()
    fields = {n.target.id for n in _class(src / "srt" / "server_args.py", "ServerArgs").body
              if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}  # fmt: skip
    s = settings("--cuda-graph-max-bs", "32", "--mem-fraction-static", "0.5",
                 "--disable-piecewise-cuda-graph", "--attention-backend", "triton")  # fmt: skip
    assert set(e2e.engine_kwargs(s, "/m", "bfloat16", tp_size=2, ep_size=2)) <= fields
    args_text = (src / "srt" / "server_args.py").read_text()
    assert "self.ep_size * self.moe_dp_size == self.tp_size" in args_text  # ep 2 needs tp 2
    # the engine keeps the NCCL_NVLS_ENABLE it is given unless one of these is on: both off
    # by default, and never set by serve/e2e.py
    for flag in ("enable_nccl_nvls", "enable_symm_mem"):
        assert f"{flag}: bool = False" in args_text
        assert flag not in e2e.engine_kwargs(s, "/m", "bfloat16", tp_size=2, ep_size=2)
    eng = (src / "srt" / "entrypoints" / "engine.py").read_text()
    assert '"NCCL_NVLS_ENABLE" not in os.environ' in eng
    # why the parallel units wait for the one-GPU engines to end (Runner.blocked)
    runner = (src / "srt" / "model_executor" / "model_runner.py").read_text()
    assert "pre_model_load_memory < local_gpu_memory * 0.9" in runner
    assert (
        "SGLANG_ENABLE_TP_MEMORY_INBALANCE_CHECK = EnvBool(True)"
        in (src / "srt" / "environ.py").read_text()
    )
    text = (src / "srt" / "server_args.py").read_text()
    for flag in [a for a in e2e.server_command(s, "/m", "bfloat16", 1, "marlin") if a[:2] == "--"]:
        assert f'"{flag}"' in text, flag
    engine = _class(src / "srt" / "entrypoints" / "engine.py", "Engine")
    methods = {n.name: n for n in engine.body if isinstance(n, ast.FunctionDef)}
    assert {"generate", "flush_cache", "get_server_info", "shutdown"} <= set(methods)
    params = {a.arg for a in methods["generate"].args.args}
    assert {"input_ids", "sampling_params", "return_logprob", "logprob_start_len",
            "top_logprobs_num"} <= params  # fmt: skip
    tm = (src / "srt" / "managers" / "tokenizer_manager.py").read_text()
    for key in ('"input_token_logprobs"', '"input_top_logprobs"', '"output_ids"'):
        assert key in tm
    assert 'ret["memory_usage"]' in (src / "srt" / "managers" / "scheduler.py").read_text()
    assert "Minimum capability" in (src / "srt" / "model_loader" / "loader.py").read_text()
    assert (src / "launch_server.py").is_file()


def test_marlin_log_patterns_are_the_series_messages() -> None:
    src = _sglang_source()
    fp4 = (src / "srt" / "layers" / "quantization" / "fp4_utils.py").read_text()
    if "should_use_fp4_marlin" not in fp4:
        pytest.skip("the SGLang tree on PYTHONPATH is not the patched pin")
    text = "\n".join(p.read_text() for p in (src / "srt" / "layers" / "quantization").rglob("*.py"))
    for pattern in e2e.MARLIN_PATTERNS:
        assert pattern in text, pattern


def test_free_port_leaves_room_for_the_ports_sglang_derives():
    """SGLang derives the gRPC port as --port + 10000 and refuses one above 65535."""
    import socket

    port = e2e_engine.free_port(start=e2e_engine.PORT_RANGE[1] - 1)
    assert all(port + d <= 65535 for d in e2e_engine.DERIVED_PORT_OFFSETS)
    # a taken derived port moves the choice on
    with socket.socket() as held:
        held.bind(("127.0.0.1", port + 10000))
        again = e2e_engine.free_port(start=port)
    assert again != port
    assert all(e2e_engine._port_free(again + d) for d in e2e_engine.DERIVED_PORT_OFFSETS)


def test_reports_name_project_paths_not_the_hosts() -> None:
    root = Path("/srv/ci/checkout")
    rep = {"checkpoint": "/srv/ci/checkout/.work/checkpoints/full/dense/ct-nvfp4",
           "commands": ["PYTHONPATH=/srv/ci/checkout/.work/gpu-site python x"], "n": 3,
           "other": "/opt/elsewhere"}  # fmt: skip
    out = e2e.portable(rep, root)
    assert out["checkpoint"] == ".work/checkpoints/full/dense/ct-nvfp4"
    assert out["commands"] == ["PYTHONPATH=.work/gpu-site python x"]
    assert (out["n"], out["other"]) == (3, "/opt/elsewhere")
