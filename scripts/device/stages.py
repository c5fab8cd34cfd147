"""The GPU proof's stages: what each runs, which JIT modules it needs, which reports it writes.

Adding a stage is one entry in STAGES. ``command`` runs with this interpreter from the
repository root; ``{report_dir}`` in it is the stage's own report directory (conftest and the
benchmark also read FP4SERIES_REPORT_DIR). After the stage, the files named in ``reports`` are
copied from there into ``--out``. ``modules`` are (variant, spec) pairs built before any stage
starts (specs as tests/gpu/_jitenv.py's ``warm`` takes them); a variant is a python tree plus
build settings:
  patched    the patched tree
  unpatched  the patched tree with the pin's jit_kernel CUDA sources (the repro of patches 1-2)
  compute75  the patched tree, every module built as compute_75 PTX only (the SM75 path)
  upstream   upstream 0.5.23's tree (the benchmark's comparison column; only when given)
The conformance stage runs upstream 0.5.13's own NVFP4 Marlin tests (tests/gpu/run_conformance.py);
a bundle carries their wheel with ``--include WHEEL:wheels/WHEEL``. The e2e stage (serve/e2e.py,
issue 13) serves the checkpoints of serve/make_checkpoints.py through SGLang's engine and server;
it needs SGLang's whole runtime (serve/README.md's wheelhouse venv as PYTHON), so it is not a
default stage. It reads FP4SERIES_PIN_TREE (the bare pin, its negative control),
FP4SERIES_DEADLINE_EPOCH (``--deadline``) and FP4SERIES_E2E_ARGS (its own options).
The kernels stage (issue 23, not a default) builds the standalone NVFP4 kernels of
bench/kernels/ with nvcc, checks them against an fp32 reference and times them beside FP4 Marlin,
bf16 cuBLAS and the roofline (bench/kernels/run_round.py); FP4SERIES_KERNELS_ARGS adds options.
"""

from __future__ import annotations

from dataclasses import dataclass, field

PYTEST = ("-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider")


@dataclass(frozen=True)
class Stage:
    name: str
    command: tuple[str, ...]
    reports: tuple[str, ...]
    modules: tuple[tuple[str, str], ...]
    env: dict[str, str] = field(default_factory=dict)


def _modules(**variants: str) -> tuple[tuple[str, str], ...]:
    """``_modules(patched="repack act:bf16")``: (("patched", "repack"), ("patched", "act:bf16"))."""
    return tuple((v, spec) for v, specs in variants.items() for spec in specs.split())


NUMERICS_TESTS = ("tests/gpu/test_marlin_numerics.py", "tests/gpu/test_fused_shards.py",
                  "tests/gpu/test_tensor_parallel.py", "tests/gpu/test_tracing.py",
                  "tests/gpu/test_kernel_repro.py::test_unpatched_templates_fail")  # fmt: skip
MARLIN = "gptq_marlin:{0} moe_wna16_marlin:{0} repack act:{0}"

STAGES: dict[str, Stage] = {
    s.name: s
    for s in (
        Stage(
            "numerics",
            (*PYTEST, *NUMERICS_TESTS),
            ("numerics.json",),
            _modules(
                patched=f"{MARLIN.format('bf16')} {MARLIN.format('fp16')}",
                unpatched=MARLIN.format("bf16"),
            ),
        ),
        Stage(
            "conformance",
            ("tests/gpu/run_conformance.py", "--out", "{report_dir}/conformance.json"),
            ("conformance.json",),
            _modules(patched="gptq_marlin:bf16 gptq_marlin:fp16 repack"),
        ),
        Stage(
            "compute75",
            (*PYTEST, "tests/gpu/test_kernel_repro.py::test_turing_compute75_ptx"),
            ("turing_ptx.json",),
            _modules(compute75=MARLIN.format("fp16")),
        ),
        Stage(
            "bench",
            ("bench/bench_fp4_marlin.py", "--out", "{report_dir}"),
            ("bench.json", "bench.md", "bench.png"),
            _modules(patched=MARLIN.format("bf16"), upstream="up_gptq_marlin:bf16 up_repack"),
        ),
        Stage(  # numerics' fused-shards cases alone (its numerics.json holds only those)
            "fused_shards",
            (*PYTEST, "tests/gpu/test_fused_shards.py"),
            ("numerics.json",),
            _modules(patched=f"{MARLIN.format('bf16')} {MARLIN.format('fp16')}"),
        ),
        Stage(  # numerics' tensor/expert-parallel cases alone (issue 20)
            "tensor_parallel",
            (*PYTEST, "tests/gpu/test_tensor_parallel.py"),
            ("numerics.json",),
            _modules(patched=f"{MARLIN.format('bf16')} {MARLIN.format('fp16')}"),
        ),
        Stage(
            "kernels",
            ("bench/kernels/run_round.py", "--out", "{report_dir}"),
            ("kernels.json", "kernels.md", "dispatch.json", "build.txt"),
            _modules(patched="gptq_marlin:bf16 repack"),
        ),
        Stage(
            "e2e",
            ("serve/e2e.py", "run", "--out", "{report_dir}"),
            ("e2e.json", "e2e.md"),
            _modules(patched=f"{MARLIN.format('bf16')} {MARLIN.format('fp16')}"),
        ),
    )
}
DEFAULT_STAGES = ("numerics", "conformance", "compute75", "bench")


def select(names: str) -> list[Stage]:
    """Stages named in a comma list, in the table's order; ValueError names unknown ones."""
    wanted = [n.strip() for n in names.split(",") if n.strip()]
    unknown = [n for n in wanted if n not in STAGES]
    if unknown or not wanted:
        raise ValueError(f"unknown stage(s) {unknown or names!r}; known: {', '.join(STAGES)}")
    return [s for s in STAGES.values() if s.name in wanted]
