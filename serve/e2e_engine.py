"""The engine-facing half of serve/e2e.py: runs one unit in this process and writes its record.

``python serve/e2e_engine.py JOB.json`` (serve/e2e.py writes the job and reads the record);
``python serve/e2e_engine.py --probe-pin KWARGS_JSON`` (the negative control's child, run with
the bare pin on PYTHONPATH). Everything that imports SGLang or the ``openai`` client is here;
the arithmetic (perplexity, agreement, rates, memory parsing) is serve/e2e.py's, CPU-tested.
NVLink multicast is switched off in this process's environment before SGLang is imported, so
every process the engine or a server starts inherits it (``e2e.NO_MULTICAST_ENV``).

API of the pin (v0.5.11) used: ``sglang.srt.entrypoints.engine.Engine(**ServerArgs fields)``,
``Engine.generate(input_ids=, sampling_params=, return_logprob=, logprob_start_len=,
top_logprobs_num=)`` (a list of dicts with ``output_ids`` and ``meta_info`` holding
``input_token_logprobs`` / ``input_top_logprobs``, entry 0 None), ``Engine.flush_cache()``,
``Engine.get_server_info()``, ``Engine.shutdown()``; ``python -m sglang.launch_server`` and its
``/v1/models`` and ``/v1/completions``; on two GPUs the ServerArgs ``tp_size`` and ``ep_size``.
"""

from __future__ import annotations

import json
import os
import shlex
import socket
import subprocess
import sys
import time
import traceback
import urllib.request
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import e2e  # noqa: E402

T0 = time.time()
# Scoring requests: no new token; greedy, so that the prefill's sampling step is an argmax and
# never one of flashinfer's sampling kernels (JIT-built on first use; greedy never needs them).
SCORE = {"max_new_tokens": 0, "temperature": 0.0}


def say(msg: str) -> None:
    print(f"[unit {time.time() - T0:6.1f}s] {msg}", flush=True)


class Record:
    """The unit's record file, rewritten after every step (a crash leaves what was done)."""

    def __init__(self, job: dict[str, Any]) -> None:
        self.path = Path(job["result"])
        self.rec: dict[str, Any] = {
            "id": job["id"], "kind": job["kind"], "spec": job["spec"], "hash": job["hash"],
            "status": "running", "started": time.time(), "error": None, "data": {},
            "pid": os.getpid()}  # fmt: skip
        self.save()

    @property
    def data(self) -> dict[str, Any]:
        return self.rec["data"]

    def save(self) -> None:
        e2e.write_json(self.path, self.rec)

    def finish(self, error: str | None = None) -> None:
        self.rec["status"] = "failed" if error else "done"
        self.rec["error"] = error
        self.rec["seconds"] = round(time.time() - self.rec["started"], 1)
        self.save()


