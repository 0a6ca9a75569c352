"""The web console in a real headless Chromium (Debian's, through chromedriver and selenium),
against a real server on a real database; its session and CSRF rules through a plain HTTP
client (aiohttp).

Two servers: one whose database has no API key (the console is open, as the API is on
loopback), one with keys (log in; act with the key's grants). A failed test keeps a
screenshot of the browser under pytest's temporary directory and prints its path.
"""

from __future__ import annotations

import asyncio
import base64
import json
import re
import ssl
import subprocess
import sys
from collections.abc import Iterator
from http.cookies import SimpleCookie
from pathlib import Path
from urllib.request import urlopen

import aiohttp
import grpc
import pytest
from auth_support import bearer
from certificates import Authority
from postbox.v1 import (
    access_service_pb2,
    access_service_pb2_grpc,
    message_pb2,
    message_service_pb2_grpc,
    queue_service_pb2,
    queue_service_pb2_grpc,
    schedule_service_pb2,
    schedule_service_pb2_grpc,
    stream_service_pb2,
    stream_service_pb2_grpc,
    topic_service_pb2,
    topic_service_pb2_grpc,
)
from postbox.v1 import message_service_pb2 as msg_pb
from receiver import Receiver
from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException, WebDriverException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import WebDriverWait
from support import (
    ROOT,
    ServerProcess,
    bootstrap_key,
    create_database,
    drop_database,
    eventually,
    free_port,
)
from support import seconds as duration

from postbox_server.console.sessions import Sessions

CHROMIUM = Path("/usr/bin/chromium")
# What the console shows for a time or holder that is not set (format.js): an en dash.
NOTHING = "\u2013"
CHROMEDRIVER = Path("/usr/bin/chromedriver")
WAIT = 20.0


class Console:
    """A server with --console-port, and gRPC stubs that speak as `secret` (if any)."""

    def __init__(self, database_url: str) -> None:
        self.console_port = free_port()
        self.server = ServerProcess(
            database_url, "--console-port", str(self.console_port), "--maintenance-interval", "0.2"
        )
        self.database_url = database_url
        self.secret: str | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.console_port}"

    def session_info(self) -> dict:
        with urlopen(f"{self.url}/console/session") as response:
            return json.load(response)

    def metadata(self) -> list[tuple[str, str]] | None:
        return None if self.secret is None else bearer(self.secret)


@pytest.fixture(scope="module")
def channel_of():
    channels: list[grpc.Channel] = []

    def open_channel(console: Console) -> grpc.Channel:
        channels.append(grpc.insecure_channel(console.server.target))
        return channels[-1]

    yield open_channel
    for channel in channels:
        channel.close()


@pytest.fixture(scope="module")
def open_console(admin_url: str) -> Iterator[Console]:
    url = create_database(admin_url, "postbox_console_open")
    console = Console(url)
    console.server.start()
    yield console
    console.server.stop()
    drop_database(admin_url, url)


@pytest.fixture(scope="module")
def keyed_console(admin_url: str) -> Iterator[Console]:
    url = create_database(admin_url, "postbox_console_keys")
    console = Console(url)
    console.server.start()  # installs the engine, which holds the keys
    console.secret = bootstrap_key(url, "console-admin", "admin:*")
    eventually(lambda: console.session_info()["auth"], what="the server has loaded the keys")
    yield console
    console.server.stop()
    drop_database(admin_url, url)


@pytest.fixture(scope="module")
def browser() -> Iterator[WebDriver]:
    if not (CHROMIUM.exists() and CHROMEDRIVER.exists()):
        pytest.fail(
            "the console tests need Debian's chromium and chromium-driver "
            "(apt-get install chromium chromium-driver; .ci/run installs them)"
        )
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage",
                     "--window-size=1400,1000", "--disable-gpu"):  # fmt: skip
        options.add_argument(argument)
    driver = webdriver.Chrome(options=options, service=Service(str(CHROMEDRIVER)))
    yield driver
    driver.quit()


