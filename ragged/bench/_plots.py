"""PNG plots of the suites' results (matplotlib, imported lazily: ``pip install .[bench]``)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

__all__ = ["available", "plot_all"]


def available() -> bool:
    """Whether matplotlib can be imported."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _bars(
    ax: Any,
    groups: list[str],
    series: dict[str, list[float]],
    *,
    ratio: bool = True,
    missing: dict[str, list[str]] | None = None,
) -> None:
    """Grouped bars labelled with their heights: ratios (``12x``, a line at 1) or amounts.

    A missing (non-finite) height gets a grey label at the foot of its slot instead of an
    unexplained gap: ``missing[series][group]``, or "n/a". Long or many group labels are slanted so that they never
    overlap; the top of the axes is left free for the legend (``_legend``).
    """
    suffix = "x" if ratio else ""
    width = 0.8 / max(len(series), 1)
    for i, (label, heights) in enumerate(series.items()):
        xs = [g + (i - (len(series) - 1) / 2) * width for g in range(len(groups))]
        bars = ax.bar(xs, [h if math.isfinite(h) else 0 for h in heights], width, label=label)
        why = (missing or {}).get(label) or ["n/a"] * len(groups)
        for bar, h, reason in zip(bars, heights, why, strict=True):
            x = bar.get_x() + bar.get_width() / 2
            if math.isfinite(h):
                text = f"{h:.0f}{suffix}" if h >= 10 else f"{h:.1f}{suffix}"
                ax.annotate(text, (x, h), ha="center", va="bottom", fontsize=7)
            else:
                ax.annotate(
                    reason,
                    (x, 0),
                    xycoords=("data", "axes fraction"),
                    xytext=(0, 3),
                    textcoords="offset points",
                    ha="center",
                    va="bottom",
                    rotation=90,
                    fontsize=7,
                    color="grey",
                )
    # Slant the labels when the longest would not fit its slot (~14 characters per inch).
    inches = ax.get_position().width * ax.get_figure().get_figwidth() / max(len(groups), 1)
    slant = max((len(g) for g in groups), default=0) > 14 * inches
    ax.set_xticks(
        range(len(groups)),
        groups,
        rotation=25 if slant else 0,
        ha="right" if slant else "center",
        rotation_mode="anchor",
    )
    if ratio:
        ax.axhline(1.0, color="grey", linewidth=0.8, linestyle="--")
    ax.margins(y=0.15)


def _legend(ax: Any) -> None:
    """The legend in a band above the tallest bar, in one row: it never covers a label."""
    bottom, top = ax.get_ylim()
    if ax.get_yscale() == "log":
        ax.set_ylim(bottom, top * (top / bottom) ** 0.25)
    else:
        ax.set_ylim(bottom, top + 0.25 * (top - bottom))
    handles, _ = ax.get_legend_handles_labels()
    ax.legend(loc="upper center", ncols=max(1, len(handles)), fontsize=8, frameon=False)


def plot_ops(result: dict[str, Any], out: Path) -> Path:
    """Speedup of every ragged op over padding and over the best plain-torch composition."""
    plt = _pyplot()
    speedup = result["plots"]["speedup"]
    ops = list(speedup)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, kind, title in (
        (axes[0], "padded", "padded time / ragged time"),
        (axes[1], "torch", "best plain-torch time / ragged time"),
    ):
        series = {
            mode: [speedup[op].get(f"{mode} {kind}", math.nan) for op in ops]
            for mode in ("fwd", "fwd+bwd")
        }
        _bars(ax, ops, series)
        ax.set_title(title)
        ax.set_ylabel("speedup (above 1: ragged is faster)")
        if kind == "padded":
            ax.set_yscale("log")
        _legend(ax)
    return _save(fig, result, out)


def plot_skew(result: dict[str, Any], out: Path) -> Path:
    """Time and peak memory of ragged vs padded against the max/mean length ratio."""
    plt = _pyplot()
    points = result["plots"]["skew"]
    xs = [p["max_over_mean"] for p in points]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, key, label in (
        (axes[0], "ms", f"{result['metric']} time per call (ms)"),
        (axes[1], "mb", "peak extra memory (MB)"),
    ):
        for variant in ("ragged", "padded"):
            ax.plot(xs, [p[f"{variant}_{key}"] for p in points], marker="o", label=variant)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("max / mean segment length")
        ax.set_ylabel(label)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    axes[0].set_title("logsumexp over the ragged axis, forward + backward")
    axes[1].set_title("memory")
    return _save(fig, result, out)


