"""Upstream's own NVFP4 Marlin tests, taken from a sha256-verified upstream wheel, ready to run.

The series backports upstream's NVFP4 Marlin helpers; upstream's tests of them are the judge
of "behaves like upstream". They are never copied into this repository: ``extract`` reads them
from the release's wheel (sha256 checked against ``upstream.lock``), applies only mechanical
edits and writes them to a directory that ``tests/gpu/run_conformance.py`` runs with pytest
against the patched tree. Every edit is returned (and reported) with its file, line and text.

The mechanical edits, each refused when upstream's text no longer has the expected form:

* ``skip``: ``@pytest.mark.skip(reason=...)`` on the NVFP4 tests (upstream skips them in CI
  only because compiling takes long);
* ``skipif``: the ``@pytest.mark.skipif(not (is_sm80_supported() or is_sm90_supported()), ...)``
  capability gates, and their import, which names helpers the pin's tree does not have
  (the runner checks the capability itself);
* ``ci-registration``: ``register_cuda_ci(...)`` and its import (upstream's CI bookkeeping).

The 0.5.11 tree has its own ``sglang/test/test_marlin_utils.py`` without upstream's NVFP4
helper (``make_nvfp4_weight_and_ref``); a generated ``conftest.py`` loads the wheel's copy as
that module for the run. Nothing else changes.

A series line runs the same tests (its ``Profile``): no release after 0.5.13.post1 ships
upstream's NVFP4 Marlin tests in its wheel (they left the package with the ``jit_kernel/`` ->
``kernels/`` move of 0.5.17; the 0.5.23 wheel carries only their helper module), so 0.5.13's
wheel stays their verified source (0.5.13.post1's test files are byte-identical). On a tree of
the new layout one more mechanical edit applies:

* ``module-move``: ``from sglang.jit_kernel.<module> import`` becomes the module's new place
  (``MODULE_MOVES``), each replacement listed like the removals.

The features the pin's series does not take are in 0.5.23 itself (non-gated MoE experts), so
on the 0.5.23 line every extracted NVFP4 test is required to pass.
"""

from __future__ import annotations

import argparse
import re
import sys
import xml.etree.ElementTree as ET
import zipfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from fp4series import paths
from fp4series.digest import sha256_file
from fp4series.errors import SeriesError, run_reporting_errors
from fp4series.lock import Release, load_lock

UPSTREAM_VERSION = "0.5.13"
# upstream path in the wheel -> name in the extracted directory
TEST_FILES = {
    "sglang/jit_kernel/tests/test_gptq_marlin.py": "tests/test_gptq_marlin.py",
    "sglang/jit_kernel/tests/test_moe_wna16_marlin.py": "tests/test_moe_wna16_marlin.py",
}
HELPER_MODULES = {"sglang.test.test_marlin_utils": "sglang/test/test_marlin_utils.py"}
HELPER_DIR = "upstream_helpers"
# pytest -k expression selecting upstream's NVFP4 Marlin tests in those files
SELECTION = "nvfp4"
# Tests that must pass on the series (dense numerics and the capability/global-scale check).
REQUIRED = (
    "test_nvfp4_marlin_support_and_scale_transforms_sm80_sm90",
    "test_nvfp4_marlin_dense_matches_dequant_reference",
)
_NON_GATED = (
    "fused_marlin_moe(..., is_gated=False, activation='relu2'): non-gated MoE experts, an "
    "upstream feature after 0.5.11 that this series does not take (its Marlin MoE path serves "
    "gated SiLU experts)"
)
# Tests that exercise an upstream feature the series does not take: reported, not gated.
NOT_APPLICABLE = {
    "test_fused_marlin_moe_nvfp4_non_gated_padded_intermediate_launches": _NON_GATED,
    "test_fused_marlin_moe_nvfp4_non_gated_matches_dequant_reference": _NON_GATED,
}

