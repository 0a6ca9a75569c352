"""The REST API's delivery ids (services/deliveries.py) on their own: how a number packs
(message id, receive count), where it stops fitting, and which path segments are one.
tests/api/test_rest_api.py drives them through two real server processes."""

from __future__ import annotations

from postbox_server.http.rest.shapes import message_id
from postbox_server.services.deliveries import (
    COUNTS,
    LIMIT,
    message_number,
    message_of,
    number,
    parse_number,
    receipt_of,
)


def test_a_number_names_a_message_and_its_receive_count() -> None:
    assert number(7, 1) == 7 * 4096 + 1
    assert receipt_of(7 * 4096 + 1) == "7#1"
    assert number(7, 1) != number(7, 2)  # two deliveries of a message, two numbers


def test_the_count_wraps_after_4096_deliveries() -> None:
    # The documented bound: a stale number acts again 4096 deliveries later.
    assert number(7, 1) == number(7, 1 + COUNTS)


def test_message_ids_from_2_to_the_41_get_no_number() -> None:
    largest = LIMIT // COUNTS - 1
    packed = number(largest, COUNTS - 1)
    assert packed == LIMIT - 1
    assert receipt_of(packed) == f"{largest}#{COUNTS - 1}"
    assert number(largest + 1, 0) is None  # the receipt stands for it instead


def test_digits_below_2_to_the_53_are_a_delivery_id_and_anything_else_a_receipt() -> None:
    assert parse_number("12345") == 12345
    assert parse_number(str(LIMIT - 1)) == LIMIT - 1
    assert parse_number(str(LIMIT)) is None
    assert parse_number("1:3f1c") is None
    assert parse_number("\uff11\uff12") is None  # fullwidth digits: not ASCII
    assert parse_number("1" * 17) is None


def test_count_part_0_names_the_message_never_a_delivery() -> None:
    # A send's id: the message's number, part 0; every delivery's differs from it.
    assert message_number(7) == 7 * COUNTS
    assert message_of(7 * COUNTS) == 7
    assert message_of(number(7, 1) or 0) is None
    # The 4096th delivery (and every 4096th after) has no number: its receipt stands for
    # it, so part 0 stays the message's.
    assert number(7, COUNTS) is None
    assert number(7, 2 * COUNTS) is None
    assert message_number(LIMIT // COUNTS - 1) == LIMIT - COUNTS
    assert message_number(LIMIT // COUNTS) is None


def test_the_rest_api_writes_a_message_id_as_its_number() -> None:
    assert message_id("7") == 7 * COUNTS
    assert message_id(str(LIMIT // COUNTS)) == f"{LIMIT // COUNTS}#0"  # past 2^41
