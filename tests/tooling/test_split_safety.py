"""split never overwrites what is the user's, and is all or nothing (issue 25, split's share).

The user's names: a branch ``nvfp4-marlin/<unit>`` holding their commit, a file in the out dir
with an output's name (written by them, or written by split and edited since), a directory
where split keeps a worktree. Each is refused before anything is written, or replaced only
with a ``--force`` that names it, the old one kept aside and named.

All or nothing: a fault at every named pause point (split_guard.PAUSE_POINTS), raised in the
process or a SIGKILL of a real one, leaves the repository's refs and the out dir exactly as
they were, or (a kill after the ref transaction) every branch moved; no sleeps decide anything.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_split import git, run_split, world  # noqa: F401  (world is a fixture)

from fp4series import split as sp
from fp4series import split_guard as guard
from fp4series.errors import SeriesError

SRC = Path(__file__).resolve().parents[2] / "src"
BRANCHES = [
    "nvfp4-marlin/change-a",
    "nvfp4-marlin/other-b",
    "nvfp4-marlin/follow-a",
    "nvfp4-marlin/needs-b",
    "nvfp4-marlin/grp",
]


def refs(repo: Path) -> dict[str, str]:
    out = git(repo, "for-each-ref", "--format=%(refname) %(objectname)")
    return dict(ln.split(" ", 1) for ln in out.splitlines())


def files(root: Path) -> dict[str, bytes]:
    """Every file under ROOT (worktrees' contents left out: split's scratch checkouts)."""
    if not root.exists():
        return {}
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and "worktrees" not in p.relative_to(root).parts
    }


def user_commit(repo: Path, branch: str) -> str:
    """A branch of the user's, one commit of theirs on the pin."""
    git(repo, "branch", branch, "v0.0.1")
    tree = git(repo, "rev-parse", "v0.0.1^{tree}").strip()
    sha = git(repo, "commit-tree", tree, "-p", "v0.0.1", "-m", "my own work").strip()
    git(repo, "update-ref", f"refs/heads/{branch}", sha)
    return sha


def edit_patch(world: dict[str, Path]) -> None:  # noqa: F811
    p = world["patches"] / "0001-change-a.patch"
    p.write_text(p.read_text().replace("What Change a changes.", "What Change a changes, v2."))


# --- the user's branches and files ------------------------------------------------------------


def test_a_user_branch_of_that_name_is_refused_then_replaced_only_when_forced(
    world: dict[str, Path],  # noqa: F811
) -> None:
    t = world["target"]
    mine = user_commit(t, "nvfp4-marlin/follow-a")
    before = refs(t)
    with pytest.raises(SeriesError, match=r"branch nvfp4-marlin/follow-a exists at .* someone's"):
        run_split(world)
    assert refs(t) == before  # no other branch created either
    assert not (world["root"] / "split" / "split-record.json").exists()
    logs: list[str] = []
    run_split(world, force=["nvfp4-marlin/follow-a"], log=logs.append)
    assert git(t, "log", "-1", "--format=%s", "nvfp4-marlin/follow-a").strip() == (
        "[Quant] Follow a"
    )
    kept = [r for r in refs(t) if r.startswith("refs/fp4series/split/follow-a/replaced-")]
    assert len(kept) == 1 and refs(t)[kept[0]] == mine
    assert any(kept[0] in ln and mine[:12] in ln for ln in logs), logs
    # now split's own: a second split moves it without --force
    edit_patch(world)
    run_split(world)


def test_a_force_that_names_nothing_split_writes_is_refused(world: dict[str, Path]) -> None:  # noqa: F811
    with pytest.raises(SeriesError, match="--force nvfp4-marlin/typo: split writes no branch"):
        run_split(world, force=["nvfp4-marlin/typo"])
    assert not any(r.startswith("refs/heads/nvfp4-marlin/") for r in refs(world["target"]))


@pytest.mark.parametrize("name", ["change-a.md", "grp.range-diff.txt", "summary.json"])
def test_a_user_file_with_an_output_name_is_refused_then_kept_aside_when_forced(
    world: dict[str, Path],  # noqa: F811
    name: str,
) -> None:
    out = world["root"] / "split"
    out.mkdir()
    (out / name).write_text("my notes\n")
    before_refs = refs(world["target"])
    with pytest.raises(SeriesError, match=rf"{name} exists and is not split's \(split did not"):
        run_split(world)
    assert files(out) == {name: b"my notes\n"} and refs(world["target"]) == before_refs
    logs: list[str] = []
    run_split(world, force=[name], log=logs.append)
    aside = [p for p in out.iterdir() if p.name.startswith(f"{name}.replaced-")]
    assert len(aside) == 1 and aside[0].read_text() == "my notes\n"
    assert any(str(aside[0]) in ln for ln in logs), logs


def test_an_output_edited_since_split_wrote_it_is_the_users(world: dict[str, Path]) -> None:  # noqa: F811
    out = world["root"] / "split"
    run_split(world)
    md = out / "change-a.md"
    md.write_text(md.read_text() + "\nmy review notes\n")
    edit_patch(world)
    before = (refs(world["target"]), files(out))
    with pytest.raises(SeriesError, match=r"change-a\.md exists and is not split's \(edited"):
        run_split(world)
    assert (refs(world["target"]), files(out)) == before
    # untouched outputs are split's: rewriting them needs no --force
    md.write_text(md.read_text().replace("\nmy review notes\n", ""))
    run_split(world)
    assert "What Change a changes, v2." in md.read_text()


