#!/usr/bin/python3
"""Draws the headline comparisons of docs/bench.md from docs/bench-data/*.jsonl
into docs/bench-img/*.png. One command, from the repository root:

    /usr/bin/python3 scripts/plots.py

Needs Debian's python3-matplotlib (apt-get install python3-matplotlib). Each
chart is the median of the runs its file holds; the files say what was run,
on which machine, with which command (docs/bench.md has the same figures).
"""

import json
import os
import statistics
import sys
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
DATA = os.path.join(ROOT, "docs", "bench-data")
OUT = os.path.join(ROOT, "docs", "bench-img")


def lines(name):
    with open(os.path.join(DATA, name)) as f:
        return [json.loads(line) for line in f if line.strip()]


def bars(ax, labels, values, colors=None, fmt="{:.1f}"):
    b = ax.bar(range(len(values)), values, color=colors)
    ax.set_xticks(range(len(values)), labels, rotation=20, ha="right")
    for rect, v in zip(b, values):
        ax.annotate(fmt.format(v), (rect.get_x() + rect.get_width() / 2, rect.get_height()),
                    ha="center", va="bottom", fontsize=8)


def loads():
    """An 8 GiB model into one H200: cold and warm, kylix vs the others."""
    d = defaultdict(list)
    for r in lines("gpu-h200-bench.jsonl"):
        d[(r["what"], r["state"])].append(r["r"]["gb_per_s"])
    med = {k: statistics.median(v) for k, v in d.items()}
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    cold = [("raw O_DIRECT", "raw-odirect"), ("safetensors", "safetensors"), ("kylix load", "kylix")]
    bars(a, [n for n, _ in cold], [med[(k, "cold")] for _, k in cold], ["#999", "#c66", "#36c"], "{:.2f}")
    a.set_title("cold (page cache dropped)")
    a.set_ylabel("GB/s")
    warm = [("safetensors", "safetensors"), ("kylix load", "kylix"), ("kylix, later passes", "kylix-pass2+"),
            ("kylix --io mapped,\nlater passes", "kylix-mapped-pass2+"), ("pinned H2D", "pinned-h2d")]
    bars(b, [n for n, _ in warm], [med[(k, "warm")] for _, k in warm], ["#c66", "#36c", "#36c", "#36c", "#999"])
    b.set_title("warm (in the page cache)")
    fig.suptitle("8 GiB safetensors model into one H200 (medians; docs/bench-data/gpu-h200-bench.jsonl)", fontsize=10)
    fig.tight_layout()
    return fig


def cachepolicy():
    """Repeated kylix load: O_DIRECT for cold bytes vs the page-cache policy."""
    d = defaultdict(list)
    limit = None
    for r in lines("h200-cachepolicy.jsonl"):
        if r["what"] == "pinned-h2d":
            limit = r["gb_per_s"]
            continue
        d[(r["io"], r["pass"])].append(r["gb_per_s"])
    passes = ["cold", "repeat1", "repeat2"]
    fig, ax = plt.subplots(figsize=(7, 4))
    w = 0.38
    for i, (io, label, color) in enumerate([("direct", "--io direct (before)", "#999"), ("auto", "auto: the page-cache policy", "#36c")]):
        v = [statistics.median(d[(io, p)]) for p in passes]
        b = ax.bar([x + (i - 0.5) * w for x in range(3)], v, w, label=label, color=color)
        for rect, y in zip(b, v):
            ax.annotate(f"{y:.1f}", (rect.get_x() + rect.get_width() / 2, y), ha="center", va="bottom", fontsize=8)
    if limit:
        ax.axhline(limit, ls="--", color="#c66", lw=1)
        ax.annotate(f"pinned H2D {limit:.1f}", (2.4, limit), ha="right", va="bottom", fontsize=8, color="#c66")
    ax.set_xticks(range(3), ["first (cold)", "second", "third"])
    ax.set_ylabel("GB/s")
    ax.legend(fontsize=8, loc="center left")
    ax.set_title("kylix load of an 8 GiB model three times after a cache drop, H200\n(medians of 3 rounds; docs/bench-data/h200-cachepolicy.jsonl)", fontsize=10)
    fig.tight_layout()
    return fig


def datasets():
    """Samples/s of 20 000 small samples: kylix.data vs DataLoaders over ext4."""
    rows = [r for r in lines("h200-datasets.jsonl") if "way" in r]
    ways = ["ext4 files", "ext4 tarfile", "kylix files", "kylix shards"]
    colors = ["#999", "#bbb", "#8ad", "#36c"]
    fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
    for ax, workers in zip(axes, (0, 4)):
        w = 0.38
        for i, temp in enumerate(("warm", "cold")):
            v = [next(r["samples_per_s"] for r in rows if r["way"] == way and r["temp"] == temp and r["workers"] == workers) for way in ways]
            b = ax.bar([x + (i - 0.5) * w for x in range(len(ways))], v, w, label=temp,
                       color=colors, alpha=1.0 if temp == "warm" else 0.55, edgecolor="black", linewidth=0.3)
            for rect, y in zip(b, v):
                ax.annotate(f"{y / 1000:.1f}k", (rect.get_x() + rect.get_width() / 2, y), ha="center", va="bottom", fontsize=7)
        ax.set_xticks(range(len(ways)), ways, rotation=15)
        ax.set_title(f"DataLoader, {workers} workers (left bar warm, right cold)", fontsize=9)
    axes[0].set_ylabel("samples/s")
    fig.suptitle("20 000 samples of 4-64 KiB, GPU machine host, 16 cores (medians of 3; docs/bench-data/h200-datasets.jsonl)", fontsize=10)
    fig.tight_layout()
    return fig


def keep():
    """kylix load on a member lacking the model: first start (keeping a copy
    or not) against the network's ceiling, next start against the disk."""
    d = defaultdict(list)
    for r in lines("cpu-netns-keep.jsonl"):
        if "what" in r:
            d[r["what"]].append(r["mb_per_s"])
    med = {k: statistics.median(v) for k, v in d.items()}
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    first = [("kylix load,\nkeeping a copy", "first start, keep"), ("kylix load\n--no-keep", "first start, --no-keep"),
             ("ceiling:\nTLS + BLAKE3", "ceiling (TLS + BLAKE3)")]
    bars(a, [n for n, _ in first], [med[k] for _, k in first], ["#36c", "#36c", "#999"], "{:.0f}")
    a.set_title("first start: fetched from 3 members")
    a.set_ylabel("MB/s")
    nxt = [("kylix load,\nits copy (cold)", "next start (its copy, cold)"), ("O_DIRECT of\nthe copy", "disk (O_DIRECT of the copy)")]
    bars(b, [n for n, _ in nxt], [med[k] for _, k in nxt], ["#36c", "#999"], "{:.0f}")
    b.set_title("next start: after a restart, page cache dropped")
    fig.suptitle("1 GiB model, CPU machine, network namespaces (medians; docs/bench-data/cpu-netns-keep.jsonl)", fontsize=10)
    fig.tight_layout()
    return fig


def main():
    os.makedirs(OUT, exist_ok=True)
    for name, fn in [("loads", loads), ("cachepolicy", cachepolicy), ("datasets", datasets), ("keep", keep)]:
        fig = fn()
        p = os.path.join(OUT, name + ".png")
        fig.savefig(p, dpi=110)
        plt.close(fig)
        print(os.path.relpath(p, ROOT))


if __name__ == "__main__":
    sys.exit(main())
