"""The patch model: one ``git format-patch`` file, parsed once, every file section byte-exact.

Every command reads patches through this module: the series (apply, export, lint, blob ids),
the overlap graph, the split, the rebase check's judge and the rebase's replay. A file section
(``FileDiff``) keeps its header lines as written and its hunks; ``FileDiff.text()`` gives back
the section byte for byte (or with fewer hunks, or paths rewritten), so a patch rebuilt from
the model is what ``git apply --3way`` needs. Lines are split on LF alone: a CR or a form feed
inside a line is content.

Public API (stable):
    parse_patch(path) -> Patch              SeriesError names the file (and line)
    parse_patch_text(text, path) -> Patch   the same for text read elsewhere
    Patch: name, path, subject (without "[PATCH]"), author ("Name <email>"), date, message
           (the body after the subject, up to the diff), trailers, changes (list[FileDiff]),
           text, signature (the line after the closing "-- ": END_MARKER in an exported patch;
           None when the file ends without one)
           .files, .hunks (every file's, in order), .stem, .group, .tests(), .depends_on,
           .provides, .upstream_status, .author_name, .author_email, .commit_message(),
           .diff_text(rename=None)
    FileDiff: old_path (None if created), new_path (None if deleted), header (its lines up to
           the first hunk), hunks, binary, old_id / new_id (the blob ids of its `index` line,
           full hex; ZERO_ID for an added or deleted side; None only for a pure mode change),
           line_no (1-based line of its "diff --git"), mode_change
           .path (after the patch; before it for a deletion), .source_path (before; the
           created path for a new file), .is_new, .is_deleted, .is_rename,
           .text(hunks=None, rename=None)
    Hunk: file, old_start, old_len, new_start, new_len, header (the "@@" line), lines (body
           lines as written, with their ' ', '-', '+', '\\' prefix), line_no, old_file
           .preimage(), .postimage(), .added(), .removed() (lines without prefix),
           .images() (pre- and post-image lines with their LF, none before "\\ No newline"),
           .section, .label(index), .text()
    line_kind(body_line) -> ' ' | '-' | '+' | '\\'
    parse_trailers(message) -> dict; split_list(value); split_provides(value)
    message_lines(lines) -> (start, end)    where the message of a patch's lines runs
    ZERO_ID = "0" * 40;  END_MARKER = "fp4series"
"""

from __future__ import annotations

import email
import email.header
import email.message
import email.utils
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from fp4series.errors import SeriesError

ZERO_ID = "0" * 40
END_MARKER = "fp4series"  # format-patch --signature: proves the file was not cut short
HUNK_RE = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@ ?(.*)$")
_INDEX = re.compile(
    r"^index ([0-9a-f]{40}|[0-9a-f]{64})\.\.([0-9a-f]{40}|[0-9a-f]{64})(?: [0-7]{6})?$"
)
_TRAILER = re.compile(r"^([A-Za-z][A-Za-z0-9-]*):\s*(.*)$")
_PATCH_PREFIX = re.compile(r"^\s*\[[^\]]*PATCH[^\]]*\]\s*")
_NUMBER = re.compile(r"^\d{4}-")


def line_kind(line: str) -> str:
    """A body line's kind; an empty line is context whose leading space was lost in transit."""
    return line[:1] if line else " "


