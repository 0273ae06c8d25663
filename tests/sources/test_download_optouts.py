"""Opt-outs in `download`: robots.txt, TDMRep (header and tdmrep.json), ai.txt, X-Robots-Tag.

Each case is a fresh loopback host (its own port) serving an image at /img/a.jpg (or the case's
path) and the case's files; the stage fetches that one URL and must keep or drop it with the
named reason. Files that drop an image before it is fetched must leave the image unrequested.
"""

from __future__ import annotations

import json
import tarfile

import pytest
from mmcurate.stages.download import Download, DownloadOptions
from mmcurate.stages.lib.optout_rules import parse_robots, parse_tdmrep, tdm_reserved

from tests.host_server import Route, Site
from tests.http_corpus import photo_bytes

IMAGE = photo_bytes(size=(64, 48))
ROBOTS, TDM, AI = "/robots.txt", "/.well-known/tdmrep.json", "/ai.txt"
SLOW_S = 2.0  # a slow file's delay, well past the cases' optout_timeout_s
# decided before the image is asked for
BEFORE = ("robots_txt_optout", "robots_txt_unreachable", "timeout", "connection_error")


def text(body: str, status: int = 200, **route) -> Route:
    return Route(status, body.encode(), {"Content-Type": "text/plain"}, **route)


def tdm(rules) -> Route:
    return Route(200, json.dumps(rules).encode(), {"Content-Type": "application/json"})


def moved(location: str) -> Route:
    return Route(302, b"", {"Location": location})


def image(**headers: str) -> Route:
    return Route(200, IMAGE, {"Content-Type": "image/jpeg", **headers})