_SKIP = re.compile(r'^@pytest\.mark\.skip\(reason="[^"\n]*"\)\n', re.M)
_SKIPIF = re.compile(
    r"^@pytest\.mark\.skipif\(\n"
    r"    not \(is_sm80_supported\(\) or is_sm90_supported\(\)\),\n"
    r'    reason="[^"\n]*",\n'
    r"\)\n",
    re.M,
)
_SKIPIF_IMPORT = re.compile(
    r"^from sglang\.srt\.utils\.common import is_sm80_supported, is_sm90_supported\n", re.M
)
_CI_IMPORT = re.compile(r"^from sglang\.test\.ci\.ci_register import register_cuda_ci\n", re.M)
# sglang/jit_kernel/<module>.py -> its place from 0.5.17 on (kernels/ops/), per imported module
MODULE_MOVES = {
    "sglang.jit_kernel.gptq_marlin": "sglang.kernels.ops.gemm.gptq_marlin",
    "sglang.jit_kernel.moe_wna16_marlin": "sglang.kernels.ops.moe.moe_wna16_marlin",
}
_MOVED_IMPORT = re.compile(r"^from (sglang\.jit_kernel\.\w+) import ", re.M)
_CI_CALL = re.compile(r"^register_cuda_ci\([^\n]*\)\n", re.M)
# kind -> (pattern, whether every file must contain it)
_EDITS = (
    ("skip", _SKIP),
    ("skipif", _SKIPIF),
    ("skipif", _SKIPIF_IMPORT),
    ("ci-registration", _CI_IMPORT),
    ("ci-registration", _CI_CALL),
)


@dataclass(frozen=True)
class Edit:
    """One removed (or replaced) piece of upstream text: file (upstream path), 1-based line,
    what, the text, and what replaced it (empty: removed)."""

    file: str
    line: int
    kind: str
    removed: str
    replacement: str = ""


@dataclass(frozen=True)
class Profile:
    """Upstream's NVFP4 Marlin tests as one series line runs them: where they come from, what
    is edited, which must pass and which test a feature the line does not take."""

    line: str | None  # None: the pin's line
    source_version: str  # the release whose verified wheel carries the tests
    module_moves: dict[str, str]
    required: tuple[str, ...]
    not_applicable: dict[str, str]


@dataclass(frozen=True)
class Extracted:
    dest: Path
    wheel: str
    sha256: str
    version: str
    tests: dict[str, str]  # upstream path -> extracted path (relative to dest)
    helpers: dict[str, str]  # module name -> extracted path (relative to dest)
    edits: list[Edit]

    def to_json(self) -> dict[str, object]:
        return {
            "version": self.version,
            "wheel": self.wheel,
            "sha256": self.sha256,
            "tests": dict(self.tests),
            "helpers": dict(self.helpers),
            "edits": [asdict(e) for e in self.edits],
        }


def mechanical_edits(
    upstream_path: str, text: str, module_moves: dict[str, str] | None = None
) -> tuple[str, list[Edit]]:
    """Remove skip marks and CI registration from one upstream test file, and with
    ``module_moves`` point imports of moved modules at their new place; list each edit.

    Raises SeriesError when a file has none of the removals (upstream's text changed: the edits
    would no longer be known to be mechanical), imports a moved module the table does not know,
    or still uses a removed name afterwards.
    """
    spans: list[tuple[int, int, str, str]] = []
    for kind, pattern in _EDITS:
        for match in pattern.finditer(text):
            spans.append((match.start(), match.end(), kind, ""))
    for match in _MOVED_IMPORT.finditer(text) if module_moves is not None else ():
        old = match.group(1)
        if old not in module_moves:
            raise SeriesError(
                f"{upstream_path}: imports {old}, whose place on this tree's layout "
                "fp4series.conformance.MODULE_MOVES does not know",
                hint="add the module's new place (kernels/ops/...) to MODULE_MOVES",
            )
        spans.append((match.start(1), match.end(1), "module-move", module_moves[old]))
    kinds = {kind for _, _, kind, _ in spans}
    missing = {"skip", "skipif", "ci-registration"} - kinds
    if missing:
        raise SeriesError(
            f"{upstream_path}: expected upstream's {sorted(missing)} lines, found none",
            hint="upstream changed this test file; review the mechanical edits in "
            "src/fp4series/conformance.py before trusting a conformance run",
        )
    spans.sort()
    edits, out, pos = [], [], 0
    for start, end, kind, new in spans:
        line = text.count("\n", 0, start) + 1
        edits.append(Edit(upstream_path, line, kind, text[start:end].rstrip("\n"), new))
        out += [text[pos:start], new]
        pos = end
    out.append(text[pos:])
    edited = "".join(out)
    gone = ["is_sm80_supported", "is_sm90_supported", "register_cuda_ci", "pytest.mark.skip("]
    gone += ["sglang.jit_kernel"] if module_moves is not None else []
    for name in gone:
        if name in edited:
            raise SeriesError(
                f"{upstream_path}: {name} is still used after the mechanical edits",
                hint="upstream uses it outside the skip marks; extend the edits knowingly",
            )
    return edited, edits