@dataclass
class Hunk:
    file: str  # path after the patch (before, for a deletion)
    old_start: int
    old_len: int
    new_start: int
    new_len: int
    header: str  # the whole "@@ -a,b +c,d @@ ctx" line
    lines: list[str]  # body lines as written, with their ' ', '-', '+', '\\' prefix
    line_no: int = 0  # 1-based line of the "@@" header in the patch file
    old_file: str | None = None  # path before the patch

    def preimage(self) -> list[str]:
        return [ln[1:] for ln in self.lines if line_kind(ln) in (" ", "-")]

    def postimage(self) -> list[str]:
        return [ln[1:] for ln in self.lines if line_kind(ln) in (" ", "+")]

    def added(self) -> list[str]:
        return [ln[1:] for ln in self.lines if line_kind(ln) == "+"]

    def removed(self) -> list[str]:
        return [ln[1:] for ln in self.lines if line_kind(ln) == "-"]

    def images(self) -> tuple[list[str], list[str]]:
        """(pre-image, post-image) lines with their LF, except where '\\ No newline' follows:
        the very text the file holds before and after the hunk."""
        pre: list[str] = []
        post: list[str] = []
        for k, line in enumerate(self.lines):
            tag = line_kind(line)
            if tag == "\\":
                continue
            text = line[1:]
            if not (k + 1 < len(self.lines) and self.lines[k + 1].startswith("\\")):
                text += "\n"
            if tag in (" ", "-"):
                pre.append(text)
            if tag in (" ", "+"):
                post.append(text)
        return pre, post

    @property
    def section(self) -> str:
        """The function/section name git printed after the ``@@`` (may be empty)."""
        m = HUNK_RE.match(self.header)
        return m.group(5).strip() if m else ""

    def label(self, index: int) -> str:
        """Human name of the hunk: number, ranges and section."""
        sec = f" {self.section}" if self.section else ""
        return (
            f"hunk #{index + 1} @@ -{self.old_start},{self.old_len} "
            f"+{self.new_start},{self.new_len} @@{sec}"
        )

    def text(self) -> str:
        return "".join(f"{ln}\n" for ln in (self.header, *self.lines))


@dataclass
class FileDiff:
    """One ``diff --git`` section: its header lines (up to the first hunk) and its hunks."""

    old_path: str | None
    new_path: str | None
    header: list[str] = field(default_factory=list)
    hunks: list[Hunk] = field(default_factory=list)
    binary: bool = False
    old_id: str | None = None
    new_id: str | None = None
    line_no: int = 0
    mode_change: bool = False  # "old mode"/"new mode" lines in its header

    @property
    def path(self) -> str:
        """The path after the patch (before it, for a deletion)."""
        return self.new_path or self.old_path or ""

    @property
    def source_path(self) -> str:
        """The path the patch reads (before it), or the created path for a new file."""
        return self.old_path or self.new_path or ""

    @property
    def is_new(self) -> bool:
        return self.old_path is None

    @property
    def is_deleted(self) -> bool:
        return self.new_path is None

    @property
    def is_rename(self) -> bool:
        return None not in (self.old_path, self.new_path) and self.old_path != self.new_path

    def text(
        self, hunks: Sequence[Hunk] | None = None, rename: dict[str, str] | None = None
    ) -> str:
        """The section as written; with HUNKS only those hunks, with RENAME paths rewritten."""
        header = [_rewrite_header_line(ln, rename) for ln in self.header] if rename else self.header
        chosen = self.hunks if hunks is None else hunks
        return "".join(f"{ln}\n" for ln in header) + "".join(h.text() for h in chosen)


def _rewrite_header_line(line: str, rename: dict[str, str]) -> str:
    for old, new in rename.items():
        if line.startswith("diff --git "):
            line = line.replace(f" a/{old}", f" a/{new}").replace(f" b/{old}", f" b/{new}")
        elif line in (f"--- a/{old}", f"+++ b/{old}"):
            line = line[:6] + new
        elif line.startswith(("rename from ", "rename to ", "copy from ", "copy to ")):
            words = line.split(" ", 2)
            if words[2] == old:
                line = f"{words[0]} {words[1]} {new}"
    return line


