"""Request rates per host under `download`'s politeness options (issue 49 item 3), on loopback.

Two scenarios, each run with the limits and, as the reference in the same run, without them
(`host_concurrency` 1000, `host_requests_per_s` 0, the old behaviour's shape):

- rate: HOSTS hosts with PER_HOST images each, healthy; `host_requests_per_s` R. The servers
  log each image request's arrival; a host's rate is (n - 1) / (last - first arrival), and the
  busiest second is the most arrivals in any 1 s window.
- busy: 50 hosts with 20 images each, every 7th request a 429 (Retry-After 0 or 1), every 10th
  a 500; `host_concurrency` 2, `retries` 3. The servers count requests in flight (see
  tests/host_server.py); reports peak per host, samples that arrived, wall time.

    .venv/bin/python bench/polite_fetch.py --rate 10 --out /tmp/polite.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.append(str(Path(__file__).resolve().parents[1]))  # last: a PYTHONPATH tree wins
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

UNLIMITED = {"host_concurrency": 1000, "host_requests_per_s": 0.0, "host_pause_after": 0}


def run_stage(urls: list[str], **options) -> tuple[list[str | None], float]:
    from mmcurate.stages.download import Download, DownloadOptions

    base = {"allow_private_addresses": True, "backoff_s": 0.05, "threads": 32}
    stage = Download(DownloadOptions(**(base | options)))
    stage.setup()
    start = time.perf_counter()
    _, reasons = stage.process({"__key__": [str(i) for i in range(len(urls))], "url": urls})
    elapsed = time.perf_counter() - start
    stage.executor.shutdown()
    return reasons, elapsed


def rate_scenario(hosts: int, per_host: int, rate: float, options: dict) -> dict:
    from tests.host_server import Route, sites, stop_all
    from tests.http_corpus import photo_bytes

    image = photo_bytes(size=(64, 48))
    servers = sites(hosts)
    arrivals: dict[int, list[float]] = {i: [] for i in range(hosts)}
    lock = threading.Lock()
    try:
        urls = []
        for index, server in enumerate(servers):
            server.chaos = logger(arrivals[index], lock)
            urls += [server.route(f"/img/{i}.jpg", Route(200, image)) for i in range(per_host)]
        reasons, elapsed = run_stage(urls, **options)
    finally:
        stop_all(servers)
    rates = [per_second(times) for times in arrivals.values()]
    busiest = [busiest_second(times) for times in arrivals.values()]
    return {
        "options": options,
        "wall_s": round(elapsed, 2),
        "arrived": reasons.count(None),
        "samples": len(urls),
        "rate_per_host": {
            "min": round(min(rates), 1),
            "median": round(statistics.median(rates), 1),
            "max": round(max(rates), 1),
        },
        "busiest_second_max": max(busiest),
        "limit": rate,
    }


def logger(times: list[float], lock: threading.Lock):
    def chaos(path: str, number: int):
        if path.startswith("/img/"):
            with lock:
                times.append(time.monotonic())
        return None

    return chaos


def per_second(times: list[float]) -> float:
    times = sorted(times)
    span = times[-1] - times[0] if len(times) > 1 else 0.0
    return (len(times) - 1) / span if span > 0 else float("inf")


def busiest_second(times: list[float]) -> int:
    times, best, first = sorted(times), 0, 0
    for last, when in enumerate(times):
        while when - times[first] >= 1.0:
            first += 1
        best = max(best, last - first + 1)
    return best


def busy_scenario(options: dict) -> dict:
    from tests.host_server import Route, sites, stop_all
    from tests.http_corpus import photo_bytes

    def busy_and_flaky(path: str, number: int):
        if number % 7 == 0:
            return Route(429, b"slow down", {"Retry-After": str(int(number % 14 == 0))})
        if number % 10 == 3:
            return Route(500, b"oops")
        return None

    image = photo_bytes(size=(64, 48))
    servers = sites(50)
    try:
        urls = []
        for server in servers:
            server.chaos = busy_and_flaky
            urls += [server.route(f"/img/{i}.jpg", Route(200, image)) for i in range(20)]
        reasons, elapsed = run_stage(urls, retries=3, **options)
    finally:
        stop_all(servers)
    requests = [sum(s.hits.values()) for s in servers]
    return {
        "options": options,
        "wall_s": round(elapsed, 2),
        "arrived": reasons.count(None),
        "samples": len(urls),
        "peak_in_flight_per_host": max(s.peak for s in servers),
        "requests_per_host_per_s": round(statistics.median(requests) / elapsed, 1),
        "drops": {r: reasons.count(r) for r in set(reasons) if r is not None},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", type=int, default=10)
    parser.add_argument("--per-host", type=int, default=40)
    parser.add_argument("--rate", type=float, default=10.0)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    limited = {"host_concurrency": args.concurrency, "host_requests_per_s": args.rate}
    result = {
        "rate_limited": rate_scenario(args.hosts, args.per_host, args.rate, limited),
        "rate_reference": rate_scenario(args.hosts, args.per_host, 0.0, UNLIMITED),
        "busy_limited": busy_scenario({"host_concurrency": 2}),
        "busy_reference": busy_scenario(UNLIMITED),
    }
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text)


if __name__ == "__main__":
    main()
