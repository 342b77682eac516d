"""Passwords, permissions and the login decision, with no I/O.

Passwords are stored as scrypt hashes in the text form
``scrypt$<n>$<r>$<p>$<salt base64>$<key base64>`` (what ``amqlite passwd``
prints and ``[[users]] password_hash`` holds). scrypt is slow on purpose (about
50 ms and 16 MiB at the default ``n = 2**14``): the server must call
:meth:`Authenticator.authenticate` in a worker thread
(``await trio.to_thread.run_sync(authenticator.authenticate, ...)``) so a login
never stalls the event loop.

Permissions follow RabbitMQ's three regexes per user and vhost (configure,
write, read), with RabbitMQ's semantics: a pattern is *searched* in the
resource name (anchor it with ``^...$`` to match whole names), and the empty
pattern matches nothing.

Tags (``[[users]] tags``) grant what permissions cannot, as RabbitMQ's user
tags do: ``administrator`` (switchover, trace on/off, anything that changes the
node; it implies ``monitoring``, ``management`` and ``peering``), ``monitoring``
(the full ``status`` of every vhost and connection, monitor connections; it
implies ``management``), ``management`` (the HTTP management API: its own vhosts),
``cluster`` (opening the HA pair's peer link) and ``peering`` (opening an
exchange peering link). :func:`require_tag` is the one check.

Role constraints (``[[constraints]]``, the Flex message service's
security-constraint) come on top: a user carries roles (``[[users]] roles``), and a
constraint names the roles that may ``send`` to or ``subscribe`` to one exchange or
queue of a vhost. :meth:`AuthenticatedUser.refusal` is the one check.

Every refusal carries reply code 403 and a text that reveals nothing an attacker
could use (not whether the login exists, nor whether the vhost exists); the
detail goes to ``log_reason`` for the server's log only.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import ipaddress
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, TypeAlias

from amqlite.errors import AccessRefused, ReplyCode

if TYPE_CHECKING:
    from amqlite.config import ConstraintConfig, UserConfig

__all__ = [
    "GUEST_LOGIN",
    "SCRYPT_N",
    "SCRYPT_P",
    "SCRYPT_R",
    "TAGS",
    "AuthRefused",
    "AuthResult",
    "AuthenticatedUser",
    "Authenticator",
    "ConstrainedAction",
    "PermissionKind",
    "Permissions",
    "ResourceType",
    "RoleConstraint",
    "RoleConstraints",
    "ScryptHash",
    "Tag",
    "check",
    "effective_tags",
    "hash_password",
    "is_loopback",
    "parse_password_hash",
    "require_tag",
    "verify_password",
]

SCRYPT_N = 2**14
SCRYPT_R = 8
SCRYPT_P = 1
SALT_BYTES = 16
KEY_BYTES = 32

_MIN_SALT_BYTES = 8
_MIN_KEY_BYTES = 16
_MAX_KEY_BYTES = 1024
_MAX_SCRYPT_MEMORY = 256 * 1024 * 1024
_HASH_SCHEME = "scrypt"
_B64 = r"[A-Za-z0-9+/]+={0,2}"
_HASH_PATTERN = re.compile(
    rf"{_HASH_SCHEME}\$([1-9][0-9]{{0,9}})\$([1-9][0-9]{{0,3}})\$([1-9][0-9]{{0,3}})\$({_B64})\$({_B64})"
)

GUEST_LOGIN = "guest"
_GUEST_PASSWORD = "guest"

PermissionKind = Literal["configure", "write", "read"]
Tag = Literal["administrator", "monitoring", "management", "cluster", "peering"]
#: every tag a user may carry (``[[users]] tags``)
TAGS: tuple[Tag, ...] = ("administrator", "monitoring", "management", "cluster", "peering")
_IMPLIED: Mapping[str, frozenset[str]] = {
    "administrator": frozenset({"monitoring", "management", "peering"}),
    "monitoring": frozenset({"management"}),
}
ResourceType = Literal["exchange", "queue"]
ConstrainedAction = Literal["send", "subscribe"]

_BAD_CREDENTIALS = "access refused: bad login or password"


@dataclass(frozen=True, slots=True)
class ScryptHash:
    """A parsed password hash; :func:`parse_password_hash` guarantees it is usable.

    "Usable" means ``n`` is a power of two, the memory scrypt needs stays under
    256 MiB, the salt has at least 8 bytes and the key 16 to 1024 bytes.
    """

    n: int
    r: int
    p: int
    salt: bytes = field(repr=False)
    key: bytes = field(repr=False)

    def encode(self) -> str:
        """The text form stored in the config file."""
        salt = base64.b64encode(self.salt).decode("ascii")
        key = base64.b64encode(self.key).decode("ascii")
        return f"{_HASH_SCHEME}${self.n}${self.r}${self.p}${salt}${key}"

    def problem(self) -> str | None:
        """Why these parameters are unusable, or None when they are fine."""
        if self.n < 2 or self.n & (self.n - 1):
            return f"n must be a power of two >= 2, got {self.n}"
        if self.r < 1 or self.p < 1:
            return "r and p must be at least 1"
        if self._memory_bytes() > _MAX_SCRYPT_MEMORY:
            return "n, r and p need more than 256 MiB"
        if len(self.salt) < _MIN_SALT_BYTES:
            return f"the salt must have at least {_MIN_SALT_BYTES} bytes"
        if not _MIN_KEY_BYTES <= len(self.key) <= _MAX_KEY_BYTES:
            return f"the key must have {_MIN_KEY_BYTES} to {_MAX_KEY_BYTES} bytes"
        return None

    def derive(self, password: str) -> bytes:
        """scrypt of ``password`` (UTF-8) with this hash's salt and parameters."""
        return hashlib.scrypt(
            password.encode("utf-8"),
            salt=self.salt,
            n=self.n,
            r=self.r,
            p=self.p,
            maxmem=self._memory_bytes() + 1024 * 1024,
            dklen=len(self.key),
        )

    def _memory_bytes(self) -> int:
        return 128 * self.r * (self.n + self.p + 2)


