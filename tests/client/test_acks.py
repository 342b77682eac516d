"""Ack coalescing: few frames, and a multiple ack never covers an open tag."""

from amqlite.client.acks import AckCoalescer


def _coalescer(*tags: int) -> AckCoalescer:
    a = AckCoalescer()
    for t in tags:
        a.delivered(t)
    return a


def test_all_acked_in_order_is_one_multiple_ack() -> None:
    a = _coalescer(*range(1, 101))
    for t in range(1, 101):
        a.ack(t)
    assert a.take() == [(100, True)]
    assert len(a) == 0
    assert a.take() == []


def test_single_ack_is_not_multiple() -> None:
    a = _coalescer(5)
    a.ack(5)
    assert a.take() == [(5, False)]


def test_gap_keeps_later_acks_individual() -> None:
    a = _coalescer(1, 2, 3, 4, 5)
    for t in (1, 2, 4, 5):
        a.ack(t)
    assert a.take() == [(2, True), (4, False), (5, False)]
    assert len(a) == 1  # 3 is still open
    a.ack(3)
    assert a.take() == [(3, False)]  # 4 and 5 were settled already: no multiple over them
    assert len(a) == 0


def test_out_of_order_acks_before_flush_coalesce() -> None:
    a = _coalescer(1, 2, 3)
    for t in (3, 1, 2):
        a.ack(t)
    assert a.take() == [(3, True)]


def test_nacked_tags_inside_the_prefix_are_skipped() -> None:
    a = _coalescer(1, 2, 3, 4)
    a.ack(1)
    assert a.take() == [(1, False)]
    a.settle(2)  # a nack went out for 2
    a.ack(3)
    a.ack(4)
    assert a.take() == [(4, True)]
    assert len(a) == 0


def test_prefix_ending_in_settled_tag() -> None:
    a = _coalescer(1, 2, 3)
    a.ack(1)
    a.settle(2)
    assert a.take() == [(1, False)]
    assert len(a) == 1


def test_ack_multiple_marks_only_open_tags_up_to() -> None:
    a = _coalescer(1, 2, 3, 4, 5)
    a.settle(2)
    assert a.ack(4, multiple=True) == 3
    assert a.take() == [(4, True)]
    assert len(a) == 1


def test_nack_multiple_settles_up_to() -> None:
    a = _coalescer(1, 2, 3)
    a.settle(2, multiple=True)
    a.ack(3)
    assert a.take() == [(3, False)]


def test_double_ack_is_counted_once() -> None:
    a = _coalescer(1)
    assert a.ack(1) == 1
    assert a.ack(1) == 0
    assert a.take() == [(1, False)]


def test_never_covers_an_open_tag() -> None:
    """Brute force: for random ack orders, every multiple ack's range holds only
    tags the application settled."""
    import random

    rng = random.Random(7)
    for _ in range(200):
        n = rng.randint(1, 30)
        a = _coalescer(*range(1, n + 1))
        settled: set[int] = set()
        order = list(range(1, n + 1))
        rng.shuffle(order)
        sent: set[int] = set()
        for t in order:
            a.ack(t)
            settled.add(t)
            if rng.random() < 0.3:
                for dtag, multiple in a.take():
                    covered = (
                        {x for x in range(1, dtag + 1) if x not in sent} if multiple else {dtag}
                    )
                    assert covered <= settled
                    sent |= covered
        for dtag, multiple in a.take():
            covered = {x for x in range(1, dtag + 1) if x not in sent} if multiple else {dtag}
            assert covered <= settled
            sent |= covered
        assert sent == set(range(1, n + 1))
