"""Every string field of the API is classified for the tenant door (auth/tenancy.py): a
resource name (qualified on the way in, unqualified on the way out), a name prefix, a
free text that may quote names, or none of these. A new field fails here until it is
classified, so a resource name cannot reach a tenant's caller in its stored form."""

from __future__ import annotations

from collections.abc import Iterator

from google.protobuf.descriptor import Descriptor, FieldDescriptor
from support import api_methods

from postbox_server.auth.tenancy import NAME_PREFIXES, NOT_RESOURCE_NAMES, RESOURCE_NAMES, TEXTS

TABLES = {
    "RESOURCE_NAMES": RESOURCE_NAMES,
    "NAME_PREFIXES": NAME_PREFIXES,
    "TEXTS": TEXTS,
    "NOT_RESOURCE_NAMES": NOT_RESOURCE_NAMES,
}


def _string_fields(descriptor: Descriptor, seen: set[str]) -> Iterator[str]:
    if descriptor.full_name in seen or descriptor.GetOptions().map_entry:
        return
    seen.add(descriptor.full_name)
    for field in descriptor.fields:
        if field.type == FieldDescriptor.TYPE_STRING:
            yield f"{descriptor.full_name}.{field.name}"
        elif field.type == FieldDescriptor.TYPE_MESSAGE and field.message_type.full_name.startswith(
            "postbox."
        ):
            yield from _string_fields(field.message_type, seen)


def _api_string_fields() -> set[str]:
    seen: set[str] = set()
    found: set[str] = set()
    for method in api_methods():
        found.update(_string_fields(method.input_type, seen))
        found.update(_string_fields(method.output_type, seen))
    return found


def _classified(table: dict[str, frozenset[str]]) -> set[str]:
    return {f"{message}.{field}" for message, fields in table.items() for field in fields}


def test_every_string_field_of_the_api_is_classified_once() -> None:
    fields = _api_string_fields()
    classes = {name: _classified(table) for name, table in TABLES.items()}
    unclassified = sorted(fields - set().union(*classes.values()))
    assert not unclassified, (
        "string fields the tenant door does not know (add each to a table of "
        f"server/postbox_server/auth/tenancy.py): {unclassified}"
    )
    stale = sorted(set().union(*classes.values()) - fields)
    assert not stale, f"tables of auth/tenancy.py name fields that do not exist: {stale}"
    names = list(classes)
    for i, first in enumerate(names):
        for second in names[i + 1 :]:
            both = classes[first] & classes[second]
            assert not both, f"in both {first} and {second}: {sorted(both)}"


def test_fields_that_read_like_resource_names_are_resource_names() -> None:
    """A field called queue, topic, *_queue or *_queues is a name of a queue or topic."""
    resource = _classified(RESOURCE_NAMES)
    looks_like = {
        field
        for field in _api_string_fields()
        if field.rsplit(".", 1)[1] in ("queue", "topic", "queues", "queue_names", "destination")
        or field.rsplit(".", 1)[1].endswith(("_queue", "_queues"))
    }
    assert looks_like <= resource, sorted(looks_like - resource)