@dataclass
class Patch:
    name: str
    path: Path
    subject: str
    author: str
    date: str
    message: str  # body after the subject, up to the diff
    trailers: dict[str, str]
    changes: list[FileDiff]
    text: str = ""
    signature: str | None = None  # the line after the closing "-- " (END_MARKER when exported)

    @property
    def files(self) -> list[str]:
        return [c.path for c in self.changes]

    @property
    def hunks(self) -> list[Hunk]:
        return [h for c in self.changes for h in c.hunks]

    @property
    def stem(self) -> str:
        """``0004-marlin-utils-fp4.patch`` -> ``marlin-utils-fp4``."""
        return _NUMBER.sub("", self.name.removesuffix(".patch"))

    def tests(self) -> list[str]:
        """Test ids from the Tests: trailer (may carry gpu:/bench: prefixes)."""
        return split_list(self.trailers.get("Tests", ""))

    @property
    def depends_on(self) -> list[str]:
        return split_list(self.trailers.get("Depends-On", ""))

    @property
    def provides(self) -> list[str]:
        return split_provides(self.trailers.get("Provides", ""))

    @property
    def upstream_status(self) -> str | None:
        return self.trailers.get("Upstream-Status")

    @property
    def group(self) -> str | None:
        return self.trailers.get("Group", "").strip() or None

    @property
    def author_name(self) -> str:
        return email.utils.parseaddr(self.author)[0]

    @property
    def author_email(self) -> str:
        return email.utils.parseaddr(self.author)[1]

    def commit_message(self) -> str:
        """The commit message ``git am`` makes of it: the subject, a blank line, the body."""
        return f"{self.subject}\n\n{self.message}\n" if self.message else f"{self.subject}\n"

    def diff_text(self, rename: dict[str, str] | None = None) -> str:
        """The diff part alone (what ``git apply`` needs), optionally with paths rewritten."""
        return "".join(c.text(rename=rename) for c in self.changes)


def split_list(value: str) -> list[str]:
    """A trailer value split on commas and whitespace."""
    return [x for x in re.split(r"[,\s]+", value.strip()) if x]


def split_provides(value: str) -> list[str]:
    """``Provides:`` split on commas and whitespace, keeping ``func(a, b)`` lists together."""
    out: list[str] = []
    depth = 0
    cur = ""
    for ch in value:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if (ch == "," or ch.isspace()) and depth == 0:
            if cur.strip():
                out.append(cur.strip())
            cur = ""
            continue
        cur += ch
    if cur.strip():
        out.append(cur.strip())
    return out


def parse_trailers(message: str) -> dict[str, str]:
    """Trailers = the last paragraph of the message if it is made of 'Key: value' lines."""
    paras = [p for p in re.split(r"\n\s*\n", message.strip("\n")) if p.strip()]
    if not paras:
        return {}
    out: dict[str, str] = {}
    key: str | None = None
    for line in paras[-1].splitlines():
        m = _TRAILER.match(line)
        if m:
            key = m.group(1)
            out[key] = f"{out[key]}, {m.group(2)}" if key in out else m.group(2)
        elif key and line[:1] in (" ", "\t"):
            out[key] = f"{out[key]} {line.strip()}".strip()
        else:
            return {}
    return out


def message_lines(lines: list[str]) -> tuple[int, int]:
    """(first line of the message, the line after it) in a format-patch file's LINES: the
    message follows the blank line that ends the mail headers and runs up to "---" or the
    first "diff --git". ValueError when there is no blank line after the headers."""
    blank = lines.index("", 1)
    end = blank + 1
    while end < len(lines) and lines[end] != "---" and not lines[end].startswith("diff --git "):
        end += 1
    return blank + 1, end


def _fail(path: Path, what: str, line: int | None = None) -> SeriesError:
    where = f"{path}:{line}" if line else str(path)
    return SeriesError(
        f"{where}: {what}",
        hint="regenerate the patch with scripts/export.sh from commits on the pin, "
        "or fix it by hand (git format-patch form)",
    )


def _header(msg: email.message.Message, key: str) -> str:
    """A header as written (unfolded), with RFC 2047 encoded words (non-ASCII names) decoded."""
    raw = msg.get(key)
    if raw is None:
        return ""
    return str(email.header.make_header(email.header.decode_header(str(raw))))