def plot_func(result: dict[str, Any], out: Path) -> Path:
    """ragged.vmap against a loop, and compiled against eager."""
    plt = _pyplot()
    vmap, compiled = result["plots"]["vmap"], result["plots"]["compile"]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    methods = list(vmap)
    _bars(axes[0], methods, {m: [vmap[x][m] for x in methods] for m in ("fwd", "fwd+bwd")})
    axes[0].set_title("per-segment attention: loop time / method time")
    axes[0].set_ylabel("speedup over the loop (above 1: faster)")
    axes[0].axhline(4.0, color="red", linewidth=0.8, linestyle=":", label="target 4x")
    _legend(axes[0])
    batches = list(compiled)
    short = [b.split(",")[0] for b in batches]
    _bars(axes[1], short, {m: [compiled[b][m] for b in batches] for m in ("fwd", "fwd+bwd")})
    axes[1].set_title("attention pooling: eager time / compiled time")
    axes[1].set_ylabel("speedup of compiled over eager")
    axes[1].axhline(2.0, color="red", linewidth=0.8, linestyle=":", label="target 2x")
    _legend(axes[1])
    return _save(fig, result, out)


def plot_pair(result: dict[str, Any], out: Path) -> Path:
    """The Pairformer block per length regime: time and peak memory, ragged against padded."""
    plt = _pyplot()
    rows = result["plots"]["pair"]
    regimes = [r["regime"] for r in rows]
    mib = 2.0**20
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    _bars(
        axes[0],
        regimes,
        {
            "ragged": [1e3 * r["time_ragged_s"] for r in rows],
            "padded": [1e3 * r["time_padded_s"] for r in rows],
        },
        ratio=False,
    )
    axes[0].set_title("forward + backward time (ms)")
    _bars(
        axes[1],
        regimes,
        {
            "ragged": [r["peak_ragged_bytes"] / mib for r in rows],
            "padded": [r["peak_padded_bytes"] / mib for r in rows],
            "packed bound": [r["packed_block_bound_bytes"] / mib for r in rows],
        },
        ratio=False,
    )
    axes[1].set_title("peak memory of one pass (MiB)")
    axes[0].set_ylabel("milliseconds")
    axes[1].set_ylabel("MiB")
    for ax in axes:
        _legend(ax)
    return _save(fig, result, out)


def plot_encoder(result: dict[str, Any], out: Path) -> Path:
    """Encoder speedup over padding per variant (forward + backward), against the FLOP ratio.

    Every panel shows the variants in one order (ragged first, then by the first panel's eager
    speedup); a variant timed forward only (torch's inference fast path) has no bar here, which
    a note under the panels says; a missing bar says why, from the suite's table ("fails",
    "not run": the per-sequence loop is not compiled).
    """
    plt = _pyplot()
    settings = result["plots"]["encoder"]
    fig, axes = plt.subplots(1, len(settings), figsize=(5.5 * len(settings), 4.4), squeeze=False)
    measured = [
        {k.rsplit(" ", 2)[0] for k in setting["speedup"]} - {"padded"} for setting in settings
    ]
    first = settings[0]["speedup"] if settings else {}
    both = [
        v
        for v in sorted(set().union(*measured))
        if any(f"{v} eager fwd+bwd" in s["speedup"] for s in settings)
    ]
    variants = sorted(both, key=lambda v: (v != "ragged", -first.get(f"{v} eager fwd+bwd", 0.0), v))
    forward_only = sorted(set().union(*measured) - set(variants))
    tables = result.get("tables") or [None] * len(settings)
    for ax, setting, table in zip(axes[0], settings, tables, strict=True):
        speedup = setting["speedup"]
        modes = [
            m for m in ("eager", "compiled") if any(f"{v} {m} fwd+bwd" in speedup for v in variants)
        ]
        cells = _encoder_cells(table)
        _bars(
            ax,
            variants,
            {m: [speedup.get(f"{v} {m} fwd+bwd", math.nan) for v in variants] for m in modes},
            missing={m: [cells.get((v, m), "not run") for v in variants] for m in modes},
        )
        ax.axhline(
            setting["flop_ratio"], color="red", linewidth=0.8, linestyle=":", label="FLOP ratio"
        )
        ax.set_title(f"{setting['setting']}: padded time / variant time (fwd+bwd)", fontsize=9)
        ax.set_ylabel("speedup over padding (above 1: faster)")
        ax.tick_params(axis="x", labelsize=8)
        _legend(ax)
    if forward_only:
        fig.text(
            0.5,
            0.01,
            f"Not shown: {', '.join(forward_only)} (timed forward only). Missing bars: the "
            "variant failed in that mode or is not run in it (see the tables).",
            ha="center",
            fontsize=8,
            color="dimgrey",
        )
    return _save(fig, result, out, bottom=0.06 if forward_only else 0.0)