# (id, routes on the host, image path, stage options, expected drop reason or None)
CASES = [
    # robots.txt
    ("robots_missing", {}, "/img/a.jpg", {}, None),
    ("robots_allow_all", {ROBOTS: text("User-agent: *\nDisallow:\n")}, "/img/a.jpg", {}, None),
    ("robots_disallow_all", {ROBOTS: text("User-agent: *\nDisallow: /\n")}, "/img/a.jpg", {},
     "robots_txt_optout"),
    ("robots_disallow_us", {ROBOTS: text("User-agent: mmcurate\nDisallow: /\n")}, "/img/a.jpg",
     {}, "robots_txt_optout"),
    ("robots_disallow_other_bot", {ROBOTS: text("User-agent: otherbot\nDisallow: /\n")},
     "/img/a.jpg", {}, None),
    ("robots_our_group_wins", {ROBOTS: text("User-agent: *\nDisallow: /\n\nUser-agent: "
     "mmcurate\nAllow: /\n")}, "/img/a.jpg", {}, None),
    ("robots_wildcard_ext", {ROBOTS: text("User-agent: *\nDisallow: /*.jpg$\n")}, "/img/a.jpg",
     {}, "robots_txt_optout"),
    ("robots_wildcard_end_anchor", {ROBOTS: text("User-agent: *\nDisallow: /*.jpg$\n")},
     "/img/a.jpg?size=2", {}, None),
    ("robots_longest_allow", {ROBOTS: text("User-agent: *\nDisallow: /img/\nAllow: /img/ok/\n")},
     "/img/ok/a.jpg", {}, None),
    ("robots_longest_disallow", {ROBOTS: text("User-agent: *\nAllow: /img/\n"
     "Disallow: /img/private/\n")}, "/img/private/a.jpg", {}, "robots_txt_optout"),
    ("robots_other_path", {ROBOTS: text("User-agent: *\nDisallow: /private\n")}, "/img/a.jpg",
     {}, None),
    ("robots_malformed_binary", {ROBOTS: Route(200, bytes(range(256)) * 4)}, "/img/a.jpg", {},
     None),
    ("robots_malformed_html", {ROBOTS: text("<html><body>Disallow everything</body></html>")},
     "/img/a.jpg", {}, None),
    ("robots_malformed_lines_skipped", {ROBOTS: text("garbage\nUser-agent: *\nfoo bar\n"
     "Disallow: /img\n")}, "/img/a.jpg", {}, "robots_txt_optout"),
    ("robots_uppercase_keys", {ROBOTS: text("USER-AGENT: *\nDISALLOW: /img/\n")}, "/img/a.jpg",
     {}, "robots_txt_optout"),
    ("robots_byte_order_mark", {ROBOTS: text("\ufeffUser-agent: *\nDisallow: /\n")},
     "/img/a.jpg", {}, "robots_txt_optout"),
    ("robots_percent_encoded", {ROBOTS: text("User-agent: *\nDisallow: /img/%7Eme/\n")},
     "/img/~me/a.jpg", {}, "robots_txt_optout"),
    ("robots_500", {ROBOTS: text("oops", 500)}, "/img/a.jpg", {"retries": 0},
     "robots_txt_unreachable"),
    ("robots_500_allowed_by_option", {ROBOTS: text("oops", 500)}, "/img/a.jpg",
     {"retries": 0, "robots_unreachable": "allow"}, None),
    ("robots_503", {ROBOTS: text("busy", 503)}, "/img/a.jpg", {"retries": 0},
     "robots_txt_unreachable"),
    ("robots_403", {ROBOTS: text("no", 403)}, "/img/a.jpg", {}, None),
    ("robots_401", {ROBOTS: text("no", 401)}, "/img/a.jpg", {}, None),
    ("robots_hangs_up", {ROBOTS: Route(close=True)}, "/img/a.jpg", {"retries": 0},
     "connection_error"),
    ("robots_redirect", {ROBOTS: moved("/real-robots.txt"), "/real-robots.txt":
     text("User-agent: *\nDisallow: /img/\n")}, "/img/a.jpg", {}, "robots_txt_optout"),
    ("robots_redirect_loop", {ROBOTS: moved(ROBOTS)}, "/img/a.jpg", {}, None),
    ("robots_slow", {ROBOTS: text("User-agent: *\nDisallow:\n", delay_s=SLOW_S)}, "/img/a.jpg",
     {"retries": 0}, "timeout"),
    ("robots_slow_allowed_by_option", {ROBOTS: text("User-agent: *\n", delay_s=SLOW_S)},
     "/img/a.jpg", {"retries": 0, "robots_unreachable": "allow"}, None),
    ("robots_slowish_in_time", {ROBOTS: text("User-agent: *\nDisallow: /\n", delay_s=0.05)},
     "/img/a.jpg", {}, "robots_txt_optout"),
    ("robots_turned_off", {ROBOTS: text("User-agent: *\nDisallow: /\n")}, "/img/a.jpg",
     {"robots_txt": False}, None),
    ("robots_agent_option", {ROBOTS: text("User-agent: mybot\nDisallow: /\n")}, "/img/a.jpg",
     {"robots_agent": "MyBot"}, "robots_txt_optout"),
    # TDMRep: the response header
    ("tdm_header_reserved", {"/img/a.jpg": image(**{"tdm-reservation": "1"})}, "/img/a.jpg", {},
     "tdm_optout"),
    ("tdm_header_not_reserved", {"/img/a.jpg": image(**{"tdm-reservation": "0"})},
     "/img/a.jpg", {}, None),
    ("tdm_header_malformed", {"/img/a.jpg": image(**{"tdm-reservation": "yes please"})},
     "/img/a.jpg", {}, None),
    ("tdm_header_turned_off", {"/img/a.jpg": image(**{"tdm-reservation": "1"})}, "/img/a.jpg",
     {"tdm_rep": False}, None),
    # TDMRep: /.well-known/tdmrep.json
    ("tdm_file_reserved", {TDM: tdm([{"location": "/img/*", "tdm-reservation": 1}])},
     "/img/a.jpg", {}, "tdm_optout"),
    ("tdm_file_other_location", {TDM: tdm([{"location": "/text/*", "tdm-reservation": 1}])},
     "/img/a.jpg", {}, None),
    ("tdm_file_not_reserved", {TDM: tdm([{"location": "/*", "tdm-reservation": 0}])},
     "/img/a.jpg", {}, None),
    ("tdm_file_first_rule_wins", {TDM: tdm([{"location": "/img/*", "tdm-reservation": 0},
     {"location": "/*", "tdm-reservation": 1}])}, "/img/a.jpg", {}, None),
    ("tdm_file_string_flag", {TDM: tdm([{"location": "/", "tdm-reservation": "1",
     "tdm-policy": "https://example.org/policy"}])}, "/img/a.jpg", {}, "tdm_optout"),
    ("tdm_file_malformed_json", {TDM: text("[{not json")}, "/img/a.jpg", {}, None),
    ("tdm_file_not_an_array", {TDM: tdm({"location": "/", "tdm-reservation": 1})},
     "/img/a.jpg", {}, None),
    ("tdm_file_missing", {}, "/img/a.jpg", {}, None),
    ("tdm_file_500", {TDM: text("oops", 500)}, "/img/a.jpg", {"retries": 0}, None),
    ("tdm_file_redirect", {TDM: moved("/tdm2.json"), "/tdm2.json":
     tdm([{"location": "/img/", "tdm-reservation": 1}])}, "/img/a.jpg", {}, "tdm_optout"),
    ("tdm_file_slow", {TDM: Route(200, b'[{"location": "/", "tdm-reservation": 1}]', {},
     SLOW_S)}, "/img/a.jpg", {"retries": 0}, None),
    ("tdm_file_turned_off", {TDM: tdm([{"location": "/", "tdm-reservation": 1}])},
     "/img/a.jpg", {"tdm_rep": False}, None),
    # ai.txt
    ("ai_disallow_all", {AI: text("User-Agent: *\nDisallow: /\n")}, "/img/a.jpg", {},
     "ai_txt_optout"),
    ("ai_disallow_jpg", {AI: text("User-Agent: *\nDisallow: *.jpg\n")}, "/img/a.jpg", {},
     "ai_txt_optout"),
    ("ai_disallow_png_only", {AI: text("User-Agent: *\nDisallow: *.png\n")}, "/img/a.jpg", {},
     None),
    ("ai_disallow_jpg_by_type", {AI: text("User-Agent: *\nDisallow: *.jpg\n")}, "/img/photo",
     {}, "ai_txt_optout"),
    ("ai_disallow_jpeg_by_type", {AI: text("User-Agent: *\nDisallow: *.jpeg\n")},
     "/img/photo?id=3", {}, "ai_txt_optout"),
    ("ai_allow_jpg_over_root", {AI: text("User-Agent: *\nDisallow: /\nAllow: *.jpg\n")},
     "/img/a.jpg", {}, None),
    ("ai_missing", {}, "/img/a.jpg", {}, None),
    ("ai_malformed", {AI: Route(200, b"\x00\xff<html>" * 50)}, "/img/a.jpg", {}, None),
    ("ai_500", {AI: text("oops", 500)}, "/img/a.jpg", {"retries": 0}, None),
    ("ai_redirect", {AI: moved("/ai2.txt"), "/ai2.txt": text("User-Agent: *\nDisallow: /\n")},
     "/img/a.jpg", {}, "ai_txt_optout"),
    ("ai_slow", {AI: text("User-Agent: *\nDisallow: /\n", delay_s=SLOW_S)}, "/img/a.jpg",
     {"retries": 0}, None),
    ("ai_turned_off", {AI: text("User-Agent: *\nDisallow: /\n")}, "/img/a.jpg",
     {"ai_txt": False}, None),
    # X-Robots-Tag
    ("xrobots_noai", {"/img/a.jpg": image(**{"X-Robots-Tag": "noai"})}, "/img/a.jpg", {},
     "robots_optout"),
    ("xrobots_noimageai", {"/img/a.jpg": image(**{"X-Robots-Tag": "noimageai, nofollow"})},
     "/img/a.jpg", {}, "robots_optout"),
    ("xrobots_other_bot", {"/img/a.jpg": image(**{"X-Robots-Tag": "otherbot: noai"})},
     "/img/a.jpg", {}, None),
    ("xrobots_aimed_at_us", {"/img/a.jpg": image(**{"X-Robots-Tag": "mmcurate: noai"})},
     "/img/a.jpg", {}, "robots_optout"),
    ("xrobots_harmless", {"/img/a.jpg": image(**{"X-Robots-Tag": "nofollow"})}, "/img/a.jpg",
     {}, None),
    ("xrobots_malformed", {"/img/a.jpg": image(**{"X-Robots-Tag": ",,:;: :"})}, "/img/a.jpg",
     {}, None),
    ("xrobots_turned_off", {"/img/a.jpg": image(**{"X-Robots-Tag": "noai"})}, "/img/a.jpg",
     {"x_robots_tag": False}, None),
    ("xrobots_after_redirect", {"/img/a.jpg": moved("/img/b.jpg"),
     "/img/b.jpg": image(**{"X-Robots-Tag": "noai"})}, "/img/a.jpg", {}, "robots_optout"),
]  # fmt: skip


