"""Run upstream 0.5.13's NVFP4 Marlin tests against the patched tree; write conformance.json.

    PYTHONPATH=<patched python tree> python tests/gpu/run_conformance.py [--line VERSION] \\
        [--out reports/h200/conformance.json] [--wheel sglang-0.5.13-...whl] [--workdir DIR]

The tests come from the sha256-verified upstream wheel at run time (fp4series.conformance:
extracted with their mechanical edits listed, never copied into this repository) and run with
pytest in a directory of their own (its own rootdir: none of this project's conftest or
config applies), with ``-k nvfp4``. One record per upstream test: ``pass``, ``fail``, or
``not-applicable`` with the upstream feature the series does not take; a test listed as
not-applicable still runs and its observed outcome is recorded. Exit status 0 when the
required tests pass. ``--line`` (default ``$FP4SERIES_LINE``): the tree is that series line's,
and the tests are edited and judged as its profile says (fp4series.conformance.profile).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "src"))

from fp4series import conformance, report  # noqa: E402
from fp4series.errors import SeriesError  # noqa: E402

SOURCE_NOTE = (
    "no release after 0.5.13.post1 ships upstream's NVFP4 Marlin tests in its wheel (they left "
    "the package with the jit_kernel/ -> kernels/ move of 0.5.17); 0.5.13's are the newest in a "
    "verified wheel, their imports of moved modules pointed at the new place (module-move)"
)


def _device_capability() -> str:
    import torch

    if not torch.cuda.is_available():
        raise SeriesError("no CUDA device: upstream's NVFP4 Marlin tests need a GPU")
    major, minor = torch.cuda.get_device_capability()
    if not (8, 0) <= (major, minor) < (10, 0):
        raise SeriesError(
            f"compute capability {major}.{minor}: upstream gates these tests to SM80-SM90",
            hint="run on an Ampere, Ada or Hopper GPU",
        )
    return f"{major}.{minor}"


def _bundled_wheel(version: str) -> Path | None:
    """The upstream wheel a GPU bundle carries (make-bundle --include WHEEL:wheels/NAME), if any."""
    extra = os.environ.get("FP4SERIES_BUNDLE_EXTRA")
    if not extra:
        return None
    found = sorted((Path(extra) / "wheels").glob(f"sglang-{version}-*.whl"))
    return found[0] if found else None


def run(args: argparse.Namespace) -> int:
    capability = _device_capability()
    prof = conformance.profile(args.line)
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="fp4series-conformance-"))
    tests_dir = workdir / "upstream"
    extracted = conformance.extract_from_lock(
        tests_dir,
        wheel=args.wheel or _bundled_wheel(prof.source_version),
        cache_dir=args.cache_dir,
        line=args.line,
    )
    junit = workdir / "junit.xml"
    cmd = [
        sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-v", "-rA",
        "-k", conformance.SELECTION, f"--junitxml={junit}", "tests",
    ]  # fmt: skip
    print("+ " + " ".join(cmd), flush=True)
    proc = subprocess.run(cmd, cwd=tests_dir, env=dict(os.environ), check=False)
    if not junit.is_file():
        raise SeriesError(f"pytest wrote no results (exit {proc.returncode})")
    records = conformance.records(conformance.outcomes_from_junit(junit), prof.not_applicable)
    data = {
        **report.run_metadata(args.command or "python tests/gpu/run_conformance.py"),
        "device_capability": capability,
        "upstream": {k: v for k, v in extracted.to_json().items() if k != "edits"},
        "selection": f"pytest -k {conformance.SELECTION}",
        "helpers_note": "sglang.test.test_marlin_utils is the wheel's copy (the pin's lacks "
        "make_nvfp4_weight_and_ref), loaded by the generated conftest.py",
        **({"source_note": SOURCE_NOTE} if args.line else {}),
        "edits": extracted.to_json()["edits"],
        "pytest_exit_code": proc.returncode,
        "tests": records,
    }
    report.write_json(Path(args.out), data)
    problems: list[str] = []
    report.check_conformance(data, problems, args.line)
    for record in records:
        print(f"{record['status']:>15}  {record['id']}")
    print(f"wrote {args.out}")
    if problems:
        print("conformance problems:\n" + report.summarize(problems))
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=str(REPO / "reports" / "h200" / "conformance.json"))
    parser.add_argument("--wheel", type=Path, help="sglang 0.5.13 wheel (verified); default cache")
    parser.add_argument("--cache-dir", type=Path, default=REPO / ".work" / "cache")
    parser.add_argument("--workdir", type=Path, help="where the tests are extracted and run")
    parser.add_argument("--command", help="the command recorded in the report")
    parser.add_argument(
        "--line",
        default=os.environ.get("FP4SERIES_LINE") or None,
        help="the series line the tree is (default $FP4SERIES_LINE: the pin's)",
    )
    args = parser.parse_args(argv)
    try:
        return run(args)
    except SeriesError as exc:
        print(f"error: {exc}" + (f"\n  what to do: {exc.hint}" if exc.hint else ""))
        return 1


if __name__ == "__main__":
    sys.exit(main())
