"""Who is asking: HTTP basic authentication, or the page's login session (ASGI
middleware in front of every ``/api/`` path).

Two ways in, both with the broker's own users:

- **HTTP basic** (scripts, monitors, curl): ``Authorization: Basic ...`` on each
  request. None (or a malformed header) gets 401 with ``WWW-Authenticate: Basic``,
  wrong credentials 401.
- **A login session** (the management page): ``POST /api/login`` with JSON
  ``{"username", "password"}`` sets the cookie ``amqlite_session`` (a random
  token; ``HttpOnly``, ``SameSite=Strict``, ``Secure`` over HTTPS) that stands for
  the user until ``POST /api/logout`` or ``SESSION_IDLE`` seconds without use.
  Against cross-site requests (CSRF): besides ``SameSite=Strict``, a request
  authenticated by the cookie that is not a ``GET`` must carry the header
  ``X-Amqlite-Page``, which a page on another site cannot add without a CORS
  preflight this server never grants (403 otherwise).

A request from the page (``X-Amqlite-Page`` present) gets its 401 without
``WWW-Authenticate``, so the browser shows no dialog over the page's own form. A
user without the ``management`` tag (or one that implies it) gets 403.
``/metrics``, ``/health/*`` and the page's files are open.

Passwords are scrypt hashes, about 50 ms each on purpose, so a check runs in a
worker thread (as the native handshake's does) and a success is remembered for
``CACHE_SECONDS`` under an HMAC of the credentials with a key drawn at start (a
script polling every few seconds costs one scrypt a minute, not one a request;
nothing in memory gives the password back).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import os
import secrets
from http.cookies import SimpleCookie
from typing import Any

import structlog
import trio
from starlette.requests import Request
from starlette.types import ASGIApp, Receive, Scope, Send

from amqlite.auth import AuthenticatedUser, Authenticator

__all__ = ["SESSION_COOKIE", "USER_SCOPE_KEY", "ApiAuth", "CredentialCache", "SessionStore"]

USER_SCOPE_KEY = "amqlite.user"
SESSION_COOKIE = "amqlite_session"
PAGE_HEADER = b"x-amqlite-page"
CACHE_SECONDS = 60.0
CACHE_ENTRIES = 1024
SESSION_IDLE = 30 * 60.0
SESSIONS = 1024
REALM = 'Basic realm="amqlite management"'

log = structlog.get_logger("amqlite.http")


class CredentialCache:
    """Logins whose password checked out recently, keyed by an HMAC."""

    def __init__(self, ttl: float = CACHE_SECONDS, size: int = CACHE_ENTRIES) -> None:
        self._key = os.urandom(32)
        self._ttl = ttl
        self._size = size
        self._until: dict[bytes, float] = {}

    def _digest(self, login: str, password: str) -> bytes:
        text = f"{login}\0{password}".encode("utf-8", "surrogatepass")
        return hmac.new(self._key, text, hashlib.sha256).digest()

    def known(self, login: str, password: str, now: float) -> bool:
        digest = self._digest(login, password)
        until = self._until.get(digest)
        if until is None:
            return False
        if until < now:
            del self._until[digest]
            return False
        return True

    def remember(self, login: str, password: str, now: float) -> None:
        if len(self._until) >= self._size:
            self._until = {k: t for k, t in self._until.items() if t >= now}
            if len(self._until) >= self._size:
                self._until.clear()
        self._until[self._digest(login, password)] = now + self._ttl


class SessionStore:
    """Login sessions: token -> (login, idle deadline). Bounded; the oldest go first."""

    def __init__(self, idle: float = SESSION_IDLE, size: int = SESSIONS) -> None:
        self._idle = idle
        self._size = size
        self._sessions: dict[str, tuple[str, float]] = {}

    def open(self, login: str, now: float) -> str:
        if len(self._sessions) >= self._size:
            live = {t: s for t, s in self._sessions.items() if s[1] >= now}
            while len(live) >= self._size:
                del live[next(iter(live))]
            self._sessions = live
        token = secrets.token_urlsafe(32)
        self._sessions[token] = (login, now + self._idle)
        return token

    def login(self, token: str, now: float) -> str | None:
        """The session's login (and its idle deadline moved on), or None."""
        found = self._sessions.get(token)
        if found is None:
            return None
        if found[1] < now:
            del self._sessions[token]
            return None
        self._sessions[token] = (found[0], now + self._idle)
        return found[0]

    def close(self, token: str) -> None:
        self._sessions.pop(token, None)


def _header(scope: Scope, name: bytes) -> bytes | None:
    for key, value in scope.get("headers", ()):
        if key == name:
            return bytes(value)
    return None


