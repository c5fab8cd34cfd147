"""The rebase's work checkout and the few git operations the replay does in it.

A clone of the materialized release (branch ``fp4series-rebase``) that also holds the source
release's objects, so ``git apply --3way`` finds the pre-image blobs the patches' ``index``
lines name. Patches go in exactly (offsets allowed, never fuzz) or by a 3-way merge that leaves
its conflicts in the tree for the user; commits carry the source patch's author and date.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path

from git import Repo

from fp4series import gitops
from fp4series.errors import SeriesError, machine_hint
from fp4series.gitops import ABORT_COMMANDS, operation_in_progress
from fp4series.judging.repo import offsets

BRANCH = "fp4series-rebase"
SOURCE_BASE_REF = "refs/fp4series/source-base"
UNMERGED = {"DD", "AU", "UD", "UA", "DU", "AA", "UU"}


class WorkCheckout:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._committer: dict[str, str] | None = None

    @classmethod
    def clone(
        cls, path: Path, release_repo: str, tag: str, source_repo: str, source_tag: str
    ) -> WorkCheckout:
        proc = gitops.run(None, "clone", "-q", release_repo, str(path))
        if proc.returncode != 0:
            raise SeriesError(
                f"git clone {release_repo} failed: {proc.stderr.strip()}",
                hint=machine_hint(proc.stderr)
                or f"remove {release_repo} so that it is materialized again, then start again",
            )
        co = cls(path)
        co.git("config", "core.autocrlf", "false")
        co.git("config", "commit.gpgsign", "false")
        co.git("checkout", "-q", "-b", BRANCH, tag)
        co.git(
            "fetch", "-q", "--no-tags", source_repo, f"+refs/tags/{source_tag}:{SOURCE_BASE_REF}"
        )
        return co

    def git(
        self,
        *args: str,
        stdin: str | None = None,
        env: dict[str, str] | None = None,
        check: bool = True,
    ) -> subprocess.CompletedProcess[str]:
        proc = gitops.run(self.path, *args, input=stdin, env=env)
        if check and proc.returncode != 0:
            said = proc.stderr.strip()
            raise SeriesError(
                f"git {' '.join(args[:2])} failed in {self.path}: {said}",
                hint=machine_hint(said)
                or "the work checkout is the rebase's own: if it is damaged, "
                "scripts/rebase.sh --abort and start again",
            )
        return proc

    # ------------------------------------------------------------------------- what it holds

    def head(self) -> str:
        return self.git("rev-parse", "HEAD").stdout.strip()

    def status(self) -> list[str]:
        """``git status --porcelain`` entries ("XY path"), untracked files included."""
        out = self.git("status", "--porcelain=v1", "-z", "--untracked-files=all").stdout
        return [e for e in out.split("\0") if len(e) > 3 and e[2] == " "]

    def unmerged(self) -> list[str]:
        return sorted({e[3:] for e in self.status() if e[:2] in UNMERGED})

    def busy(self) -> SeriesError | None:
        """A refusal when a git operation (am, rebase, merge, ...) is in progress here."""
        op = operation_in_progress(Repo(self.path))
        if op is None:
            return None
        abort = ABORT_COMMANDS[op].replace("git ", f"git -C {self.path} ", 1)
        return SeriesError(
            f"a {op} is in progress in {self.path}; nothing was changed",
            hint=f"finish it, or abandon it with `{abort}`, then run --continue again",
        )

    def fingerprint(self) -> str:
        """HEAD, the index (conflict stages too) and every changed or untracked file's bytes:
        equal fingerprints mean nobody touched the checkout in between."""
        h = hashlib.sha256(self.head().encode())
        h.update(self.git("ls-files", "-s", "-z").stdout.encode("utf-8", "surrogateescape"))
        for entry in self.status():
            path = self.path / entry[3:]
            h.update(entry.encode("utf-8", "surrogateescape"))
            h.update(path.read_bytes() if path.is_file() else b"<none>")
        return h.hexdigest()

    def commits_since(self, start: str) -> list[str]:
        return self.git("rev-list", "--reverse", f"{start}..HEAD").stdout.split()

    def contains(self, ancestor: str) -> bool:
        return (
            self.git("merge-base", "--is-ancestor", ancestor, "HEAD", check=False).returncode == 0
        )

    def count(self, base: str, commit: str) -> int:
        return int(self.git("rev-list", "--count", f"{base}..{commit}").stdout)

    def message(self, commit: str) -> str:
        return self.git("log", "-1", "--format=%B", commit).stdout

    def subject(self, commit: str) -> str:
        return self.git("log", "-1", "--format=%s", commit).stdout.strip()

    # -------------------------------------------------------------------------------- changes

    def reset_to(self, start: str) -> None:
        """Back to START: only for a step nobody has seen yet, or an explicit drop."""
        if (self.path / ".git" / "rebase-apply").exists():
            self.git("am", "--abort", check=False)
        self.git("reset", "-q", "--hard", start)
        self.git("clean", "-fdq")

    def apply(self, text: str) -> tuple[str, str]:
        """(clean | offset | three-way | conflict | failed, what git said). Exact first (never
        fuzz), else a 3-way merge, whose conflicts stay in the tree; ``failed`` changed nothing."""
        exact = self.git(
            "apply", "--index", "-v", "--whitespace=nowarn", "-", stdin=text, check=False
        )
        if exact.returncode == 0:
            shifted = any(any(x) for x in offsets(exact.stderr).values())
            return ("offset" if shifted else "clean"), ""
        three = self.git("apply", "--3way", "--whitespace=nowarn", "-", stdin=text, check=False)
        if three.returncode == 0:
            return "three-way", ""
        return ("conflict" if self.unmerged() else "failed"), three.stderr.strip()

    def commit(self, message: str, author: dict[str, str]) -> bool:
        """Commit what is staged as AUTHOR (name, email, date); False when nothing is staged."""
        if self.git("diff", "--cached", "--quiet", check=False).returncode == 0:
            return False
        env = {
            **self.committer(),
            "GIT_AUTHOR_NAME": author["name"],
            "GIT_AUTHOR_EMAIL": author["email"],
            "GIT_AUTHOR_DATE": author["date"],
        }
        self.git(
            "commit", "-q", "--no-verify", "--cleanup=whitespace", "-F", "-", stdin=message, env=env
        )
        return True

    def amend(self, message: str) -> None:
        """Reword HEAD (its author and date kept)."""
        self.git(
            "commit",
            "-q",
            "--amend",
            "--no-verify",
            "--cleanup=whitespace",
            "-F",
            "-",
            stdin=message,
            env=self.committer(),
        )

    def am(self, patch: Path) -> str | None:
        """Replay PATCH exactly as a commit (no 3-way, no fuzz); None, or what git said."""
        proc = self.git(
            "am",
            "--no-3way",
            "--keep-cr",
            "--keep-non-patch",
            "--quiet",
            str(patch.resolve()),
            env=self.committer(),
            check=False,
        )
        if proc.returncode == 0:
            return None
        said = (proc.stderr or proc.stdout).strip().splitlines()
        return said[0] if said else "git am failed"

    def committer(self) -> dict[str, str]:
        """A committer identity where none is configured (CI); the user's own otherwise."""
        if self._committer is None:
            self._committer = {}
            for key, var, fallback in (
                ("user.name", "GIT_COMMITTER_NAME", "fp4series rebase"),
                ("user.email", "GIT_COMMITTER_EMAIL", "fp4series@localhost"),
            ):
                if not os.environ.get(var) and not self.git("config", key, check=False).stdout:
                    self._committer[var] = fallback
        return self._committer