class Session:
    """One ``sglang.Engine`` for one checkpoint, started under the gate's ``starting`` lock
    (``alone``: exclusively, so that the memory it reports after load is its own)."""

    def __init__(self, job: dict[str, Any], path: str, gate: e2e.Gate, alone: bool = False) -> None:
        spec = job["spec"]
        self.alone = alone
        self.kwargs = e2e.engine_kwargs(job["settings"], path, spec["dtype"],
                                        tp_size=spec.get("tp_size", 1),
                                        ep_size=spec.get("ep_size", 1))  # fmt: skip
        self.gate, self.log = gate, Path(job["log"])
        self.engine: Any = None

    def __enter__(self) -> Session:
        self.offset = self.log.stat().st_size if self.log.is_file() else 0
        say(f"Engine({self.kwargs})")
        # SGLang's import too: not beside another engine's timing
        with self.gate.starting(alone=self.alone):
            from sglang.srt.entrypoints.engine import Engine

            t = time.perf_counter()
            self.engine = Engine(**self.kwargs)
            self.start_s = round(time.perf_counter() - t, 1)
        say(f"engine up in {self.start_s} s")
        return self

    def __exit__(self, *exc: object) -> None:
        if self.engine is not None:
            with self.gate.starting():  # not while another engine is timed (Gate.quiet)
                self.engine.shutdown()
            say("engine shut down")

    def log_text(self) -> str:
        with self.log.open("rb") as fh:
            fh.seek(self.offset)
            return fh.read().decode(errors="replace")

    # measurements ---------------------------------------------------------------------------
    def ppl_parts(self, windows: list[list[int]]) -> list[list[float]]:
        outs = self.engine.generate(input_ids=windows, sampling_params=SCORE,
                                    return_logprob=True, logprob_start_len=0)  # fmt: skip
        return [list(e2e.nll_of(o["meta_info"]["input_token_logprobs"])) for o in outs]

    def greedy(self, prompts: list[list[int]], new_tokens: int) -> list[list[int]]:
        params = {"temperature": 0.0, "max_new_tokens": new_tokens, "ignore_eos": True}
        outs = self.engine.generate(input_ids=prompts, sampling_params=params)
        return [list(o["output_ids"])[:new_tokens] for o in outs]

    def top1(self, seqs: list[list[int]], start: int) -> list[list[int | None]]:
        outs = self.engine.generate(input_ids=seqs, sampling_params=SCORE,
                                    return_logprob=True, logprob_start_len=0,
                                    top_logprobs_num=1)  # fmt: skip
        return [e2e.top1_of(o["meta_info"]["input_top_logprobs"], start) for o in outs]

    def memory(self) -> dict[str, Any]:
        """The scheduler's memory numbers; a failure here never costs the accuracy numbers."""
        try:
            return e2e.weight_gib(self.engine.get_server_info())
        except Exception as exc:  # get_server_info also dataclasses.asdict()s the server args
            try:  # what get_server_info reads them from
                tm = self.engine.tokenizer_manager
                states = self.engine.loop.run_until_complete(tm.get_internal_state())
                return e2e.weight_gib({"internal_states": states})
            except Exception as exc2:
                return {"weight_gib": None, "error": f"{exc!r}; {exc2!r}"}

    def _timed(self, prompts: list[list[int]], new_tokens: int) -> float:
        self.engine.flush_cache()  # no radix-cache hits between repeats
        params = {"temperature": 0.0, "max_new_tokens": new_tokens, "ignore_eos": True}
        t = time.perf_counter()
        self.engine.generate(input_ids=prompts, sampling_params=params)
        return time.perf_counter() - t

    def _decode(self, tokens: dict[str, Any], s: dict[str, Any], batches: list[int]) -> dict:
        """Decode timings per batch: ``speed_new_tokens`` and 1 new token, after a warm-up."""
        out: dict[str, Any] = {}
        n, reps = s["speed_new_tokens"], s["speed_repeats"]
        for batch in batches:
            prompts = tokens["speed"][:batch]
            self._timed(prompts, n)  # warm-up
            full = [self._timed(prompts, n) for _ in range(reps)]
            one = [self._timed(prompts, 1) for _ in range(reps)]
            out[str(batch)] = {"full": full, "one": one, "new_tokens": n,
                               "prompt_tokens": len(prompts[0])}  # fmt: skip
            rate = e2e.decode_rate(batch, n, full, one)
            say(f"decode batch {batch}: {rate['tok_s'] or 0:.0f} tok/s")
        return out

    def _prefill(self, prompt: list[int], reps: int) -> dict[str, Any]:
        """One prompt's prefill times (one new token), after a warm-up."""
        self._timed([prompt], 1)
        times = [self._timed([prompt], 1) for _ in range(reps)]
        say(
            f"prefill {len(prompt)}: {e2e.prefill_rate(len(prompt), times)['tok_s'] or 0:.0f} tok/s"
        )
        return {"tokens": len(prompt), "times": times}

    def speed(self, tokens: dict[str, Any], s: dict[str, Any]) -> dict[str, Any]:
        return {
            "decode": self._decode(tokens, s, s["speed_batches"]),
            "prefill": self._prefill(tokens["prefill"], s["speed_repeats"]),
        }

    def speed_rounds(
        self, tokens: dict[str, Any], s: dict[str, Any], rounds: e2e.Rounds, save: Any
    ) -> dict[str, Any]:
        """Decode at ``large_batches`` and one prefill per ``large_prefill_tokens``, one
        repeat of each per round (``speed_repeats`` rounds), each round in this variant's turn
        (``rounds``) on a quiet GPU; the first round warms every row up first."""
        n = s["speed_new_tokens"]
        out: dict[str, Any] = {"decode": {}, "prefill": {}}
        for batch in s["large_batches"]:
            out["decode"][str(batch)] = {"full": [], "one": [], "new_tokens": n,
                                         "prompt_tokens": len(tokens["speed"][0])}  # fmt: skip
        for size, prompt in tokens["prefill_large"].items():
            out["prefill"][size] = {"tokens": len(prompt), "times": []}
        out["turns"] = []  # wall-clock start and end of each turn (epoch seconds)
        for rnd in range(s["speed_repeats"]):
            rounds.wait_turn(rnd)
            with self.gate.quiet():
                began = time.time()
                self._timed(tokens["speed"][:1], 1)  # wakes an idle scheduler; not timed
                for batch in s["large_batches"]:
                    prompts, row = tokens["speed"][:batch], out["decode"][str(batch)]
                    if rnd == 0:
                        self._timed(prompts, n)
                    row["full"].append(self._timed(prompts, n))
                    row["one"].append(self._timed(prompts, 1))
                for size, prompt in tokens["prefill_large"].items():
                    if rnd == 0:
                        self._timed([prompt], 1)
                    out["prefill"][size]["times"].append(self._timed([prompt], 1))
                out["turns"].append([round(began, 3), round(time.time(), 3)])
            rounds.done(rnd)
            save(out)
            rates = [e2e.decode_rate(int(b), n, r["full"][-1:], r["one"][-1:])["tok_s"] or 0
                     for b, r in out["decode"].items()]  # fmt: skip
            say(f"round {rnd + 1}/{s['speed_repeats']}: decode "
                + ", ".join(f"{r:.0f}" for r in rates) + " tok/s")  # fmt: skip
        return out


