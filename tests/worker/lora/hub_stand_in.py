"""A local stand-in for the few Hugging Face Hub endpoints that ``huggingface_hub`` calls.

No hub is reachable from the test machines, so ``hf://`` is tested against
this: a real HTTP server on 127.0.0.1 that serves one repository's files the
way the Hub does (model info JSON, ``resolve`` with ``X-Repo-Commit`` and
``ETag``), checks the bearer token, and records every request.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import unquote

COMMIT_SHA = "0123456789abcdef0123456789abcdef01234567"


@dataclass
class HubRepo:
    """One repository: its id, revision name, files, and the token it requires (if any)."""

    repo_id: str
    files: dict[str, bytes]
    revision: str = "main"
    token: str | None = None
    requests: list[str] = field(default_factory=list)
    authorizations: list[str | None] = field(default_factory=list)


def _etag(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _handler(repo: HubRepo) -> type[BaseHTTPRequestHandler]:
    info_paths = {
        f"/api/models/{repo.repo_id}",
        f"/api/models/{repo.repo_id}/revision/{repo.revision}",
        f"/api/models/{repo.repo_id}/revision/{COMMIT_SHA}",
    }
    tree_paths = {f"/api/models/{repo.repo_id}/tree/{rev}" for rev in (repo.revision, COMMIT_SHA)}
    resolve_prefixes = [f"/{repo.repo_id}/resolve/{rev}/" for rev in (repo.revision, COMMIT_SHA)]

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:  # keep the test output clean
            pass

        def do_GET(self) -> None:
            self._answer(body=True)

        def do_HEAD(self) -> None:
            self._answer(body=False)

        def _answer(self, *, body: bool) -> None:
            path = unquote(self.path.split("?", 1)[0])
            repo.requests.append(f"{self.command} {path}")
            repo.authorizations.append(self.headers.get("authorization"))
            if (
                repo.token is not None
                and self.headers.get("authorization") != f"Bearer {repo.token}"
            ):
                return self._send(
                    401, b'{"error": "Invalid credentials"}', body, {"X-Error-Code": "RepoNotFound"}
                )
            if path in info_paths:
                siblings = [{"rfilename": name} for name in sorted(repo.files)]
                info = {"id": repo.repo_id, "sha": COMMIT_SHA, "siblings": siblings}
                return self._send(
                    200, json.dumps(info).encode(), body, {"Content-Type": "application/json"}
                )
            if path in tree_paths:
                tree = [
                    {"type": "file", "path": name, "size": len(data), "oid": _etag(data)}
                    for name, data in sorted(repo.files.items())
                ]
                return self._send(
                    200, json.dumps(tree).encode(), body, {"Content-Type": "application/json"}
                )
            for prefix in resolve_prefixes:
                name = path.removeprefix(prefix)
                if path.startswith(prefix) and name in repo.files:
                    data = repo.files[name]
                    headers = {
                        "X-Repo-Commit": COMMIT_SHA,
                        "ETag": f'"{_etag(data)}"',
                        "Content-Type": "application/octet-stream",
                    }
                    return self._send(200, data, body, headers)
            self._send(
                404, b'{"error": "Repository not found"}', body, {"X-Error-Code": "RepoNotFound"}
            )

        def _send(self, status: int, data: bytes, body: bool, headers: dict[str, str]) -> None:
            self.send_response(status)
            for name, value in headers.items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if body:
                self.wfile.write(data)

    return Handler


@contextmanager
def serve_hub(repo: HubRepo) -> Iterator[str]:
    """Serve ``repo`` on a free port of 127.0.0.1; yields the endpoint URL for ``HF_ENDPOINT``."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(repo))
    thread = threading.Thread(target=server.serve_forever, name="hub-stand-in", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