def _conftest(helpers: dict[str, str]) -> str:
    lines = [
        '"""Generated by fp4series.conformance: load upstream helpers taken from the wheel."""',
        "",
        "import importlib.util",
        "import sys",
        "from pathlib import Path",
        "",
        "_HERE = Path(__file__).resolve().parent",
        f"_HELPERS = {helpers!r}",
        "for _name, _rel in _HELPERS.items():",
        "    _spec = importlib.util.spec_from_file_location(_name, _HERE / _rel)",
        "    _module = importlib.util.module_from_spec(_spec)",
        "    sys.modules[_name] = _module",
        "    _spec.loader.exec_module(_module)",
        "",
    ]
    return "\n".join(lines)


def extract(
    wheel: Path | str,
    sha256: str,
    dest: Path | str,
    version: str,
    module_moves: dict[str, str] | None = None,
) -> Extracted:
    """Write the edited tests, the helpers, a conftest and pytest.ini into DEST (new/empty);
    ``module_moves``: imports of moved modules to rewrite (a line on the new layout)."""
    wheel, dest = Path(wheel), Path(dest)
    actual = sha256_file(wheel)
    if actual != sha256:
        raise SeriesError(
            f"{wheel.name}: sha256 {actual} differs from upstream.lock's {sha256}",
            hint="the conformance tests must come from the verified upstream wheel",
        )
    if dest.exists() and any(dest.iterdir()):
        raise SeriesError(f"{dest} is not empty", hint="give a new or empty directory")
    edits: list[Edit] = []
    files: dict[str, str] = {}
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        for upstream, rel in {**TEST_FILES, **_helper_targets()}.items():
            if upstream not in names:
                raise SeriesError(f"{wheel.name} has no {upstream}")
            text = zf.read(upstream).decode("utf-8")
            if upstream in TEST_FILES:
                text, file_edits = mechanical_edits(upstream, text, module_moves)
                edits.extend(file_edits)
            files[rel] = text
    helpers = {module: f"{HELPER_DIR}/{path}" for module, path in HELPER_MODULES.items()}
    files["conftest.py"] = _conftest(helpers)
    files["pytest.ini"] = "[pytest]\n"  # the directory is its own rootdir: no project config
    for rel, text in files.items():
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")
    return Extracted(dest, wheel.name, actual, version, dict(TEST_FILES), helpers, edits)


def _helper_targets() -> dict[str, str]:
    return {path: f"{HELPER_DIR}/{path}" for path in HELPER_MODULES.values()}


PIN_PROFILE = Profile(None, UPSTREAM_VERSION, {}, REQUIRED, NOT_APPLICABLE)
# Upstream 0.5.23 has non-gated MoE experts: 0.5.13's MoE NVFP4 tests apply, and must pass.
LINE_PROFILES = {
    "0.5.23": Profile(
        "0.5.23",
        UPSTREAM_VERSION,
        MODULE_MOVES,
        (*REQUIRED, *NOT_APPLICABLE),
        {},
    ),
}


def profile(line: str | None = None) -> Profile:
    """The conformance profile of a series line (None: the pin's)."""
    if line is None:
        return PIN_PROFILE
    if line not in LINE_PROFILES:
        raise SeriesError(
            f"no conformance profile for the {line} line",
            hint=f"add one to fp4series.conformance.LINE_PROFILES (known: "
            f"{', '.join(LINE_PROFILES)})",
        )
    return LINE_PROFILES[line]


