"""report.html: one static page per build, with every image embedded (opens offline).

Sections: the funnel (samples after each stage) and drops by reason; the language mix (when
language_filter ran: samples per detected language, kept and dropped); the CLIP score
histogram with its threshold; duplicate groups (kept beside dropped); kept samples; samples
each filter dropped; per host of a URL list, its opt-outs and failures (report/hosts.py);
shard sizes; worker seconds per stage. Charts are inline SVG
(pipeline/report/charts.py), thumbnails small JPEGs as data URIs. Images of dropped samples
come from the source files when the source is a folder (they are not in the shards); URL
sources show captions.
Thumbnails of kept samples come from the first shards, read only until the grid's samples and
the shown duplicate groups' kept ones are found (at most `SCAN_BYTES`). Of each member only
pictures and captions up to MEMBER_BYTES are read (a 1 GB mp4 or picture is skipped by a seek,
never held), and a kept sample is held as its thumbnail, not its picture.
"""

from __future__ import annotations

import base64
import html
import io
import json
import tarfile
from collections import defaultdict
from collections.abc import Iterator
from typing import IO, Any

import pyarrow.parquet as pq
from mmcurate.core.atomic import write_bytes_atomic
from mmcurate.core.formats import IMAGE_COLUMNS
from mmcurate.core.storage import filesystem, join
from mmcurate.core.tario import (
    EXT_ALIASES,
    group_samples,
    read_exact,
    regular_member,
    split_member_name,
)
from mmcurate.pipeline.report.buckets import bucket_section
from mmcurate.pipeline.report.charts import bar_chart, histogram
from mmcurate.pipeline.report.hosts import host_section
from PIL import Image

SCAN_BYTES = 64 << 20
THUMB = 128
# The report decodes in the driver: pictures beyond these (after a JPEG's reduced-scale
# decode) are shown as undecodable rather than held whole in memory (a 13,000 x 13,000 PNG
# of 194 KB that decode_image had dropped took the driver to 931 MB).
THUMB_MAX_PIXELS = 25_000_000
THUMB_SOURCE_BYTES = 32 << 20
MEMBER_BYTES = THUMB_SOURCE_BYTES  # a shard member larger is not read (not shown either)
KEPT_GRID = 24  # kept samples shown
DUPLICATE_GROUPS = 8  # duplicate groups shown
REPORT_ROWS = 200_000  # the first signature group's first rows: what the charts are drawn from
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
        # a sample of big builds; ParquetFile, as read_table imports pyarrow.dataset (~35 ms)
        rows = pq.ParquetFile(f).read().slice(0, REPORT_ROWS).to_pylist()
    keepers = duplicate_groups(rows)
    kept = kept_samples(fs, root, manifest, set(keepers))
    source_fs, _ = filesystem(source or manifest["config"]["source"]["path"], storage_options)
    sections = [
        summary(output, manifest, stats),
        funnel(stats),
        language_mix(rows),
        scores(rows, manifest),
        bucket_section(fs, root),
        duplicates(source_fs, keepers, kept),
        kept_grid(kept),
        dropped_grids(source_fs, rows),
        host_section(rows),
        shard_sizes(manifest),
        stage_time(stats),
    ]
    page = PAGE.format(title=html.escape(output), body="\n".join(s for s in sections if s))
    url = join(root, "report.html")
    write_bytes_atomic(fs, url, page.encode())
    return url


# ---- data ----------------------------------------------------------------------------------


def kept_samples(fs: Any, root: str, manifest: dict, wanted: set[str]) -> dict[str, dict]:
    """key -> {image, txt, first}: the first `KEPT_GRID` samples of the shards (`first` True)
    and the `wanted` keys, reading shards in order only until enough are found (a build with
    no duplicates reads a few samples, not `SCAN_BYTES`)."""
    found: dict[str, dict] = {}
    budget, first = SCAN_BYTES, 0
    for shard in manifest["shards"]:
        if budget <= 0 or enough(found, wanted, first):
            break
        budget -= shard["bytes"]
        with fs.open(join(root, shard["name"]), "rb") as f:
            for sample in group_samples(shown_members(f)):
                key, image = sample["__key__"], picture(sample)
                if image is not None and (first < KEPT_GRID or key in wanted):
                    text = (sample.get("txt") or b"").decode("utf-8", "replace")
                    found[key] = {"image": picture_tag(image), "txt": text}  # a thumbnail
                    found[key]["first"] = first < KEPT_GRID
                    first += 1 if first < KEPT_GRID else 0
                if enough(found, wanted, first):
                    break
    return found