def _credentials(scope: Scope) -> tuple[str, str] | None:
    value = _header(scope, b"authorization")
    if value is None:
        return None
    scheme, _, token = value.partition(b" ")
    if scheme.lower() != b"basic":
        return None
    try:
        decoded = base64.b64decode(token.strip(), validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        return None
    login, colon, password = decoded.partition(":")
    return (login, password) if colon else None


def _session_token(scope: Scope) -> str | None:
    raw = _header(scope, b"cookie")
    if raw is None:
        return None
    cookies: SimpleCookie = SimpleCookie()
    try:
        cookies.load(raw.decode("latin-1"))
    except Exception:  # a malformed Cookie header is no session
        return None
    morsel = cookies.get(SESSION_COOKIE)
    return morsel.value if morsel is not None else None


def _cookie(scope: Scope, token: str, max_age: int) -> tuple[bytes, bytes]:
    secure = "; Secure" if scope.get("scheme") == "https" else ""
    value = f"{SESSION_COOKIE}={token}; Path=/; HttpOnly; SameSite=Strict; Max-Age={max_age}"
    return b"set-cookie", f"{value}{secure}".encode("latin-1")


async def _send_json(send: Send, status: int, body: dict[str, Any] | None, *extra: Any) -> None:
    payload = json.dumps(body).encode() if body is not None else b""
    headers = [(b"content-length", str(len(payload)).encode()), *extra]
    if body is not None:
        headers.append((b"content-type", b"application/json"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": payload})


class ApiAuth:
    """Puts the :class:`~amqlite.auth.AuthenticatedUser` (tags and every vhost's
    permissions) in ``scope["amqlite.user"]`` for ``/api/`` requests, answers
    401/403 itself, and serves ``/api/login`` and ``/api/logout``."""

    def __init__(self, app: ASGIApp, authenticator: Authenticator) -> None:
        self.app = app
        self.authenticator = authenticator
        self.cache = CredentialCache()
        self.sessions = SessionStore()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope["path"] if scope["type"] == "http" else ""
        if not path.startswith("/api/"):
            await self.app(scope, receive, send)
            return
        if path in ("/api/login", "/api/logout") and scope["method"] == "POST":
            if _header(scope, PAGE_HEADER) is None:  # a form posted from another site
                await _send_json(send, 403, {"error": "access_refused", "reason": "no page"})
            elif path == "/api/login":
                await self._login(scope, receive, send)
            else:
                token = _session_token(scope)
                if token is not None:
                    self.sessions.close(token)
                await _send_json(send, 204, None, _cookie(scope, "", 0))
            return
        user = await self._user(scope, send)
        if user is not None:
            scope[USER_SCOPE_KEY] = user
            await self.app(scope, receive, send)

    async def _user(self, scope: Scope, send: Send) -> AuthenticatedUser | None:
        """The user asking, or None once a 401/403 has been sent."""
        from_page = _header(scope, PAGE_HEADER) is not None
        # the page asks with its own form: no browser dialog over it
        challenge = () if from_page else ((b"www-authenticate", REALM.encode()),)
        credentials = _credentials(scope)
        now = trio.current_time()
        if credentials is not None:
            login, password = credentials
            if not await self._check(login, password, scope):
                await _send_json(
                    send, 401, {"error": "not_authorised", "reason": "Login failed"}, *challenge
                )
                return None
        else:
            token = _session_token(scope)
            session_login = self.sessions.login(token, now) if token is not None else None
            if session_login is None:
                reason = "Not_Authorized" if token is None else "the session has ended"
                await _send_json(
                    send, 401, {"error": "not_authorised", "reason": reason}, *challenge
                )
                return None
            if scope["method"] not in ("GET", "HEAD") and not from_page:
                await _send_json(
                    send,
                    403,
                    {
                        "error": "access_refused",
                        "reason": "a change under a login session needs the X-Amqlite-Page "
                        "header (cross-site request refused)",
                    },
                )
                return None
            login = session_login
        return await self._management_user(login, send)

    async def _management_user(self, login: str, send: Send) -> AuthenticatedUser | None:
        user = self.authenticator.management_user(login)
        if user is None or not user.has_tag("management"):
            reason = f"user {login!r} has no 'management' (or monitoring, administrator) tag"
            await _send_json(send, 403, {"error": "not_authorised", "reason": reason})
            return None
        return user

    async def _login(self, scope: Scope, receive: Receive, send: Send) -> None:
        request = Request(scope, receive)
        try:
            body = json.loads(await request.body())
            login, password = body["username"], body["password"]
            if not isinstance(login, str) or not isinstance(password, str):
                raise TypeError
        except (ValueError, KeyError, TypeError):
            reason = 'the body must be JSON {"username": ..., "password": ...}'
            await _send_json(send, 400, {"error": "bad_request", "reason": reason})
            return
        if not await self._check(login, password, scope):
            await _send_json(send, 401, {"error": "not_authorised", "reason": "Login failed"})
            return
        user = await self._management_user(login, send)
        if user is None:
            return
        token = self.sessions.open(login, trio.current_time())
        log.info("http_session_opened", user=login)
        await _send_json(
            send,
            200,
            {"name": user.name, "tags": sorted(user.tags)},
            _cookie(scope, token, int(SESSION_IDLE)),
        )

    async def _check(self, login: str, password: str, scope: Scope) -> bool:
        client = scope.get("client") or ("", 0)
        remote_host = str(client[0])
        auth = self.authenticator
        if auth.guest_only:  # a plain comparison, and the loopback rule needs the address
            ok = auth.check_credentials(login, password, remote_host) is None
        else:
            now = trio.current_time()
            if self.cache.known(login, password, now):
                return True
            refused = await trio.to_thread.run_sync(
                auth.check_credentials, login, password, remote_host
            )
            ok = refused is None
            if ok:
                self.cache.remember(login, password, now)
        if not ok:
            log.warning("http_login_refused", login=login, remote=remote_host)
        return ok
