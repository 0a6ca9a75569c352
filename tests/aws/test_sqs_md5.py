"""The SQS digests against the values AWS publishes for its samples."""

from __future__ import annotations

import pytest
from postbox.v1.message_pb2 import AttributeValue

from postbox_server.aws.sqs import md5


def text(value: str, data_type: str = "String") -> AttributeValue:
    return AttributeValue(data_type=data_type, string_value=value)


@pytest.mark.parametrize(
    ("attributes", "expected"),
    [
        ({"SellerName": text("Example Store")}, "cd28f3b68aeee4b2eac9c66f2f694b58"),
        (
            {
                "City": text("Any City"),
                "PostalCode": text("99065"),
                "Region": text("WA"),
                "SellerName": text("Example Store"),
            },
            "66d793da93becb551e41562575418975",
        ),
        (
            {
                "SellerName": text("Example Store"),
                "PricePerGallon": text("1.99", "Number"),
                "Region": text("WA"),
                "City": text("Any City"),
                "PostalCode": text("99065"),
            },
            "10809b55e3d9b22c17220b7dbaf283ef",
        ),
        (
            {
                "test_attribute_name_2": text("test_attribute_value_2"),
                "test_attribute_name_1": text("test_attribute_value_1"),
            },
            "d53f3b558fe951154770f25cb63dbba9",
        ),
        (
            {
                "test_attribute_name": AttributeValue(
                    data_type="Binary", binary_value=b"test_attribute_value"
                )
            },
            "23f6bd27ea87aab7dfeadcc9aebee495",
        ),
    ],
)
def test_attribute_digest(attributes, expected):
    assert md5.of_attributes(attributes) == expected


def test_no_attributes_no_digest():
    assert md5.of_attributes({}) is None


def test_body_digest_is_of_the_utf8_text():
    assert md5.of_body("test") == "098f6bcd4621d373cade4e832627b4f6"
    assert md5.of_body("é") == "66ddcd97cfdeabb2f6fb8a999b4bc76f"  # of b"\xc3\xa9"
