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
    """One removed piece of upstream text: file (upstream path), 1-based line, what, text."""

    file: str
    line: int
    kind: str
    removed: str


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


def mechanical_edits(upstream_path: str, text: str) -> tuple[str, list[Edit]]:
    """Remove skip marks and CI registration from one upstream test file; list each removal.

    Raises SeriesError when a file has none of them (upstream's text changed: the edits
    would no longer be known to be mechanical) or still uses a removed name afterwards.
    """
    spans: list[tuple[int, int, str]] = []
    for kind, pattern in _EDITS:
        for match in pattern.finditer(text):
            spans.append((match.start(), match.end(), kind))
    kinds = {kind for _, _, kind in spans}
    missing = {"skip", "skipif", "ci-registration"} - kinds
    if missing:
        raise SeriesError(
            f"{upstream_path}: expected upstream's {sorted(missing)} lines, found none",
            hint="upstream changed this test file; review the mechanical edits in "
            "src/fp4series/conformance.py before trusting a conformance run",
        )
    spans.sort()
    edits, out, pos = [], [], 0
    for start, end, kind in spans:
        line = text.count("\n", 0, start) + 1
        edits.append(Edit(upstream_path, line, kind, text[start:end].rstrip("\n")))
        out.append(text[pos:start])
        pos = end
    out.append(text[pos:])
    edited = "".join(out)
    for name in ("is_sm80_supported", "is_sm90_supported", "register_cuda_ci", "pytest.mark.skip("):
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


def extract(wheel: Path | str, sha256: str, dest: Path | str, version: str) -> Extracted:
    """Write the edited tests, the helpers, a conftest and pytest.ini into DEST (new/empty)."""
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
                text, file_edits = mechanical_edits(upstream, text)
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


def upstream_release(lock_path: Path | str | None = None) -> Release:
    lock = load_lock(lock_path or paths.default_lock_path())
    release = lock.release(UPSTREAM_VERSION)
    if not release.sha256:
        raise SeriesError(f"upstream.lock records no sha256 for {UPSTREAM_VERSION}")
    return release


def extract_from_lock(
    dest: Path | str,
    *,
    wheel: Path | str | None = None,
    lock_path: Path | str | None = None,
    cache_dir: Path | str | None = None,
) -> Extracted:
    """``extract`` from the given wheel file, else the cached or downloaded one (verified)."""
    release = upstream_release(lock_path)
    if wheel is None:
        from fp4series.upstream import fetch_wheel  # git-dependent module: imported on use

        wheel = fetch_wheel(release, cache_dir or paths.default_cache_dir())
    return extract(wheel, release.sha256, dest, release.version)


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


def records(outcomes: dict[str, tuple[str, str]]) -> list[dict[str, Any]]:
    """One conformance.json record per test: pass, fail, or not-applicable (+ what it needs).

    A not-applicable test still ran; its outcome is kept as ``observed``. A skipped test is
    a fail: not run is not a pass.
    """
    out = []
    for tid, (status, message) in sorted(outcomes.items()):
        record: dict[str, Any] = {"id": tid}
        base = base_name(tid.rsplit("::", 1)[-1])
        if base in NOT_APPLICABLE:
            record.update(status="not-applicable", needs=NOT_APPLICABLE[base], observed=status)
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
    args = parser.parse_args(argv)

    def run(a: argparse.Namespace) -> int:
        got = extract_from_lock(a.dest, wheel=a.wheel, cache_dir=a.cache_dir)
        for edit in got.edits:
            print(f"{edit.file}:{edit.line}: removed ({edit.kind}) {edit.removed.splitlines()[0]}")
        print(f"extracted {len(got.tests)} test file(s) from {got.wheel} into {got.dest}")
        return 0

    return run_reporting_errors(run, args)


if __name__ == "__main__":
    sys.exit(main())
