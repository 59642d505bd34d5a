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
    ax: Any, groups: list[str], series: dict[str, list[float]], *, ratio: bool = True
) -> None:
    """Grouped bars labelled with their heights: ratios (``12x``, a line at 1) or amounts."""
    suffix = "x" if ratio else ""
    width = 0.8 / max(len(series), 1)
    for i, (label, heights) in enumerate(series.items()):
        xs = [g + (i - (len(series) - 1) / 2) * width for g in range(len(groups))]
        bars = ax.bar(xs, [h if math.isfinite(h) else 0 for h in heights], width, label=label)
        for bar, h in zip(bars, heights, strict=True):
            if math.isfinite(h):
                text = f"{h:.0f}{suffix}" if h >= 10 else f"{h:.1f}{suffix}"
                ax.annotate(
                    text,
                    (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                    ha="center",
                    va="bottom",
                    fontsize=7,
                )
    ax.set_xticks(range(len(groups)), groups)
    if ratio:
        ax.axhline(1.0, color="grey", linewidth=0.8, linestyle="--")
    ax.margins(y=0.15)


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
        ax.legend()
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
    axes[0].axhline(4.0, color="red", linewidth=0.8, linestyle=":", label="target 4x")
    axes[0].legend()
    batches = list(compiled)
    short = [b.split(",")[0] for b in batches]
    _bars(axes[1], short, {m: [compiled[b][m] for b in batches] for m in ("fwd", "fwd+bwd")})
    axes[1].set_title("attention pooling: eager time / compiled time")
    axes[1].axhline(2.0, color="red", linewidth=0.8, linestyle=":", label="target 2x")
    axes[1].legend()
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
    for ax in axes:
        ax.legend()
    return _save(fig, result, out)


def plot_encoder(result: dict[str, Any], out: Path) -> Path:
    """Encoder speedup over padding per variant (forward + backward), against the FLOP ratio."""
    plt = _pyplot()
    settings = result["plots"]["encoder"]
    fig, axes = plt.subplots(1, len(settings), figsize=(5.5 * len(settings), 4), squeeze=False)
    for ax, setting in zip(axes[0], settings, strict=True):
        speedup = setting["speedup"]
        variants = sorted(
            {k.rsplit(" ", 2)[0] for k in speedup} - {"padded"},
            key=lambda v: -speedup.get(f"{v} eager fwd+bwd", 0.0),
        )
        _bars(
            ax,
            variants,
            {
                mode: [speedup.get(f"{v} {mode} fwd+bwd", math.nan) for v in variants]
                for mode in ("eager", "compiled")
                if any(f"{v} {mode} fwd+bwd" in speedup for v in variants)
            },
        )
        ax.axhline(
            setting["flop_ratio"], color="red", linewidth=0.8, linestyle=":", label="FLOP ratio"
        )
        ax.set_title(f"{setting['setting']}: padded time / variant time (fwd+bwd)", fontsize=9)
        ax.tick_params(axis="x", labelsize=7)
        ax.legend()
    return _save(fig, result, out)


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


def _save(fig: Any, result: dict[str, Any], out: Path) -> Path:
    """Caption the figure with the command and machine, write it, free it."""
    fig.suptitle(_caption(result))
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    _pyplot().close(fig)
    return out


def _caption(result: dict[str, Any]) -> str:
    m = result["machine"]
    return f"{result['command']}  ({m['cpu']}, torch {m['torch']}, {m['torch_threads']} thread)"


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