def upstream_release(
    lock_path: Path | str | None = None, version: str = UPSTREAM_VERSION
) -> Release:
    lock = load_lock(lock_path or paths.default_lock_path())
    release = lock.release(version)
    if not release.sha256:
        raise SeriesError(f"upstream.lock records no sha256 for {version}")
    return release


def extract_from_lock(
    dest: Path | str,
    *,
    wheel: Path | str | None = None,
    lock_path: Path | str | None = None,
    cache_dir: Path | str | None = None,
    line: str | None = None,
) -> Extracted:
    """``extract`` from the given wheel file, else the cached or downloaded one (verified), as
    the line's profile says (None: the pin's)."""
    prof = profile(line)
    release = upstream_release(lock_path, prof.source_version)
    if wheel is None:
        from fp4series.upstream import fetch_wheel  # git-dependent module: imported on use

        wheel = fetch_wheel(release, cache_dir or paths.default_cache_dir())
    moves = prof.module_moves if prof.module_moves else None
    return extract(wheel, release.sha256, dest, release.version, moves)


def test_id(upstream_path: str, name: str) -> str:
    return f"{upstream_path}::{name}"


def base_name(test_name: str) -> str:
    """``test_x[dtype0]`` -> ``test_x``."""
    return test_name.split("[", 1)[0]


def outcomes_from_junit(junit: Path) -> dict[str, tuple[str, str]]:
    """test id (upstream path::name) -> (pass | fail | skipped, message) from JUnit XML."""
    upstream_of = {Path(rel).stem: up for up, rel in TEST_FILES.items()}
    results = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        module = case.get("classname", "").rsplit(".", 1)[-1]
        name = case.get("name", "?")
        status, message = "pass", ""
        for child in case:
            if child.tag in ("failure", "error"):
                status = "fail"
                message = (child.get("message") or child.text or "")[:800]
            elif child.tag == "skipped":
                status, message = "skipped", (child.get("message") or "")[:800]
        results[test_id(upstream_of.get(module, module or name), name)] = (status, message)
    return results


def records(
    outcomes: dict[str, tuple[str, str]], not_applicable: dict[str, str] | None = None
) -> list[dict[str, Any]]:
    """One conformance.json record per test: pass, fail, or not-applicable (+ what it needs;
    default: the pin's NOT_APPLICABLE).

    A not-applicable test still ran; its outcome is kept as ``observed``. A skipped test is
    a fail: not run is not a pass.
    """
    not_applicable = NOT_APPLICABLE if not_applicable is None else not_applicable
    out = []
    for tid, (status, message) in sorted(outcomes.items()):
        record: dict[str, Any] = {"id": tid}
        base = base_name(tid.rsplit("::", 1)[-1])
        if base in not_applicable:
            record.update(status="not-applicable", needs=not_applicable[base], observed=status)
        elif status == "skipped":
            record.update(status="fail", observed="skipped")
        else:
            record["status"] = status
        if message:
            record["message"] = message
        out.append(record)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m fp4series.conformance",
        description="extract upstream's NVFP4 Marlin tests from the verified wheel into DEST",
    )
    parser.add_argument("dest", type=Path, help="new or empty directory")
    parser.add_argument("--wheel", type=Path, help="the upstream wheel (default: cache/PyPI)")
    parser.add_argument("--cache-dir", type=Path, default=paths.default_cache_dir())
    parser.add_argument("--line", metavar="VERSION", help="as that series line runs them")
    args = parser.parse_args(argv)

    def run(a: argparse.Namespace) -> int:
        got = extract_from_lock(a.dest, wheel=a.wheel, cache_dir=a.cache_dir, line=a.line)
        for edit in got.edits:
            what = f"-> {edit.replacement}" if edit.replacement else "removed"
            print(f"{edit.file}:{edit.line}: {what} ({edit.kind}) "
                  f"{edit.removed.splitlines()[0]}")  # fmt: skip
        print(f"extracted {len(got.tests)} test file(s) from {got.wheel} into {got.dest}")
        return 0

    return run_reporting_errors(run, args)


if __name__ == "__main__":
    sys.exit(main())