def parse_password_hash(encoded: str) -> ScryptHash | None:
    """Parse ``scrypt$n$r$p$salt$key``; None for anything malformed or unusable."""
    if not isinstance(encoded, str):
        return None
    match = _HASH_PATTERN.fullmatch(encoded)
    if match is None:
        return None
    n, r, p, salt_b64, key_b64 = match.groups()
    try:
        salt = base64.b64decode(salt_b64, validate=True)
        key = base64.b64decode(key_b64, validate=True)
    except binascii.Error:
        return None
    parsed = ScryptHash(int(n), int(r), int(p), salt, key)
    return None if parsed.problem() else parsed


def hash_password(
    password: str,
    *,
    salt: bytes | None = None,
    n: int = SCRYPT_N,
    r: int = SCRYPT_R,
    p: int = SCRYPT_P,
) -> str:
    """Hash ``password`` for the config file (``amqlite passwd`` prints this).

    A fresh random 16-byte salt is drawn unless ``salt`` is given (tests). The
    defaults (n=2**14, r=8, p=1, 32-byte key) cost about 50 ms; lower ``n`` only
    in tests. Raises ValueError for parameters :func:`parse_password_hash` would
    refuse, so every returned string verifies.
    """
    parsed = ScryptHash(n, r, p, os.urandom(SALT_BYTES) if salt is None else salt, bytes(KEY_BYTES))
    problem = parsed.problem()
    if problem is not None:
        raise ValueError(f"cannot hash password: {problem}")
    return ScryptHash(n, r, p, parsed.salt, parsed.derive(password)).encode()


def verify_password(password: str, encoded: str) -> bool:
    """True when ``password`` matches ``encoded``; never raises.

    A malformed or unusable hash, or a password that is not encodable text,
    gives False. The comparison of derived keys is constant-time.
    """
    parsed = parse_password_hash(encoded)
    if parsed is None:
        return False
    try:
        derived = parsed.derive(password)
    except (ValueError, MemoryError, UnicodeEncodeError, AttributeError):
        return False
    return hmac.compare_digest(derived, parsed.key)


