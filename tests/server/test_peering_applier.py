"""The action applier's shortcut for turns of sends only (a client publish on a
peered exchange) does what the general turn does."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from amqlite.peering import Action, Heartbeat, Send
from amqlite.server.peering.applier import ActionApplier
from amqlite.server.peering.registry import LinkRegistry


class _Storage:
    def __init__(self) -> None:
        self.holds = 0
        self.held = 0

    def hold(self) -> None:
        self.holds += 1
        self.held += 1

    def release(self) -> None:
        self.held -= 1


class _Durability:
    def __init__(self) -> None:
        self.storage = _Storage()
        self.marks_pending: dict[Any, Any] = {}


def _applier() -> tuple[ActionApplier, list[str]]:
    calls: list[str] = []
    registry = LinkRegistry()
    registry.conns = {"l1": "conn1", "l2": "conn2"}  # type: ignore[dict-item]
    applier = ActionApplier(
        registry,
        _Durability(),  # type: ignore[arg-type]
        session=lambda vhost: None,  # type: ignore[arg-type,return-value]
        dial=lambda link, address: calls.append(f"dial {link}"),
        pump=lambda: calls.append("pump"),
        turn_ended=lambda: calls.append("turn ended"),
    )
    return applier, calls


sends = st.builds(Send, st.sampled_from(["l1", "l2", "gone"]), st.builds(Heartbeat))


@given(st.lists(st.tuples(st.lists(sends, max_size=4), st.booleans()), max_size=6))
def test_a_turn_of_sends_is_what_the_general_turn_makes(
    turns: list[tuple[list[Action], bool]],
) -> None:
    """Same outbox (per connection, in order), same pumps and turn ends; the
    shortcut takes no journal hold (nothing is written), the general turn one."""
    (fast, fast_calls), (ref, ref_calls) = _applier(), _applier()
    for actions, delivered in turns:
        fast._delivered = ref._delivered = delivered
        fast.apply(list(actions))
        ref._turn(list(actions))
        assert fast._outbox == ref._outbox
        assert fast_calls == ref_calls
        assert fast._delivered == ref._delivered is False
    assert fast.durability.storage.holds == 0  # type: ignore[attr-defined]
    assert ref.durability.storage.holds == len(turns)  # type: ignore[attr-defined]
    assert ref.durability.storage.held == 0  # type: ignore[attr-defined]
