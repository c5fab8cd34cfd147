"""The patch series: the order file ``patches/series`` and parsed ``git format-patch`` files.

Public API (stable):
    load_series(patches_dir) -> list[Patch]
        Read the order file ('#' comments and blank lines allowed) and parse every patch.
        SeriesError if an entry is missing, listed twice, not a plain file name in the directory
        (no '/', '..' or absolute path: see paths.name_problem), a symbolic link to a file
        outside the directory, numbered NNNN- other than its position, or a *.patch file is not
        listed. lint reports exactly these (series_problems), so lint and apply agree.
        A directory with neither a series file nor patches is an empty series.
    read_series_names(patches_dir) -> list[str]          just the order file
    parse_patch(path) -> Patch                            SeriesError names the file (and line)
    Patch: name, path, subject (without "[PATCH]"), author, date, message, trailers,
           files, hunks, changes, signature (the line after the closing "-- ", END_MARKER in
           an exported patch; None when the file ends without one);
           patch.tests() -> list[str]; patch.depends_on / provides (lists) and
           patch.upstream_status (str | None) are properties.
    Hunk: file, old_start, old_len, new_start, new_len, header, lines, line_no, old_file
    FileChange: old_path (None if created), new_path (None if deleted), binary,
           old_id / new_id (the blob ids of its `index` line, full 40-hex; ZERO_ID for an added
           or deleted side; both None only for a pure mode change, which has no index line),
           line_no (1-based line of its "diff --git" header)
    SERIES_FILE = "series";  ZERO_ID = "0" * 40;  END_MARKER = "fp4series"
"""

from __future__ import annotations

import email
import email.header
import email.message
import re
from dataclasses import dataclass, field
from pathlib import Path

from fp4series.errors import SeriesError
from fp4series.paths import name_problem

SERIES_FILE = "series"
ZERO_ID = "0" * 40
END_MARKER = "fp4series"  # format-patch --signature: proves the file was not cut short
_INDEX = re.compile(
    r"^index ([0-9a-f]{40}|[0-9a-f]{64})\.\.([0-9a-f]{40}|[0-9a-f]{64})(?: [0-7]{6})?$"
)
_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@ ?(.*)$")
_TRAILER = re.compile(r"^([A-Za-z][A-Za-z0-9-]*):\s*(.*)$")
_PATCH_PREFIX = re.compile(r"^\s*\[[^\]]*PATCH[^\]]*\]\s*")
_NUMBER = re.compile(r"^(\d{4})-")  # NNNN-stem.patch: its number is its position


@dataclass
class Hunk:
    file: str  # path after the patch (before, for a deletion)
    old_start: int
    old_len: int
    new_start: int
    new_len: int
    header: str  # the whole "@@ -a,b +c,d @@ ctx" line
    lines: list[str]  # body lines with their ' ', '-', '+', '\\' prefix
    line_no: int = 0  # 1-based line of the "@@" header in the patch file
    old_file: str | None = None  # path before the patch

    def preimage(self) -> list[str]:
        return [ln[1:] for ln in self.lines if ln[:1] in (" ", "-")]

    def postimage(self) -> list[str]:
        return [ln[1:] for ln in self.lines if ln[:1] in (" ", "+")]


@dataclass
class FileChange:
    old_path: str | None
    new_path: str | None
    binary: bool = False
    old_id: str | None = None
    new_id: str | None = None
    line_no: int = 0
    mode_change: bool = False  # "old mode"/"new mode" lines in its header

    @property
    def path(self) -> str:
        return self.new_path or self.old_path or ""


@dataclass
class Patch:
    name: str
    path: Path
    subject: str
    author: str
    date: str
    message: str  # body after the subject, up to the diff
    trailers: dict[str, str]
    files: list[str]
    hunks: list[Hunk]
    changes: list[FileChange] = field(default_factory=list)
    text: str = ""
    signature: str | None = None  # the line after the closing "-- " (END_MARKER when exported)

    def _list(self, key: str) -> list[str]:
        raw = self.trailers.get(key, "")
        return [x for x in re.split(r"[,\s]+", raw) if x]

    def tests(self) -> list[str]:
        """Test ids from the Tests: trailer (may carry gpu:/bench: prefixes)."""
        return self._list("Tests")

    @property
    def depends_on(self) -> list[str]:
        return self._list("Depends-On")

    @property
    def provides(self) -> list[str]:
        return self._list("Provides")

    @property
    def upstream_status(self) -> str | None:
        return self.trailers.get("Upstream-Status")


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


def _check_ids(path: Path, change: FileChange, has_hunks: bool) -> None:
    """Every file header names its blobs (format-patch --full-index): what lets lint and apply
    prove the patch is whole. Only a pure mode change has no index line."""
    where = change.line_no
    if change.old_id is None:
        if change.mode_change and not has_hunks and not change.binary:
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


def _parse_diff(
    path: Path, lines: list[str], first: int
) -> tuple[list[FileChange], list[Hunk], str | None]:
    """(file changes, hunks, signature: the line after the "-- " that ends the diff, if any)."""
    changes, hunks, end = _parse_diff_body(path, lines, first)
    for change in changes:
        _check_ids(path, change, any(h.file == change.path for h in hunks))
    signature = lines[end + 1] if end + 1 < len(lines) else None
    return changes, hunks, signature