def test_a_user_directory_where_a_worktree_goes_is_refused(world: dict[str, Path]) -> None:  # noqa: F811
    wt = world["root"] / "split" / "worktrees" / "other-b"
    wt.mkdir(parents=True)
    (wt / "mine.txt").write_text("mine\n")
    with pytest.raises(SeriesError, match=r"other-b exists and is not a worktree split made"):
        run_split(world)
    assert (wt / "mine.txt").read_text() == "mine\n"


def test_a_group_git_cannot_name_is_refused_before_anything_is_written(
    world: dict[str, Path],  # noqa: F811
) -> None:
    for name in ("0005-grp-one.patch", "0006-grp-two.patch"):
        p = world["patches"] / name
        p.write_text(p.read_text().replace("Group: grp", "Group: foo.lock"))
    before = refs(world["target"])
    with pytest.raises(SeriesError, match=r"nvfp4-marlin/foo\.lock as a ref name") as exc:
        run_split(world)
    assert "nothing was written" in exc.value.hint
    assert refs(world["target"]) == before
    assert files(world["root"] / "split") == {}
    assert not (world["root"] / "split" / "worktrees").exists()


def test_a_unit_that_does_not_apply_leaves_none_of_the_new_branches(
    world: dict[str, Path],  # noqa: F811
) -> None:
    p = world["patches"] / "0004-needs-b.patch"
    p.write_text(p.read_text().replace("-C = 1", "-C = 7"))  # no longer applies on the pin
    before = refs(world["target"])
    logs: list[str] = []
    results = run_split(world, log=logs.append)
    assert [r.ok for r in results] == [True, True, True, False, True]
    assert refs(world["target"]) == before
    assert files(world["root"] / "split") == {}
    assert any("no branch was created or moved" in ln for ln in logs), logs


# --- faults at every pause point ----------------------------------------------------------------


class Boom(Exception):
    pass


@pytest.mark.parametrize("fault", [Boom, KeyboardInterrupt])
@pytest.mark.parametrize("point", guard.PAUSE_POINTS)
@pytest.mark.parametrize("again", [False, True], ids=["first-split", "re-split"])
def test_a_fault_at_any_point_leaves_refs_and_out_dir_as_they_were(
    world: dict[str, Path],  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
    point: str,
    fault: type[BaseException],
    again: bool,
) -> None:
    out = world["root"] / "split"
    if again:
        run_split(world)
        edit_patch(world)
    mine = user_commit(world["target"], "my-topic")
    before = (refs(world["target"]), files(out))
    hits: list[str] = []

    def hook(at: str) -> None:
        hits.append(at)
        if at == point:
            raise fault(f"injected at {at}")

    monkeypatch.setattr(guard, "PAUSE_HOOK", hook)
    with pytest.raises(fault):
        run_split(world)
    assert point in hits
    assert (refs(world["target"]), files(out)) == before
    assert refs(world["target"])["refs/heads/my-topic"] == mine
    assert not [p for p in out.glob(f"{guard.STAGING}*")] if out.exists() else True
    monkeypatch.setattr(guard, "PAUSE_HOOK", None)
    run_split(world)  # and the next split goes through, needing no --force
    assert all(
        b in {r.removeprefix("refs/heads/") for r in refs(world["target"])} for b in BRANCHES
    )


SPLIT_SCRIPT = """
import sys
import time
from pathlib import Path
from fp4series import split as sp
from fp4series.series import load_series
root = Path(sys.argv[1])
sp.split(root / "target", load_series(root / "patches"), base="pin", pin_version="0.0.1",
         pin_tag="v0.0.1", pin_commit=None, out_dir=root / "split",
         reports_dir=root / "reports", log=lambda s: None)
"""


@pytest.mark.parametrize("point", ["branch-built", "before-refs", "refs-moved", "files-placed"])
def test_sigkill_leaves_no_branch_or_every_branch_and_the_next_split_recovers(
    world: dict[str, Path],  # noqa: F811
    tmp_path: Path,
    point: str,
) -> None:
    out = world["root"] / "split"
    pause_dir = tmp_path / "pause"
    pause_dir.mkdir()
    before = refs(world["target"])
    env = {
        **os.environ,
        "PYTHONPATH": str(SRC),
        "FP4SERIES_SPLIT_PAUSE_AT": point,
        "FP4SERIES_PAUSE_DIR": str(pause_dir),
    }
    proc = subprocess.Popen(
        [sys.executable, "-c", SPLIT_SCRIPT, str(world["root"])],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    reached = pause_dir / f"{point}.reached"
    while not reached.exists():  # the process writes it when it stops there
        assert proc.poll() is None, proc.stdout.read() if proc.stdout else b""
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    after = refs(world["target"])
    made = [b for b in BRANCHES if f"refs/heads/{b}" in after]
    if point in ("branch-built", "before-refs"):
        assert after == before and not (out / "split-record.json").exists()
    else:
        assert made == BRANCHES  # the ref transaction is one: all branches or none
    run_split(world)  # no --force needed: what split left is split's
    record = json.loads((out / "split-record.json").read_text())
    assert [e["branch"] for e in record["branches"]] == BRANCHES
    assert set(record["outputs"]) >= {"change-a.md", "summary.json"}
    for name, digest in record["outputs"].items():
        assert guard.sha256_of(out / name) == digest


def test_record_lists_outputs_with_their_digests(world: dict[str, Path]) -> None:  # noqa: F811
    out = world["root"] / "split"
    run_split(world)
    record = json.loads((out / sp.RECORD_FILE).read_text())
    assert set(record["outputs"]) == {f"{b.split('/')[1]}.md" for b in BRANCHES} | {"summary.json"}
