"""Password hashing, permission regexes, and the login decision (no I/O, fast scrypt)."""

from __future__ import annotations

import base64
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from amqlite.auth import (
    SCRYPT_N,
    TAGS,
    AuthenticatedUser,
    Authenticator,
    AuthRefused,
    Permissions,
    check,
    effective_tags,
    hash_password,
    is_loopback,
    parse_password_hash,
    require_tag,
    verify_password,
)
from amqlite.config import UserConfig, VhostPermissions
from amqlite.errors import AccessRefused, ReplyCode

FAST_N = 2**4
BAD_CREDENTIALS = "access refused: bad login or password"


def fast_hash(password: str) -> str:
    return hash_password(password, n=FAST_N)


# --- hashing ----------------------------------------------------------------------


def test_default_hash_format_and_round_trip() -> None:
    encoded = hash_password("s3cret")

    scheme, n, r, p, salt, key = encoded.split("$")
    assert (scheme, n, r, p) == ("scrypt", str(2**14), "8", "1")
    assert SCRYPT_N == 2**14
    assert len(base64.b64decode(salt, validate=True)) == 16
    assert len(base64.b64decode(key, validate=True)) == 32
    assert verify_password("s3cret", encoded)


def test_known_answer_rfc7914() -> None:
    # RFC 7914 section 12: scrypt("pleaseletmein", "SodiumChloride", N=16384, r=8, p=1).
    expected = bytes.fromhex(
        "7023bdcb3afd7348461c06cd81fd38ebfda8fbba904f8e3ea9b543f6545da1f2"
        "d5432955613f0fcf62d49705242a9af9e61e85dc0d651e40dfcf017b45575887"
    )
    encoded = "$".join(
        [
            "scrypt",
            "16384",
            "8",
            "1",
            base64.b64encode(b"SodiumChloride").decode(),
            base64.b64encode(expected).decode(),
        ]
    )
    assert verify_password("pleaseletmein", encoded)
    assert not verify_password("pleaseletmeout", encoded)


def test_fresh_salt_each_time_and_fixed_salt_is_deterministic() -> None:
    assert fast_hash("pw") != fast_hash("pw")
    salt = b"fixed-salt-16byt"
    assert hash_password("pw", salt=salt, n=FAST_N) == hash_password("pw", salt=salt, n=FAST_N)


def test_wrong_password_is_refused() -> None:
    encoded = fast_hash("right")
    assert not verify_password("wrong", encoded)
    assert not verify_password("", encoded)
    assert not verify_password("right ", encoded)


@settings(max_examples=25, deadline=None)
@given(password=st.text())
def test_any_text_password_round_trips(password: str) -> None:
    try:
        password.encode("utf-8")
    except UnicodeEncodeError:
        with pytest.raises(UnicodeEncodeError):
            fast_hash(password)
        return
    encoded = fast_hash(password)
    assert verify_password(password, encoded)
    assert parse_password_hash(encoded) is not None


GOOD = hash_password("pw", salt=b"0123456789abcdef", n=FAST_N)
_, _N, _R, _P, GOOD_SALT, GOOD_KEY = GOOD.split("$")


@pytest.mark.parametrize(
    "encoded",
    [
        "",
        "scrypt",
        "plain-text-password",
        GOOD.replace("scrypt$", "bcrypt$"),
        GOOD + "$extra",
        GOOD[:-3],  # truncated base64
        f"scrypt$15${_R}${_P}${GOOD_SALT}${GOOD_KEY}",  # n not a power of two
        f"scrypt$1${_R}${_P}${GOOD_SALT}${GOOD_KEY}",  # n too small
        f"scrypt$0${_R}${_P}${GOOD_SALT}${GOOD_KEY}",
        f"scrypt$-16${_R}${_P}${GOOD_SALT}${GOOD_KEY}",
        f"scrypt$ 16${_R}${_P}${GOOD_SALT}${GOOD_KEY}",
        f"scrypt${2**30}${_R}${_P}${GOOD_SALT}${GOOD_KEY}",  # would need 128 GiB
        f"scrypt${_N}$0${_P}${GOOD_SALT}${GOOD_KEY}",
        f"scrypt${_N}${_R}$0${GOOD_SALT}${GOOD_KEY}",
        f"scrypt${_N}${_R}${_P}$c2FsdA==${GOOD_KEY}",  # 4-byte salt
        f"scrypt${_N}${_R}${_P}${GOOD_SALT}$c2hvcnQ=",  # 5-byte key
        f"scrypt${_N}${_R}${_P}${GOOD_SALT}${GOOD_KEY[:-1]}!",
        f"scrypt${_N}${_R}${_P}${GOOD_SALT}$",
    ],
)
def test_malformed_hash_is_false_not_an_exception(encoded: str) -> None:
    assert parse_password_hash(encoded) is None
    assert verify_password("pw", encoded) is False


