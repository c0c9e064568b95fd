"""A read-only Python package index (PEP 503 "simple" pages) over one directory of wheels.

``scripts/images.sh`` serves the wheels it downloaded once from PyPI with this, on the loopback of the
network namespace the image builds run in, and passes ``PIP_INDEX_URL=http://127.0.0.1:PORT/simple``
to the builds: every image installs the same files, nothing is downloaded twice, and a build can reach
nothing but this index. Standard library only (it runs before any environment exists).

    python3 scripts/pyindex.py DIR [--port 3141]
"""

from __future__ import annotations

import argparse
import html
import http.server
import re
import sys
import urllib.parse
from pathlib import Path


def normalize(name: str) -> str:
    """PEP 503 name normalisation."""
    return re.sub(r"[-_.]+", "-", name).lower()


def project_of(filename: str) -> str:
    """The project a distribution file belongs to (wheel ``name-version-...``, sdist ``name-version.tar.gz``)."""
    if filename.endswith(".whl"):
        return normalize(filename.split("-", 1)[0])
    stem = re.sub(r"\.(tar\.gz|zip|tar\.bz2)$", "", filename)
    return normalize(stem.rsplit("-", 1)[0])


def projects(root: Path) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for path in sorted(root.iterdir()):
        if path.is_file() and re.search(r"\.(whl|tar\.gz|zip|tar\.bz2)$", path.name):
            found.setdefault(project_of(path.name), []).append(path.name)
    return found


def page(title: str, links: list[tuple[str, str]]) -> bytes:
    body = "".join(f'<a href="{html.escape(href)}">{html.escape(text)}</a><br/>\n' for href, text in links)
    return f"<!DOCTYPE html>\n<html><head><title>{html.escape(title)}</title></head><body>\n{body}</body></html>\n".encode()


class Handler(http.server.BaseHTTPRequestHandler):
    root: Path
    index: dict[str, list[str]]

    def do_GET(self) -> None:
        path = urllib.parse.unquote(urllib.parse.urlsplit(self.path).path)
        parts = [p for p in path.split("/") if p]
        if parts == ["simple"]:
            self._send(page("Simple index", [(f"{name}/", name) for name in sorted(self.index)]))
        elif len(parts) == 2 and parts[0] == "simple":
            files = self.index.get(normalize(parts[1]))
            if files is None:
                self.send_error(404, f"no project {parts[1]!r} in {self.root}")
                return
            self._send(page(f"Links for {parts[1]}", [(f"../../files/{f}", f) for f in files]))
        elif len(parts) == 2 and parts[0] == "files" and (self.root / parts[1]).is_file():
            self._send_file(self.root / parts[1])
        else:
            self.send_error(404)

    def _send(self, body: bytes) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _send_file(self, path: Path) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(path.stat().st_size))
        self.end_headers()
        with path.open("rb") as fh:
            while chunk := fh.read(1 << 20):
                self.wfile.write(chunk)

    def log_message(self, format: str, *args: object) -> None:
        if args and str(args[1]) != "200":  # only what went wrong
            sys.stderr.write(f"pyindex: {format % args}\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", type=Path)
    parser.add_argument("--port", type=int, default=3141)
    args = parser.parse_args()
    Handler.root = args.root.resolve()
    Handler.index = projects(Handler.root)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    print(f"pyindex: {len(Handler.index)} projects from {Handler.root} on 127.0.0.1:{args.port}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
