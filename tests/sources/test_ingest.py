"""URL lists -> download -> decode -> shards, over a loopback corpus of bad inputs."""

import json
import socket

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import webdataset as wds
from mmcurate.pipeline.build import run_build
from mmcurate.pipeline.config import BuildConfig

from tests.http_corpus import Corpus, animated_gif, bomb_png, photo_bytes, png16

GOOD = "a photo of an astronaut in a suit"


@pytest.fixture
def corpus():
    server = Corpus().start()
    yield server
    server.stop()


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]  # closed again when the block ends: connection refused


def cases(c: Corpus) -> list[tuple[str, str | None, bytes | None, str | None]]:
    """(name, url, caption bytes, expected drop reason or None to keep)."""
    jpg = photo_bytes()
    c.serve("/img/good", jpg)
    return [
        # kept, though each is unusual
        ("plain_jpeg", c.serve("/a.jpg", photo_bytes("chelsea")), GOOD.encode(), None),
        (
            "cmyk_jpeg",
            c.serve("/cmyk.jpg", photo_bytes("coffee", mode="CMYK")),
            GOOD.encode(),
            None,
        ),
        ("png_16bit", c.serve("/deep.png", png16(), "image/png"), GOOD.encode(), None),
        ("animated_gif", c.serve("/anim.gif", animated_gif(), "image/gif"), GOOD.encode(), None),
        (
            "wrong_extension",
            c.serve("/really-png.jpg", photo_bytes("rocket", "PNG")),
            GOOD.encode(),
            None,
        ),
        (
            "palette_alpha",
            c.serve("/p.png", photo_bytes("coins", "PNG", mode="P"), "image/png"),
            GOOD.encode(),
            None,
        ),
        (
            "webp_alpha",
            c.serve("/a.webp", photo_bytes("moon", "WEBP", mode="RGBA"), "image/webp"),
            GOOD.encode(),
            None,
        ),
        ("500_then_200", f"{c.base}/flaky/500", GOOD.encode(), None),
        ("429_then_200", f"{c.base}/flaky/429", GOOD.encode(), None),
        ("redirect_ok", f"{c.base}/redirect-ok", GOOD.encode(), None),
        (
            "unicode_caption",
            c.serve("/u.jpg", photo_bytes("grass")),
            "ein Foto – 草".encode(),
            None,
        ),
        # dropped, each under its own reason
        (
            "truncated_jpeg",
            c.serve("/trunc.jpg", jpg[: len(jpg) // 2]),
            GOOD.encode(),
            "decode_error",
        ),
        (
            "corrupt_jpeg",
            c.serve("/corrupt.jpg", jpg[:300] + bytes(range(256)) * 40),
            GOOD.encode(),
            "decode_error",
        ),
        ("zero_bytes", c.serve("/empty.jpg", b""), GOOD.encode(), "not_image"),
        (
            "html_as_image",
            c.serve("/page.jpg", b"<html><body>hi</body></html>"),
            GOOD.encode(),
            "not_image",
        ),
        (
            "decompression_bomb",
            c.serve("/bomb.png", bomb_png(), "image/png"),
            GOOD.encode(),
            "too_many_pixels",
        ),
        ("too_small", c.serve("/tiny.jpg", photo_bytes(size=(8, 8))), GOOD.encode(), "too_small"),
        (
            "bad_aspect",
            c.serve("/strip.jpg", photo_bytes(size=(900, 30))),
            GOOD.encode(),
            "bad_aspect_ratio",
        ),
        (
            "too_large_body",
            c.serve("/huge.png", photo_bytes("astronaut", "PNG", size=(900, 900)), "image/png"),
            GOOD.encode(),
            "too_large",
        ),
        (
            "robots_noai",
            c.serve("/robots.jpg", jpg, X_Robots_Tag="noai"),
            GOOD.encode(),
            "robots_optout",
        ),
        ("http_404", f"{c.base}/status/404", GOOD.encode(), "http_404"),
        ("http_403", f"{c.base}/status/403", GOOD.encode(), "http_403"),
        ("always_500", f"{c.base}/status/503", GOOD.encode(), "http_503"),
        ("stall_mid_body", f"{c.base}/stall", GOOD.encode(), "timeout"),
        ("redirect_loop", f"{c.base}/loop", GOOD.encode(), "too_many_redirects"),
        (
            "connection_refused",
            f"http://127.0.0.1:{closed_port()}/x.jpg",
            GOOD.encode(),
            "connection_error",
        ),
        ("ftp_scheme", "ftp://127.0.0.1/x.jpg", GOOD.encode(), "bad_scheme"),
        ("file_scheme", "file:///etc/hostname", GOOD.encode(), "bad_scheme"),
        ("missing_url", None, GOOD.encode(), "missing_url"),
        (
            "bad_utf8_caption",
            c.serve("/b.jpg", photo_bytes("brick")),
            b"caf\xe9 \xff photo",
            "caption_not_utf8",
        ),
        ("missing_caption", c.serve("/m.jpg", photo_bytes("clock")), None, "missing_caption"),
        ("empty_caption", c.serve("/e.jpg", photo_bytes("camera")), b"   ", "empty_caption"),
        ("huge_caption", c.serve("/h.jpg", photo_bytes("text")), b"word " * 5000, "too_long"),
    ]


def url_list(tmp_path, rows) -> str:
    table = pa.table(
        {
            "url": pa.array([r[1] for r in rows], pa.string()),
            "caption": pa.array([r[2] for r in rows], pa.binary()),
            "case": [r[0] for r in rows],  # an extra column: carried into <key>.json
        }
    )
    path = tmp_path / "urls.parquet"
    pq.write_table(table, path)
    return str(path)


def ingest_config(urls: str, out, private_ok=True) -> BuildConfig:
    return BuildConfig.model_validate(
        {
            "source": {"kind": "urls", "path": urls, "files_per_task": 10},
            "stages": [
                {
                    "name": "download",
                    "timeout_s": 2,
                    "retries": 2,
                    "backoff_s": 0.05,
                    "max_bytes": 400_000,
                    "allow_private_addresses": private_ok,
                },
                {
                    "name": "decode_image",
                    "resize": {"size": 64},
                    "min_side": 16,
                    "max_aspect_ratio": 8,
                },
                {"name": "caption_filter", "max_chars": 2000},
            ],
            "output": {"path": str(out), "shard_max_samples": 8, "overwrite": True},
        }
    )


@pytest.mark.slow
def test_bad_inputs_are_dropped_by_reason_and_good_kept(ray_session, corpus, tmp_path):
    rows = cases(corpus)
    bad_kinds = {name for name, _, _, reason in rows if reason}
    assert len(bad_kinds) >= 20
    urls = url_list(tmp_path, rows)
    manifest = run_build(ingest_config(urls, tmp_path / "out"), progress=False)
    signatures = pq.read_table(tmp_path / "out" / "signatures").to_pylist()
    got = {row["key"]: row["drop_reason"] for row in signatures}
    expected = {f"{i:09d}": reason for i, (_, _, _, reason) in enumerate(rows)}
    assert got == expected  # keys from input position; each case under its reason
    assert manifest["samples"] == sum(1 for r in rows if r[3] is None)
    assert corpus.hits["/flaky/500"] == 2 and corpus.hits["/status/404"] == 1  # no 4xx retry
    assert corpus.hits["/status/503"] == 3  # 1 + retries

    shards = sorted(str(p) for p in (tmp_path / "out").glob("shard-*.tar"))
    samples = list(wds.WebDataset(shards, shardshuffle=False).decode("pil"))
    meta = {s["__key__"]: s["json"] for s in samples}
    assert {m["case"] for m in meta.values()} == {r[0] for r in rows if r[3] is None}
    for s in samples:
        assert s["jpg"].mode == "RGB" and min(s["jpg"].size) == 64
        assert meta[s["__key__"]]["status"] == "success"
        assert meta[s["__key__"]]["url"].startswith(corpus.base)

    for shard in manifest["shards"]:  # img2dataset-style metadata next to each tar
        table = pq.read_table(tmp_path / "out" / shard["name"].replace(".tar", ".parquet"))
        assert table.num_rows == shard["samples"]
        assert {"key", "url", "caption", "width", "original_width", "sha256"} <= set(
            table.column_names
        )

    again = run_build(ingest_config(urls, tmp_path / "out"), progress=False)
    assert again["shards"] == manifest["shards"]  # same keys in the same shards, same bytes


def test_private_address_guard_on_loopback(ray_session, corpus, tmp_path):
    corpus.serve("/img/good", photo_bytes())
    rows = [
        ("loopback_v4", f"{corpus.base}/img/good", GOOD.encode(), "private_address"),
        ("loopback_v6", "http://[::1]:9/x.jpg", GOOD.encode(), "private_address"),
        (
            "localhost",
            f"http://localhost:{corpus.server_address[1]}/img/good",
            GOOD.encode(),
            "private_address",
        ),
    ]
    cfg = ingest_config(url_list(tmp_path, rows), tmp_path / "out", private_ok=False)
    manifest = run_build(cfg, progress=False)
    assert manifest["samples"] == 0 and manifest["shards"] == []
    assert corpus.hits["/img/good"] == 0  # refused before any request was sent
    stats = json.loads((tmp_path / "out" / "stats.json").read_text())
    assert stats["stages"][1]["dropped"] == {"private_address": 3}
