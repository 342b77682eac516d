import pytest

from amqlite.client.addresses import Address, parse_addresses


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("127.0.0.1:5555", [Address("127.0.0.1", 5555)]),
        ("a:1,b:2", [Address("a", 1), Address("b", 2)]),
        (" a:1 , b ", [Address("a", 1), Address("b", 5555)]),
        ("[::1]:7000,[fe80::1]", [Address("::1", 7000), Address("fe80::1", 5555)]),
        ("a:1,,b:2,", [Address("a", 1), Address("b", 2)]),
    ],
)
def test_parse_in_order(text: str, expected: list[Address]) -> None:
    assert parse_addresses(text) == expected


def test_list_input_and_str() -> None:
    addrs = parse_addresses(["h:1", "[::1]:2"])
    assert [str(a) for a in addrs] == ["h:1", "[::1]:2"]


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("", "no server"),
        ("h:x", "port must be a number"),
        ("h:70000", "out of range"),
        (":5", "no host"),
        ("::1:5", "IPv6"),
        ("[::1", "IPv6"),
    ],
)
def test_bad_addresses(text: str, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        parse_addresses(text)
