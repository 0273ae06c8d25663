"""A loopback HTTP server with misbehaving routes, and the images it serves (for tests)."""

from __future__ import annotations

import io
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
from mmcurate.pipeline.demo_data import source_photo
from PIL import Image


def photo_bytes(
    name: str = "astronaut", fmt: str = "JPEG", size=(320, 240), mode="RGB", **save
) -> bytes:
    image = source_photo(name).convert("RGB").resize(size)
    if mode == "CMYK":
        image = image.convert("CMYK")
    elif mode == "P":
        image = image.convert("P", palette=Image.Palette.ADAPTIVE)
        save.setdefault("transparency", 0)
    elif mode == "RGBA":
        image = image.convert("RGBA")
    out = io.BytesIO()
    image.save(out, fmt, **save)
    return out.getvalue()


def png16() -> bytes:
    grey = (np.linspace(0, 65535, 300 * 200).reshape(200, 300)).astype(np.uint16)
    out = io.BytesIO()
    Image.fromarray(grey).save(out, "PNG")  # mode I;16
    return out.getvalue()


def animated_gif() -> bytes:
    frames = [Image.new("RGB", (120, 90), color) for color in ((255, 0, 0), (0, 0, 255))]
    out = io.BytesIO()
    frames[0].save(out, "GIF", save_all=True, append_images=frames[1:], duration=100, loop=0)
    return out.getvalue()


def bomb_png() -> bytes:
    """110 megapixels of one colour: a few hundred kB compressed."""
    out = io.BytesIO()
    Image.new("1", (11000, 10000)).save(out, "PNG")
    return out.getvalue()


class Served:
    """A socketserver served from a daemon thread; stop() first releases stalled handlers
    (they wait on the server's `release` event)."""

    release: threading.Event

    def start(self):  # noqa: ANN201 - the server itself
        threading.Thread(target=self.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        self.release.set()
        self.shutdown()
        self.server_close()


class Corpus(Served, ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.files: dict[str, tuple[bytes, str, dict]] = {}  # path -> (body, type, headers)
        self.hits: Counter[str] = Counter()
        self.redirects: dict[str, tuple[int, str]] = {}  # path -> (status, raw Location)
        self.busy_paths: dict[str, tuple[int, str]] = {}  # path -> (429s to send, Retry-After)
        self.connections = 0  # accepted TCP connections, whether or not a request followed
        self.release = threading.Event()  # lets stalled handlers finish at shutdown

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def serve(self, path: str, body: bytes, ctype: str = "image/jpeg", **headers: str) -> str:
        self.files[path] = (body, ctype, headers)
        return self.base + path

    def redirect(self, path: str, location: str, status: int = 302) -> str:
        """Answer `path` with a redirect to `location`, sent byte for byte (UTF-8), however
        malformed it is."""
        self.redirects[path] = (status, location)
        return self.base + path

    def busy(self, path: str, retry_after: str, times: int = 1) -> str:
        """Answer `path` with 429 and this Retry-After `times` times, then with /img/good."""
        self.busy_paths[path] = (times, retry_after)
        return self.base + path

    def process_request(self, request, client_address) -> None:
        self.connections += 1
        super().process_request(request, client_address)

    def handle_error(self, request, client_address) -> None:
        pass  # clients hang up on purpose (too_large, robots, timeouts): not a test failure


class Handler(BaseHTTPRequestHandler):
    server: Corpus
    protocol_version = "HTTP/1.1"

    def log_message(self, *args) -> None:  # quiet
        pass

    def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
        path = self.path
        self.server.hits[path] += 1
        hits = self.server.hits[path]
        if path.startswith("/status/"):
            return self.reply(int(path.rsplit("/", 1)[1]), b"no", "text/plain")
        if path.startswith("/flaky/"):  # 500 (or 429) first, then the image
            code = 429 if "429" in path else 500
            if hits == 1:
                return self.reply(code, b"busy", "text/plain")
            return self.reply(200, *self.server.files["/img/good"][:2])
        if path in self.server.busy_paths:
            times, retry_after = self.server.busy_paths[path]
            if hits <= times:
                return self.reply(429, b"busy", "text/plain", Retry_After=retry_after)
            return self.reply(200, *self.server.files["/img/good"][:2])
        if path in self.server.redirects:
            code, location = self.server.redirects[path]
            location = location.encode().decode("latin-1")  # send_header encodes latin-1
            return self.reply(code, b"", "text/plain", Location=location)
        if path.startswith("/chain/"):  # /chain/3 -> /chain/2 -> ... -> /chain/0 -> the image
            left = int(path.rsplit("/", 1)[1])
            target = f"/chain/{left - 1}" if left else "/img/good"
            return self.reply(302, b"", "text/plain", Location=target)
        if path == "/loop":
            return self.reply(302, b"", "text/plain", Location="/loop")
        if path == "/redirect-ok":
            return self.reply(302, b"", "text/plain", Location="/img/good")
        if path.startswith("/nolength/"):  # body ends when the connection closes
            body, ctype, _ = self.server.files[path.removeprefix("/nolength")]
            return self.reply(200, body, ctype, with_length=False)
        if path.startswith("/slow/"):  # a slow but healthy server: keeps a build busy
            time.sleep(0.3)
            return self.reply(200, *self.server.files["/img/good"][:2])
        if path == "/stall":
            return self.stall()
        if path in self.server.files:
            body, ctype, headers = self.server.files[path]
            return self.reply(200, body, ctype, **headers)
        return self.reply(404, b"not found", "text/plain")

    def reply(self, code: int, body: bytes, ctype: str, with_length=True, **headers: str) -> None:
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        if with_length:
            self.send_header("Content-Length", str(len(body)))
        else:
            self.send_header("Connection", "close")
            self.close_connection = True
        for name, value in headers.items():
            self.send_header(name.replace("_", "-"), value)
        self.end_headers()
        self.wfile.write(body)

    def stall(self) -> None:
        """Headers and the first bytes of a JPEG, then nothing until the test ends."""
        self.send_response(200)
        self.send_header("Content-Type", "image/jpeg")
        self.send_header("Content-Length", "100000")
        self.end_headers()
        self.wfile.write(b"\xff\xd8\xff" + b"\0" * 1000)
        self.wfile.flush()
        self.server.release.wait(120)