def shown_members(f: IO[bytes]) -> Iterator[tuple[str, Any]]:
    """(name, read) of a shard's members as core.tario.tar_files gives them, where only
    PICTURE_COLUMNS members up to MEMBER_BYTES are read; any other reads as b"" and is passed
    by a seek. Ends at the first header that is not a plain file's (our shards hold no other)."""
    while member := regular_member(f.read(tarfile.BLOCKSIZE)):
        name, size = member
        ext = split_member_name(name)[1]
        padding = -size % tarfile.BLOCKSIZE
        if EXT_ALIASES.get(ext, ext) in PICTURE_COLUMNS and size <= MEMBER_BYTES:
            data = read_exact(f, size)
            f.seek(padding, io.SEEK_CUR)
        else:
            data = b""
            f.seek(size + padding, io.SEEK_CUR)
        yield name, lambda data=data: data


def enough(found: dict[str, dict], wanted: set[str], first: int) -> bool:
    """The grid is full and as many duplicate groups' kept samples are found as are shown."""
    return first >= KEPT_GRID and len(wanted & found.keys()) >= min(len(wanted), DUPLICATE_GROUPS)


def duplicate_groups(rows: list[dict]) -> dict[str, list[dict]]:
    """Kept key -> the rows dropped as its duplicates."""
    groups: dict[str, list[dict]] = defaultdict(list)
    for row in rows:
        if row.get("drop_reason") in DUPLICATE_REASONS and row.get("duplicate_of"):
            groups[row["duplicate_of"]].append(row)
    return groups


PICTURE_COLUMNS = frozenset((*IMAGE_COLUMNS, "000.jpg", "txt"))  # what the grid reads (no video)


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
        if fs.size(source) > THUMB_SOURCE_BYTES:
            return None  # a picture that large was most likely dropped for its size
        return fs.cat_file(source)
    except Exception:  # noqa: BLE001  (any storage backend's error: the thumbnail is skipped)
        return None


# ---- pieces --------------------------------------------------------------------------------


def thumb(data: bytes | None, caption: str = "", note: str = "") -> str:
    return figure(picture_tag(data), caption, note)


def picture_tag(data: bytes | None) -> str:
    """The picture as a small embedded JPEG (or why there is none)."""
    img = '<div class="missing">not stored</div>'
    if data:
        try:
            with Image.open(io.BytesIO(data)) as image:
                image.draft("RGB", (THUMB, THUMB))  # JPEGs decode at a reduced scale
                if image.width * image.height > THUMB_MAX_PIXELS:
                    raise ValueError("too large to thumbnail")  # decode_image dropped it
                image = image.convert("RGB")
                image.thumbnail((THUMB, THUMB))
                out = io.BytesIO()
                image.save(out, "JPEG", quality=80)
            img = f'<img src="data:image/jpeg;base64,{base64.b64encode(out.getvalue()).decode()}">'
        # Why broad: any image that cannot be thumbnailed (bombs, odd modes) is shown as such.
        except Exception:  # noqa: BLE001
            img = '<div class="missing">undecodable</div>'
    return img


def figure(img: str, caption: str = "", note: str = "") -> str:
    label = html.escape(caption[:80])
    tag = f"<b>{html.escape(note)}</b><br>" if note else ""
    return f"<figure>{img}<figcaption>{tag}{label}</figcaption></figure>"


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
    chart = bar_chart([s["name"] for s in stages], [s["out"] for s in stages], "samples after it")
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
    marker = None if threshold is None else (float(threshold), f"min_score {threshold}")
    return f"<h2>CLIP scores</h2>{histogram(values, 40, 'CLIP score', marker)}"


def duplicates(fs: Any, groups: dict[str, list[dict]], kept: dict[str, dict]) -> str:
    shown = sorted((k, members) for k, members in groups.items() if k in kept)
    if not shown:
        return ""
    blocks = []
    for keeper, members in shown[:DUPLICATE_GROUPS]:
        cells = [figure(kept[keeper]["image"], keeper, "kept")]
        cells += [
            thumb(source_picture(fs, r), r["key"], r["drop_reason"].removeprefix("duplicate_"))
            for r in members[:5]
        ]
        blocks.append(f'<div class="grid">{"".join(cells)}</div>')
    return "<h2>Duplicate groups (kept, then dropped)</h2>" + "".join(blocks)


def kept_grid(kept: dict[str, dict]) -> str:
    cells = [figure(v["image"], v["txt"]) for v in kept.values() if v["first"]]
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
    chart = histogram(sizes, min(30, max(5, len(sizes))), "shard size (MB)")
    return f"<h2>Shard sizes</h2>{chart}"


def stage_time(stats: dict) -> str:
    timed = [s for s in stats["stages"] if s.get("seconds")]
    if not timed:
        return ""
    rates = [s["in"] / s["seconds"] for s in timed]
    chart = bar_chart([s["name"] for s in timed], rates, "samples per worker-second")
    return f"<h2>Throughput per stage</h2>{chart}"


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
svg.plot {{ max-width: 100%; height: auto; display: block; margin: 0.5em 0; }}
</style></head>
<body><h1>mmcurate build report</h1>
{body}
</body></html>
"""