def _strip_path(raw: str) -> str | None:
    raw = raw.split("\t", 1)[0].strip()
    if raw == "/dev/null":
        return None
    if raw.startswith('"'):
        raw = raw.strip('"').encode("latin-1", "backslashreplace").decode("unicode_escape")
    return raw[2:] if raw[:2] in ("a/", "b/") else raw


def _check_ids(path: Path, change: FileDiff) -> None:
    """Every file header names its blobs (format-patch --full-index): what lets lint and apply
    prove the patch is whole. Only a pure mode change has no index line."""
    where = change.line_no
    if change.old_id is None:
        if change.mode_change and not change.hunks and not change.binary:
            return
        raise _fail(
            path,
            f"{change.path}: file header has no 'index <old>..<new>' line with full blob ids "
            "(written without --full-index, or the header was cut)",
            where,
        )
    zero = change.old_id.strip("0") == ""
    if (change.old_path is None) != zero:
        raise _fail(
            path,
            f"{change.path}: index line's old id {change.old_id} does not fit "
            "a " + ("created" if change.old_path is None else "modified") + " file",
            where,
        )
    zero = change.new_id is not None and change.new_id.strip("0") == ""
    if (change.new_path is None) != zero:
        raise _fail(
            path,
            f"{change.path}: index line's new id {change.new_id} does not fit "
            "a " + ("deleted" if change.new_path is None else "kept") + " file",
            where,
        )


def _header_line(current: FileDiff, line: str, path: Path, no: int) -> None:
    """What a line of a file section's header says about the section."""
    if line.startswith("index "):
        m = _INDEX.match(line)
        if not m:
            raise _fail(
                path,
                f"malformed index line {line!r} (want 'index <old>..<new> <mode>' with full "
                "blob ids, as git format-patch --full-index writes)",
                no,
            )
        current.old_id, current.new_id = m.group(1), m.group(2)
    elif line.startswith(("old mode ", "new mode ")):
        current.mode_change = True
    elif line.startswith("new file mode"):
        current.old_path = None
    elif line.startswith("deleted file mode"):
        current.new_path = None
    elif line.startswith("rename from "):
        current.old_path = line[len("rename from ") :]
    elif line.startswith("rename to "):
        current.new_path = line[len("rename to ") :]
    elif line.startswith("--- "):
        current.old_path = _strip_path(line[4:])
    elif line.startswith("+++ "):
        current.new_path = _strip_path(line[4:])
    elif line.startswith(("GIT binary patch", "Binary files ")):
        current.binary = True


def _hunk(current: FileDiff, lines: list[str], i: int, path: Path) -> tuple[Hunk, int]:
    """The hunk whose "@@" header is LINES[I], bounded by its line counts; (hunk, next line)."""
    line = lines[i]
    m = HUNK_RE.match(line)
    if not m:
        raise _fail(path, f"malformed hunk header {line!r}", i + 1)
    old_len = int(m.group(2)) if m.group(2) is not None else 1
    new_len = int(m.group(4)) if m.group(4) is not None else 1
    body: list[str] = []
    need_old, need_new = old_len, new_len
    j = i + 1
    while need_old > 0 or need_new > 0:
        if j >= len(lines):
            raise _fail(path, f"hunk {line} is truncated (patch corrupt)", i + 1)
        b = lines[j]
        tag = line_kind(b)
        if tag == " ":
            need_old, need_new = need_old - 1, need_new - 1
        elif tag == "-":
            need_old -= 1
        elif tag == "+":
            need_new -= 1
        elif tag != "\\":
            raise _fail(path, f"hunk {line} has a malformed line {b!r}", j + 1)
        if need_old < 0 or need_new < 0:
            raise _fail(path, f"hunk {line} line counts do not match its body", i + 1)
        body.append(b)
        j += 1
    while j < len(lines) and lines[j].startswith("\\"):
        body.append(lines[j])
        j += 1
    hunk = Hunk(
        file=current.path,
        old_start=int(m.group(1)),
        old_len=old_len,
        new_start=int(m.group(3)),
        new_len=new_len,
        header=line,
        lines=body,
        line_no=i + 1,
        old_file=current.old_path,
    )
    return hunk, j


