"""Plot one kernel round (kernels.json): speed-up over its peers and share of the roofline by M.

Speed-up panels, one line per shape: the peer's time / the fastest new path's time (above 1:
the new path is faster), against FP4 Marlin (the dispatch takes Marlin below 1), bf16 cuBLAS
and, where the round timed it, FP8 through cuBLASLt (the GEMM alone). Last panel, M <= 64: the
HBM roofline / time for the gemv (solid; the faster of its two ends), its register-ring loader
where the round timed it (dashed) and Marlin (dotted).

Usage: python bench/kernels/plot_round.py reports/h200/kernels/round-N/kernels.json OUT.png
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

# the peers a round times beside the new paths: row field, name
PEERS = (("marlin_us", "FP4 Marlin"), ("bf16_us", "bf16 cuBLAS"),
         ("fp8_us", "FP8 cuBLASLt (GEMM alone)"))  # fmt: skip


def series(rows: list[dict[str, Any]], value: Any) -> dict[str, list[tuple[int, float]]]:
    """shape -> [(M, value(row))] where value gives a number, M ascending."""
    out: dict[str, list[tuple[int, float]]] = defaultdict(list)
    for row in rows:
        v = value(row)
        if v:
            out[row["shape"]].append((int(row["m"]), float(v)))
    return {shape: sorted(points) for shape, points in out.items()}


def _ratio(num: Any, den: Any) -> float | None:
    return float(num) / float(den) if num and den else None


def plot_round(data: dict[str, Any], out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = data["rows"]
    peers = [(key, name) for key, name in PEERS if any(r.get(key) for r in rows)]
    fig, grid = plt.subplots(2, 2, figsize=(15, 11))
    axes = list(grid.flat)
    colors: dict[str, Any] = {}
    for ax, (key, name) in zip(axes, peers, strict=False):
        for shape, pts in series(
            rows, lambda r, key=key: _ratio(r.get(key), r.get("new_us"))
        ).items():
            (line,) = ax.plot(*zip(*pts, strict=True), marker="o", label=shape,
                              color=colors.get(shape))  # fmt: skip
            colors[shape] = line.get_color()
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set(xscale="log", xlabel="M (rows)", ylabel=f"{name} time / new path time",
               title=f"new paths against {name}")  # fmt: skip
    axes[0].legend(fontsize=8)
    for ax in axes[len(peers) : len(axes) - 1]:
        ax.set_visible(False)
    right = axes[-1]
    small = [r for r in rows if r["m"] <= 64]
    styles = (("paths_us", "-"), ("gemv_ring_us", "--"), ("marlin_us", ":"))
    for key, style in styles:

        def value(r: dict[str, Any], key: str = key) -> float | None:
            gemv = [v for k, v in r.get("paths_us", {}).items() if k.startswith("gemv") and v]
            t = (min(gemv) if gemv else None) if key == "paths_us" else r.get(key)
            return _ratio(r["roofline_us"], t)

        for shape, pts in series(small, value).items():
            right.plot(*zip(*pts, strict=True), style, color=colors.get(shape), marker=".")
    right.set(xscale="log", xlabel="M (rows)", ylabel="HBM roofline / time",
              title="share of the roofline, M <= 64: gemv, its faster end (solid), its "
                    "register ring (dashed), Marlin (dotted)")  # fmt: skip
    right.title.set_fontsize(9)
    fig.suptitle(f"{data.get('device')}: {data.get('command')}", fontsize=9)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print(__doc__.split("Usage: ")[1].strip(), file=sys.stderr)
        return 2
    print(plot_round(json.loads(Path(args[0]).read_text()), Path(args[1])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