def test_the_malformed_cases_differ_from_a_good_hash_only_in_the_defect() -> None:
    assert verify_password("pw", GOOD)
    assert verify_password("pw", f"scrypt${_N}${_R}${_P}${GOOD_SALT}${GOOD_KEY}")


def test_non_string_inputs_are_false() -> None:
    assert verify_password("pw", None) is False  # type: ignore[arg-type]
    assert verify_password(None, GOOD) is False  # type: ignore[arg-type]
    assert verify_password("\udc80", GOOD) is False


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"n": 15}, "power of two"),
        ({"n": 1}, "power of two"),
        ({"r": 0}, "at least 1"),
        ({"salt": b"short"}, "salt"),
        ({"n": 2**30}, "256 MiB"),
    ],
)
def test_hash_password_refuses_unusable_parameters(
    kwargs: dict[str, object], fragment: str
) -> None:
    with pytest.raises(ValueError, match=re.escape(fragment)):
        hash_password("pw", **kwargs)  # type: ignore[arg-type]


# --- permissions ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pattern", "resource", "allowed"),
    [
        (".*", "anything", True),
        (".*", "", True),
        ("", "", False),
        ("", "anything", False),
        ("app", "app", True),
        ("app", "app.orders", True),  # searched, as RabbitMQ does
        ("app", "my-app", True),
        ("^app$", "app.orders", False),
        (r"^app\.", "app.orders", True),
        (r"^app\.", "my-app.orders", False),
        (r"app\..*", "app.orders", True),
        (r"^app\..*", "appxorders", False),
        ("^app$", "app", True),
        ("amq\\.gen-.*|app\\..*", "amq.gen-abc", True),
        ("^(amq\\.gen-.*|app\\..*)$", "other", False),
    ],
)
def test_permission_patterns_are_searched_as_in_rabbitmq(
    pattern: str, resource: str, allowed: bool
) -> None:
    permissions = Permissions(configure=pattern, write=pattern, read=pattern)
    for kind in ("configure", "write", "read"):
        assert permissions.allows(kind, resource) is allowed


def test_each_kind_uses_its_own_pattern() -> None:
    permissions = Permissions(configure="", write="out\\..*", read="in\\..*")
    assert not permissions.allows("configure", "out.x")
    assert permissions.allows("write", "out.x")
    assert not permissions.allows("read", "out.x")
    assert permissions.allows("read", "in.x")
    assert not permissions.allows("write", "in.x")


@given(name=st.text(max_size=20))
def test_an_anchored_escaped_name_allows_exactly_that_name(name: str) -> None:
    permissions = Permissions("^" + re.escape(name) + "$", "", "")
    assert permissions.allows("configure", name)
    assert not permissions.allows("configure", name + "x")


def test_permissions_compare_by_pattern_text() -> None:
    assert Permissions(".*", "", "a") == Permissions(".*", "", "a")
    assert hash(Permissions.full()) == hash(Permissions(".*", ".*", ".*"))


def test_invalid_regex_raises_at_construction() -> None:
    with pytest.raises(re.error):
        Permissions("(", "", "")


# --- guest (no users configured) --------------------------------------------------


GUEST_ONLY = Authenticator(users=(), vhosts=("/", "prod"))


@pytest.mark.parametrize(
    "remote_host", ["127.0.0.1", "127.5.5.5", "::1", "[::1]", "::ffff:127.0.0.1"]
)
def test_guest_is_accepted_from_loopback(remote_host: str) -> None:
    result = GUEST_ONLY.authenticate("guest", "guest", "/", remote_host)
    assert result == AuthenticatedUser("guest", Permissions.full(), frozenset(TAGS))