def plot_context_parallel(result: dict[str, Any], out: Path) -> Path:
    """Context parallelism, causal: work balance and key/value bytes per plan, and wall time."""
    plt = _pyplot()
    points = [p for p in result["plots"]["plans"] if p["causal"]]
    wall = result["plots"]["wall"]
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.2), gridspec_kw={"width_ratios": [1, 1.6, 0.7]})
    mixes = list(dict.fromkeys(p["mix"] for p in points))
    for i, mix in enumerate(mixes):
        rows = [p for p in points if p["mix"] == mix]
        ranks = [p["ranks"] for p in rows]
        color = f"C{i}"
        axes[0].plot(
            ranks,
            [p["static_max_over_mean"] for p in rows],
            "--o",
            color=color,
            label=f"{mix}: static",
        )
        axes[0].plot(
            ranks,
            [p["balanced_max_over_mean"] for p in rows],
            "-s",
            color=color,
            label=f"{mix}: balanced",
        )
    axes[0].set_xscale("log", base=2)
    axes[0].set_yscale("log")
    axes[0].yaxis.set_major_formatter("{x:g}")
    axes[0].yaxis.set_minor_formatter("{x:g}")
    axes[0].axhline(1.10, color="red", linewidth=0.8, linestyle=":", label="target 1.10")
    axes[0].set_xlabel("ranks")
    axes[0].set_ylabel("attention work, max / mean rank")
    axes[0].set_title("work balance (causal)")
    axes[0].legend(fontsize=6)
    gib = 2.0**30
    groups = [f"{p['mix'].split()[0]}\n{p['ranks']}" for p in points]
    _bars(
        axes[1],
        groups,
        {
            "static ring": [p["static_ring_bytes"] / gib for p in points],
            "static, needed rows": [p["static_needed_bytes"] / gib for p in points],
            "balanced": [p["balanced_bytes"] / gib for p in points],
        },
        ratio=False,
    )
    axes[1].set_yscale("log")
    axes[1].set_title("key/value GiB moved, forward (causal)")
    axes[1].tick_params(axis="x", labelsize=7)
    axes[1].legend(fontsize=7)
    _bars(
        axes[2],
        [f"{w['processes']} proc" for w in wall],
        {
            name: [1e3 * w[f"{name}_s"] for w in wall]
            for name in ("static", "balanced", "balanced, fitted cost")
            if all(f"{name}_s" in w for w in wall)
        },
        ratio=False,
    )
    axes[2].set_title("fwd+bwd wall time (ms), gloo")
    axes[2].legend(fontsize=7)
    return _save(fig, result, out)


def _encoder_cells(table: dict[str, Any] | None) -> dict[tuple[str, str], str]:
    """``(variant, mode) -> the fwd+bwd cell`` of one encoder table ("fails", "n/a", a time)."""
    if not table or table.get("columns", [None])[0] != "variant":
        return {}
    column = table["columns"].index("fwd+bwd ms")
    return {(row[0], row[1]): row[column] or "n/a" for row in table["rows"]}


def _save(fig: Any, result: dict[str, Any], out: Path, bottom: float = 0.0) -> Path:
    """Caption the figure with the command and machine, write it, free it (``bottom``: room
    kept under the axes for a note, as a fraction of the height)."""
    fig.suptitle(_caption(result))
    fig.tight_layout(rect=(0.0, bottom, 1.0, 1.0))
    fig.savefig(out, dpi=110)
    _pyplot().close(fig)
    return out


def _caption(result: dict[str, Any]) -> str:
    m = result["machine"]
    where = f"{m['device']}, " if m.get("device") else ""
    threads = f"{m['torch_threads']} thread{'s' * (m['torch_threads'] != 1)}"
    return f"{result['command']}  ({where}{m['cpu']}, torch {m['torch']}, {threads})"


PLOTS = {
    "ops": [("ops_speedup.png", plot_ops)],
    "skew": [("skew.png", plot_skew)],
    "func": [("func.png", plot_func)],
    "pair": [("pair.png", plot_pair)],
    "encoder": [("encoder.png", plot_encoder)],
    "context_parallel": [("context_parallel.png", plot_context_parallel)],
}


def plot_all(results: dict[str, dict[str, Any]], img_dir: Path) -> list[Path]:
    """Draw every plot whose suite has a result; returns the files written."""
    img_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for suite, plots in PLOTS.items():
        if suite in results:
            for name, draw in plots:
                written.append(draw(results[suite], img_dir / name))
    return written