@dataclass(frozen=True, slots=True)
class Permissions:
    """One user's rights in one vhost: three regexes over resource names.

    ``configure`` covers declaring and deleting, ``write`` publishing to an
    exchange and binding into a queue, ``read`` consuming from a queue and
    binding from an exchange (as RabbitMQ). A pattern is searched in the name, as
    RabbitMQ does (``^app[.]`` is a prefix rule); the empty pattern matches
    nothing. Invalid regexes raise ``re.error`` here; the config loader rejects
    them earlier with the key named.
    """

    configure: str
    write: str
    read: str
    _compiled: Mapping[str, re.Pattern[str]] = field(
        init=False, repr=False, compare=False, hash=False
    )

    def __post_init__(self) -> None:
        compiled = {
            "configure": re.compile(self.configure),
            "write": re.compile(self.write),
            "read": re.compile(self.read),
        }
        object.__setattr__(self, "_compiled", compiled)

    @classmethod
    def full(cls) -> Permissions:
        """Everything allowed (``.*`` three times)."""
        return cls(".*", ".*", ".*")

    def allows(self, kind: PermissionKind, resource: str) -> bool:
        """True when ``kind`` access to the resource named ``resource`` is granted."""
        pattern = self._compiled[kind]
        return pattern.pattern != "" and pattern.search(resource) is not None


@dataclass(frozen=True, slots=True)
class RoleConstraint:
    """Who may ``send`` to / ``subscribe`` to one exchange or queue (None: anyone
    the permissions allow); ``label`` is how refusals name it."""

    label: str
    vhost: str
    resource_type: str
    resource: str
    send: frozenset[str] | None = None
    subscribe: frozenset[str] | None = None

    @classmethod
    def from_config(cls, c: ConstraintConfig) -> RoleConstraint:
        return cls(
            c.label,
            c.vhost,
            c.resource_type,
            c.resource,
            None if c.send is None else frozenset(c.send),
            None if c.subscribe is None else frozenset(c.subscribe),
        )


class RoleConstraints:
    """The role constraints of one vhost, by (resource type, name)."""

    __slots__ = ("_by_resource", "queues_send")

    def __init__(self, constraints: Iterable[RoleConstraint] = ()) -> None:
        self._by_resource = {(c.resource_type, c.resource): c for c in constraints}
        #: some queue has a send constraint: a publish to the default exchange looks
        self.queues_send = any(
            c.resource_type == "queue" and c.send is not None for c in self._by_resource.values()
        )

    def __bool__(self) -> bool:
        return bool(self._by_resource)

    def refusal(
        self,
        action: ConstrainedAction,
        resource_type: ResourceType,
        name: str,
        user: str,
        roles: frozenset[str],
    ) -> str | None:
        """Why ``user`` with ``roles`` may not ``action`` the resource (the text names
        the constraint), or None when no constraint stops it."""
        c = self._by_resource.get((resource_type, name))
        if c is None:
            return None
        allowed = c.send if action == "send" else c.subscribe
        if allowed is None or not allowed.isdisjoint(roles):
            return None
        needed = ", ".join(sorted(allowed)) or "none"
        has = ", ".join(sorted(roles)) or "none"
        return (
            f"access refused: {action} on {resource_type} {name!r} in vhost {c.vhost!r} "
            f"needs one of the roles [{needed}] (constraint {c.label}); "
            f"user {user!r} has roles [{has}]"
        )


_NO_CONSTRAINTS = RoleConstraints()


def effective_tags(tags: Iterable[str]) -> frozenset[str]:
    """``tags`` with what they imply (``administrator`` -> ``monitoring``, ...)."""
    given = frozenset(tags)
    return given.union(*(_IMPLIED.get(tag, frozenset()) for tag in given))


