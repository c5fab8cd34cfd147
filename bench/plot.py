"""Plot bench.json: speed-ups versus M, one line per shape: FP4 Marlin against each baseline,
and the series' dispatch (Marlin, or dequant + cuBLAS at prefill sizes) against bf16, Marlin,
FP8 and the roofline.

Usage: python bench/plot.py reports/h200/bench.json reports/h200/bench.png
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

PANELS = (  # (numerator, denominator, title)
    ("bf16_us", "fp4_us", "bf16 cuBLAS time / FP4 Marlin time"),
    ("bf16_us", "dispatch_us", "bf16 cuBLAS time / the series' dispatch time"),
    ("int4_us", "fp4_us", "INT4 GPTQ Marlin time / FP4 Marlin time"),
    ("fp4_us", "dispatch_us", "FP4 Marlin time / the series' dispatch time"),
    ("upstream_fp4_us", "fp4_us", "upstream 0.5.23 FP4 time / patched FP4 time"),
    ("roofline_us", "fp4_us", "HBM roofline / FP4 Marlin time (fraction reached)"),
    ("fp8_us", "dispatch_us", "FP8 cuBLASLt time / the series' dispatch time"),
    ("epilogue_us", "dispatch_us", "a layer with column scale + bias / the plain layer (served)"),
)


def speedups(
    rows: list[dict[str, Any]], baseline: str, over: str = "fp4_us"
) -> dict[str, list[tuple[int, float]]]:
    """shape -> [(M, baseline_us / over_us)] for rows where both numbers exist, M ascending."""
    series: dict[str, list[tuple[int, float]]] = defaultdict(list)
    for row in rows:
        base, new = row.get(baseline), row.get(over)
        if base and new:
            series[row["shape"]].append((int(row["m"]), float(base) / float(new)))
    return {shape: sorted(points) for shape, points in series.items()}


def plot_bench(data: dict[str, Any], out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(4, 2, figsize=(14, 18), sharex=True)
    for ax, (baseline, over, title) in zip(axes.flat, PANELS, strict=True):
        for shape, points in speedups(data["rows"], baseline, over).items():
            ms, ys = zip(*points, strict=True)
            style = "--" if shape.startswith("moe") else "-"
            ax.plot(ms, ys, style, marker="o", markersize=3, label=shape)
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_xscale("log", base=2)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("M (tokens)")
        ax.grid(True, which="both", alpha=0.3)
    labels: dict[str, Any] = {}
    for ax in axes.flat:
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            labels.setdefault(label, handle)
    fig.legend(labels.values(), labels.keys(), loc="lower center", ncol=5, fontsize=8)
    fig.suptitle(
        f"NVFP4 Marlin (W4A16) on {data.get('device', '?')}, bf16 activations: "
        "ratio > 1 = the denominator is faster"
    )
    fig.tight_layout(rect=(0, 0.06, 1, 0.97))
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    data = json.loads(Path(argv[0]).read_text())
    print(plot_bench(data, Path(argv[1])))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
