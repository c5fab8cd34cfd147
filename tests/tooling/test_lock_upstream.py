"""upstream.lock parsing/recording, wheel fetch (sha256, offline), RECORD hashes, materialize."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pytest
from _fakepin import FILES, WHEEL, git, make_wheel, write_lock

from fp4series import upstream
from fp4series.errors import SeriesError
from fp4series.lock import UNRESOLVED, load_lock, record_pin_commit, record_target_sha256
from fp4series.progress import quiet

PROJECT_LOCK = Path(__file__).resolve().parents[2] / "upstream.lock"
SHA_A = "a" * 64


def test_project_lock_names_the_pin_and_targets() -> None:
    lock = load_lock(PROJECT_LOCK)
    assert lock.repo_url == "https://github.com/sgl-project/sglang"
    assert (lock.pin.version, lock.pin.tag, lock.pin.commit) == ("0.5.11", "v0.5.11", UNRESOLVED)
    assert lock.pin.wheel_filename == WHEEL
    assert lock.pin.sha256 == "fe0748beaff218d3e16c9018a5e19f018db06fc3c7ac4f90d2f93da1cf074b6f"
    versions = [t.version for t in lock.targets]
    assert versions[0] == "0.5.12" and versions[-1] == "0.5.23" and "0.5.12.post1" in versions
    assert lock.wheel_path("python/sglang/srt/x.py") == "sglang/srt/x.py"
    assert lock.repo_path("sglang/srt/x.py") == "python/sglang/srt/x.py"
    assert lock.wheel_path("sgl-kernel/x.h") is None


def test_record_target_sha256_edits_in_place_keeping_comments(tmp_path: Path) -> None:
    path = write_lock(tmp_path / "upstream.lock", SHA_A)
    before = path.read_text().splitlines()
    record_target_sha256(path, "0.5.12", "sglang-0.5.12-x.whl", "B" * 64)
    after = path.read_text().splitlines()
    changed = [(a, b) for a, b in zip(before, after, strict=True) if a != b]
    note = "  # empty until fetched"
    assert changed == [
        (f'wheel_filename = ""{note}', f'wheel_filename = "sglang-0.5.12-x.whl"{note}'),
        ('sha256 = ""', f'sha256 = "{"b" * 64}"'),
    ]
    target = load_lock(path).release("0.5.12")
    assert (target.wheel_filename, target.sha256) == ("sglang-0.5.12-x.whl", "b" * 64)
    record_target_sha256(path, "0.5.99", "sglang-0.5.99-x.whl", "c" * 64)  # appended
    assert load_lock(path).release("0.5.99").sha256 == "c" * 64
    assert "# targets" in path.read_text() and "# fill me" in path.read_text()
    with pytest.raises(SeriesError, match="is the pin"):
        record_target_sha256(path, "0.5.11", WHEEL, "d" * 64)
    with pytest.raises(SeriesError, match="not a sha256"):
        record_target_sha256(path, "0.5.12", "x.whl", "zz")
    record_pin_commit(path, "1" * 40)
    assert load_lock(path).pin.commit == "1" * 40
    assert 'commit = "1111111111111111111111111111111111111111"  # fill me' in path.read_text()


@pytest.mark.parametrize(
    ("old", "new", "match"),
    [
        ('sha256 = "' + SHA_A + '"', 'sha256 = "123"', "not 64 hex"),
        ('commit = "unresolved"  # fill me', 'commit = "abc"', "40-hex"),
        ("[pin]", "[pinned]", r"\[pin\] table"),
        ('version = "0.5.11"', 'version = "latest"', "release version"),
        ('version = "0.5.12"', 'version = "0.5.11"', "listed twice"),
        ("[paths]", "[paths", "not valid TOML"),
    ],
)
def test_lock_validation_errors_say_what_and_how(
    tmp_path: Path, old: str, new: str, match: str
) -> None:
    path = write_lock(tmp_path / "upstream.lock", SHA_A)
    path.write_text(path.read_text().replace(old, new, 1))
    with pytest.raises(SeriesError, match=match) as exc:
        load_lock(path)
    assert exc.value.hint


def test_record_hashes_decodes_urlsafe_base64(tmp_path: Path) -> None:
    wheel = make_wheel(tmp_path / WHEEL, FILES)
    hashes = upstream.record_hashes(wheel)
    for name, text in FILES.items():
        assert hashes[name] == hashlib.sha256(text.encode()).hexdigest()
    assert "sglang-0.5.11.dist-info/RECORD" not in hashes


def _lock_for(tmp_path: Path, wheel_bytes_sha: str):
    return load_lock(write_lock(tmp_path / "upstream.lock", wheel_bytes_sha))


def test_cached_wheel_with_wrong_sha_is_refused_and_kept(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    (cache / "wheels").mkdir(parents=True)
    wheel = make_wheel(cache / "wheels" / WHEEL, FILES)
    lock = _lock_for(tmp_path, SHA_A)
    with pytest.raises(SeriesError) as exc:
        upstream.fetch_wheel(lock.pin, cache, progress=quiet())
    msg = str(exc.value)
    assert SHA_A in msg and upstream.sha256_file(wheel) in msg and "expected" in msg
    assert wheel.is_file()  # the user's cached file is not deleted


def test_downloaded_wheel_with_wrong_sha_is_moved_aside(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = tmp_path / "cache"
    cache.mkdir()
    lock = _lock_for(tmp_path, SHA_A)
    calls = []

    def fake_pip(cmd, tmp, progress, label):  # what pip download leaves behind
        calls.append(cmd)
        make_wheel(Path(cmd[cmd.index("-d") + 1]) / WHEEL, {"sglang/x.py": "evil\n"})
        return 0, "Saved\n"

    monkeypatch.setattr(upstream, "_run_pip", fake_pip)
    with pytest.raises(SeriesError, match="sha256 mismatch") as exc:
        upstream.fetch_wheel(lock.pin, cache, progress=quiet())
    assert "sglang==0.5.11" in calls[0] and "--no-deps" in calls[0]
    assert (cache / "wheels" / "rejected" / WHEEL).is_file()
    assert not (cache / "wheels" / WHEEL).exists()
    assert "rejected" in str(exc.value)


def test_offline_download_says_offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    lock = _lock_for(tmp_path, SHA_A)
    monkeypatch.setattr(
        upstream,
        "_run_pip",
        lambda *a: (1, "WARNING: Retrying ... NewConnectionError: Temporary failure in name "
                    "resolution\nERROR: No matching distribution found for sglang==0.5.11\n"),
    )  # fmt: skip
    with pytest.raises(SeriesError, match="offline") as exc:
        upstream.fetch_wheel(lock.pin, tmp_path / "cache", progress=quiet())
    assert WHEEL in exc.value.hint
    assert not list((tmp_path / "cache" / "wheels").glob(".download-*"))


def test_unrecorded_target_is_fetched_and_hash_recorded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write_lock(tmp_path / "upstream.lock", SHA_A)
    name = "sglang-0.5.12-cp311-cp311-manylinux_2_34_x86_64.whl"

    def fake_pip(cmd, tmp, progress, label):
        make_wheel(Path(cmd[cmd.index("-d") + 1]) / name, {"sglang/x.py": "v12\n"})
        return 0, ""

    monkeypatch.setattr(upstream, "_run_pip", fake_pip)
    wheel = upstream.fetch_and_record(path, "0.5.12", tmp_path / "cache")
    target = load_lock(path).release("0.5.12")
    assert target.wheel_filename == name and target.sha256 == upstream.sha256_file(wheel)


def test_materialize_is_reproducible_and_atomic(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    (cache / "wheels").mkdir(parents=True)
    wheel = make_wheel(cache / "wheels" / WHEEL, FILES)
    lock = _lock_for(tmp_path, upstream.sha256_file(wheel))
    one = upstream.materialize(lock.pin, tmp_path / "one", cache, lock=lock, progress=quiet())
    (tmp_path / "two").mkdir()  # an empty DEST is fine
    two = upstream.materialize(lock.pin, tmp_path / "two", cache, lock=lock, progress=quiet())
    sha = git(one, "rev-parse", "v0.5.11^{commit}")
    assert sha == git(two, "rev-parse", "HEAD") and git(one, "rev-parse", "HEAD") == sha
    files = git(one, "ls-files").split()
    assert files == sorted("python/" + f for f in FILES)
    assert git(one, "status", "--porcelain") == ""
    # DEST not empty: refused, untouched
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep.txt").write_text("mine")
    with pytest.raises(SeriesError, match="not empty"):
        upstream.materialize(lock.pin, tmp_path / "full", cache, lock=lock, progress=quiet())
    assert [p.name for p in (tmp_path / "full").iterdir()] == ["keep.txt"]
    # a bad wheel: nothing half-written beside DEST
    shutil.copy(wheel, tmp_path / "good.whl")
    make_wheel(cache / "wheels" / WHEEL, {"sglang/evil.py": "x\n"})
    with pytest.raises(SeriesError, match="sha256 mismatch"):
        upstream.materialize(lock.pin, tmp_path / "three", cache, lock=lock, progress=quiet())
    assert not (tmp_path / "three").exists()
    assert not [p for p in tmp_path.iterdir() if ".partial-" in p.name]


def test_resolve_commit_refuses_a_materialized_tree(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    (cache / "wheels").mkdir(parents=True)
    wheel = make_wheel(cache / "wheels" / WHEEL, FILES)
    lock_path = write_lock(tmp_path / "upstream.lock", upstream.sha256_file(wheel))
    lock = load_lock(lock_path)
    pin = upstream.materialize(lock.pin, tmp_path / "pin", cache, lock=lock, progress=quiet())
    with pytest.raises(SeriesError, match="materialized"):
        upstream.resolve_commit(pin, lock_path)
    # a "real clone": same tree, an ordinary commit and tag
    real = tmp_path / "real"
    git(tmp_path, "init", "-q", str(real))
    (real / "f").write_text("x\n")
    git(real, "add", "f")
    git(real, "commit", "-qm", "upstream commit")
    git(real, "tag", "v0.5.11")
    commit = upstream.resolve_commit(real, lock_path)
    assert load_lock(lock_path).pin.commit == commit == git(real, "rev-parse", "HEAD").strip()
