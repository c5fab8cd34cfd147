"""The Markdown report: patch x release table with short codes and shared footnotes."""

from __future__ import annotations

from fp4series.judging.matrix import Matrix
from fp4series.judging.verdict import APPLIES, CODES, PatchResult, Verdict


def _cell(v: Verdict | None) -> str:
    if v is None:
        return "!"
    if v.verdict == "moved":
        return f"M→{CODES.get(v.moved_verdict or '', '?')}"
    return CODES[v.verdict]


def _short(path: str) -> str:
    return path.removeprefix("python/").removeprefix("sglang/")


def _hunk_no(label: str) -> str:
    return label.split(" ", 2)[1] if label.startswith("hunk #") else label


def note_text(v: Verdict) -> str:
    """Compact evidence for a Markdown footnote (the JSON keeps lines and full labels)."""
    bits: list[str] = []
    if v.moved_to:
        bits.append(
            "moved: " + "; ".join(f"{_short(o)} → {_short(n)}" for o, n in v.moved_to.items())
        )
    eff = v.effective
    found = [s for s in v.symbols if s.found and not s.at_pin]
    missing_syms = [s.symbol for s in v.symbols if not s.found and not s.at_pin]
    if eff == "upstream":
        if found and "symbol" in v.evidence:
            where = sorted({_short(w.rsplit(":", 1)[0]) for s in found for w in s.where[:1]})
            bits.append(
                f"all {len(found)} symbols it provides are defined upstream "
                f"({', '.join(s.symbol for s in found)}) in {', '.join(where)}"
            )
        else:
            bits.append(v.evidence)
    if eff == "partly-upstream":
        present = [r for r in v.hunks if r.get("present")]
        if present:
            loose = sum(1 for r in present if r.get("match") == "lines")
            how = f", {loose} of them line by line" if loose else ""
            bits.append(f"{len(present)}/{len(v.hunks)} hunks present{how}")
        if found:
            bits.append(
                f"symbols defined upstream: {', '.join(s.symbol for s in found)}"
                + (f"; not (yet): {', '.join(missing_syms)}" if missing_syms else "")
            )
    if eff in ("conflict", "partly-upstream"):
        per_file: dict[str, list[dict[str, str]]] = {}
        for c in v.conflicts:
            per_file.setdefault(c["file"], []).append(c)
        for f, cs in per_file.items():
            label = cs[0]["hunk"]
            first = label.split(" ", 2)[2] if label.startswith("hunk #") else label
            why = cs[0]["reason"].split(" (best match")[0]
            why = f": {why}" if why.startswith("expects") else ""
            nos = ", ".join(_hunk_no(c["hunk"]) for c in cs)
            bits.append(f"does not apply: {_short(f)} hunk {nos} (first: `{first}`{why})")
    if eff == "deleted":
        bits.append("gone, nothing similar found: " + ", ".join(map(_short, v.missing_files)))
    if eff == "three-way":
        bits.append("needs git apply --3way")
    if v.not_judged:
        by_creator: dict[str, list[str]] = {}
        for n in v.not_judged:
            by_creator.setdefault(n["from"], []).append(_short(n["file"]))
        for creator, paths in by_creator.items():
            bits.append(
                f"not judged: its hunks on {', '.join(paths)} (files {creator} creates; "
                "that patch is not applied here, so they say nothing about upstream)"
            )
    return "; ".join(bits)


def result_note(r: PatchResult) -> str:
    """Footnote for a cell: the verdict's evidence plus what it was judged on when some
    prerequisites did not apply (an "applies" cell must not read as "fully verified")."""
    v = r.verdict
    text = note_text(v)
    if r.failed_prerequisites and (v.effective in APPLIES or v.not_judged):
        on = ", ".join(r.stacked) if r.stacked else "nothing else"
        extra = (
            f"judged on the release plus the earlier patches that applied ({on}); "
            f"prerequisites not applied: {', '.join(r.failed_prerequisites)}"
        )
        text = f"{text}; {extra}" if text else extra
    return text


def to_markdown(m: Matrix, policy: str, exit_status: int, failures: list[str]) -> str:
    """Patch × release table with short codes and footnotes for conflicts and evidence."""
    notes: dict[str, int] = {}

    def note(text: str) -> str:
        if text not in notes:
            notes[text] = len(notes) + 1
        return f"[{notes[text]}]"

    out = [
        "# Rebase check",
        "",
        f"Series patches judged against every upstream release after the pin ({m.pin}).",
        "Each cell is the verdict of the patch on the release plus the earlier patches that",
        "applied there, in series order. When some prerequisites did not apply (`judged`:",
        "`partial-series` in the JSON, which also has every hunk), hunks on files only they",
        "create are not judged (`not_judged`): they say nothing about upstream.",
        "",
        "Codes: C clean · O offset · 3W three-way · X conflict · U upstream · P partly-upstream ·",
        "M→x moved (then re-judged as x) · D deleted · ! release not checked.",
        "",
        "| patch | " + " | ".join(m.releases) + " |",
        "|---|" + "---|" * len(m.releases),
    ]
    for p in m.patches:
        cells = []
        for r in m.releases:
            res = m.results.get(r, {}).get(p)
            v = res.verdict if res else None
            c = _cell(v)
            if (
                res is not None
                and v is not None
                and (
                    v.effective in ("conflict", "deleted", "partly-upstream")
                    or (v.effective == "upstream" and "symbol" in v.evidence)
                    or v.verdict == "moved"
                    or v.not_judged
                    or (res.failed_prerequisites and v.effective in APPLIES)
                )
            ):
                c += note(f"{p}: {result_note(res)}")
            cells.append(c)
        out.append(f"| {p} | " + " | ".join(cells) + " |")
    out.append("")
    if notes:
        out.append("Notes (the same note is shared by every cell where it holds):")
        out.append("")
        for text, n in notes.items():
            out.append(f"- [{n}] {text}")
        out.append("")
    if m.errors:
        out.append("Releases not checked:")
        out += [f"- {r}: {e}" for r, e in m.errors.items()]
        out.append("")
    if m.timings:
        out.append(
            "Time per release (s): "
            + ", ".join(f"{r} {t:.1f}" for r, t in m.timings.items())
            + f"; total {sum(m.timings.values()):.1f}"
        )
        out.append("")
    out.append(f"Policy `{policy}`: exit status {exit_status}.")
    out += [f"- {f}" for f in failures]
    out.append("")
    return "\n".join(out)