@dataclass(frozen=True, slots=True)
class AuthenticatedUser:
    """A successful login: who, what they may do in the vhost they chose, their
    tags (as configured, see :meth:`has_tag` for what they imply) and their
    permissions in every vhost (``grants``: what a filtered ``status`` shows)."""

    name: str
    permissions: Permissions
    tags: frozenset[str] = frozenset()
    grants: Mapping[str, Permissions] = field(default_factory=dict, compare=False, hash=False)
    roles: frozenset[str] = frozenset()
    #: the role constraints of the vhost the user logged into
    constraints: RoleConstraints = field(default=_NO_CONSTRAINTS, compare=False, hash=False)

    def has_tag(self, tag: Tag) -> bool:
        """True when the user carries ``tag`` or a tag that implies it."""
        return tag in effective_tags(self.tags)

    def refusal(
        self, action: ConstrainedAction, resource_type: ResourceType, name: str
    ) -> str | None:
        """Why a role constraint of this vhost stops this user from ``action`` on the
        exchange or queue ``name`` (a 403 text naming the constraint), or None."""
        constraints = self.constraints
        if not constraints:
            return None
        return constraints.refusal(action, resource_type, name, self.name, self.roles)


@dataclass(frozen=True, slots=True)
class AuthRefused:
    """A refused login. Send ``code`` and ``text``; log ``log_reason``, never send it."""

    code: int
    text: str
    log_reason: str


AuthResult: TypeAlias = AuthenticatedUser | AuthRefused


@dataclass(frozen=True, slots=True)
class _UserRecord:
    password_hash: str
    permissions: Mapping[str, Permissions]
    tags: frozenset[str]
    roles: frozenset[str] = frozenset()


class Authenticator:
    """Decides logins from the configured users and vhosts.

    With no users configured, only ``guest``/``guest`` is accepted, only from a
    loopback address, and guest gets full permissions on every vhost and every
    tag (the single-user development set-up). With users configured, there is no
    guest unless a user is named ``guest``.

    The answer for an unknown login costs the same scrypt work as a wrong
    password, so response time does not reveal which logins exist.
    """

    def __init__(
        self,
        users: Iterable[UserConfig],
        vhosts: Iterable[str],
        constraints: Iterable[ConstraintConfig] = (),
    ) -> None:
        self._vhosts = frozenset(vhosts)
        by_vhost: dict[str, list[RoleConstraint]] = {}
        for c in constraints:
            by_vhost.setdefault(c.vhost, []).append(RoleConstraint.from_config(c))
        self._constraints = {vhost: RoleConstraints(cs) for vhost, cs in by_vhost.items()}
        self._users: dict[str, _UserRecord] = {
            user.name: _UserRecord(
                user.password_hash,
                {
                    grant.vhost: Permissions(grant.configure, grant.write, grant.read)
                    for grant in user.permissions
                },
                frozenset(user.tags),
                frozenset(user.roles),
            )
            for user in users
        }
        self._timing_decoy = next((record.password_hash for record in self._users.values()), None)

    @property
    def guest_only(self) -> bool:
        """True when no users are configured and the loopback-only guest applies."""
        return not self._users

    def authenticate(self, login: str, password: str, vhost: str, remote_host: str) -> AuthResult:
        """Check credentials, then vhost access. Slow (scrypt): run in a worker thread.

        ``remote_host`` is the numeric address of the connecting side (IPv4, IPv6,
        optionally in brackets); it matters only for the guest rule.
        """
        refused = self.check_credentials(login, password, remote_host)
        if refused is not None:
            return refused
        return self.authorize(login, vhost)

    def check_credentials(self, login: str, password: str, remote_host: str) -> AuthRefused | None:
        """None when ``login``/``password`` may log in from ``remote_host``; the first
        half of :meth:`authenticate` (AMQP checks credentials at ``start-ok`` and
        the vhost at ``open``). Slow (scrypt): run in a worker thread."""
        if self.guest_only:
            if login != GUEST_LOGIN:
                return _refused(f"unknown user {login!r} (no users configured: only guest)")
            guest = _GUEST_PASSWORD.encode()
            if not hmac.compare_digest(password.encode("utf-8", "replace"), guest):
                return _refused("wrong password for user 'guest'")
            if not is_loopback(remote_host):
                return _refused(f"guest is loopback-only (peer {remote_host!r})")
            return None
        record = self._users.get(login)
        if record is None:
            if self._timing_decoy is not None:
                verify_password(password, self._timing_decoy)
            return _refused(f"unknown user {login!r}")
        if not verify_password(password, record.password_hash):
            return _refused(f"wrong password for user {login!r}")
        return None

    def authorize(self, login: str, vhost: str) -> AuthResult:
        """What ``login`` (whose credentials passed) may do in ``vhost``."""
        if vhost not in self._vhosts:
            return _refused(f"unknown vhost {vhost!r}", vhost=vhost)
        if self.guest_only:
            full = Permissions.full()
            everywhere = dict.fromkeys(sorted(self._vhosts), full)
            return AuthenticatedUser(
                GUEST_LOGIN,
                full,
                frozenset(TAGS),
                everywhere,
                constraints=self._constraints.get(vhost, _NO_CONSTRAINTS),
            )
        record = self._users.get(login)
        if record is None:
            return _refused(f"user {login!r} has no permissions on vhost {vhost!r}", vhost=vhost)
        permissions = record.permissions.get(vhost)
        if permissions is None:
            return _refused(f"user {login!r} has no permissions on vhost {vhost!r}", vhost=vhost)
        return AuthenticatedUser(
            login,
            permissions,
            record.tags,
            record.permissions,
            record.roles,
            self._constraints.get(vhost, _NO_CONSTRAINTS),
        )

    def management_user(self, login: str) -> AuthenticatedUser | None:
        """Who ``login`` (whose credentials passed) is across the node, for the
        HTTP API: tags and every vhost's permissions in ``grants``; ``permissions``
        (one vhost's) allow nothing. None for an unknown login."""
        nothing = Permissions("", "", "")
        if self.guest_only:
            if login != GUEST_LOGIN:
                return None
            full = Permissions.full()
            everywhere = dict.fromkeys(sorted(self._vhosts), full)
            return AuthenticatedUser(GUEST_LOGIN, nothing, frozenset(TAGS), everywhere)
        record = self._users.get(login)
        if record is None:
            return None
        return AuthenticatedUser(login, nothing, record.tags, record.permissions)