def shard_json(out) -> list[dict]:
    metas = []
    for shard in sorted(out.glob("shard-*.tar")):
        with tarfile.open(shard) as tar:
            for member in tar.getmembers():
                if member.name.endswith(".json"):
                    metas.append(json.loads(tar.extractfile(member).read()))
    return metas


def stage_for(**options) -> Download:
    base = {"allow_private_addresses": True, "optout_timeout_s": 0.5, "backoff_s": 0.01}
    stage = Download(DownloadOptions(**(base | options)))
    stage.setup()
    return stage


def fetch_one(stage: Download, url: str) -> tuple[str | None, dict]:
    try:
        batch, reasons = stage.process({"__key__": ["k"], "url": [url]})
    finally:
        stage.executor.shutdown()
    return reasons[0], json.loads(batch["json"][0])


@pytest.mark.parametrize("routes,path,options,expected", [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])  # fmt: skip
def test_each_optout_case_keeps_or_drops_with_its_reason(routes, path, options, expected):
    site = Site().start()
    try:
        site.routes.update(routes)
        site.routes.setdefault(path, image())
        reason, meta = fetch_one(stage_for(**options), site.base + path)
    finally:
        site.stop()
    assert reason == expected, meta
    assert meta["error_message"] == expected
    if expected in BEFORE or (expected == "tdm_optout" and TDM in routes):
        assert site.hits[path] == 0  # a reserved image is never requested