@pytest.mark.parametrize(
    "remote_host", ["10.0.0.1", "192.168.1.2", "::ffff:10.0.0.1", "2001:db8::1", "localhost", ""]
)
def test_guest_is_refused_from_elsewhere(remote_host: str) -> None:
    result = GUEST_ONLY.authenticate("guest", "guest", "/", remote_host)
    assert isinstance(result, AuthRefused)
    assert result.code == ReplyCode.ACCESS_REFUSED
    assert result.text == BAD_CREDENTIALS
    assert "guest is loopback-only" in result.log_reason


def test_guest_has_full_rights_on_every_vhost() -> None:
    result = GUEST_ONLY.authenticate("guest", "guest", "prod", "127.0.0.1")
    assert isinstance(result, AuthenticatedUser)
    for kind in ("configure", "write", "read"):
        assert result.permissions.allows(kind, "any.queue")


@pytest.mark.parametrize(
    ("login", "password", "log_fragment"),
    [
        ("guest", "wrong", "wrong password for user 'guest'"),
        ("admin", "guest", "unknown user 'admin'"),
    ],
)
def test_guest_mode_refuses_other_credentials(login: str, password: str, log_fragment: str) -> None:
    result = GUEST_ONLY.authenticate(login, password, "/", "127.0.0.1")
    assert isinstance(result, AuthRefused)
    assert (result.code, result.text) == (403, BAD_CREDENTIALS)
    assert log_fragment in result.log_reason


def test_guest_mode_refuses_unknown_vhost_without_saying_it_is_unknown() -> None:
    result = GUEST_ONLY.authenticate("guest", "guest", "/x", "127.0.0.1")
    assert isinstance(result, AuthRefused)
    assert (result.code, result.text) == (403, "access refused: no access to vhost '/x'")
    assert "unknown vhost '/x'" in result.log_reason


# --- configured users -------------------------------------------------------------


APP = UserConfig(
    "app",
    fast_hash("app-pw"),
    (VhostPermissions("/", configure="app\\..*", write=".*", read=".*"),),
)
OPS = UserConfig("ops", fast_hash("ops-pw"), ())
USERS = Authenticator(users=(APP, OPS), vhosts=("/", "prod"))


def test_configured_user_logs_in_with_its_permissions() -> None:
    result = USERS.authenticate("app", "app-pw", "/", "10.0.0.1")
    assert result == AuthenticatedUser("app", Permissions("app\\..*", ".*", ".*"))
    assert isinstance(result, AuthenticatedUser)
    assert result.tags == frozenset()
    assert set(result.grants) == {"/"}


def test_guest_does_not_exist_once_users_are_configured() -> None:
    result = USERS.authenticate("guest", "guest", "/", "127.0.0.1")
    assert isinstance(result, AuthRefused)
    assert "unknown user 'guest'" in result.log_reason


@pytest.mark.parametrize(
    ("login", "password", "log_fragment"),
    [
        ("app", "wrong", "wrong password for user 'app'"),
        ("nobody", "app-pw", "unknown user 'nobody'"),
        ("", "", "unknown user ''"),
    ],
)
def test_bad_login_or_password_gives_the_same_answer(
    login: str, password: str, log_fragment: str
) -> None:
    result = USERS.authenticate(login, password, "/", "10.0.0.1")
    assert isinstance(result, AuthRefused)
    assert (result.code, result.text) == (403, BAD_CREDENTIALS)
    assert log_fragment in result.log_reason


@pytest.mark.parametrize(
    ("login", "password", "vhost", "log_fragment"),
    [
        ("app", "app-pw", "prod", "user 'app' has no permissions on vhost 'prod'"),
        ("ops", "ops-pw", "/", "user 'ops' has no permissions on vhost '/'"),
        ("app", "app-pw", "/missing", "unknown vhost '/missing'"),
    ],
)
def test_vhost_refusals_look_alike(
    login: str, password: str, vhost: str, log_fragment: str
) -> None:
    result = USERS.authenticate(login, password, vhost, "10.0.0.1")
    assert isinstance(result, AuthRefused)
    assert (result.code, result.text) == (403, f"access refused: no access to vhost '{vhost}'")
    assert log_fragment in result.log_reason


def test_wrong_password_on_unknown_vhost_is_a_credentials_refusal() -> None:
    result = USERS.authenticate("app", "wrong", "/missing", "10.0.0.1")
    assert isinstance(result, AuthRefused)
    assert result.text == BAD_CREDENTIALS


