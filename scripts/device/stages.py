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
bf16 cuBLAS and the roofline (bench/kernels/run_round.py); FP4SERIES_KERNELS_ARGS adds options
(FP4SERIES_BENCH_ARGS to the bench stage's bench/bench_fp4_marlin.py).

A maintained series line (``--line V``) has its own table, LINE_STAGES[V]: the same tests on
the line's tree, with the bare release it is made on as the repro (variant ``upstream``: the
release's python tree) instead of the pin's templates. Its module specs name what that
release's loaders take (0.5.23's MoE module is built per routing flags, and the MoE path builds
its activation and alignment modules too: the dry run of tests/gpu/_dryrun.py lists every module
a suite asks for and says which the table does not warm).
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
    runner: tuple[str, ...] = ()  # a program the stage's python runs under (a profiler)


def _modules(**variants: str) -> tuple[tuple[str, str], ...]:
    """``_modules(patched="repack act:bf16")``: (("patched", "repack"), ("patched", "act:bf16"))."""
    return tuple((v, spec) for v, specs in variants.items() for spec in specs.split())


NUMERICS_TESTS = ("tests/gpu/test_marlin_numerics.py", "tests/gpu/test_fused_shards.py",
                  "tests/gpu/test_tensor_parallel.py", "tests/gpu/test_tracing.py",
                  "tests/gpu/test_kernel_repro.py::test_unpatched_templates_fail")  # fmt: skip
MARLIN = "gptq_marlin:{0} moe_wna16_marlin:{0} repack act:{0}"
# SourceCounters: where a kernel's warps stall (sampled, by instruction; the modules are built
# with -lineinfo); InstructionStats: the instruction mix (integer unpack against mma).
NCU_SECTIONS = ("SpeedOfLight", "MemoryWorkloadAnalysis", "WarpStateStats", "Occupancy",
                "LaunchStats", "SchedulerStats", "SourceCounters", "InstructionStats")  # fmt: skip

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
        Stage(  # one gemv and one Marlin launch per shape under Nsight Compute (issue 23)
            "kernels-profile",
            ("bench/kernels/profile_m1.py", "--out", "{report_dir}"),
            ("ncu.txt",),
            _modules(patched="gptq_marlin:bf16 repack"),
            runner=(
                "ncu",
                "--profile-from-start",
                "off",
                "--target-processes",
                "all",
                *(a for sec in NCU_SECTIONS for a in ("--section", sec)),
                "--log-file",
                "{report_dir}/ncu.txt",
            ),  # fmt: skip
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

# The 0.5.23 line: fused_marlin_moe's two GEMMs are two MoE modules per dtype (routing flags),
# M = 1 aligns with the single-token module, larger M with the JIT align module (int32 ids).
_MOE_0523 = ("expert_ids_are_sorted+has_inactive_prefix_count",
             "expert_ids_are_sorted+zero_inactive_output+has_inactive_prefix_count")  # fmt: skip
_ALIGN_0523 = (
    "sglang.kernels.ops.moe.moe_align_single_token._jit_align_single_token_module:-:"
    "write_inactive_prefix_count",
    "sglang.kernels.ops.moe.moe_align._jit_moe_align_module:int32:write_inactive_prefix_count",
)


def _marlin_0523(dtype: str) -> str:
    moe = [f"moe_wna16_marlin:{dtype}:{flags}" for flags in _MOE_0523]
    return " ".join([f"gptq_marlin:{dtype}", *moe, "repack", f"act:{dtype}", *_ALIGN_0523])


LINE_NUMERICS_TESTS = (
    "tests/gpu/test_marlin_numerics.py",
    "tests/gpu/test_fused_shards.py",
    "tests/gpu/test_tracing.py",
    "tests/gpu/test_kernel_repro.py::test_bare_release_repro",
)
LINE_STAGES: dict[str, dict[str, Stage]] = {
    "0.5.23": {
        s.name: s
        for s in (
            Stage(
                "numerics",
                (*PYTEST, *LINE_NUMERICS_TESTS),
                ("numerics.json",),
                _modules(
                    patched=f"{_marlin_0523('bf16')} {_marlin_0523('fp16')}",
                    upstream=f"{_marlin_0523('bf16')} {_marlin_0523('fp16')}",
                ),
            ),
            Stage(
                "conformance",
                ("tests/gpu/run_conformance.py", "--out", "{report_dir}/conformance.json"),
                ("conformance.json",),
                _modules(patched=f"{_marlin_0523('bf16')} {_marlin_0523('fp16')}"),
            ),
            Stage(
                "compute75",
                (*PYTEST, "tests/gpu/test_kernel_repro.py::test_turing_compute75_ptx"),
                ("turing_ptx.json",),
                _modules(compute75=_marlin_0523("fp16")),
            ),
        )
    }
}
LINE_DEFAULT_STAGES = ("numerics", "conformance", "compute75")


def table(line: str | None = None) -> dict[str, Stage]:
    """The stage table of the pin's line (None) or of a maintained line; ValueError if none."""
    if line is None:
        return STAGES
    if line not in LINE_STAGES:
        raise ValueError(f"no GPU stages for the {line} line; lines with stages: "
                         f"{', '.join(LINE_STAGES) or 'none'}")  # fmt: skip
    return LINE_STAGES[line]


def default_stages(line: str | None = None) -> tuple[str, ...]:
    return DEFAULT_STAGES if line is None else LINE_DEFAULT_STAGES


def select(names: str, line: str | None = None) -> list[Stage]:
    """Stages named in a comma list, in the table's order; ValueError names unknown ones."""
    stages = table(line)
    wanted = [n.strip() for n in names.split(",") if n.strip()]
    unknown = [n for n in wanted if n not in stages]
    if unknown or not wanted:
        raise ValueError(f"unknown stage(s) {unknown or names!r}; known: {', '.join(stages)}")
    return [s for s in stages.values() if s.name in wanted]