def test_signals_seen_are_listed_in_the_json():
    site = Site().start()
    try:
        site.route(ROBOTS, text("User-agent: *\nDisallow: /private/\n"))
        site.route(TDM, tdm([{"location": "/img/", "tdm-reservation": 0}]))
        site.route(AI, text("User-Agent: *\nDisallow: *.png\n"))
        url = site.route(
            "/img/a.jpg", image(**{"X-Robots-Tag": "nofollow", "tdm-reservation": "0"})
        )
        reason, meta = fetch_one(stage_for(), url)
    finally:
        site.stop()
    assert reason is None
    assert meta["optout"] == {
        "robots_txt": "allowed",
        "tdmrep_json": "not_reserved",
        "ai_txt": "allowed",
        "x_robots_tag": ["nofollow"],
        "tdm_reservation": "0",
    }
    assert meta["final_url"] == url and meta["http_status"] == 200 and "fetched_at" not in meta


def test_the_fetch_time_goes_into_the_json_when_asked():
    site = Site().start()
    try:
        url = site.route("/img/a.jpg", image())
        _, meta = fetch_one(stage_for(fetched_at_in_json=True), url)
    finally:
        site.stop()
    assert meta["fetched_at"].endswith("+00:00")


def test_files_are_fetched_once_per_host_for_all_its_urls():
    site = Site().start()
    try:
        site.route(ROBOTS, text("User-agent: *\nDisallow: /private/\n"))
        urls = [site.route(f"/img/{i}.jpg", image()) for i in range(24)]
        urls += [site.route(f"/private/{i}.jpg", image()) for i in range(8)]
        stage = stage_for(threads=8)
        batch, reasons = stage.process({"__key__": [str(i) for i in range(32)], "url": urls})
        stage.executor.shutdown()
    finally:
        site.stop()
    assert reasons == [None] * 24 + ["robots_txt_optout"] * 8
    assert site.hits[ROBOTS] == site.hits[TDM] == site.hits[AI] == 1


def test_a_redirect_to_another_host_obeys_that_hosts_robots_txt():
    first, second = Site().start(), Site().start()
    try:
        second.route(ROBOTS, text("User-agent: *\nDisallow: /\n"))
        second.route("/img/a.jpg", image())
        url = first.route("/img/a.jpg", moved(second.base + "/img/a.jpg"))
        reason, meta = fetch_one(stage_for(), url)
    finally:
        first.stop()
        second.stop()
    assert reason == "robots_txt_optout"


