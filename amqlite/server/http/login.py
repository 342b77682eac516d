"""HTTP basic authentication with the broker's own users (ASGI middleware).

Every path under ``/api/`` needs credentials: none (or a malformed header) gets
401 with ``WWW-Authenticate: Basic``, wrong ones 401, a user without the
``management`` tag (or one that implies it) 403. ``/metrics`` and ``/health/*``
are open, as RabbitMQ's Prometheus endpoint is.

Passwords are scrypt hashes, about 50 ms each on purpose, so a check runs in a
worker thread (as the native handshake's does) and a success is remembered for
``CACHE_SECONDS`` under an HMAC of the credentials with a key drawn at start (a
dashboard polling every few seconds costs one scrypt a minute, not one a
request; nothing in memory gives the password back).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import os
from typing import Any

import structlog
import trio
from starlette.types import ASGIApp, Receive, Scope, Send

from amqlite.auth import Authenticator

__all__ = ["USER_SCOPE_KEY", "BasicAuth", "CredentialCache"]

USER_SCOPE_KEY = "amqlite.user"
CACHE_SECONDS = 60.0
CACHE_ENTRIES = 1024
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


def _credentials(scope: Scope) -> tuple[str, str] | None:
    for name, value in scope.get("headers", ()):
        if name == b"authorization":
            scheme, _, token = value.partition(b" ")
            if scheme.lower() != b"basic":
                return None
            try:
                decoded = base64.b64decode(token.strip(), validate=True).decode("utf-8")
            except (binascii.Error, UnicodeDecodeError):
                return None
            login, colon, password = decoded.partition(":")
            return (login, password) if colon else None
    return None


def _from_page(scope: Scope) -> bool:
    return any(name == b"x-amqlite-page" for name, _ in scope.get("headers", ()))


async def _send_json(send: Send, status: int, body: dict[str, Any], *extra: Any) -> None:
    payload = json.dumps(body).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(payload)).encode()),
        *extra,
    ]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": payload})


class BasicAuth:
    """Puts the :class:`~amqlite.auth.AuthenticatedUser` (tags and every vhost's
    permissions) in ``scope["amqlite.user"]`` for ``/api/`` requests, or answers
    401/403 itself."""

    def __init__(self, app: ASGIApp, authenticator: Authenticator) -> None:
        self.app = app
        self.authenticator = authenticator
        self.cache = CredentialCache()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not scope["path"].startswith("/api/"):
            await self.app(scope, receive, send)
            return
        credentials = _credentials(scope)
        # the management page asks with its own form: no browser dialog for it
        challenge = () if _from_page(scope) else ((b"www-authenticate", REALM.encode()),)
        if credentials is None:
            await _send_json(
                send, 401, {"error": "not_authorised", "reason": "Not_Authorized"}, *challenge
            )
            return
        login, password = credentials
        client = scope.get("client") or ("", 0)
        if not await self._check(login, password, str(client[0])):
            log.warning("http_login_refused", login=login, remote=client[0])
            await _send_json(
                send, 401, {"error": "not_authorised", "reason": "Login failed"}, *challenge
            )
            return
        user = self.authenticator.management_user(login)
        if user is None or not user.has_tag("management"):
            await _send_json(
                send,
                403,
                {
                    "error": "not_authorised",
                    "reason": f"user {login!r} has no 'management' (or monitoring, "
                    "administrator) tag",
                },
            )
            return
        scope[USER_SCOPE_KEY] = user
        await self.app(scope, receive, send)

    async def _check(self, login: str, password: str, remote_host: str) -> bool:
        auth = self.authenticator
        if auth.guest_only:  # a plain comparison, and the loopback rule needs the address
            return auth.check_credentials(login, password, remote_host) is None
        now = trio.current_time()
        if self.cache.known(login, password, now):
            return True
        refused = await trio.to_thread.run_sync(
            auth.check_credentials, login, password, remote_host
        )
        if refused is not None:
            return False
        self.cache.remember(login, password, now)
        return True
