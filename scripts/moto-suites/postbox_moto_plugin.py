"""A pytest plugin for running moto's SQS and SNS tests against postbox's shim.

moto's tests, in server mode (TEST_SERVER_MODE=true), send every boto3 call to
TEST_SERVER_MODE_ENDPOINT. This plugin makes that endpoint look like a fresh AWS account
to each test, as the tests expect of AWS itself:

- every queue and topic is deleted before each test;
- STS, which the shim does not serve, is answered locally: GetCallerIdentity names the
  account the shim was started with (POSTBOX_MOTO_ACCOUNT, 123456789012 by default);
- each test's outcome is written (--postbox-results FILE) with whether moto marks it
  `aws_verified`, and the counts are printed at the end.

scripts/run-moto-suites loads it with `-p postbox_moto_plugin`.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterator
from typing import Any

import boto3
import boto3.session
import botocore.session
import pytest
from botocore.awsrequest import AWSResponse
from botocore.config import Config

ACCOUNT = os.environ.get("POSTBOX_MOTO_ACCOUNT", "123456789012")
REGION = "us-east-1"


class _Body:
    """What AWSResponse reads a body from (a urllib3 response's stream)."""

    def __init__(self, data: bytes) -> None:
        self.data = data

    def stream(self, *_args: Any, **_kwargs: Any) -> Iterator[bytes]:
        yield self.data


def _caller_identity(request: Any, **_kwargs: Any) -> AWSResponse | None:
    """The answer to an STS call, before it is sent: GetCallerIdentity only."""
    body = request.body or b""
    if isinstance(body, str):
        body = body.encode()
    if b"GetCallerIdentity" not in body:
        return None  # sent on, to fail as STS is not served
    xml = (
        '<GetCallerIdentityResponse xmlns="https://sts.amazonaws.com/doc/2011-06-15/">'
        "<GetCallerIdentityResult>"
        f"<Arn>arn:aws:iam::{ACCOUNT}:user/moto</Arn>"
        "<UserId>AIDAPOSTBOXMOTOSUITES</UserId>"
        f"<Account>{ACCOUNT}</Account>"
        "</GetCallerIdentityResult>"
        f"<ResponseMetadata><RequestId>{uuid.uuid4()}</RequestId></ResponseMetadata>"
        "</GetCallerIdentityResponse>"
    ).encode()
    return AWSResponse(request.url, 200, {"Content-Type": "text/xml"}, _Body(xml))


def _answer_sts_locally() -> None:
    """Every boto3 session, made now or later, answers STS calls with the stub."""
    original = boto3.session.Session.__init__

    def init(self: boto3.session.Session, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        self.events.register("before-send.sts", _caller_identity)

    boto3.session.Session.__init__ = init  # type: ignore[method-assign]
    boto3.DEFAULT_SESSION = None


def _clients() -> tuple[Any, Any]:
    """SQS and SNS clients of the endpoint, made outside moto's patching of boto3."""
    session = boto3.session.Session(
        botocore_session=botocore.session.get_session(),
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
        region_name=REGION,
    )
    endpoint = os.environ["TEST_SERVER_MODE_ENDPOINT"]
    config = Config(retries={"max_attempts": 3, "mode": "standard"})
    return (
        session.client("sqs", endpoint_url=endpoint, config=config),
        session.client("sns", endpoint_url=endpoint, config=config),
    )


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--postbox-results", help="write each test's outcome here, as JSON")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Deselects exactly the node ids of $POSTBOX_MOTO_DESELECT (one a line)."""
    chosen = set(filter(None, os.environ.get("POSTBOX_MOTO_DESELECT", "").splitlines()))
    if not chosen:
        return
    config.hook.pytest_deselected(items=[item for item in items if item.nodeid in chosen])
    items[:] = [item for item in items if item.nodeid not in chosen]


def pytest_configure(config: pytest.Config) -> None:
    _answer_sts_locally()
    config.stash[_OUTCOMES] = {}


_OUTCOMES = pytest.StashKey[dict[str, dict[str, Any]]]()


@pytest.fixture(autouse=True)
def _empty_account() -> None:
    """Every queue and topic deleted: each test starts in an empty account."""
    sqs, sns = _clients()
    urls = [
        url
        for page in sqs.get_paginator("list_queues").paginate(PaginationConfig={"PageSize": 1000})
        for url in page.get("QueueUrls", [])
    ]
    # postbox refuses to delete a dead-letter queue while a queue names it: the queues
    # that name one go first, in the earlier rounds.
    while urls:
        refused = []
        for url in urls:
            try:
                sqs.delete_queue(QueueUrl=url)
            except sqs.exceptions.QueueDoesNotExist:
                pass
            except sqs.exceptions.ClientError:
                refused.append(url)
        if len(refused) == len(urls):
            raise RuntimeError(f"cannot delete the queues {refused}")
        urls = refused
    for page in sns.get_paginator("list_topics").paginate():
        for topic in page.get("Topics", []):
            sns.delete_topic(TopicArn=topic["TopicArn"])


def _aws_verified(item: pytest.Item) -> bool:
    return item.get_closest_marker("aws_verified") is not None


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    report = yield
    outcomes = item.config.stash[_OUTCOMES]
    entry = outcomes.setdefault(
        item.nodeid, {"aws_verified": _aws_verified(item), "outcome": "passed"}
    )
    if report.skipped and entry["outcome"] == "passed":
        entry["outcome"] = "skipped"
    elif report.failed:
        entry["outcome"] = "failed"
        last = str(report.longrepr).splitlines()[-1] if report.longrepr else ""
        entry.setdefault("error", last[:300])
    return report


def _counts(outcomes: dict[str, dict[str, Any]], only_verified: bool) -> str:
    chosen = [o for o in outcomes.values() if o["aws_verified"] or not only_verified]
    passed = sum(o["outcome"] == "passed" for o in chosen)
    failed = sum(o["outcome"] == "failed" for o in chosen)
    skipped = sum(o["outcome"] == "skipped" for o in chosen)
    return f"{passed} passed, {failed} failed, {skipped} skipped of {len(chosen)}"


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    outcomes = config.stash[_OUTCOMES]
    terminalreporter.section("postbox: moto's suites against the shim")
    terminalreporter.write_line(f"all tests:    {_counts(outcomes, False)}")
    terminalreporter.write_line(f"aws_verified: {_counts(outcomes, True)}")
    path = config.getoption("--postbox-results")
    if path:
        with open(path, "w") as file:
            json.dump(outcomes, file, indent=1, sort_keys=True)
