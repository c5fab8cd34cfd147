"""The real pin: materialize sglang 0.5.11 from its PyPI wheel (cache first) and prove it against
the wheel's RECORD. Skips when the wheel is neither cached nor downloadable."""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

import pytest
from _fakepin import git, isolate_git
from git import Repo

from fp4series import paths, upstream
from fp4series.errors import SeriesError
from fp4series.lock import load_lock
from fp4series.progress import quiet
from fp4series.verify import record_mismatches

pytestmark = pytest.mark.integration
# where a copy of the pinned wheel may already lie (the project cache, a team cache)
WHEEL_DIRS = [paths.default_cache_dir() / "wheels"]
TOUCHED = [
    "python/sglang/jit_kernel/csrc/gemm/marlin/marlin_template.h",
    "python/sglang/srt/layers/quantization/modelopt_quant.py",
    "python/sglang/srt/layers/quantization/fp4_utils.py",
]


def test_materialize_real_pin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    isolate_git(monkeypatch, tmp_path)
    lock = load_lock(paths.default_lock_path())
    cache = tmp_path / "cache"
    (cache / "wheels").mkdir(parents=True)
    extra = os.environ.get("FP4SERIES_WHEEL_DIR")
    for d in [Path(extra)] if extra else WHEEL_DIRS:
        if (d / lock.pin.wheel_filename).is_file():
            shutil.copy(d / lock.pin.wheel_filename, cache / "wheels")
            break
    try:
        dest = upstream.materialize(lock.pin, tmp_path / "pin", cache, lock=lock, progress=quiet())
    except SeriesError as exc:
        if "offline" in str(exc) or "could not download" in str(exc):
            pytest.skip(f"pinned wheel not cached and not downloadable: {exc}")
        raise
    files = git(dest, "ls-files").split("\n")[:-1]
    assert len(files) == 2529
    assert all(f.startswith("python/sglang/") for f in files)
    assert git(dest, "rev-parse", "v0.5.11^{commit}") == git(dest, "rev-parse", "HEAD")
    assert git(dest, "status", "--porcelain") == ""
    hashes = upstream.record_hashes(cache / "wheels" / lock.pin.wheel_filename)
    in_tree = {lock.wheel_path(f) for f in files}
    assert in_tree == {p for p in hashes if p.startswith(lock.wheel_prefix)}
    for f in files:
        digest = hashlib.sha256((dest / f).read_bytes()).hexdigest()
        assert digest == hashes[lock.wheel_path(f)], f
    assert record_mismatches(Repo(dest), "HEAD", lock, TOUCHED, hashes) == []
    assert "marlin_utils_fp4.py" not in " ".join(files)  # the pin predates NVFP4 Marlin