def _session_data(
    sess: Session, job: dict[str, Any], rec: Record, key: str, seqs: list[list[int]] | None
) -> dict[str, Any]:
    """The measurements one engine makes; ``seqs``: the reference's prompt + continuation."""
    s, tokens = job["settings"], job["tokens"]
    d = rec.data[key] = {"path": sess.kwargs["model_path"], "start_s": sess.start_s,
                         "complete": False}  # fmt: skip
    with sess.gate.working():
        d["ppl_parts"] = sess.ppl_parts(tokens["ppl"])
        d["memory"] = sess.memory()
        rec.save()
        say(f"{key}: perplexity {e2e.perplexity(d['ppl_parts'])[0]}, memory {d['memory']}")
        if seqs is None:  # the reference: its greedy continuations are the agreement's text
            d["greedy"] = sess.greedy(tokens["prompts"], s["new_tokens"])
            seqs = [p + g for p, g in zip(tokens["prompts"], d["greedy"], strict=True)]
        d["top1"] = sess.top1(seqs, s["prompt_tokens"])
        rec.save()
    if job["spec"].get("speed"):
        with sess.gate.quiet():
            d["speed"] = sess.speed(tokens, s)
    d["marlin_log"] = e2e.marlin_evidence(sess.log_text())
    d["complete"] = True
    rec.save()
    return d


def run_case(job: dict[str, Any], rec: Record) -> None:
    gate, spec, prev = e2e.Gate(Path(job["locks"])), job["spec"], job.get("previous") or {}
    kept = True  # the NVFP4 session is kept only with the greedy text it was scored on
    for key in ("reference", "nvfp4"):  # the reference first: its greedy text is needed
        if kept and (prev.get(key) or {}).get("complete"):
            rec.data[key] = prev[key]
            say(f"{key}: kept from the earlier run")
            continue
        kept = False
        seqs = None
        if key == "nvfp4":
            ref = rec.data["reference"]
            seqs = [p + g for p, g in zip(job["tokens"]["prompts"], ref["greedy"], strict=True)]
        with Session(job, spec[key], gate) as sess:
            _session_data(sess, job, rec, key, seqs)