def parse_diff(lines: list[str], first: int, path: Path) -> tuple[list[FileDiff], int]:
    """The file sections of LINES from FIRST on, up to the "-- " that ends a format-patch
    (or the end of the text); (sections, index of that "-- " line, or where the text ends).
    PATH names the file in errors."""
    changes: list[FileDiff] = []
    stop = len(lines) - 1 if lines and lines[-1] == "" else len(lines)  # the text's final LF
    i = first
    current: FileDiff | None = None
    while i < stop:
        line = lines[i]
        if line == "-- ":
            break
        if line.startswith("diff --git "):
            parts = line[len("diff --git ") :].split(" b/", 1)
            old = _strip_path(parts[0])
            new = _strip_path("b/" + parts[1]) if len(parts) == 2 else old
            current = FileDiff(old, new, [line], line_no=i + 1)
            changes.append(current)
        elif current is None:
            pass  # between the message's "---" and the first section: the diffstat
        elif line.startswith("@@"):
            hunk, i = _hunk(current, lines, i, path)
            current.hunks.append(hunk)
            continue
        elif current.hunks:
            raise _fail(path, f"{current.path}: unexpected line {line!r} after a hunk", i + 1)
        else:
            _header_line(current, line, path, i + 1)
            current.header.append(line)
        i += 1
    for change in changes:
        for hunk in change.hunks:
            hunk.file, hunk.old_file = change.path, change.old_path
        _check_ids(path, change)
    return changes, i


def parse_patch_text(text: str, path: Path | str) -> Patch:
    """Parse one `git format-patch` text (PATH: its name, and where errors say it is)."""
    path = Path(path)
    lines = text.split("\n")
    if lines[0].endswith("\r"):
        raise SeriesError(
            f"{path}:1: has CRLF (Windows) line endings; git format-patch writes LF, and the "
            "hunks cannot be read with a CR on every line",
            hint=f"restore LF endings (dos2unix {path}, or check it out again with "
            "core.autocrlf=false), or re-export it with scripts/export.sh",
        )
    if not lines[0].startswith("From "):
        raise _fail(path, "does not start with a 'From <sha> ...' line (not git format-patch)", 1)
    try:
        start, end = message_lines(lines)
    except ValueError:
        raise _fail(path, "no blank line after the mail headers") from None
    headers = email.message_from_string("\n".join(lines[1 : start - 1]) + "\n\n")
    subject_raw, author, date = (_header(headers, k) for k in ("Subject", "From", "Date"))
    for name, value in (("From", author), ("Date", date), ("Subject", subject_raw)):
        if not value:
            raise _fail(path, f"has no {name}: header", 2)
    subject = _PATCH_PREFIX.sub("", " ".join(str(subject_raw).split()), count=1)
    if end >= len(lines):
        raise _fail(path, "contains no diff ('diff --git' line)")
    message = "\n".join(lines[start:end]).strip("\n")
    changes, stop = parse_diff(lines, end, path)
    if not changes:
        raise _fail(path, "contains no diff ('diff --git' line)")
    signature = lines[stop + 1] if stop + 1 < len(lines) else None
    return Patch(
        name=path.name,
        path=path,
        subject=subject,
        author=str(author),
        date=str(date),
        message=message,
        trailers=parse_trailers(message),
        changes=changes,
        text=text,
        signature=signature,
    )


def parse_patch(path: Path | str) -> Patch:
    """Parse one `git format-patch` file; every structural problem names the file."""
    path = Path(path)
    try:
        text = path.read_bytes().decode("utf-8", "surrogateescape")
    except OSError as exc:
        raise _fail(path, f"cannot read: {exc.strerror}") from None
    return parse_patch_text(text, path)
