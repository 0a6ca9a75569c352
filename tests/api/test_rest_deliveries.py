"""The REST API's delivery ids (services/deliveries.py) on their own: how a number packs
(message id, receive count), where it stops fitting, and which path segments are one.
tests/api/test_rest_api.py drives them through two real server processes."""

from __future__ import annotations

from postbox_server.services.deliveries import COUNTS, LIMIT, number, parse_number, receipt_of


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