def run_unquantized(job: dict[str, Any], rec: Record) -> None:
    gate = e2e.Gate(Path(job["locks"]))
    with Session(job, job["spec"]["path"], gate) as sess:
        rec.data["start_s"] = sess.start_s
        with gate.working():
            rec.data["ppl_parts"] = sess.ppl_parts(job["tokens"]["ppl"])
            rec.data["memory"] = sess.memory()
    say(f"unquantized perplexity {e2e.perplexity(rec.data['ppl_parts'])[0]}")


# Ports SGLang derives from --port (v0.5.11 server_args.py): the gRPC port (+10000, must
# stay <= 65535), the ZMQ TCP base (+233) and --port + 1.
DERIVED_PORT_OFFSETS = (0, 1, 233, 10000)
PORT_RANGE = (20000, 65535 - max(DERIVED_PORT_OFFSETS))


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def run_speed(job: dict[str, Any], rec: Record) -> None:
    """One speed-model checkpoint (NVFP4, FP8 or bf16) in its own engine, started alone: its
    weight memory, then decode and prefill on a quiet GPU in turn with the model's other
    variants (e2e.Rounds)."""
    gate, spec = e2e.Gate(Path(job["locks"])), job["spec"]
    rounds = e2e.Rounds(Path(job["rounds"]), spec["variant"])
    rounds.join()  # first: a unit that fails below is gone for its peers at once
    if not Path(spec["path"], "config.json").is_file():
        raise FileNotFoundError(
            f"{spec['path']}: no checkpoint (make it with serve/make_checkpoints.py "
            f"--models {spec['model']})"
        )
    with Session(job, spec["path"], gate, alone=True) as sess:
        rec.data["start_s"] = sess.start_s
        rec.data["memory"] = sess.memory()
        rec.data["rounds"] = {"roster": rounds.roster, "id": rounds.written,
                              "rounds": job["settings"]["speed_repeats"]}  # fmt: skip
        rec.save()

        def save(speed: dict[str, Any]) -> None:
            rec.data["speed"] = speed
            rec.save()

        sess.speed_rounds(job["tokens"], job["settings"], rounds, save)
        rec.data["marlin_log"] = e2e.marlin_evidence(sess.log_text())


def run_parallel(job: dict[str, Any], rec: Record) -> None:
    """One NVFP4 checkpoint on two GPUs (``tp_size``, ``ep_size`` from the spec), measured as its
    one-GPU unit was: accuracy units score the same held-out windows and the same reference
    continuations; the speed unit decodes at the spec's batches. The one-GPU numbers it is
    compared with (``job["tp1"]``) are copied into the record, so a row never mixes runs."""
    spec, s, tokens = job["spec"], job["settings"], job["tokens"]
    tp1 = job.get("tp1") or {}
    speed = spec["measure"] == "speed"
    need = ("decode",) if speed else ("ppl_parts", "top1", "greedy")
    lacking = [k for k in need if not tp1.get(k)]
    if lacking:
        raise ValueError(
            f"no one-GPU results to compare with: {spec['after']} has no {', '.join(lacking)} "
            f"(run it first: serve/e2e.py --only {spec['after']})"
        )
    path = spec.get("nvfp4") or spec["path"]
    if not Path(path, "config.json").is_file():
        raise FileNotFoundError(f"{path}: no checkpoint (serve/make_checkpoints.py)")
    gate, d = e2e.Gate(Path(job["locks"])), rec.data
    d.update(tp_size=spec["tp_size"], ep_size=spec["ep_size"], compared_with=spec["after"])
    with Session(job, path, gate) as sess:
        d["start_s"] = sess.start_s
        if speed:
            d["memory"] = sess.memory()
            rec.save()
            with gate.quiet():
                d["speed"] = {"decode": sess._decode(tokens, s, list(spec["batches"]))}
            d["tp1"] = {"decode": {str(b): tp1["decode"].get(str(b)) for b in spec["batches"]}}
        else:
            seqs = [p + g for p, g in zip(tokens["prompts"], tp1["greedy"], strict=True)]
            with gate.working():
                d["ppl_parts"] = sess.ppl_parts(tokens["ppl"])
                d["memory"] = sess.memory()
                rec.save()
                d["top1"] = sess.top1(seqs, s["prompt_tokens"])
            d["tp1"] = {"ppl_parts": tp1["ppl_parts"], "top1": tp1["top1"]}
            ppl = e2e.perplexity(d["ppl_parts"])[0]
            agree = e2e.agreement(tp1["top1"], d["top1"])[0]
            say(f"tp {spec['tp_size']} ep {spec['ep_size']}: perplexity {ppl} (one GPU "
                f"{e2e.perplexity(tp1['ppl_parts'])[0]}), top-1 agreement {agree}")  # fmt: skip
        rec.save()
        d["marlin_log"] = e2e.marlin_evidence(sess.log_text())


