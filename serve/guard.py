"""Who may use the server: only the user's own pages and programs (docs/serve.md, "Security").

One ASGI middleware, `Guard`, checks every request before any route sees it:

- **Host** (DNS rebinding): a page on evil.example whose name is re-pointed at 127.0.0.1 reaches this server
  with `Host: evil.example`; only the names this server was started under are answered (the loopback names,
  `--host`, `--allow_host`), anything else is 421.
- **Cross-site requests** (CSRF): a request whose `Sec-Fetch-Site` says another site sent it, or whose `Origin`
  is not this server, is 403 — every request but the page itself, GETs included, since `GET /speak?text=…` does
  work a cross-site `<img src=…>` could otherwise start; and every POST must carry the `X-Requested-By` header,
  which a cross-site HTML form or a `fetch(..., {mode: "no-cors"})` cannot send (a custom header makes the browser
  ask first with a CORS preflight, which this server never grants). The page sends it; curl users add
  `-H "X-Requested-By: curl"`. A GET needs no header, so `curl "…/speak?text=Salom" -o salom.wav` works as with
  Piper's and coqui's servers, while browsers (which send `Sec-Fetch-Site`) are refused from other sites.
- **Token** (`--token`): when one is set, every request but the page itself (`GET /`, which holds no secret)
  needs `Authorization: Bearer <token>`, else 401.

Each refusal is one line, `{"error": ...}`, in the API's shape. Why not Starlette's TrustedHostMiddleware: it
answers 400 with a fixed text; the user (and the test) needs the status that says "wrong host" and which names
this server answers to.
"""

from __future__ import annotations

import hmac
import ipaddress
import json
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

CLIENT_HEADER = "X-Requested-By"  # any value; what a cross-site form or no-cors fetch cannot send
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")
WILDCARDS = ("0.0.0.0", "::", "")


def is_loopback(host: str) -> bool:
    """Whether binding to `host` keeps the server on this machine (localhost, 127.x, ::1)."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def host_name(value: str) -> str | None:
    """The name of a Host / Origin authority without its port (`[::1]:8000` → `::1`), lower case; None when it is
    not a valid authority."""
    if not value or any(c in value for c in "@/?#\\ "):  # userinfo or a path: no browser sends that as a host
        return None
    try:
        parts = urlsplit(f"//{value}")
        parts.port  # noqa: B018 - raises ValueError on a port that is not a number
    except ValueError:
        return None
    return parts.hostname


@dataclass
class Access:
    """What `Guard` admits: the host names this server answers to and the token every request needs (None: none)."""

    hosts: frozenset[str] = field(default_factory=lambda: frozenset(LOOPBACK_NAMES))
    token: str | None = None

    @classmethod
    def for_bind(cls, bind: str, allow: tuple[str, ...] = (), token: str | None = None) -> Access:
        """The loopback names, the address bound (unless it is a wildcard such as 0.0.0.0) and the `allow`ed names."""
        names = set(LOOPBACK_NAMES) | {n.strip("[]").lower() for n in allow}
        if bind not in WILDCARDS:
            names.add(bind.strip("[]").lower())
        return cls(frozenset(names), token or None)


class Refused(Exception):
    """A request `Guard` will not pass on: its status and one line saying why and what to do."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class Guard:
    """The ASGI middleware that admits only requests `access` allows (see the module's docstring)."""

    def __init__(self, app: ASGIApp, access: Access) -> None:
        self.app, self.access = app, access

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        try:
            self.check(scope)
        except Refused as e:
            headers = [(b"content-type", b"application/json")]
            if e.status == 401:
                headers.append((b"www-authenticate", b"Bearer"))
            await send({"type": "http.response.start", "status": e.status, "headers": headers})
            await send({"type": "http.response.body", "body": json.dumps({"error": str(e)}).encode()})
            return
        await self.app(scope, receive, send)

    def check(self, scope: Scope) -> None:
        """Raise Refused unless the request may reach the routes."""
        headers = Headers(scope=scope)
        host = headers.get("host", "")
        name = host_name(host)
        if name not in self.access.hosts:
            raise Refused(421, f"this server does not answer to the host name {host[:80]!r}; it answers to "
                               f"{', '.join(sorted(self.access.hosts))} (start it with --allow_host NAME for another)")
        page = scope["method"] in ("GET", "HEAD") and scope["path"] == "/"  # holds no secret and does no work
        if not page:
            self.check_same_origin(headers, host)
        if scope["method"] not in ("GET", "HEAD") and not headers.get(CLIENT_HEADER):
            raise Refused(403, f"add the header {CLIENT_HEADER} (any value, e.g. curl -H '{CLIENT_HEADER}: curl'): "
                               "it tells this server the request is not a cross-site form")
        if self.access.token is not None and not page:
            given = headers.get("authorization", "")
            if not hmac.compare_digest(given.encode(), f"Bearer {self.access.token}".encode()):
                raise Refused(401, "this server needs its token: send Authorization: Bearer <token>, or open the "
                                   "address the server printed at start (…/#token=…)")

    def check_same_origin(self, headers: Headers, host: str) -> None:
        """A request that does work must come from this server's own page or from a program, never another site
        (a link from another site to the page itself is fine: the caller skips this for `GET /`)."""
        site = headers.get("sec-fetch-site", "")
        if site in ("cross-site", "same-site"):
            raise Refused(403, f"refused a request another site sent (Sec-Fetch-Site: {site}): use this server's own page")
        origin = headers.get("origin")
        if origin is not None:
            parts = urlsplit(origin)
            if parts.scheme not in ("http", "https") or parts.netloc.lower() != host.lower():
                raise Refused(403, f"refused a request from the page at {origin[:80]!r}: only this server's own page "
                                   f"({host}) may send it")