def test_empty_patterns_still_grant_vhost_access() -> None:
    locked = UserConfig("locked", fast_hash("pw"), (VhostPermissions("/"),))
    result = Authenticator((locked,), ("/",)).authenticate("locked", "pw", "/", "10.0.0.1")
    assert isinstance(result, AuthenticatedUser)
    assert not result.permissions.allows("read", "q")


@pytest.mark.parametrize(
    ("remote_host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.255.255.254", True),
        ("::1", True),
        ("[::1]", True),
        ("::ffff:127.0.0.1", True),
        ("128.0.0.1", False),
        ("0.0.0.0", False),
        ("::", False),
        ("fe80::1%lo", False),
        ("not-an-address", False),
    ],
)
def test_is_loopback(remote_host: str, loopback: bool) -> None:
    assert is_loopback(remote_host) is loopback


# --- check ------------------------------------------------------------------------


def test_check_passes_when_allowed() -> None:
    user = AuthenticatedUser("u", Permissions("", "q", ""))
    check(user, "/", "write", "q", resource_type="queue")


def test_check_raises_access_refused_naming_everything() -> None:
    user = AuthenticatedUser("u", Permissions(".*", "other", ".*"))
    with pytest.raises(AccessRefused) as caught:
        check(user, "/", "write", "q", resource_type="queue")
    assert caught.value.code == 403
    assert caught.value.text == "access to queue 'q' in vhost '/' refused for user 'u' (write)"


def test_check_names_exchanges_too() -> None:
    user = AuthenticatedUser("u", Permissions("", "", ""))
    with pytest.raises(AccessRefused) as caught:
        check(user, "prod", "configure", "amq.topic", resource_type="exchange")
    assert caught.value.text == (
        "access to exchange 'amq.topic' in vhost 'prod' refused for user 'u' (configure)"
    )


# --- tags -------------------------------------------------------------------------


def test_guest_carries_every_tag_and_every_vhost() -> None:
    result = GUEST_ONLY.authenticate("guest", "guest", "/", "127.0.0.1")
    assert isinstance(result, AuthenticatedUser)
    assert all(result.has_tag(tag) for tag in TAGS)
    assert set(result.grants) == {"/", "prod"}


def test_configured_tags_reach_the_login() -> None:
    admin = UserConfig(
        "admin", fast_hash("pw"), (VhostPermissions("/", ".*", ".*", ".*"),), ("administrator",)
    )
    auth = Authenticator(users=(admin, APP), vhosts=("/",))
    result = auth.authenticate("admin", "pw", "/", "10.0.0.1")
    assert isinstance(result, AuthenticatedUser)
    assert result.tags == frozenset({"administrator"})
    plain = auth.authenticate("app", "app-pw", "/", "10.0.0.1")
    assert isinstance(plain, AuthenticatedUser)
    assert not any(plain.has_tag(tag) for tag in TAGS)


@pytest.mark.parametrize(
    ("tags", "implied"),
    [
        ({"administrator"}, {"administrator", "monitoring", "management", "peering"}),
        ({"monitoring"}, {"monitoring", "management"}),
        ({"management"}, {"management"}),
        ({"cluster"}, {"cluster"}),
        ({"peering"}, {"peering"}),
        (set(), set()),
    ],
)
def test_tags_imply_as_rabbitmq(tags: set[str], implied: set[str]) -> None:
    assert effective_tags(tags) == implied
    user = AuthenticatedUser("u", Permissions.full(), frozenset(tags))
    assert {tag for tag in TAGS if user.has_tag(tag)} == implied


def test_administrator_does_not_imply_cluster() -> None:
    """The HA peer link is the pair's own login, not an operator's."""
    user = AuthenticatedUser("root", Permissions.full(), frozenset({"administrator"}))
    with pytest.raises(AccessRefused):
        require_tag(user, "cluster", "opening an HA peer link")


def test_require_tag_refuses_with_403_naming_action_tag_and_user() -> None:
    user = AuthenticatedUser("app", Permissions.full(), frozenset({"management"}))
    with pytest.raises(AccessRefused) as caught:
        require_tag(user, "administrator", "a switchover")
    assert caught.value.code == 403
    assert caught.value.text == (
        "access refused: a switchover needs the 'administrator' tag "
        "(user 'app' has tags: management)"
    )
    require_tag(user, "management", "anything")  # no raise
