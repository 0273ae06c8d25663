"""Loopback web hosts for the opt-out and politeness tests: each serves a table of routes, counts
hits per path, and counts the requests it is handling at once (`peak`).

The in-flight count is exact, not a timing: a request counts from the moment its handler reads
it until just before the last byte of its reply is sent, so that interval lies inside the
client's (which sends first and reads that last byte before it lets another request go).
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from tests.http_corpus import Served


@dataclass(frozen=True)
class Route:
    status: int = 200
    body: bytes = b"not found"
    headers: dict[str, str] = field(default_factory=dict)
    delay_s: float = 0.0  # before answering (a slow host)
    close: bool = False  # hang up without an answer


NOT_FOUND = Route(404)


class Site(Served, ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, host: str = "127.0.0.1") -> None:
        super().__init__((host, 0), SiteHandler)
        self.routes: dict[str, Route] = {}
        self.hits: Counter[str] = Counter()
        self.release = threading.Event()
        self.lock = threading.Lock()
        self.active = self.peak = 0
        # path, this request's number on the site -> the route to answer with (None: the table)
        self.chaos: Callable[[str, int], Route | None] | None = None

    def start(self) -> Site:
        """Served from a daemon thread that looks for shutdown often (tests stop many)."""
        threading.Thread(target=self.serve_forever, args=(0.02,), daemon=True).start()
        return self

    @property
    def base(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host}:{port}"

    def route(self, path: str, route: Route) -> str:
        self.routes[path] = route
        return self.base + path

    def handle_error(self, request, client_address) -> None:
        pass  # clients hang up on purpose (opt-outs, timeouts)


class SiteHandler(BaseHTTPRequestHandler):
    server: Site
    protocol_version = "HTTP/1.1"

    def log_message(self, *args) -> None:
        pass

    def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
        site = self.server
        with site.lock:
            site.hits[self.path] += 1
            number = sum(site.hits.values())
            site.active += 1
            site.peak = max(site.peak, site.active)
        counted = True
        try:
            route = (site.chaos and site.chaos(self.path, number)) or site.routes.get(self.path)
            route = route or NOT_FOUND
            if route.delay_s:
                site.release.wait(route.delay_s)
            if route.close:
                self.close_connection = True
                return
            self.send_response(route.status)
            self.send_header("Content-Length", str(len(route.body)))
            for name, value in route.headers.items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(route.body[:-1])
            self.wfile.flush()
            with site.lock:  # before the last byte: see the module's notes
                site.active -= 1
            counted = False
            self.wfile.write(route.body[-1:])
        finally:
            if counted:
                with site.lock:
                    site.active -= 1


def sites(n: int, host: str = "127.0.0.1") -> list[Site]:
    return [Site(host).start() for _ in range(n)]


def stop_all(servers: list[Site]) -> None:
    for server in servers:
        server.stop()
