"""report.html: one static page per build, with every image embedded (opens offline).

Sections: the funnel (samples after each stage) and drops by reason; the language mix (when
language_filter ran: samples per detected language, kept and dropped); the CLIP score
histogram with its threshold; duplicate groups (kept beside dropped); kept samples; samples
each filter dropped; shard sizes; worker seconds per stage. Plots are matplotlib PNGs,
thumbnails small JPEGs, both as data URIs. Images of dropped samples come from the source
files when the source is a folder (they are not in the shards); URL sources show captions.
Thumbnails of kept samples come from the first shards, reading at most `SCAN_BYTES`.
"""

from __future__ import annotations

import base64
import html
import io
import json
from collections import defaultdict
from typing import Any

import pyarrow.parquet as pq
from PIL import Image

from core.storage import filesystem, join, write_bytes_atomic
from core.tario import iter_tar_samples
from stages.base import IMAGE_COLUMNS

SCAN_BYTES = 64 << 20
THUMB = 128
REPORT_ROWS = 200_000  # the first signature group's first rows: what the plots are drawn from
DUPLICATE_REASONS = ("duplicate_exact", "duplicate_near", "duplicate_semantic")


def render_report(
    output: str, storage_options: dict, manifest: dict | None = None, source: str | None = None
) -> str:
    """Write `<output>/report.html`; returns its URL. `source` is the live source path (the
    manifest's copy is redacted, so a URL with a password in it no longer opens)."""
    fs, root = filesystem(output, storage_options)
    if manifest is None:
        manifest = json.loads(fs.cat_file(join(root, "manifest.json")))
    stats = json.loads(fs.cat_file(join(root, "stats.json")))
    with fs.open(join(root, "signatures", "part-000000.parquet"), "rb") as f:
        rows = pq.read_table(f).slice(0, REPORT_ROWS).to_pylist()  # a sample of big builds
    kept = kept_samples(fs, root, manifest)
    source_fs, _ = filesystem(source or manifest["config"]["source"]["path"], storage_options)
    sections = [
        summary(output, manifest, stats),
        funnel(stats),
        language_mix(rows),
        scores(rows, manifest),
        duplicates(source_fs, rows, kept),
        kept_grid(kept),
        dropped_grids(source_fs, rows),
        shard_sizes(manifest),
        stage_time(stats),
    ]
    page = PAGE.format(title=html.escape(output), body="\n".join(s for s in sections if s))
    url = join(root, "report.html")
    write_bytes_atomic(fs, url, page.encode())
    return url


# ---- data ----------------------------------------------------------------------------------


def kept_samples(fs: Any, root: str, manifest: dict) -> dict[str, dict]:
    """key -> {image, txt} for the samples of the first shards (at most SCAN_BYTES read)."""
    found: dict[str, dict] = {}
    budget = SCAN_BYTES
    for shard in manifest["shards"]:
        if budget <= 0:
            break
        budget -= shard["bytes"]
        with fs.open(join(root, shard["name"]), "rb") as f:
            for sample in iter_tar_samples(f):
                image = picture(sample)
                if image is not None:
                    text = (sample.get("txt") or b"").decode("utf-8", "replace")
                    found[sample["__key__"]] = {"image": image, "txt": text}
    return found


def picture(sample: dict) -> bytes | None:
    for col in (*IMAGE_COLUMNS, "000.jpg"):
        if sample.get(col):
            return sample[col]
    return None


def source_picture(fs: Any, row: dict) -> bytes | None:
    """A dropped sample's image from its source file, when that is a readable image file."""
    source = row.get("source") or ""
    if source.rpartition(".")[2].lower() not in {"jpg", "jpeg", "png", "webp", "gif", "bmp"}:
        return None
    try:
        return fs.cat_file(source)
    except Exception:  # noqa: BLE001  (any storage backend's error: the thumbnail is skipped)
        return None


# ---- pieces --------------------------------------------------------------------------------


