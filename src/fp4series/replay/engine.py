"""The rebase state machine: replay a series onto a release one patch at a time, hand a conflict
to the user, and survive a kill at any point.

Everything lives in the tool's own directory ``.work/rebase/<V>/``:
    checkout/    the work checkout (fp4series.replay.worktree), branch ``fp4series-rebase``
    source/      a snapshot of the source series (edits to patches/ meanwhile do not count)
    record/      a snapshot of the target line, when it exists: the record of resolutions
    judge/       the judge's scratch repository (fp4series.judging.repo)
    state.json   the State below, replaced atomically after every step
    message      the prepared commit message of the step handed to the user

Per source patch, in series order (verdicts from fp4series.judging.stack, judged once at the
start on the release, with the source series stacked):
    recorded resolution   replayed exactly (git am, no 3-way, no fuzz): fp4series.replay.record
    upstream              dropped, with a stanza naming the first release judged upstream
    partly-upstream       shrunk to the hunks upstream lacks, then applied like the rest
    anything else         applied exactly (clean/offset, files upstream moved followed), else
                          with a 3-way merge; a conflict stops the rebase for the user
Commits keep the source's author, date and message, with ``Rebased-From:`` added and
``Depends-On:`` renamed to the line's patches (dropped ones left out).

Crash safety: a step is ``working`` from the moment its start commit is recorded until it is
done or handed to the user (``stopped``). A working step found by a later run was killed
before the user saw anything, so it is redone from its start commit; a stopped step is never
reset (``--drop`` resets only a tree that is still exactly as the tool left it).
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from fp4series import gitops
from fp4series.checkout import wait_at
from fp4series.errors import SeriesError
from fp4series.export import existing_stems, patch_stem
from fp4series.judging.matrix import Target
from fp4series.judging.repo import JudgeRepo
from fp4series.judging.stack import check_tree
from fp4series.judging.verdict import PatchResult
from fp4series.patch import Patch, parse_trailers
from fp4series.paths import write_atomically
from fp4series.progress import Progress
from fp4series.replay.record import (
    DROPPED,
    TRAILER,
    Record,
    Stanza,
    load_record,
    stable_patch_id,
    stanza,
)
from fp4series.replay.worktree import WorkCheckout
from fp4series.series import SERIES_FILE, load_series

STATE = "state.json"
MESSAGE = "message"
OWNER = "owner"  # marks a directory as a rebase's own, even before its state exists
PAUSE_POINTS = (
    "begun",  # the work directory marked as the rebase's own, no state yet
    "judged",
    "step-applied",
    "step-committed",
    "write-exported",
    "write-done",  # line and lock written, state "done", the work directory still there
    "work-renamed",  # the work directory renamed away, not yet removed
    "abort-restored",  # --abort: the user's work moved aside, line and lock put back
)
APPLIED = ("clean", "offset", "three-way")


def pause(point: str) -> None:
    """Test hook, checkout.pause's mechanism with this module's points: with
    FP4SERIES_PAUSE_AT=<point>[,...] and FP4SERIES_PAUSE_DIR=D, write D/<point>.reached and
    wait until D/<point>.release exists."""
    assert point in PAUSE_POINTS, point
    wait_at(point)


@dataclass
class State:
    """What a rebase has decided and done so far: everything a resumed run needs."""

    version: str  # the target release
    tag: str  # its tag in the work checkout: the line's base
    release_repo: str  # .work/upstream/<V>
    source_version: str  # the release the source series sits on (the line's rebased_from)
    source_repo: str
    source_tag: str
    source: str  # the source series directory as given (the snapshot is source/)
    out: str  # where the line is written
    record: str | None  # the snapshot of the target line read as the record of resolutions
    lock: str
    check: bool = False  # --check: replayed in scratch, compared, never written
    earlier: list[str] = field(default_factory=list)  # releases between source and target
    phase: str = "replay"  # replay -> finish (export + lint in scratch) -> write -> done
    patches: list[dict[str, Any]] = field(default_factory=list)  # one per source patch
    index: int = 0  # the next source patch to replay
    step: dict[str, Any] | None = None  # the step in progress: working | stopped
    done: list[dict[str, Any]] = field(default_factory=list)
    drops: list[str] = field(default_factory=list)  # stanza texts, source series order
    notes: list[str] = field(default_factory=list)
    history: dict[str, dict[str, str]] = field(default_factory=dict)  # release -> verdicts
    problems: list[str] = field(default_factory=list)  # lint problems of the last finish
    format: int = 1


def load_state(work: Path) -> State | None:
    try:
        return State(**json.loads((work / STATE).read_text()))
    except FileNotFoundError:
        return None
    except (ValueError, TypeError) as exc:
        raise SeriesError(
            f"{work / STATE} is not a rebase state this version can read ({exc})",
            hint="give that rebase up with scripts/rebase.sh --abort and start again",
        ) from None


def save_state(work: Path, state: State) -> None:
    write_atomically(work / STATE, (json.dumps(asdict(state), indent=1) + "\n").encode())


@dataclass
class Stop:
    """The rebase is waiting for the user at one patch."""

    patch: str
    position: int  # 1-based, in the source series
    verdict: str
    kind: str  # conflict (markers left in the tree) | failed (git could not merge at all)
    files: list[str]
    said: str  # what git said


def stop_of(state: State) -> Stop:
    """The stop a state waits at (its step is ``stopped``)."""
    step = state.step
    assert step is not None and step["phase"] == "stopped"
    p = state.patches[state.index]
    return Stop(p["name"], state.index + 1, p["shown"], step["kind"], step["files"], step["said"])


def line_message(message: str, trailer: str, renames: dict[str, list[str]]) -> str:
    """MESSAGE for the line: ``Rebased-From: TRAILER`` (replacing an older one, as when a line
    is rebased again) and ``Depends-On:`` renamed by RENAMES (source -> line names; [] for a
    dropped patch, which is left out)."""
    text = message.strip("\n")
    head, sep, last = text.rpartition("\n\n")
    if not sep or not parse_trailers(last):
        head, last = text, ""
    kept = []
    for line in last.splitlines():
        key = line.split(":", 1)[0]
        if key == TRAILER:
            continue
        if key == "Depends-On":
            deps: list[str] = []
            for dep in filter(None, re.split(r"[,\s]+", line.split(":", 1)[1])):
                deps += renames.get(dep, [dep])
            if not deps:
                continue
            line = "Depends-On: " + ", ".join(dict.fromkeys(deps))
        kept.append(line)
    kept.append(f"{TRAILER}: {trailer}")
    return head + "\n\n" + "\n".join(kept) + "\n"


def judge_series(
    repo: JudgeRepo, docs: Sequence[Patch], release: Target, source: Target
) -> dict[str, PatchResult]:
    """The judge's verdicts (fp4series.judging.stack) of the whole series on RELEASE."""
    trees = []
    for t in (release, source):
        repo.borrow(t.repo)
        tree = gitops.rev(t.repo, f"{t.rev}^{{tree}}")
        if tree is None:
            raise SeriesError(
                f"{t.repo} has no {t.rev}", hint=f"remove {t.repo} so that it is materialized again"
            )
        trees.append(tree)
    return check_tree(repo, docs, trees[0], trees[1])


