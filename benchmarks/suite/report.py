"""The Markdown tables and the plots made of one run's times.

W1: the median ms per request of every path at every size, then per-round ratios of chosen pairs; plot:
latency against tensor size, one line per path, both axes log scale. W2: the median s per volume of every
path and its per-round ratio to the ``torch`` backend; plot: one bar per path with the fastest and slowest
run as whiskers.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from .timing import Times, median, ratio, spread

#: Each size's tensor is 1x1xN^3 float32.
BYTES_PER_VOXEL = 4


def w1_tables(rows: Sequence[tuple[int, Times]], pairs: Sequence[tuple[str, str]]) -> str:
    """The W1 median table and the per-round ratio table (pairs whose paths both ran)."""
    labels = list(rows[0][1])
    head = "| path | " + " | ".join(f"1x1x{size}^3" for size, _ in rows) + " |\n|---|" + "---:|" * len(rows)
    lines = [head]
    for label in labels:
        lines.append(f"| {label} | " + " | ".join(f"{median(times, label):.2f}" for _, times in rows) + " |")
    chosen = [(a, b) for a, b in pairs if a in labels and b in labels]
    if chosen:
        lines += [
            "",
            "| a | b | " + " | ".join(f"1x1x{s}^3" for s, _ in rows) + " |",
            "|---|---|" + "---:|" * len(rows),
        ]
        for a, b in chosen:
            lines.append(f"| {a} | {b} | " + " | ".join(f"{ratio(times, a, b):.2f}" for _, times in rows) + " |")
    return "\n".join(lines) + "\n"


def w2_table(times: Times, base: str) -> str:
    """The W2 table: median s per volume, and per-round ratio to ``base`` when it ran."""
    lines = [f"| path | median s | fastest s | x {base} (per round) |", "|---|---:|---:|---:|"]
    for label in times:
        fastest, _ = spread(times, label)
        against = f"{ratio(times, label, base):.2f}" if base in times else "-"
        lines.append(f"| {label} | {median(times, label) / 1000:.2f} | {fastest / 1000:.2f} | {against} |")
    return "\n".join(lines) + "\n"


def plot_w1(rows: Sequence[tuple[int, Times]], path: Path) -> Path:
    """Latency (ms, log) against tensor size (MB, log), one line per path; returns ``path`` (a PNG)."""
    plt = _pyplot()
    sizes_mb = [BYTES_PER_VOXEL * size**3 / 1e6 for size, _ in rows]
    figure, axes = plt.subplots(figsize=(10, 5), dpi=100)
    markers = "os^vD<>pXh*"
    colors = plt.get_cmap("tab20").colors
    for index, label in enumerate(rows[0][1]):
        values = [median(times, label) for _, times in rows]
        style = "-" if "backend" in label else "--"  # this package's backends solid, the references dashed
        color = colors[(2 * index) % len(colors) + (2 * index) // len(colors)]  # 20 distinct, dark ones first
        axes.plot(sizes_mb, values, style, color=color, marker=markers[index % len(markers)], linewidth=1.2,
                  markersize=4, label=label)  # fmt: skip
    axes.set_xscale("log")
    axes.set_yscale("log")
    axes.set_xticks(sizes_mb, [f"{size}^3\n{mb:.2g} MB" for (size, _), mb in zip(rows, sizes_mb, strict=True)])
    axes.minorticks_off()
    axes.set_xlabel("input tensor 1x1xN^3 float32")
    axes.set_ylabel("median ms per request (log)")
    axes.set_title("W1: one request of an identity model, per path")
    axes.grid(True, which="major", alpha=0.3)
    axes.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    return _save(figure, path)


def plot_w2(times: Times, path: Path) -> Path:
    """Seconds per volume per path (median bar, fastest/slowest whiskers); returns ``path`` (a PNG)."""
    plt = _pyplot()
    labels = list(times)
    medians = [median(times, label) / 1000 for label in labels]
    lows = [m - spread(times, label)[0] / 1000 for m, label in zip(medians, labels, strict=True)]
    highs = [spread(times, label)[1] / 1000 - m for m, label in zip(medians, labels, strict=True)]
    figure, axes = plt.subplots(figsize=(9, 0.5 * len(labels) + 1.5), dpi=100)
    axes.barh(labels, medians, xerr=[lows, highs], color="#4c72b0", capsize=3)
    axes.invert_yaxis()
    axes.set_xscale("log" if max(medians) > 20 * min(medians) else "linear")
    axes.set_xlabel("seconds per volume (median; whiskers: fastest and slowest run)")
    axes.set_title("W2: the sample app's sliding window on the full MNI T1", fontsize=11)
    axes.grid(True, axis="x", alpha=0.3)
    for y, (value, high) in enumerate(zip(medians, highs, strict=True)):  # past the whisker
        axes.annotate(f"{value:.2f} s", (value + high, y), xytext=(6, 0), textcoords="offset points", va="center",
                      fontsize=8)  # fmt: skip
    axes.margins(x=0.12)
    return _save(figure, path)


def _pyplot():  # type: ignore[no-untyped-def]
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    return plt


def _save(figure: object, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.tight_layout()  # type: ignore[attr-defined]
    figure.savefig(path, metadata={"Software": None})  # type: ignore[attr-defined]  # same bytes for same figures
    _pyplot().close(figure)
    return path