def free_port(start: int | None = None) -> int:
    """A --port whose derived ports are free and in range (a random --port can derive a
    gRPC port above 65535, which SGLang refuses at start)."""
    lo, hi = PORT_RANGE
    first = start if start is not None else lo + os.getpid() % (hi - lo)
    for i in range(hi - lo):
        port = lo + (first - lo + 7 * i) % (hi - lo)
        if all(_port_free(port + d) for d in DERIVED_PORT_OFFSETS):
            return port
    raise RuntimeError(f"no free port in {lo}..{hi} with its derived ports free")


def _shown(cmd: list[str]) -> str:
    return shlex.join(["python", *cmd[1:]] if cmd and cmd[0] == sys.executable else cmd)


def run_http(job: dict[str, Any], rec: Record) -> None:
    """launch_server on 127.0.0.1, one /v1/completions request through the openai client; the
    server is always stopped (its process group, recorded for serve/e2e.py too)."""
    from openai import OpenAI

    s, spec = job["settings"], job["spec"]
    gate, logf = e2e.Gate(Path(job["locks"])), Path(job["log"])
    port = free_port()
    cmd = e2e.server_command(s, spec["path"], spec["dtype"], port, spec.get("backend"))
    d = rec.data
    d.update(ok=False, command=_shown(cmd), commands=[_shown(cmd)],
             fp4_gemm_backend=spec.get("backend") or "auto")  # fmt: skip
    offset = logf.stat().st_size if logf.is_file() else 0
    say(f"server: {d['command']}")
    with logf.open("ab") as fh:  # the unit's log: the server's load and backend lines
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True,
                                preexec_fn=e2e._pdeathsig)  # fmt: skip
    e2e.write_json(Path(job["result"]).with_suffix(".pids"), {"groups": [proc.pid]})
    base = f"http://127.0.0.1:{port}"
    try:
        with gate.starting():
            t, ready = time.perf_counter(), False
            while time.perf_counter() - t < s["http_ready_timeout"] and proc.poll() is None:
                try:
                    with urllib.request.urlopen(base + "/v1/models", timeout=5) as r:
                        ready = r.status == 200
                except OSError:
                    pass
                if ready:
                    break
                time.sleep(2)
            d["ready_s"] = round(time.perf_counter() - t, 1)
        if not ready:
            raise RuntimeError(f"server not ready after {d['ready_s']} s (exit {proc.poll()})")
        client = OpenAI(base_url=base + "/v1", api_key="EMPTY", timeout=120, max_retries=0)
        model = client.models.list().data[0].id
        d["request"] = {"endpoint": "/v1/completions", "model": model, "prompt": e2e.HTTP_PROMPT,
                        "max_tokens": s["http_max_tokens"], "temperature": 0}  # fmt: skip
        with gate.working():
            t = time.perf_counter()
            r = client.completions.create(
                model=model, prompt=e2e.HTTP_PROMPT, max_tokens=s["http_max_tokens"], temperature=0
            )
            seconds = round(time.perf_counter() - t, 3)
        usage = r.usage.model_dump() if r.usage is not None else {}
        d["response"] = {"text": r.choices[0].text, "finish_reason": r.choices[0].finish_reason,
                         "usage": usage, "seconds": seconds}  # fmt: skip
        d["ok"] = isinstance(r.choices[0].text, str) and (usage.get("completion_tokens") or 0) > 0
        say(f"completion: {r.choices[0].text!r} ({usage})")
    finally:
        with gate.starting():  # not while another engine is timed (Gate.quiet)
            e2e.kill_group(proc.pid, grace=20, proc=proc)
            d["server_exit"] = proc.wait()
        with logf.open("rb") as fh:
            fh.seek(offset)
            d["marlin_log"] = e2e.marlin_evidence(fh.read().decode(errors="replace"))
        rec.save()


