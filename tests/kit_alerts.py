"""A loopback webhook that records the alerts a trainer posts, and the fields each one has."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

FIELDS = {"run", "step", "event", "message", "metrics", "time"}


class Webhook:
    """A loopback HTTP server that records every POSTed JSON body; the first `fail`
    requests get HTTP 500, the `garbage` ones after them an answer that is not HTTP."""

    def __init__(self, fail: int = 0, garbage: int = 0) -> None:
        self.bodies: list[dict] = []
        self.requests = 0
        self.fail, self.garbage = fail, garbage
        hook = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                body = self.rfile.read(int(self.headers["Content-Length"]))
                hook.requests += 1
                if hook.requests <= hook.fail:
                    self.send_response(500)
                elif hook.requests <= hook.fail + hook.garbage:
                    self.wfile.write(b"SPAM SPAM SPAM\r\n\r\n")  # no status line
                    self.close_connection = True
                    return
                else:
                    hook.bodies.append(json.loads(body))
                    self.send_response(204)
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook/secret-token"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def events(self) -> list[str]:
        return [body["event"] for body in self.bodies]

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