def _refused(log_reason: str, *, vhost: str | None = None) -> AuthRefused:
    text = _BAD_CREDENTIALS if vhost is None else f"access refused: no access to vhost {vhost!r}"
    return AuthRefused(int(ReplyCode.ACCESS_REFUSED), text, log_reason)


def is_loopback(remote_host: str) -> bool:
    """True for 127.0.0.0/8, ::1 and IPv4-mapped loopback; False for names and junk."""
    host = remote_host.strip()
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped.is_loopback
    return address.is_loopback


def require_tag(user: AuthenticatedUser, tag: Tag, action: str) -> None:
    """Raise :class:`~amqlite.errors.AccessRefused` (403) unless ``user`` carries
    ``tag`` (or one that implies it); the text names the action, the tag needed
    and the tags the user has, for the log and the user alike."""
    if not user.has_tag(tag):
        has = ", ".join(sorted(user.tags)) or "none"
        raise AccessRefused(
            f"access refused: {action} needs the {tag!r} tag (user {user.name!r} has tags: {has})"
        )


def check(
    user: AuthenticatedUser,
    vhost: str,
    kind: PermissionKind,
    resource: str,
    *,
    resource_type: ResourceType,
) -> None:
    """Raise :class:`~amqlite.errors.AccessRefused` (403) unless ``user`` may do this.

    ``vhost`` only labels the message: ``user.permissions`` already belong to
    the vhost the user logged into.
    """
    if not user.permissions.allows(kind, resource):
        raise AccessRefused(
            f"access to {resource_type} {resource!r} in vhost {vhost!r} "
            f"refused for user {user.name!r} ({kind})"
        )
