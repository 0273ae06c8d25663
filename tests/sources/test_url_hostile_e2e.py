"""Hostile URLs and redirects against a loopback server: named drop reasons, no exception, and
no connection where there should be none (the server counts every TCP connection it accepts).

Safety: every URL here that could be dialled names 127.0.0.0/8 or ::1 (in whatever spelling).
"""

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from mmcurate.pipeline.build import run_build
from mmcurate.pipeline.config import BuildConfig
from mmcurate.pipeline.sources.samples import empty_batch
from mmcurate.stages.base import DROP
from mmcurate.stages.lib.fetch_policy import FetchPolicy
from mmcurate.stages.lib.http_conn import Connections
from mmcurate.stages.lib.http_fetch import fetch
from mmcurate.stages.registry import build_stage

from tests.http_corpus import Corpus, photo_bytes

GUARD_OFF = FetchPolicy(allow_private_addresses=True, retries=0, timeout_s=5)
GUARD_ON = FetchPolicy(allow_private_addresses=False, retries=0, timeout_s=5)


@pytest.fixture
def corpus():
    server = Corpus().start()
    server.serve("/img/good", photo_bytes())
    yield server
    server.stop()


def loopback_spellings(port: int) -> list[str]:
    hosts = ["127.0.0.1", "127.0.0.2", "127.255.255.254", "[::1]", "[::ffff:127.0.0.1]"]
    hosts += ["[::ffff:7f00:2]", "2130706433", "0x7f000001", "0x7f.1", "127.1", "0177.0.0.1"]
    hosts += ["localhost", "LocalHost"]
    return [f"http://{host}:{port}/img/good" for host in hosts]


def test_guard_on_refuses_every_loopback_spelling_without_connecting(corpus):
    port = corpus.server_address[1]
    for url in loopback_spellings(port) + [f"http://127.0.0.1:{port}/redirect-ok"]:
        assert fetch(Connections(), url, GUARD_ON).reason == "private_address", url
    assert corpus.connections == 0 and sum(corpus.hits.values()) == 0
    # the count would have seen a leak: the same spellings reach the server with the guard off
    for url in (f"http://2130706433:{port}/img/good", f"http://0x7f.1:{port}/img/good"):
        assert fetch(Connections(), url, GUARD_OFF).column == "jpg"
    assert corpus.connections == 2


def test_malformed_urls_never_connect(corpus):
    port = corpus.server_address[1]
    cases = {
        f"http://127.0.0.1:{port}00000/img/good": "bad_url",  # port out of range
        "http://127.0.0.1:port/img/good": "bad_url",
        f"http://[::1:{port}/img/good": "bad_url",
        f"http://u:pw@127.0.0.1:{port}/img/good": "bad_url",
        f"http://127.0.0.1:{port}/img/good\r\nX-Injected: 1": "bad_url",
        f"http://127.0.0.1:{port}/img/\x00good": "bad_url",
        f"http://127.0.0.1:{port}/img/good?" + "a" * 9000: "bad_url",
        f"ftp://127.0.0.1:{port}/img/good": "bad_scheme",
        f"//127.0.0.1:{port}/img/good": "bad_scheme",
        f"127.0.0.1:{port}/img/good": "bad_scheme",
        "   ": "no_url",
    }
    for url, reason in cases.items():
        assert fetch(Connections(), url, GUARD_OFF).reason == reason, url
    assert corpus.connections == 0


def redirect_cases(c: Corpus) -> dict[str, str | None]:
    """Redirecting route -> expected drop reason (None: the image arrives)."""
    port = c.server_address[1]
    c.serve("/caf%C3%A9.jpg", photo_bytes("coffee"))
    bad = {
        "": "bad_redirect",
        "   ": "bad_redirect",
        "http://[::1/x": "bad_redirect",
        "http://127.0.0.1:99999/img/good": "bad_redirect",
        "http://127.0.0.1:abc/img/good": "bad_redirect",
        f"http://u:p@127.0.0.1:{port}/img/good": "bad_redirect",
        "/img/go\x01od": "bad_redirect",
        "/" + "a" * 9000: "bad_redirect",
        "ftp://127.0.0.1/x": "bad_scheme",
        "file:///etc/passwd": "bad_scheme",
        "javascript:alert(1)": "bad_scheme",
        "data:image/jpeg;base64,/9j/": "bad_scheme",
    }
    good = ["/img/good", "../img/good", f"//127.0.0.1:{port}/img/good", "/café.jpg"]
    routes = {c.redirect(f"/r/bad{i}", loc): reason for i, (loc, reason) in enumerate(bad.items())}
    routes |= {c.redirect(f"/r/good{i}", loc): None for i, loc in enumerate(good)}
    routes |= {c.redirect(f"/r/{code}", "/img/good", code): None for code in (301, 303, 307, 308)}
    c.redirect("/r/ping", "/r/pong")
    c.redirect("/r/pong", "/r/ping")
    routes[f"{c.base}/r/ping"] = "too_many_redirects"
    routes[f"{c.base}/loop"] = "too_many_redirects"
    return routes


