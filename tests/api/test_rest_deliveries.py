"""The REST API's memory of delivery ids (http/rest/deliveries.py), on its own: the
bound a server process keeps, and that one number never stands for two receipts.
tests/api/test_rest_api.py drives the same through a real server."""

from __future__ import annotations

from postbox_server.http.rest.deliveries import Deliveries, delivery_id, parse_delivery_id

RECEIPTS = [f"{n}:3f1c2a9e-0000-4000-8000-{n:012d}" for n in range(1, 5)]


def test_the_least_recently_used_delivery_is_forgotten_first() -> None:
    handed = Deliveries(capacity=2)
    first, second, third = (handed.hand_out("q", r) for r in RECEIPTS[:3])
    assert len(handed) == 2
    assert handed.receipt("q", first) is None  # out: the 410 case
    assert handed.receipt("q", second) == RECEIPTS[1]
    # Used just now, so the next one pushes the third out instead.
    handed.hand_out("q", RECEIPTS[3])
    assert handed.receipt("q", second) == RECEIPTS[1]
    assert handed.receipt("q", third) is None


def test_an_id_is_the_receipt_s_everywhere_and_belongs_to_its_queue() -> None:
    one, other = Deliveries(), Deliveries()
    number = one.hand_out("q", RECEIPTS[0])
    assert number == delivery_id(RECEIPTS[0]) == other.hand_out("q", RECEIPTS[0])
    assert 0 <= number < 2**53
    assert one.receipt("another", number) is None


def test_a_number_that_would_stand_for_two_receipts_is_not_handed_out() -> None:
    handed = Deliveries()
    number = handed.hand_out("q", RECEIPTS[0])
    # A clash of the 53-bit hash, made by hand: the receipt itself is the id then.
    handed._receipts[("q", number)] = RECEIPTS[1]
    assert handed.hand_out("q", RECEIPTS[0]) == RECEIPTS[0]
    assert handed.receipt("q", number) == RECEIPTS[1]


def test_digits_are_a_delivery_id_and_anything_else_a_receipt() -> None:
    assert parse_delivery_id("12345") == 12345
    assert parse_delivery_id("1:3f1c") is None
    assert parse_delivery_id("\uff11\uff12") is None  # fullwidth digits: not ASCII
    assert parse_delivery_id("1" * 17) is None