class Replay:
    """One rebase: its work directory, state and work checkout (see the module doc).
    PREPARE materializes a release by version (for judging the releases in between)."""

    def __init__(
        self,
        work: Path,
        state: State,
        prepare: Callable[[str], Target],
        progress: Progress | None = None,
    ) -> None:
        self.work, self.state, self.prepare = work, state, prepare
        self.progress = progress or Progress()
        self.co = WorkCheckout(work / "checkout")
        self._docs: list[Patch] | None = None
        self._record: Record | None = None
        self._stems: dict[str, str] | None = None

    @classmethod
    def begin(
        cls, work: Path, state: State, prepare: Callable[[str], Target], progress: Progress
    ) -> Replay:
        """Snapshot the source, clone the release, judge the series: the first state."""
        work.mkdir(parents=True)
        (work / OWNER).write_text("fp4series rebase\n")
        pause("begun")
        (work / "source").mkdir()
        source = Path(state.source)
        for name in [SERIES_FILE, *(p.name for p in load_series(source))]:
            shutil.copyfile(source / name, work / "source" / name)
        if state.record:  # the record is snapshotted too: edits meanwhile do not count
            line, snap = Path(state.record), work / "record"
            snap.mkdir()
            for name in [SERIES_FILE, DROPPED, *(p.name for p in load_series(line))]:
                if (line / name).is_file():
                    shutil.copyfile(line / name, snap / name)
            state.record = str(snap)
        r = cls(work, state, prepare, progress)
        if not r.docs:
            raise SeriesError(f"the series in {source} is empty", hint="nothing to rebase")
        r.warn_uncarried()
        with progress.step(f"work checkout: clone {state.tag} to {r.co.path}"):
            WorkCheckout.clone(
                r.co.path, state.release_repo, state.tag, state.source_repo, state.source_tag
            )
        with progress.step(f"judge {len(r.docs)} patches on {state.version}"):
            results = judge_series(
                JudgeRepo(work / "judge"),
                r.docs,
                Target(state.version, Path(state.release_repo), state.tag),
                Target(state.source_version, Path(state.source_repo), state.source_tag),
            )
        for doc in r.docs:
            v = results[doc.name].verdict
            shown = f"moved->{v.moved_verdict}" if v.verdict == "moved" else v.verdict
            state.patches.append(
                {
                    "name": doc.name,
                    "patch_id": stable_patch_id(doc.text),
                    "verdict": v.effective,
                    "shown": shown,
                    "evidence": " ".join(v.evidence.split()),
                    "moved_to": v.moved_to,
                    "hunks": v.hunks,
                    "not_judged": [n["file"] for n in v.not_judged],
                }
            )
            progress.info(f"{doc.name}: {shown}")
        r.save()
        pause("judged")
        return r

    @property
    def docs(self) -> list[Patch]:
        if self._docs is None:
            self._docs = load_series(self.work / "source")
        return self._docs

    @property
    def record(self) -> Record | None:
        if self._record is None and self.state.record:
            self._record = load_record(Path(self.state.record))
            if self._record is not None:
                self._record.where = Path(self.state.out)  # what messages name
        return self._record

    def warn_uncarried(self) -> None:
        """Say which patches of the target line this rebase will not carry (a line patch made
        by hand, or from a patch the source no longer has): the export drops them."""
        if self.record is None:
            return
        names = {d.name for d in self.docs}
        lost = [p.name for p in self.record.orphans]
        lost += [
            m.path.name for src, ms in self.record.patches.items() if src not in names for m in ms
        ]
        for name in sorted(set(lost)):
            self.note(
                f"{name} in {self.record.where} comes from no patch of the source series (no "
                f"'{TRAILER}:' naming one): the rebase does not carry it, the new line lacks it"
            )

    def save(self) -> None:
        save_state(self.work, self.state)

    def note(self, text: str) -> None:
        self.state.notes.append(text)
        self.progress.info(f"note: {text}")

    def trailer(self, i: int) -> str:
        p = self.state.patches[i]
        return f"{p['name']} {p['patch_id']}"

    def message(self, i: int) -> tuple[str, dict[str, str]]:
        """The line's commit message for source patch I, and its author (name, email, date),
        as ``git am`` would take them from the patch."""
        doc = self.docs[i]
        author = {"name": doc.author_name, "email": doc.author_email, "date": doc.date}
        renames = {d["patch"]: d["names"] for d in self.state.done}
        return line_message(doc.commit_message(), self.trailer(i), renames), author

    # ---------------------------------------------------------------------------------- steps

    def run(self) -> Stop | None:
        """Replay from the next patch to a stop, or to the end (then phase ``finish``)."""
        st = self.state
        if st.step is not None and st.step["phase"] == "working":
            self.progress.info(
                f"{st.step['patch']}: interrupted before it was handed to you; redoing it "
                f"from {st.step['start'][:12]}"
            )
            self.co.reset_to(st.step["start"])
            st.step = None
        assert st.step is None, "a stopped step goes through continue_stopped()"
        while st.index < len(st.patches):
            stop = self._step(st.index)
            if stop is not None:
                return stop
        st.phase = "finish"
        self.save()
        return None

    def _step(self, i: int) -> Stop | None:
        st, p = self.state, self.state.patches[i]
        start = self.co.head()
        st.step = {"patch": p["name"], "start": start, "phase": "working"}
        self.save()
        self.progress.info(f"[{i + 1}/{len(st.patches)}] {p['name']} ({p['shown']})")
        made, drop, stale = [], None, None
        if self.record is not None:
            made, drop, stale = self.record.resolution(p["name"], p["patch_id"])
        if stale:
            self.note(stale)
        if made:
            failed = next(((m, why) for m in made if (why := self.co.am(m.path))), None)
            if failed is None:
                return self._done(i, "recorded", start, ", ".join(m.path.name for m in made))
            self.note(
                f"the recorded {failed[0].path.name} does not apply exactly here ({failed[1]}); "
                f"treating {p['name']} as new"
            )
            self.co.reset_to(start)
        if drop is not None:
            return self._done(i, "recorded-drop", start, "", drop)
        text, removed = self._text(i)
        if p["verdict"] == "upstream" or not text:
            return self._drop_upstream(i, start)
        how, said = self.co.apply(text)
        if how not in APPLIED:
            return self._stop(i, start, how, said)
        pause("step-applied")
        message, author = self.message(i)
        if not self.co.commit(message, author):  # it changed nothing: upstream has it
            return self._drop_upstream(i, start)
        pause("step-committed")
        detail = how
        if removed:
            kept = sum(1 for ln in text.splitlines() if ln.startswith("@@ "))
            detail = (
                f"{len(removed)} of {len(removed) + kept} hunks removed (already upstream: "
                f"{'; '.join(removed)}), the rest {how}"
            )
        if p["moved_to"]:
            detail += "; followed " + ", ".join(f"{a} -> {b}" for a, b in p["moved_to"].items())
        return self._done(i, "shrunk" if removed else how, start, detail)

    def _text(self, i: int) -> tuple[str, list[str]]:
        """The patch to apply (paths upstream moved rewritten) and, for a partly-upstream one,
        the hunks left out because the judge found them upstream."""
        doc, p = self.docs[i], self.state.patches[i]
        rename = p["moved_to"] or None
        rows = p["hunks"] if p["verdict"] == "partly-upstream" else []
        skip = set(p["not_judged"])
        if len(rows) != sum(len(fd.hunks) for fd in doc.changes if fd.old_path not in skip):
            rows = []  # not the judge's per-hunk rows: apply it whole
        parts, removed, k = [], [], 0
        for fd in doc.changes:
            if not rows or fd.old_path in skip or not fd.hunks:
                parts.append(fd.text(rename=rename))
                continue
            keep = []
            for h in fd.hunks:
                row, k = rows[k], k + 1
                if row.get("present"):
                    removed.append(f"{row['file']} {row['hunk'].split(' @@')[0]}")
                else:
                    keep.append(h)
            if keep:
                parts.append(fd.text(hunks=keep, rename=rename))
        return "".join(parts), removed

    def _stop(self, i: int, start: str, kind: str, said: str) -> Stop:
        message, author = self.message(i)
        (self.work / MESSAGE).write_text(message, encoding="utf-8")
        files = self.co.unmerged()
        if kind == "failed":  # git named the files it could not touch
            found = re.findall(r"^error: (?:patch failed: )?([^:\n]+?)(?::\d+)?: ", said, re.M)
            files = sorted(dict.fromkeys(found))
        self.state.step = {
            "patch": self.state.patches[i]["name"],
            "start": start,
            "phase": "stopped",
            "kind": kind,
            "files": files,
            "said": said,
            "author": author,
            "fingerprint": self.co.fingerprint(),
        }
        self.save()
        return stop_of(self.state)

    def _done(
        self, i: int, outcome: str, start: str, detail: str, drop: Stanza | None = None
    ) -> None:
        st = self.state
        commits = self.co.commits_since(start)
        if drop is not None:
            st.drops.append(drop.text)
        st.done.append(
            {
                "patch": st.patches[i]["name"],
                "outcome": outcome,
                "commits": commits,
                "names": [self._line_name(c) for c in commits],
                "detail": detail,
            }
        )
        st.index, st.step = i + 1, None
        self.save()
        self.progress.info(f"    {outcome}" + (f": {detail}" if detail else ""))

    def _line_name(self, commit: str) -> str:
        """The file name export will give COMMIT: its position, the stem of the patch with its
        subject already in --out, else one made from the subject."""
        if self._stems is None:
            out = Path(self.state.out)
            self._stems = existing_stems(out) if out.is_dir() else {}
        subject = self.co.subject(commit)
        stem = self._stems.get(subject) or patch_stem(subject)
        return f"{self.co.count(self.state.tag, commit):04d}-{stem}.patch"

    # ---------------------------------------------------------------------------------- drops

    def _drop_upstream(self, i: int, start: str) -> None:
        p = self.state.patches[i]
        first = self.first_release(p["name"], ("upstream",))
        fields = [("Applied-Upstream", first), ("Verdict", "upstream")]
        self._done(i, "dropped", start, f"upstream since {first}", self._stanza(i, fields))

    def _stanza(self, i: int, fields: list[tuple[str, str]]) -> Stanza:
        p = self.state.patches[i]
        evidence = p["evidence"] or "(the judge gave none)"
        return stanza(
            [("Patch", p["name"]), ("Patch-Id", p["patch_id"]), *fields, ("Evidence", evidence)]
        )

    def first_release(self, name: str, kinds: tuple[str, ...]) -> str:
        """The first release after the source's judged one of KINDS, the target if none: from
        the committed rebase check when it was made for this series, else judged now."""
        st = self.state
        for version in st.earlier:
            if version not in st.history:
                st.history[version] = self._verdicts_on(version)
                self.save()
            if st.history[version].get(name) in kinds:
                return version
        return st.version

    def _verdicts_on(self, version: str) -> dict[str, str]:
        try:
            target = self.prepare(version)
        except SeriesError as exc:
            self.note(f"{version} not judged for Applied-Upstream: {exc}")
            return {}
        st = self.state
        source = Target(st.source_version, Path(st.source_repo), st.source_tag)
        with self.progress.step(f"judge the series on {version} (where did upstream take it?)"):
            results = judge_series(JudgeRepo(self.work / "judge"), self.docs, target, source)
        return {n: r.verdict.effective for n, r in results.items()}

    # ------------------------------------------------------------------------------- continue

    def continue_stopped(self, drop: str | None) -> None:
        """Take the user's resolution of the stopped step (or drop the patch); run() next."""
        st = self.state
        assert st.step is not None and st.step["phase"] == "stopped"
        i, start, name = st.index, st.step["start"], st.step["patch"]
        busy = self.co.busy()
        if busy is not None:
            raise busy
        if drop is not None:
            return self._drop_by_hand(i, start, drop.strip())
        where = self.co.path
        unmerged = self.co.unmerged()
        if unmerged:
            raise SeriesError(
                f"{name}: unmerged paths remain in {where}: {', '.join(unmerged)}",
                hint=f"resolve them and `git -C {where} add` each, then --continue again",
            )
        if not self.co.contains(start):
            raise SeriesError(
                f"the work branch no longer contains {start[:12]}, where {name} stopped; "
                "nothing was changed",
                hint=f"put your resolution on top of it (git -C {where} rebase {start[:12]}), "
                "then --continue again",
            )
        entries = self.co.status()
        staged = [e[3:] for e in entries if e[0] not in " ?"]
        loose = [e[3:] for e in entries if e[0] == "?" or e[1] != " "]
        commits = self.co.commits_since(start)
        if loose or (commits and staged):
            raise SeriesError(
                f"{name}: changes neither committed nor staged in {where}: "
                + ", ".join(loose or staged),
                hint=f"`git -C {where} add` what belongs to the resolution and discard the "
                "rest (git checkout -- FILE; rm an untracked file), then --continue again",
            )
        if not commits and not staged:
            raise SeriesError(
                f"{name}: nothing changed since the rebase stopped there",
                hint="resolve the conflict and git add the files, or, if upstream already "
                'covers the patch, drop it: scripts/rebase.sh --continue --drop "why"',
            )
        if commits:
            self._add_trailer(i, commits)
        else:
            message = (self.work / MESSAGE).read_text(encoding="utf-8")  # as the user left it
            self.co.commit(line_message(message, self.trailer(i), {}), st.step["author"])
        self._done(i, "resolved", start, "resolved by hand")

    def _add_trailer(self, i: int, commits: list[str]) -> None:
        """The user's own commit gets the ``Rebased-From:`` trailer when it lacks it."""
        lacking = [c for c in commits if TRAILER not in parse_trailers(self.co.message(c))]
        if not lacking:
            return
        if len(commits) > 1:
            raise SeriesError(
                f"commits {', '.join(c[:12] for c in lacking)} lack the '{TRAILER}:' trailer",
                hint=f"add '{TRAILER}: {self.trailer(i)}' to the last paragraph of each "
                f"(git -C {self.co.path} rebase -i {commits[0][:12]}~1, reword), then "
                "--continue again",
            )
        self.co.amend(line_message(self.co.message(commits[0]), self.trailer(i), {}))

    def _drop_by_hand(self, i: int, start: str, reason: str) -> None:
        st, p = self.state, self.state.patches[i]
        if not reason:
            raise SeriesError("--drop needs a reason", hint='--drop "upstream has it as ..."')
        as_left = st.step is not None and self.co.fingerprint() == st.step["fingerprint"]
        if not as_left and (self.co.head() != start or self.co.status()):
            raise SeriesError(
                f"{p['name']}: the work checkout changed since the rebase stopped there; "
                "--drop would throw your changes away, so nothing was changed",
                hint=f"keep them: --continue without --drop; or discard them yourself "
                f"(git -C {self.co.path} reset --hard {start[:12]}) and --drop again",
            )
        self.co.reset_to(start)
        first = self.first_release(p["name"], ("upstream", "partly-upstream"))
        fields = [
            ("Applied-Upstream", first),
            ("Verdict", p["verdict"]),
            ("Resolution", "dropped by hand"),
            ("Reason", reason),
        ]
        self._done(i, "dropped-by-hand", start, reason, self._stanza(i, fields))