def test_an_unresolvable_host_keeps_its_own_reason():
    reason, _ = fetch_one(stage_for(), "http://optout-test.invalid/img/a.jpg")
    assert reason == "dns_error"


@pytest.mark.parametrize(
    "robots,path,allowed",
    [
        ("User-agent: *\nDisallow: /a\nAllow: /a$\n", "/a", True),
        ("User-agent: *\nDisallow: /a\nAllow: /a$\n", "/ab", False),
        ("User-agent: *\nAllow: /p\nDisallow: /p\n", "/p", True),  # a tie: Allow wins
        ("User-agent: a\nUser-agent: mmcurate\nDisallow: /x\n", "/x/1", False),  # stacked
        ("Disallow: /\n", "/x", True),  # a rule before any user-agent belongs to no group
        ("User-agent: *\nDisallow: /\n", "/robots.txt", True),
    ],
)
def test_robots_rules(robots, path, allowed):
    assert parse_robots(robots, "mmcurate").allows(path) is allowed


def test_tdmrep_rules_skip_unusable_entries():
    rules = parse_tdmrep('[1, {"location": 5}, {"location": "/a", "tdm-reservation": true},'
                         ' {"location": "/a/*", "tdm-reservation": 1}]')  # fmt: skip
    assert rules is not None and len(rules) == 1
    assert tdm_reserved(rules, "/a/b.jpg").reserved and tdm_reserved(rules, "/b") is None


def test_a_build_counts_optouts_and_keeps_each_samples_provenance(tmp_path):
    """A URL list with a licence column through a build: opt-outs are counted by reason in
    stats.json and per host in the report; each kept sample's json says where, when and under
    which signals it was fetched, and carries the list's licence."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from mmcurate.pipeline.build import run_build
    from mmcurate.pipeline.config import BuildConfig

    open_site, closed_site = Site().start(), Site().start()
    try:
        open_site.route(TDM, tdm([{"location": "/reserved/", "tdm-reservation": 1}]))
        closed_site.route(ROBOTS, text("User-agent: *\nDisallow: /\n"))
        urls = [
            open_site.route("/img/a.jpg", image()),
            open_site.route("/img/b", moved("/img/a.jpg")),
        ]
        urls += [open_site.route("/reserved/c.jpg", image()), closed_site.route("/d.jpg", image())]
        urls.append(open_site.route("/img/e.jpg", image(**{"tdm-reservation": "1"})))
        table = {
            "url": urls,
            "caption": ["a photo"] * 5,
            "license": ["cc-by", "cc0", "x", "y", "z"],
        }
        pq.write_table(pa.table(table), tmp_path / "urls.parquet")
        spec = {
            "source": {"kind": "urls", "path": str(tmp_path / "urls.parquet")},
            "stages": [{"name": "download", "allow_private_addresses": True, "retries": 0}],
            "output": {"path": str(tmp_path / "out")},
            "ray": {"runtime": "local", "num_cpus": 1},
        }
        run_build(BuildConfig.model_validate(spec), progress=False)
    finally:
        open_site.stop()
        closed_site.stop()
    out = tmp_path / "out"
    stats = json.loads((out / "stats.json").read_text())
    download = next(s for s in stats["stages"] if s["name"] == "download")
    assert download["dropped"] == {"robots_txt_optout": 1, "tdm_optout": 2}
    metas = {m["url"]: m for m in shard_json(out)}
    assert set(metas) == set(urls[:2])
    redirected = metas[urls[1]]
    assert redirected["final_url"] == urls[0] and redirected["http_status"] == 200
    assert redirected["license"] == "cc0" and metas[urls[0]]["license"] == "cc-by"
    signatures = pq.read_table(out / "signatures").to_pylist()
    assert all(row["fetched_at"].endswith("+00:00") for row in signatures)  # UTC, every row
    assert redirected["optout"] == {"robots_txt": "absent", "tdmrep_json": "no_rule"}
    report = (out / "report.html").read_text()
    host = closed_site.base.removeprefix("http://")
    assert "Opt-outs per host" in report and f"<td>{host}</td><td>1</td><td>1</td>" in report