@pytest.fixture
def page(
    browser: WebDriver, request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[WebDriver]:
    """The browser with no session cookie, screenshotted if the test fails."""
    browser.delete_all_cookies()
    yield browser
    report = getattr(request.node, "report_call", None)
    if report is not None and report.failed:
        folder = tmp_path_factory.getbasetemp() / "console-screenshots"
        folder.mkdir(exist_ok=True)
        path = folder / f"{request.node.name}.png"
        try:
            browser.save_screenshot(str(path))
            print(f"\nscreenshot of the failed console test: {path}")
        except WebDriverException as error:
            print(f"\nno screenshot of the failed console test: {error}")


def wait(driver: WebDriver, condition, what: str):
    """Until `condition` holds. The page redraws on every poll, so an element found a
    moment ago may be gone by the time it is read: that is asked again, not a failure."""
    return WebDriverWait(driver, WAIT, ignored_exceptions=(StaleElementReferenceException,)).until(
        lambda d: condition(d), f"not after {WAIT} s: {what}"
    )


def text_of(driver: WebDriver, selector: str) -> str | None:
    found = driver.find_elements(By.CSS_SELECTOR, selector)
    return found[0].text if found else None


def retype(field, text: str) -> None:
    """Replaces a field's text by keystrokes, as a person would: selenium's clear() fires
    no input event, so a page that redraws meanwhile would put the old text back."""
    field.send_keys(Keys.CONTROL, "a")
    field.send_keys(Keys.BACKSPACE)
    field.send_keys(text)


def log_in(driver: WebDriver, console: Console, secret: str) -> None:
    driver.get(console.url + "/")
    field = wait(driver, lambda d: d.find_elements(By.ID, "api-key"), "the login form")[0]
    field.send_keys(secret)
    driver.find_element(By.ID, "login").click()
    wait(driver, lambda d: d.find_elements(By.ID, "who"), "the console after logging in")


def create_queue(channel: grpc.Channel, console: Console, name: str, bodies=()) -> None:
    queues = queue_service_pb2_grpc.QueueServiceStub(channel)
    queues.CreateQueue(
        queue_service_pb2.CreateQueueRequest(queue=queue_service_pb2.Queue(name=name)),
        metadata=console.metadata(),
    )
    messages = message_service_pb2_grpc.MessageServiceStub(channel)
    for body, attributes in bodies:
        messages.Send(
            msg_pb.SendRequest(queue=name, body=body, attributes=attributes),
            metadata=console.metadata(),
        )


def visible(channel: grpc.Channel, console: Console, name: str) -> int:
    queues = queue_service_pb2_grpc.QueueServiceStub(channel)
    queue = queues.GetQueue(
        queue_service_pb2.GetQueueRequest(name=name, view=queue_service_pb2.QUEUE_VIEW_FULL),
        metadata=console.metadata(),
    ).queue
    return queue.stats.visible_messages


def test_open_on_loopback_without_keys_shows_a_created_queue_with_its_depth(
    page, open_console, channel_of
):
    channel = channel_of(open_console)
    create_queue(channel, open_console, "console-open-orders", [(b"one", {}), (b"two", {})])
    page.get(open_console.url + "/")
    who = wait(page, lambda d: text_of(d, "#who"), "the open console")
    assert who == "open (no API keys exist)"
    row = 'tr[data-queue="console-open-orders"]'
    wait(page, lambda d: text_of(d, f"{row} td.visible") == "2", "the queue's depth of 2")
    # Live: the overview polls, so a third message shows without a reload.
    create_queue_messages = message_service_pb2_grpc.MessageServiceStub(channel)
    create_queue_messages.Send(msg_pb.SendRequest(queue="console-open-orders", body=b"three"))
    wait(page, lambda d: text_of(d, f"{row} td.visible") == "3", "the depth updated to 3")
    # Filtered by name.
    page.find_element(By.ID, "queue-filter").send_keys("no-such-queue")
    wait(page, lambda d: not d.find_elements(By.CSS_SELECTOR, row), "the filter hides the row")


def test_logging_in_with_a_key(page, keyed_console, channel_of):
    create_queue(channel_of(keyed_console), keyed_console, "console-login-queue")
    page.get(keyed_console.url + "/")
    field = wait(page, lambda d: d.find_elements(By.ID, "api-key"), "the login form")[0]
    field.send_keys("pbk_not_a_key")
    page.find_element(By.ID, "login").click()
    error = wait(page, lambda d: text_of(d, ".login .error"), "the refusal")
    assert "not known" in error
    retype(field, keyed_console.secret)
    page.find_element(By.ID, "login").click()
    assert wait(page, lambda d: text_of(d, "#who"), "the signed-in console") == "key console-admin"
    wait(
        page,
        lambda d: d.find_elements(By.CSS_SELECTOR, 'tr[data-queue="console-login-queue"]'),
        "the queue in the overview",
    )
    # The page's scripts cannot read the session cookie, nor is the key anywhere in the page.
    assert page.execute_script("return document.cookie") == ""
    assert keyed_console.secret not in page.page_source
    page.find_element(By.ID, "logout").click()
    wait(page, lambda d: d.find_elements(By.ID, "api-key"), "the login form after logging out")


def test_peeking_a_message_shows_its_body_as_text_or_json_and_its_attributes(
    page, keyed_console, channel_of
):
    attributes = {
        "origin": message_pb2.AttributeValue(data_type="String", string_value="console-test")
    }
    create_queue(
        channel_of(keyed_console),
        keyed_console,
        "console-peek",
        [(b'{"order": 42, "items": ["tea"]}', attributes)],
    )
    log_in(page, keyed_console, keyed_console.secret)
    page.get(keyed_console.url + "/#/queues/console-peek")
    body = wait(page, lambda d: text_of(d, "tr[data-message] pre.body"), "the peeked message")
    assert body == '{"order": 42, "items": ["tea"]}'
    assert "console-test" in text_of(page, "tr[data-message] dl.message-attributes")
    assert text_of(page, "tr[data-message] td:nth-child(2)") == "VISIBLE"
    page.find_element(By.ID, "as-json").click()
    wait(
        page,
        lambda d: (
            text_of(d, "tr[data-message] pre.body")
            == json.dumps({"order": 42, "items": ["tea"]}, indent=2)
        ),
        "the body pretty-printed as JSON",
    )
    # Peeking leaves the message where it was.
    assert visible(channel_of(keyed_console), keyed_console, "console-peek") == 1
    # A body that is not UTF-8 shows in base64.
    message_service_pb2_grpc.MessageServiceStub(channel_of(keyed_console)).Send(
        msg_pb.SendRequest(queue="console-peek", body=b"\xff\x00binary"),
        metadata=keyed_console.metadata(),
    )
    page.find_element(By.CSS_SELECTOR, "#peek button").click()  # Refresh
    wait(
        page,
        lambda d: (
            [e.text for e in d.find_elements(By.CSS_SELECTOR, "tr[data-message] pre.body")][1:]
            == ["(binary, base64) /wBiaW5hcnk="]
        ),
        "the binary body in base64",
    )


def test_purging_after_a_confirmation(page, keyed_console, channel_of):
    channel = channel_of(keyed_console)
    create_queue(channel, keyed_console, "console-purge", [(b"a", {}), (b"b", {}), (b"c", {})])
    log_in(page, keyed_console, keyed_console.secret)
    page.get(keyed_console.url + "/#/queues/console-purge")
    wait(page, lambda d: text_of(d, "#stat-visible") == "3", "the queue's depth")
    # Cancelled: nothing happens.
    page.find_element(By.ID, "purge").click()
    wait(page, lambda d: d.find_elements(By.ID, "purge-cancel"), "the confirmation")[0].click()
    wait(page, lambda d: d.find_elements(By.ID, "purge"), "the purge button again")
    assert visible(channel, keyed_console, "console-purge") == 3
    page.find_element(By.ID, "purge").click()
    wait(page, lambda d: d.find_elements(By.ID, "purge-confirm"), "the confirmation")[0].click()
    assert wait(page, lambda d: text_of(d, "#purged"), "the purge's answer") == "purged 3 messages"
    assert visible(channel, keyed_console, "console-purge") == 0
    wait(page, lambda d: text_of(d, "#stat-visible") == "0", "the depth after purging")


def test_a_key_without_rights_sees_no_purge_button_and_only_its_queues(
    page, keyed_console, channel_of
):
    channel = channel_of(keyed_console)
    create_queue(channel, keyed_console, "console-reader-mine", [(b"readable", {})])
    create_queue(channel, keyed_console, "console-secret-other")
    reader = bootstrap_key(keyed_console.database_url, "console-reader", "read:console-reader-*")
    log_in(page, keyed_console, reader)
    wait(
        page,
        lambda d: d.find_elements(By.CSS_SELECTOR, 'tr[data-queue="console-reader-mine"]'),
        "the readable queue",
    )
    assert not page.find_elements(By.CSS_SELECTOR, 'tr[data-queue="console-secret-other"]')
    assert "Keys" not in text_of(page, "header nav")
    assert "Tenants" not in text_of(page, "header nav")
    page.get(keyed_console.url + "/#/queues/console-reader-mine")
    wait(page, lambda d: text_of(d, "tr[data-message] pre.body") == "readable", "peeking")
    assert text_of(page, "#stat-visible") == "1"
    for control in ("purge", "pause-sends", "resume", "send-button", "save-attributes"):
        assert not page.find_elements(By.ID, control), f"a reader sees #{control}"
    assert all(
        not field.is_enabled() for field in page.find_elements(By.CSS_SELECTOR, "#attributes input")
    )


def test_a_revoked_key_ends_its_session(page, keyed_console, channel_of):
    secret = bootstrap_key(keyed_console.database_url, "console-doomed", "read:*")
    log_in(page, keyed_console, secret)
    assert text_of(page, "#who") == "key console-doomed"
    access = access_service_pb2_grpc.AccessServiceStub(channel_of(keyed_console))
    access.DeleteKey(
        access_service_pb2.DeleteKeyRequest(name="console-doomed"),
        metadata=keyed_console.metadata(),
    )
    # The overview's next poll is refused; the page asks for a key again.
    message = wait(page, lambda d: text_of(d, ".login .error"), "the login form again")
    assert message == "Your session ended: log in again."


def test_retrying_a_failed_webhook_delivery(page, keyed_console, channel_of):
    receiver = Receiver().start()
    try:
        topics = topic_service_pb2_grpc.TopicServiceStub(channel_of(keyed_console))
        metadata = keyed_console.metadata()
        topics.CreateTopic(
            topic_service_pb2.CreateTopicRequest(topic=topic_service_pb2.Topic(name="console-t")),
            metadata=metadata,
        )
        receiver.plan("/hook", (503, 0))
        endpoint = topic_service_pb2.WebhookEndpoint(
            url=receiver.url("/hook"),
            max_attempts=1,
            timeout=duration(1),
            minimum_backoff=duration(0.2),
            maximum_backoff=duration(0.4),
        )
        topics.CreateSubscription(
            topic_service_pb2.CreateSubscriptionRequest(
                subscription=topic_service_pb2.Subscription(
                    name="hook", topic="console-t", webhook=endpoint
                )
            ),
            metadata=metadata,
        )
        topics.Publish(
            topic_service_pb2.PublishRequest(topic="console-t", body=b"second chance"),
            metadata=metadata,
        )
        log_in(page, keyed_console, keyed_console.secret)
        page.get(keyed_console.url + "/#/topics/console-t")
        row = "[data-subscription=hook] tr[data-delivery]"
        wait(page, lambda d: text_of(d, f"{row} td.state") == "FAILED", "the failed delivery")
        page.find_element(By.CSS_SELECTOR, f"{row} button.retry").click()
        _, delivered = receiver.wait_for("/hook", 2)
        assert base64.b64decode(delivered.document["message"]["data"]) == b"second chance"
        wait(page, lambda d: not d.find_elements(By.CSS_SELECTOR, row), "no delivery left")
    finally:
        receiver.stop()


def test_a_stream_topic_shows_its_consumer_groups_lag_as_it_changes(
    page, keyed_console, channel_of
):
    channel = channel_of(keyed_console)
    topics = topic_service_pb2_grpc.TopicServiceStub(channel)
    streams = stream_service_pb2_grpc.StreamServiceStub(channel)
    metadata = keyed_console.metadata()
    topics.CreateTopic(
        topic_service_pb2.CreateTopicRequest(
            topic=topic_service_pb2.Topic(name="console-s", stream_retention=duration(3600))
        ),
        metadata=metadata,
    )
    streams.CreateConsumerGroup(
        stream_service_pb2.CreateConsumerGroupRequest(
            consumer_group=stream_service_pb2.ConsumerGroup(topic="console-s", name="billing")
        ),
        metadata=metadata,
    )
    log_in(page, keyed_console, keyed_console.secret)
    page.get(keyed_console.url + "/#/topics/console-s")
    row = "#consumer-groups tr[data-group=billing]"
    wait(page, lambda d: text_of(d, f"{row} td.lag-messages") == "0", "the group, with no lag")
    assert text_of(page, f"{row} td.lag-time") == "\u2013"  # no message past the cursor
    for body in (b"one", b"two", b"three"):
        topics.Publish(
            topic_service_pb2.PublishRequest(topic="console-s", body=body), metadata=metadata
        )
    # The page's own poll brings the new lag: no reload.
    wait(page, lambda d: text_of(d, f"{row} td.lag-messages") == "3", "a lag of 3 messages")
    assert (text_of(page, f"{row} td.lag-time") or "").endswith(" s")
    batch = streams.ReadStream(
        stream_service_pb2.ReadStreamRequest(
            topic="console-s", consumer_group="billing", max_messages=2
        ),
        metadata=metadata,
    )
    assert [m.body for m in batch.messages] == [b"one", b"two"]
    acked = streams.AckStream(
        stream_service_pb2.AckStreamRequest(
            topic="console-s", consumer_group="billing", batch=batch.batch
        ),
        metadata=metadata,
    )
    wait(page, lambda d: text_of(d, f"{row} td.lag-messages") == "1", "a lag of 1 after the ack")
    assert text_of(page, f"{row} td.cursor") == f"{acked.cursor_offset:,}"
    page.get(keyed_console.url + "/#/topics")
    wait(page, lambda d: text_of(d, "[data-topic=console-s] .tag") == "stream", "the stream tag")


def test_editing_attributes_sends_only_the_changed_fields(page, keyed_console, channel_of):
    channel = channel_of(keyed_console)
    create_queue(channel, keyed_console, "console-edit")
    log_in(page, keyed_console, keyed_console.secret)
    page.get(keyed_console.url + "/#/queues/console-edit")
    field = wait(
        page,
        lambda d: d.find_elements(By.CSS_SELECTOR, "#attributes input[name=visibility_timeout]"),
        "the attributes",
    )[0]
    retype(field, "45")
    page.find_element(By.CSS_SELECTOR, "#attributes input[name=max_depth]").send_keys("500")
    page.find_element(By.ID, "save-attributes").click()

    def saved():
        queue = (
            queue_service_pb2_grpc.QueueServiceStub(channel)
            .GetQueue(
                queue_service_pb2.GetQueueRequest(name="console-edit"),
                metadata=keyed_console.metadata(),
            )
            .queue
        )
        return queue.visibility_timeout.seconds == 45 and queue.max_depth == 500 and queue

    queue = eventually(saved, what="the queue updated")
    assert queue.delivery_delay.seconds == 0  # untouched
    wait(
        page,
        lambda d: not d.find_element(By.ID, "save-attributes").is_enabled(),
        "nothing left to save",
    )


def test_redriving_a_dead_letter_queue_shows_the_task_and_its_progress(
    page, keyed_console, channel_of
):
    channel = channel_of(keyed_console)
    metadata = keyed_console.metadata()
    queues = queue_service_pb2_grpc.QueueServiceStub(channel)
    messages = message_service_pb2_grpc.MessageServiceStub(channel)
    Queue = queue_service_pb2.Queue
    queues.CreateQueue(
        queue_service_pb2.CreateQueueRequest(queue=Queue(name="console-dlq")), metadata=metadata
    )
    policy = queue_service_pb2.DeadLetterPolicy(
        dead_letter_queue="console-dlq", max_receive_count=1
    )
    queues.CreateQueue(
        queue_service_pb2.CreateQueueRequest(
            queue=Queue(name="console-source", dead_letter_policy=policy)
        ),
        metadata=metadata,
    )
    for number in range(4):
        messages.Send(
            msg_pb.SendRequest(queue="console-source", body=b"%d" % number), metadata=metadata
        )
    request = msg_pb.ReceiveRequest(queue="console-source", max_messages=10)
    received = [m for r in messages.Receive(request, metadata=metadata) for m in r.messages]
    assert len(received) == 4
    for message in received:
        messages.Nack(
            msg_pb.NackRequest(queue="console-source", receipt=message.receipt, delay=duration(0)),
            metadata=metadata,
        )
    # The second receive dead-letters all four instead of delivering them.
    assert not [m for r in messages.Receive(request, metadata=metadata) for m in r.messages]
    assert visible(channel, keyed_console, "console-dlq") == 4

    log_in(page, keyed_console, keyed_console.secret)
    page.get(keyed_console.url + "/#/queues/console-dlq")
    sources = wait(page, lambda d: text_of(d, "#redrive ul.sources"), "the source queues")
    assert sources == "console-source"
    page.find_element(By.ID, "redrive-button").click()
    wait(
        page,
        lambda d: (text_of(d, "#redrive .task") or "").startswith("COMPLETED"),
        "the redrive task completed",
    )
    assert "4 / 4" in text_of(page, "#redrive .task")
    progress = page.find_element(By.CSS_SELECTOR, "#redrive .task progress")
    assert progress.get_attribute("value") == progress.get_attribute("max") == "4"
    assert visible(channel, keyed_console, "console-source") == 4


def test_keys_are_created_with_the_secret_shown_once_and_revoked(page, keyed_console):
    log_in(page, keyed_console, keyed_console.secret)
    page.get(keyed_console.url + "/#/keys")
    wait(page, lambda d: d.find_elements(By.ID, "key-name"), "the keys page")[0].send_keys(
        "console-made"
    )
    grants = page.find_element(By.ID, "key-grants")
    retype(grants, "send:orders-* read:*")
    page.find_element(By.ID, "create-key").click()
    secret = wait(page, lambda d: text_of(d, "#new-secret pre"), "the new key's secret")
    row = 'tr[data-key="console-made"]'
    assert wait(page, lambda d: text_of(d, f"{row} td.mono"), "the key listed") == (
        "read:* send:orders-*"
    )
    # The secret works, with the grants given.
    eventually(lambda: _logs_in(keyed_console, secret), what="the new key logs in")
    page.find_element(By.CSS_SELECTOR, "#new-secret button").click()
    assert not page.find_elements(By.ID, "new-secret")
    page.find_element(By.CSS_SELECTOR, f"{row} button.danger").click()
    wait(page, lambda d: d.find_elements(By.CSS_SELECTOR, f"{row} .confirm button.danger"), "")[
        0
    ].click()
    wait(page, lambda d: not d.find_elements(By.CSS_SELECTOR, row), "the key revoked")
    eventually(lambda: not _logs_in(keyed_console, secret), what="the revoked key refused")


def _logs_in(console: Console, secret: str) -> bool:
    async def attempt() -> bool:
        async with (
            aiohttp.ClientSession() as http,
            http.post(f"{console.url}/console/login", json={"secret": secret}) as response,
        ):
            return response.status == 200

    return asyncio.run(attempt())


def _tenant_with_admin_key(channel: grpc.Channel, console: Console, name: str, **quota) -> str:
    """Creates tenant `name` (as the default tenant's admin) and an admin key of it; its secret."""
    access = access_service_pb2_grpc.AccessServiceStub(channel)
    access.CreateTenant(
        access_service_pb2.CreateTenantRequest(
            tenant=access_service_pb2.Tenant(
                name=name,
                description=f"the {name} team",
                quota=access_service_pb2.TenantQuota(**quota),
                rate_limits=access_service_pb2.RateLimits(sends_per_second=50, send_burst=100),
            )
        ),
        metadata=console.metadata(),
    )
    grant = access_service_pb2.Grant(permission=access_service_pb2.PERMISSION_ADMIN, pattern="*")
    created = access.CreateKey(
        access_service_pb2.CreateKeyRequest(
            key=access_service_pb2.Key(name=f"{name}-admin", tenant=name, grants=[grant])
        ),
        metadata=console.metadata(),
    )
    return created.secret


def _create_as(channel: grpc.Channel, secret: str, queue: str, topic: str) -> None:
    queue_service_pb2_grpc.QueueServiceStub(channel).CreateQueue(
        queue_service_pb2.CreateQueueRequest(queue=queue_service_pb2.Queue(name=queue)),
        metadata=bearer(secret),
    )
    topic_service_pb2_grpc.TopicServiceStub(channel).CreateTopic(
        topic_service_pb2.CreateTopicRequest(topic=topic_service_pb2.Topic(name=topic)),
        metadata=bearer(secret),
    )


def test_tenants_are_listed_with_usage_against_quota_and_rate_limits(
    page, keyed_console, channel_of
):
    channel = channel_of(keyed_console)
    secret = _tenant_with_admin_key(
        channel, keyed_console, "console-quota", max_queues=10, max_topics=0, max_messages=1000
    )
    _create_as(channel, secret, "quota-orders", "quota-events")
    _tenant_with_admin_key(channel, keyed_console, "console-other")
    log_in(page, keyed_console, keyed_console.secret)
    wait(page, lambda d: "Tenants" in (text_of(d, "header nav") or ""), "the Tenants link")
    page.find_element(By.LINK_TEXT, "Tenants").click()
    for name in ("console-quota", "console-other"):
        wait(
            page,
            lambda d, name=name: d.find_elements(By.CSS_SELECTOR, f'tr[data-tenant="{name}"]'),
            f"tenant {name} listed",
        )
    row = 'tr[data-tenant="console-quota"]'
    assert page.find_elements(By.CSS_SELECTOR, f"{row} td")[2].text == "the console-quota team"
    account = page.find_elements(By.CSS_SELECTOR, f"{row} td")[1].text
    assert re.fullmatch(r"[0-9]{12}", account), account
    page.find_element(By.CSS_SELECTOR, f"{row} a").click()
    # Usage is the servers' snapshot, refreshed every few seconds: wait for the new queue.
    usage = "#tenant-usage tr[data-usage={} td"
    wait(
        page,
        lambda d: text_of(d, usage.format("queues]")) == "1 / 10 queues",
        "one queue of ten",
    )
    assert text_of(page, usage.format("topics]")) == "1 topics (no limit)"
    assert text_of(page, usage.format("messages]")) == "0 / 1,000 messages"
    assert text_of(page, usage.format("bytes]")) == "0 bytes (no limit)"
    assert text_of(page, "#tenant-account") == account
    assert text_of(page, "#tenant-description") == "the console-quota team"
    limits = "#tenant-limits tr[data-limit={}] td"
    assert text_of(page, limits.format("sends")) == "50 / s, burst 100"
    assert text_of(page, limits.format("calls")) == "no limit"


def test_a_tenants_key_sees_only_its_tenants_queues_and_topics(page, keyed_console, channel_of):
    channel = channel_of(keyed_console)
    secret_a = _tenant_with_admin_key(channel, keyed_console, "console-a")
    secret_b = _tenant_with_admin_key(channel, keyed_console, "console-b")
    _create_as(channel, secret_a, "a-orders", "a-events")
    _create_as(channel, secret_b, "b-orders", "b-events")
    log_in(page, keyed_console, secret_a)
    assert text_of(page, "#who") == "key console-a-admin"
    wait(
        page,
        lambda d: d.find_elements(By.CSS_SELECTOR, 'tr[data-queue="a-orders"]'),
        "tenant A's queue",
    )
    assert not page.find_elements(By.CSS_SELECTOR, 'tr[data-queue="b-orders"]')
    # Nor the default tenant's: the overview lists A's queue alone.
    assert len(page.find_elements(By.CSS_SELECTOR, "tr[data-queue]")) == 1
    # A tenant's admin manages its keys, not tenants: no Tenants screen.
    assert "Keys" in text_of(page, "header nav")
    assert "Tenants" not in text_of(page, "header nav")
    page.find_element(By.LINK_TEXT, "Topics").click()
    wait(
        page,
        lambda d: d.find_elements(By.CSS_SELECTOR, 'li[data-topic="a-events"]'),
        "tenant A's topic",
    )
    assert [item.get_attribute("data-topic") for item in page.find_elements(
        By.CSS_SELECTOR, "li[data-topic]")] == ["a-events"]  # fmt: skip
    # B's queue by its address: the API answers NOT_FOUND, as for no queue at all.
    page.get(keyed_console.url + "/#/queues/b-orders")
    assert "NotFound" in wait(page, lambda d: text_of(d, ".error"), "B's queue refused")


def test_schedules_show_next_fire_times_run_now_and_pause(page, keyed_console, channel_of):
    channel = channel_of(keyed_console)
    create_queue(channel, keyed_console, "console-scheduled")
    schedules = schedule_service_pb2_grpc.ScheduleServiceStub(channel)
    schedules.CreateSchedule(
        schedule_service_pb2.CreateScheduleRequest(
            schedule=schedule_service_pb2.Schedule(
                name="console-nightly",
                cron=schedule_service_pb2.CronSpec(expression="0 2 * * *", time_zone="UTC"),
                target=schedule_service_pb2.ScheduleTarget(queue="console-scheduled"),
                body=b"tick",
            )
        ),
        metadata=keyed_console.metadata(),
    )
    log_in(page, keyed_console, keyed_console.secret)
    page.get(keyed_console.url + "/#/schedules")
    row = 'tr[data-schedule="console-nightly"]'
    buttons = {
        button.text: button
        for button in wait(
            page, lambda d: d.find_elements(By.CSS_SELECTOR, f"{row} button"), "the schedule"
        )
    }
    buttons["Next 5"].click()
    times = wait(
        page, lambda d: d.find_elements(By.CSS_SELECTOR, f"{row} ul.fire-times li"), "fire times"
    )
    assert len(times) == 5
    assert all(item.text.endswith("02:00:00Z") for item in times)
    buttons["Run now"].click()
    eventually(
        lambda: visible(channel, keyed_console, "console-scheduled") == 1, what="the run's message"
    )
    page.find_element(By.XPATH, "//tr[@data-schedule='console-nightly']//button[.='Pause']").click()
    wait(page, lambda d: "paused" in (text_of(d, f"{row} td:nth-child(4)") or ""), "paused")
    assert schedules.GetSchedule(
        schedule_service_pb2.GetScheduleRequest(name="console-nightly"),
        metadata=keyed_console.metadata(),
    ).schedule.paused


async def test_a_change_without_the_csrf_token_is_refused(keyed_console, channel_of):
    create_queue(channel_of(keyed_console), keyed_console, "console-csrf", [(b"kept", {})])
    purge = f"{keyed_console.url}/api/postbox.v1.QueueService/PurgeQueue"
    body = {"name": "console-csrf"}
    async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as http:
        async with http.post(purge, json=body) as response:
            assert response.status == 401
            assert (await response.json())["code"] == "unauthenticated"
        async with http.post(
            f"{keyed_console.url}/console/login", json={"secret": keyed_console.secret}
        ) as response:
            assert response.status == 200
            csrf = (await response.json())["csrf"]
        async with http.post(purge, json=body) as response:
            assert response.status == 403
            refusal = await response.json()
            assert refusal["code"] == "permission_denied"
            assert "X-CSRF-Token" in refusal["message"]
        async with http.post(purge, json=body, headers={"X-CSRF-Token": csrf[::-1]}) as response:
            assert response.status == 403
        # A page of another origin, even with the token.
        async with http.post(
            purge,
            json=body,
            headers={"X-CSRF-Token": csrf, "Origin": "http://evil.example"},
        ) as response:
            assert response.status == 403
        # A bearer of the browser's own is dropped: the call is the session's.
        async with http.post(
            purge,
            json=body,
            headers={"X-CSRF-Token": "", "Authorization": f"Bearer {keyed_console.secret}"},
        ) as response:
            assert response.status == 403
        await asyncio.to_thread(
            lambda: eventually(
                lambda: visible(channel_of(keyed_console), keyed_console, "console-csrf") == 1
            )
        )
        async with http.post(purge, json=body, headers={"X-CSRF-Token": csrf}) as response:
            assert response.status == 200, await response.text()
            assert await response.json() == {"purgedMessages": "1"}


async def test_the_session_cookie_is_httponly_and_samesite_strict(keyed_console):
    async with (
        aiohttp.ClientSession() as http,
        http.post(
            f"{keyed_console.url}/console/login", json={"secret": keyed_console.secret}
        ) as response,
    ):
        assert response.status == 200
        cookie = response.cookies["postbox_console"]
        answer = await response.json()
    assert cookie["httponly"] is True
    assert cookie["samesite"] == "Strict"
    assert cookie["path"] == "/"
    assert len(cookie.value) >= 40
    assert keyed_console.secret not in json.dumps(answer)
    assert answer["key"] == {
        "name": "console-admin",
        "tenant": "",
        "grants": [{"permission": "admin", "pattern": "*"}],
    }


async def test_login_refuses_what_is_not_a_known_key(keyed_console):
    login = f"{keyed_console.url}/console/login"
    async with aiohttp.ClientSession() as http:
        async with http.post(login, data="secret=x") as response:
            assert response.status == 400
        async with http.post(login, json={"secret": "pbk_unknown"}) as response:
            assert response.status == 401
            assert "postbox_console" not in response.cookies
        async with http.post(login, json={"secret": "x" * 5000}) as response:
            assert response.status == 400
            assert "4096" in (await response.json())["message"]


def test_sessions_are_bounded_and_the_least_recently_used_goes_first():
    sessions = Sessions(max_sessions=2)
    first, _ = sessions.open("a")
    second, _ = sessions.open("b")
    assert sessions.get(first) is not None  # now the most recently used
    third, _ = sessions.open("c")
    assert len(sessions) == 2
    assert sessions.get(second) is None
    assert sessions.get(first) is not None
    assert sessions.get(third) is not None


def test_sessions_end_when_idle():
    sessions = Sessions(idle_lifetime=-1.0)  # over before it began
    session_id, _ = sessions.open("a")
    assert sessions.get(session_id) is None
    assert len(sessions) == 0


def test_workers_and_the_console_are_refused_together():
    result = subprocess.run(
        [sys.executable, "-m", "postbox_server", "serve", "--workers", "2", "--console-port", "1"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
    )
    assert result.returncode == 2
    assert "--console-port" in result.stderr
    assert "--workers" in result.stderr


def test_a_console_beyond_loopback_without_keys_is_refused(open_console):
    result = subprocess.run(
        [sys.executable, "-m", "postbox_server", "serve",
         "--database-url", open_console.database_url,
         "--grpc-port", str(free_port()), "--console-host", "0.0.0.0",
         "--console-port", str(free_port())],
        capture_output=True, text=True, cwd=ROOT, check=False, timeout=60,
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert "refusing to serve '0.0.0.0' without authentication" in result.stderr


def test_over_tls_the_session_cookie_is_secure(admin_url, tmp_path):
    authority = Authority(tmp_path, "console")
    pair = authority.issue("server", server=True)
    url = create_database(admin_url, "postbox_console_tls")
    console = Console(url)
    console.server = ServerProcess(
        url, "--console-port", str(console.console_port),
        "--tls-cert", str(pair.certificate), "--tls-key", str(pair.key),
        credentials=grpc.ssl_channel_credentials(authority.path.read_bytes()),
    )  # fmt: skip
    console.server.start()
    try:
        trust = ssl.create_default_context(cafile=str(authority.path))
        with urlopen(
            f"https://127.0.0.1:{console.console_port}/console/session", context=trust
        ) as response:
            cookies = SimpleCookie(response.headers["Set-Cookie"])
        cookie = cookies["postbox_console"]
        assert cookie["secure"] is True
        assert cookie["httponly"] is True
        assert cookie["samesite"] == "Strict"
    finally:
        console.server.stop()
        drop_database(admin_url, url)


async def test_an_open_console_answers_no_other_host_name(open_console, keyed_console):
    """DNS rebinding: a page at evil.example whose name resolves to 127.0.0.1 is
    same-origin with what it reaches; without keys the console refuses that Host."""
    async with aiohttp.ClientSession() as http:
        for host in ("evil.example", f"evil.example:{open_console.console_port}"):
            async with http.get(
                f"{open_console.url}/console/session", headers={"Host": host}
            ) as response:
                assert response.status == 403
                assert "no API key exists" in (await response.json())["message"]
        for host in ("localhost", f"127.0.0.1:{open_console.console_port}", "[::1]"):
            async with http.get(
                f"{open_console.url}/console/session", headers={"Host": host}
            ) as response:
                assert response.status == 200, host
        # With keys, the name does not matter: every call needs a key's session anyway.
        async with http.get(
            f"{keyed_console.url}/console/session", headers={"Host": "evil.example"}
        ) as response:
            assert response.status == 200
            assert (await response.json())["signedIn"] is False


def test_the_committed_bundle_is_served(open_console):
    with urlopen(f"{open_console.url}/static/app.js") as response:
        served = response.read()
        assert response.headers["Content-Type"].startswith("text/javascript")
    static = ROOT / "server" / "postbox_server" / "console" / "static"
    assert served == (static / "app.js").read_bytes()


def test_the_overview_pages_through_more_than_a_thousand_queues(page, open_console, channel_of):
    """ListQueues answers at most 1,000 a page: the overview follows the page tokens, and
    its filter finds a queue beyond the first page."""
    channel = channel_of(open_console)
    queues = queue_service_pb2_grpc.QueueServiceStub(channel)
    names = [f"console-many-{number:04d}" for number in range(1100)]
    for name in names:
        queues.CreateQueue(
            queue_service_pb2.CreateQueueRequest(queue=queue_service_pb2.Queue(name=name))
        )
    total = 0
    token = ""
    while True:
        listed = queues.ListQueues(
            queue_service_pb2.ListQueuesRequest(page_size=1000, page_token=token)
        )
        total += len(listed.queues)
        token = listed.next_page_token
        if not token:
            break
    assert total > 1000
    page.get(open_console.url + "/")
    wait(
        page,
        lambda d: text_of(d, "#queue-count") == f"{total} of {total} queues",
        f"all {total} queues listed",
    )
    page.find_element(By.ID, "queue-filter").send_keys("console-many-1099")
    wait(
        page,
        lambda d: (
            text_of(d, "#queue-count") == f"1 of {total} queues"
            and d.find_elements(By.CSS_SELECTOR, 'tr[data-queue="console-many-1099"]')
        ),
        "the filter finds the last queue",
    )


def test_a_jobs_life_shows_its_state_consumer_and_result(page, keyed_console, channel_of):
    """Send a job, receive it as consumer worker-7, ack it with a result: the message
    view, the in-flight peek and the list by state show each step."""
    channel = channel_of(keyed_console)
    queue = "console-jobs"
    queue_service_pb2_grpc.QueueServiceStub(channel).CreateQueue(
        queue_service_pb2.CreateQueueRequest(
            queue=queue_service_pb2.Queue(name=queue, archive_on_delete=True)
        ),
        metadata=keyed_console.metadata(),
    )
    messages = message_service_pb2_grpc.MessageServiceStub(channel)
    job = messages.Send(
        msg_pb.SendRequest(queue=queue, body=b'{"resize": "cat.png"}'),
        metadata=keyed_console.metadata(),
    ).message_id
    log_in(page, keyed_console, keyed_console.secret)
    page.get(f"{keyed_console.url}/#/queues/{queue}/messages/{job}")
    wait(page, lambda d: text_of(d, "#message-state") == "visible", "the job waiting")
    assert text_of(page, "#message-attempts") == "0"
    assert text_of(page, "#message-consumer") == NOTHING

    received = [
        m
        for response in messages.Receive(
            msg_pb.ReceiveRequest(
                queue=queue, max_messages=1, consumer_id="worker-7",
                visibility_timeout=duration(600),  # held through the whole check
            ),
            metadata=keyed_console.metadata(),
        )
        for m in response.messages
    ]  # fmt: skip
    assert [m.message_id for m in received] == [job]
    # The view polls: the next answer shows who holds it and since when.
    wait(page, lambda d: text_of(d, "#message-state") == "in flight", "the job in flight")
    holder = text_of(page, "#message-consumer") or ""
    assert holder.startswith("worker-7 since ")
    assert text_of(page, "#message-attempts") == "1"
    # The queue's peek and its list of in-flight messages name the consumer too.
    page.get(f"{keyed_console.url}/#/queues/{queue}")
    peeked = f'tr[data-message="{job}"] td.consumer'
    wait(page, lambda d: (text_of(d, peeked) or "").startswith("worker-7"), "the peeked holder")
    state = page.find_element(By.ID, "jobs-state")
    state.find_element(By.XPATH, "./option[.='In flight']").click()
    row = f'tr[data-job="{job}"]'
    wait(page, lambda d: text_of(d, f"{row} td.state") == "in flight", "the in-flight list")
    assert (text_of(page, f"{row} td:nth-child(4)") or "").startswith("worker-7 since ")

    messages.Delete(
        msg_pb.DeleteRequest(
            queue=queue, receipt=received[0].receipt, result=b'{"thumb": "t.png"}'
        ),
        metadata=keyed_console.metadata(),
    )
    wait(page, lambda d: not d.find_elements(By.CSS_SELECTOR, row), "the job gone from in flight")
    page.find_element(By.ID, "jobs-state").find_element(By.XPATH, "./option[.='Succeeded']").click()
    wait(page, lambda d: text_of(d, f"{row} td.state") == "succeeded", "the succeeded list")
    page.find_element(By.CSS_SELECTOR, f"{row} a").click()
    wait(page, lambda d: text_of(d, "#message-state") == "succeeded", "the job succeeded")
    assert text_of(page, "#message-result") == '{"thumb": "t.png"}'
    assert text_of(page, "#message-finished") not in (None, NOTHING)
    assert text_of(page, "#message-consumer") == NOTHING


def test_the_list_by_state_pages(page, keyed_console, channel_of):
    channel = channel_of(keyed_console)
    queue = "console-jobs-paged"
    create_queue(channel, keyed_console, queue)
    messages = message_service_pb2_grpc.MessageServiceStub(channel)
    for start in range(0, 55, 10):  # one more page than the console's 50
        entries = [
            msg_pb.SendBatchEntry(body=f"job {i}".encode())
            for i in range(start, min(start + 10, 55))
        ]
        messages.SendBatch(
            msg_pb.SendBatchRequest(queue=queue, entries=entries), metadata=keyed_console.metadata()
        )
    log_in(page, keyed_console, keyed_console.secret)
    page.get(f"{keyed_console.url}/#/queues/{queue}")
    rows = "#jobs tr[data-job]"
    wait(page, lambda d: len(d.find_elements(By.CSS_SELECTOR, rows)) == 50, "the first page")
    page.find_element(By.ID, "jobs-next").click()
    wait(page, lambda d: len(d.find_elements(By.CSS_SELECTOR, rows)) == 5, "the second page")
    assert not page.find_element(By.ID, "jobs-next").is_enabled()
    page.find_element(By.ID, "jobs-first").click()
    wait(page, lambda d: len(d.find_elements(By.CSS_SELECTOR, rows)) == 50, "the first page again")