def run_negative(job: dict[str, Any], rec: Record) -> None:
    """The bare pin, in a child process with its tree on PYTHONPATH, on an NVFP4 checkpoint."""
    spec, s = job["spec"], job["settings"]
    kwargs = e2e.engine_kwargs(s, spec["path"], spec["dtype"])
    cmd = [sys.executable, str(HERE / "e2e_engine.py"), "--probe-pin", json.dumps(kwargs)]
    d = rec.data
    d.update(pin_tree=spec.get("pin_tree"), checkpoint=spec["path"], command=_shown(cmd),
             commands=[f"PYTHONPATH={spec.get('pin_tree')}:... {_shown(cmd)}"])  # fmt: skip
    with e2e.Gate(Path(job["locks"])).starting():
        proc = subprocess.Popen(cmd, env=job["pin_env"], stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True,
                                preexec_fn=e2e._pdeathsig)  # fmt: skip
        try:
            out, _ = proc.communicate(timeout=300)
        except subprocess.TimeoutExpired:
            e2e.kill_group(proc.pid, grace=2, proc=proc)
            out, _ = proc.communicate()
        e2e.kill_group(proc.pid, grace=2, proc=proc)  # the scheduler, should it outlive the probe
    print(out, flush=True)
    probe = next((json.loads(ln[7:]) for ln in out.splitlines()
                  if ln.startswith("PROBE: {")), {})  # fmt: skip
    refused, message = e2e.refusal(out, proc.returncode)
    d.update(refused=refused, message=message, returncode=proc.returncode,
             sglang_file=probe.get("sglang_file"), bare=probe.get("bare"),
             output_tail=e2e.tail(out, 30))  # fmt: skip
    say(f"bare pin: refused={refused}: {message}")


def probe_pin(kwargs: dict[str, Any]) -> int:
    import sglang
    from sglang.srt.layers.quantization import fp4_utils

    bare = not hasattr(fp4_utils.Fp4GemmRunnerBackend, "MARLIN")
    print("PROBE: " + json.dumps({"sglang_file": sglang.__file__, "bare": bare}), flush=True)
    from sglang.srt.entrypoints.engine import Engine

    try:
        engine = Engine(**kwargs)
    except Exception:
        traceback.print_exc()
        print("PROBE: engine failed", flush=True)
        return 3
    print("PROBE: engine started", flush=True)
    engine.shutdown()
    return 0


RUNNERS = {"case": run_case, "unquantized": run_unquantized, "http": run_http,
           "negative": run_negative, "speed": run_speed, "parallel": run_parallel}  # fmt: skip


def main(argv: list[str]) -> int:
    os.environ.update(e2e.NO_MULTICAST_ENV)  # before SGLang starts any process
    if len(argv) == 2 and argv[0] == "--probe-pin":
        return probe_pin(json.loads(argv[1]))
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    job = json.loads(Path(argv[0]).read_text())
    rec = Record(job)
    say(f"{job['id']} (pid {os.getpid()})")
    try:
        RUNNERS[job["kind"]](job, rec)
    except BaseException as exc:  # the record says what failed; the log has the traceback
        traceback.print_exc()
        rec.finish(f"{type(exc).__name__}: {exc}")
        return 1
    rec.finish()
    say("done")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