def _parse_diff_body(
    path: Path, lines: list[str], first: int
) -> tuple[list[FileChange], list[Hunk], int]:
    changes: list[FileChange] = []
    hunks: list[Hunk] = []
    i = first
    current: FileChange | None = None
    while i < len(lines):
        line = lines[i]
        if line.startswith("diff --git "):
            parts = line[len("diff --git ") :].split(" b/", 1)
            old = _strip_path(parts[0])
            new = _strip_path("b/" + parts[1]) if len(parts) == 2 else old
            current = FileChange(old, new, line_no=i + 1)
            changes.append(current)
            i += 1
            continue
        if current is None:
            if line == "-- ":  # signature
                break
            i += 1
            continue
        if line.startswith("index "):
            m = _INDEX.match(line)
            if not m:
                raise _fail(
                    path,
                    f"malformed index line {line!r} (want 'index <old>..<new> <mode>' with full "
                    "blob ids, as git format-patch --full-index writes)",
                    i + 1,
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
        elif line.startswith("GIT binary patch") or line.startswith("Binary files "):
            current.binary = True
        elif line.startswith("@@"):
            m = _HUNK.match(line)
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
                tag = b[:1]
                if b == "":
                    b, tag = " ", " "
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
            if j < len(lines) and lines[j].startswith("\\"):
                body.append(lines[j])
                j += 1
            hunks.append(
                Hunk(
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
            )
            i = j
            continue
        elif line == "-- ":
            break
        i += 1
    return changes, hunks, i


def parse_patch(path: Path | str) -> Patch:
    """Parse one `git format-patch` file; every structural problem names the file."""
    path = Path(path)
    try:
        text = path.read_bytes().decode("utf-8", "surrogateescape")
    except OSError as exc:
        raise _fail(path, f"cannot read: {exc.strerror}") from None
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
        blank = lines.index("", 1)
    except ValueError:
        raise _fail(path, "no blank line after the mail headers") from None
    headers = email.message_from_string("\n".join(lines[1:blank]) + "\n\n")
    subject_raw, author, date = (_header(headers, k) for k in ("Subject", "From", "Date"))
    for name, value in (("From", author), ("Date", date), ("Subject", subject_raw)):
        if not value:
            raise _fail(path, f"has no {name}: header", 2)
    subject = _PATCH_PREFIX.sub("", " ".join(str(subject_raw).split()), count=1)
    end = blank + 1
    while end < len(lines) and lines[end] != "---" and not lines[end].startswith("diff --git "):
        end += 1
    if end >= len(lines):
        raise _fail(path, "contains no diff ('diff --git' line)")
    message = "\n".join(lines[blank + 1 : end]).strip("\n")
    changes, hunks, signature = _parse_diff(path, lines, end)
    if not changes:
        raise _fail(path, "contains no diff ('diff --git' line)")
    return Patch(
        name=path.name,
        path=path,
        subject=subject,
        author=str(author),
        date=str(date),
        message=message,
        trailers=parse_trailers(message),
        files=[c.path for c in changes],
        hunks=hunks,
        changes=changes,
        text=text,
        signature=signature,
    )


def read_series_names(patches_dir: Path | str) -> list[str]:
    """Patch file names from the order file, in order (comments and blanks skipped)."""
    series = Path(patches_dir) / SERIES_FILE
    if not series.exists():
        return []
    names = []
    for line in series.read_text(encoding="utf-8").splitlines():
        entry = line.split("#", 1)[0].strip()
        if entry:
            names.append(entry)
    return names


def series_problems(patches_dir: Path | str) -> list[tuple[int, str]]:
    """(line in series file, problem) for missing, duplicate and unlisted patches."""
    patches_dir = Path(patches_dir)
    series = patches_dir / SERIES_FILE
    on_disk = sorted(p.name for p in patches_dir.glob("*.patch"))
    if not series.exists():
        return [(0, f"no {SERIES_FILE} file but patches exist: {on_disk}")] if on_disk else []
    problems: list[tuple[int, str]] = []
    seen: dict[str, int] = {}
    real_dir = patches_dir.resolve()
    position = 0
    for no, line in enumerate(series.read_text(encoding="utf-8").splitlines(), 1):
        entry = line.split("#", 1)[0].strip()
        if not entry:
            continue
        position += 1
        bad = name_problem(entry)
        if bad:
            problems.append((no, f"{entry!r} is not a plain file name in {patches_dir}: {bad}"))
            continue
        if entry in seen:
            problems.append((no, f"{entry} is listed twice (first on line {seen[entry]})"))
        seen.setdefault(entry, no)
        path = patches_dir / entry
        if not path.is_file():
            problems.append((no, f"{entry} is listed but does not exist"))
        elif path.is_symlink() and path.resolve().parent != real_dir:
            problems.append(
                (no, f"{entry} is a symbolic link to {path.resolve()}, outside {patches_dir}")
            )
        number = _NUMBER.match(entry)
        if number and int(number.group(1)) != position:
            problems.append(
                (no, f"{entry}: number {number.group(1)} but position {position} in {SERIES_FILE}")
            )
    for name in on_disk:
        if name not in seen:
            problems.append((0, f"{name} exists but is not listed in {SERIES_FILE}"))
    return problems


def load_series(patches_dir: Path | str) -> list[Patch]:
    """The parsed series in order; SeriesError on any inconsistency."""
    patches_dir = Path(patches_dir)
    problems = series_problems(patches_dir)
    if problems:
        where = patches_dir / SERIES_FILE
        text = "; ".join(f"{where}:{no}: {p}" if no else f"{where}: {p}" for no, p in problems)
        raise SeriesError(
            text,
            hint="list every patches/*.patch exactly once in patches/series, in order, "
            "by its file name alone",
        )
    return [parse_patch(patches_dir / name) for name in read_series_names(patches_dir)]