def thumb(data: bytes | None, caption: str = "", note: str = "") -> str:
    img = '<div class="missing">not stored</div>'
    if data:
        try:
            with Image.open(io.BytesIO(data)) as image:
                image = image.convert("RGB")
                image.thumbnail((THUMB, THUMB))
                out = io.BytesIO()
                image.save(out, "JPEG", quality=80)
            img = f'<img src="data:image/jpeg;base64,{base64.b64encode(out.getvalue()).decode()}">'
        # Why broad: any image that cannot be thumbnailed (bombs, odd modes) is shown as such.
        except Exception:  # noqa: BLE001
            img = '<div class="missing">undecodable</div>'
    label = html.escape(caption[:80])
    tag = f"<b>{html.escape(note)}</b><br>" if note else ""
    return f"<figure>{img}<figcaption>{tag}{label}</figcaption></figure>"


def plot(draw: Any) -> str:
    """Run `draw(ax)` on a fresh figure; the PNG as an <img>."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.2), dpi=100)
    draw(ax)
    fig.tight_layout()
    out = io.BytesIO()
    fig.savefig(out, format="png")
    plt.close(fig)
    data = base64.b64encode(out.getvalue()).decode()
    return f'<img class="plot" src="data:image/png;base64,{data}">'


def summary(output: str, manifest: dict, stats: dict) -> str:
    facts = {
        "output": output,
        "samples in": stats["samples_in"],
        "samples out": stats["samples_out"],
        "shards": len(manifest["shards"]),
        "bytes": sum(s["bytes"] for s in manifest["shards"]),
        "build": manifest.get("build_id", "")[:12],
        "created": manifest.get("created", ""),
    }
    rows = "".join(f"<tr><th>{k}</th><td>{html.escape(str(v))}</td></tr>" for k, v in facts.items())
    return f"<h2>Summary</h2><table>{rows}</table>"


def funnel(stats: dict) -> str:
    stages = stats["stages"]
    chart = plot(
        lambda ax: (
            ax.barh([s["name"] for s in stages][::-1], [s["out"] for s in stages][::-1]),
            ax.set_xlabel("samples after the stage"),
        )
    )
    rows = "".join(
        f"<tr><td>{s['name']}</td><td>{s['in']}</td><td>{s['out']}</td>"
        f"<td>{html.escape(drops_text(s['dropped']))}</td></tr>"
        for s in stages
    )
    table = f"<table><tr><th>stage</th><th>in</th><th>out</th><th>dropped</th></tr>{rows}</table>"
    return f"<h2>Funnel</h2>{chart}{table}"


def drops_text(dropped: dict[str, int]) -> str:
    return ", ".join(f"{reason}={n}" for reason, n in dropped.items()) or "-"


def language_mix(rows: list[dict], top: int = 20) -> str:
    """Samples per detected language (language_filter's `language` column), most first."""
    seen: dict[str, list[int]] = defaultdict(lambda: [0, 0])  # code -> [kept, dropped]
    for row in rows:
        if row.get("language"):
            seen[row["language"]][0 if row.get("drop_reason") is None else 1] += 1
    if not seen:
        return ""
    order = sorted(seen, key=lambda code: (-sum(seen[code]), code))
    total = sum(sum(counts) for counts in seen.values())
    lines = [(code, *seen[code]) for code in order[:top]]
    rest = order[top:]
    if rest:
        lines.append((f"{len(rest)} others", *(sum(seen[c][i] for c in rest) for i in (0, 1))))
    cells = "".join(
        f"<tr><td>{html.escape(label)}</td><td>{kept + dropped}</td>"
        f"<td>{100 * (kept + dropped) / total:.1f}%</td><td>{kept}</td><td>{dropped}</td></tr>"
        for label, kept, dropped in lines
    )
    head = "<tr><th>language</th><th>samples</th><th>share</th><th>kept</th><th>dropped</th></tr>"
    return f"<h2>Language mix</h2><table>{head}{cells}</table>"


def scores(rows: list[dict], manifest: dict) -> str:
    values = [r["clip_score"] for r in rows if r.get("clip_score") is not None]
    if not values:
        return ""
    stage = next((s for s in manifest["config"]["stages"] if s["name"] == "clip_score"), {})
    threshold = stage.get("min_score")

    def draw(ax: Any) -> None:
        ax.hist(values, bins=40)
        if threshold is not None:
            ax.axvline(threshold, color="red", label=f"min_score {threshold}")
            ax.legend()
        ax.set_xlabel("CLIP score")

    return f"<h2>CLIP scores</h2>{plot(draw)}"


def duplicates(fs: Any, rows: list[dict], kept: dict[str, dict]) -> str:
    groups: dict[str, list[dict]] = defaultdict(list)
    for row in rows:
        if row.get("drop_reason") in DUPLICATE_REASONS and row.get("duplicate_of") in kept:
            groups[row["duplicate_of"]].append(row)
    if not groups:
        return ""
    blocks = []
    for keeper, members in sorted(groups.items())[:8]:
        cells = [thumb(kept[keeper]["image"], keeper, "kept")]
        cells += [
            thumb(source_picture(fs, r), r["key"], r["drop_reason"].removeprefix("duplicate_"))
            for r in members[:5]
        ]
        blocks.append(f'<div class="grid">{"".join(cells)}</div>')
    return "<h2>Duplicate groups (kept, then dropped)</h2>" + "".join(blocks)


def kept_grid(kept: dict[str, dict]) -> str:
    cells = [thumb(v["image"], v["txt"]) for _, v in sorted(kept.items())[:24]]
    return f'<h2>Kept samples</h2><div class="grid">{"".join(cells)}</div>' if cells else ""


def dropped_grids(fs: Any, rows: list[dict]) -> str:
    by_reason: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for row in rows:
        reason = row.get("drop_reason")
        if reason and reason not in DUPLICATE_REASONS:
            by_reason[(row.get("drop_stage") or "", reason)].append(row)
    parts = []
    for (stage, reason), members in sorted(by_reason.items()):
        cells = [thumb(source_picture(fs, r), r.get("url") or r["key"]) for r in members[:8]]
        title = f"{html.escape(stage)}: {html.escape(reason)} ({len(members)})"
        parts.append(f'<h3>{title}</h3><div class="grid">{"".join(cells)}</div>')
    return "<h2>Dropped samples</h2>" + "".join(parts) if parts else ""


def shard_sizes(manifest: dict) -> str:
    sizes = [s["bytes"] / 1e6 for s in manifest["shards"]]

    def draw(ax: Any) -> None:
        ax.hist(sizes, bins=min(30, max(5, len(sizes))))
        ax.set_xlabel("shard size (MB)")

    return f"<h2>Shard sizes</h2>{plot(draw)}"


def stage_time(stats: dict) -> str:
    timed = [s for s in stats["stages"] if s.get("seconds")]
    if not timed:
        return ""
    rates = [s["in"] / s["seconds"] for s in timed]

    def draw(ax: Any) -> None:
        ax.barh([s["name"] for s in timed][::-1], rates[::-1])
        ax.set_xlabel("samples per worker-second")

    return f"<h2>Throughput per stage</h2>{plot(draw)}"


PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>mmcurate report: {title}</title>
<style>
body {{ font-family: sans-serif; margin: 2em; max-width: 1100px; }}
table {{ border-collapse: collapse; margin: 0.5em 0; }}
td, th {{ border: 1px solid #ccc; padding: 2px 8px; text-align: left; }}
.grid {{ display: flex; flex-wrap: wrap; gap: 8px; margin-bottom: 1em; }}
figure {{ margin: 0; width: 132px; font-size: 11px; }}
figure img {{ max-width: 128px; max-height: 128px; }}
.missing {{ width: 128px; height: 96px; background: #eee; color: #777; }}
img.plot {{ max-width: 100%; }}
</style></head>
<body><h1>mmcurate build report</h1>
{body}
</body></html>
"""