def test_redirect_locations_end_to_end(corpus):
    routes = redirect_cases(corpus)
    pool = Connections()
    for url, reason in routes.items():
        result = fetch(pool, url, GUARD_OFF)
        assert (result.reason, result.column is not None) == (reason, reason is None), url
    for route in ("/loop", "/r/ping", "/r/pong", "/r/bad0"):
        assert corpus.hits[route] == 1  # a loop stops when it comes round; no retries
    assert corpus.hits["/img/good"] == 7 and corpus.hits["/caf%C3%A9.jpg"] == 1


def test_redirect_limit_counts_hops(corpus):
    policy = FetchPolicy(allow_private_addresses=True, retries=0, max_redirects=2)
    assert fetch(Connections(), f"{corpus.base}/chain/1", policy).column == "jpg"  # 2 hops
    assert fetch(Connections(), f"{corpus.base}/chain/2", policy).reason == "too_many_redirects"
    assert corpus.hits["/chain/0"] == 2 and corpus.hits["/img/good"] == 1


class ExplodingUrl(str):
    """A URL value whose methods fail: stands for whatever we did not foresee."""

    def strip(self, chars=None):
        raise RuntimeError("boom")


def test_download_stage_turns_any_url_value_into_a_reason(corpus):
    values = [None, "", " \n", 5, b"", b"http://127.0.0.1/x.jpg", "http://[::1/x.jpg"]
    values += [ExplodingUrl("http://127.0.0.1/"), f"{corpus.base}/img/good"]
    metas = [None, "not json", "[1, 2]", b'{"case": "bytes"}', "", "{}", "{}", "{}"]
    metas.append('{"case": "good"}')
    batch = empty_batch()
    for i, (url, meta) in enumerate(zip(values, metas, strict=True)):
        for col in batch:
            batch[col].append(None)
        batch["__key__"][-1], batch["url"][-1], batch["json"][-1] = f"k{i}", url, meta
    stage = build_stage({"name": "download", "allow_private_addresses": True, "threads": 3})
    out = stage(batch)
    assert out[DROP] == ["no_url"] * 3 + ["bad_url", "no_url", "bad_url", "bad_url"] + [
        "fetch_error",
        None,
    ]
    fields = [json.loads(text) for text in out["json"]]
    assert fields[3]["case"] == "bytes" and fields[3]["error_message"] == "bad_url"
    assert fields[8]["case"] == "good" and fields[8]["status"] == "success"
    assert out["jpg"][8] == corpus.files["/img/good"][0]


def test_build_counts_bad_urls_by_reason(ray_session, corpus, tmp_path):
    port = corpus.server_address[1]
    rows = [
        (f"{corpus.base}/img/good", None),
        ("http://[::1/x.jpg", "bad_url"),
        (f"http://127.0.0.1:{port}99999/x.jpg", "bad_url"),
        (f"http://u:p@127.0.0.1:{port}/img/good", "bad_url"),
        ("javascript:alert(1)", "bad_scheme"),
        (corpus.redirect("/r/broken", "http://[::1"), "bad_redirect"),
        (corpus.redirect("/r/ftp", "ftp://127.0.0.1/x"), "bad_scheme"),
        ("", "no_url"),
    ]
    pq.write_table(pa.table({"url": [r[0] for r in rows], "caption": ["a photo"] * len(rows)}),
                   tmp_path / "urls.parquet")  # fmt: skip
    cfg = BuildConfig.model_validate(
        {
            "source": {"kind": "urls", "path": str(tmp_path / "urls.parquet")},
            "stages": [{"name": "download", "allow_private_addresses": True, "retries": 0}],
            "output": {"path": str(tmp_path / "out")},
        }
    )
    manifest = run_build(cfg, progress=False)
    assert manifest["samples"] == 1
    stats = json.loads((tmp_path / "out" / "stats.json").read_text())
    download = next(s for s in stats["stages"] if s["name"] == "download")
    assert download["dropped"] == {"bad_url": 3, "bad_scheme": 2, "bad_redirect": 1, "no_url": 1}
    signatures = pq.read_table(tmp_path / "out" / "signatures").to_pylist()
    assert {r["key"]: r["drop_reason"] for r in signatures} == {
        f"{i:09d}": reason for i, (_, reason) in enumerate(rows)
    }
