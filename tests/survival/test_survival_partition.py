"""A network partition between the server and PostgreSQL: packets dropped, not refused.

The test runs its own PostgreSQL (Debian's 15) inside a network namespace of its own,
reached from the server over a veth pair. A partition is an nftables table in that
namespace whose input and output chains drop everything (Debian's nftables; .ci/run
installs it): every packet either way is dropped without a word on PostgreSQL's side,
as by a cut cable or a firewall that drops, so no connection is refused or reset and
only the server's timeouts can tell. (Dropping on the server's side instead, with a
qdisc, would not do: Linux counts a probe its own qdisc dropped as local congestion,
not as a probe unanswered. This kernel has no netem.) Creating namespaces needs root,
as CI runs; elsewhere the tests are skipped.
"""

from __future__ import annotations

import asyncio
import os
import random
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import asyncpg
import grpc
import pytest
from faults import (
    CHANNEL_OPTIONS,
    NOT_SERVING,
    SERVING,
    Senders,
    receive_numbers,
    wait_for,
    wait_for_health,
)
from grpc_health.v1 import health_pb2_grpc
from postbox.v1 import message_service_pb2 as pb
from postbox.v1 import message_service_pb2_grpc, queue_service_pb2_grpc
from postbox.v1 import queue_service_pb2 as qpb
from support import ServerProcess

from bench.pg_cluster import PG_BIN, Postgres, as_owner, scratch_directory

pytestmark = [
    pytest.mark.skipif(
        not (PG_BIN / "initdb").exists(),
        reason="Debian's postgresql-15 is not installed (.ci/run installs it)",
    ),
    pytest.mark.skipif(
        shutil.which("nft") is None, reason="Debian's nftables is not installed (.ci/run does)"
    ),
    pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root (CI runs as root)"),
]
# The partition: long enough for every timeout of the path to fire.
PARTITION_SECONDS = 30.0
# Each Send's own deadline: a call must end by it, whatever the network does.
SEND_DEADLINE = 3.0
# gRPC's timer and a loaded 2-core machine: a call ends at most this long past its deadline.
DEADLINE_SLACK = 1.0


DROP_EVERYTHING = """
table inet partition {
  chain incoming { type filter hook input priority 0; policy drop; }
  chain outgoing { type filter hook output priority 0; policy drop; }
}
"""


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)


@dataclass
class Namespace:
    """A network namespace joined to this one by a veth pair: this side HOST, that side
    PEER, a /30 of its own on the pair: addresses that exist only on this machine, drawn
    at random so that two runs at once do not collide."""

    name: str
    host_link: str
    peer_link: str
    host_address: str
    peer_address: str

    @classmethod
    def create(cls) -> Namespace:
        tag = uuid.uuid4().hex[:6]
        subnet = f"10.231.{random.randrange(256)}.{4 * random.randrange(64)}"
        base = subnet.rsplit(".", 1)
        host, peer = (f"{base[0]}.{int(base[1]) + n}" for n in (1, 2))
        ns = cls(f"postbox-{tag}", f"pbh{tag}", f"pbn{tag}", host, peer)
        _ip("netns", "add", ns.name)
        try:
            _ip("link", "add", ns.host_link, "type", "veth", "peer", "name", ns.peer_link)
            _ip("link", "set", ns.peer_link, "netns", ns.name)
            _ip("addr", "add", f"{ns.host_address}/30", "dev", ns.host_link)
            _ip("link", "set", ns.host_link, "up")
            ns.run("ip", "addr", "add", f"{ns.peer_address}/30", "dev", ns.peer_link)
            ns.run("ip", "link", "set", ns.peer_link, "up")
            ns.run("ip", "link", "set", "lo", "up")
        except BaseException:
            ns.remove()
            raise
        return ns

    def command(self, *args: str) -> list[str]:
        return ["ip", "netns", "exec", self.name, *args]

    def run(self, *args: str) -> None:
        subprocess.run(self.command(*args), check=True, capture_output=True, timeout=60)

    def drop(self) -> None:
        """From now on the namespace drops every packet it gets or sends, silently."""
        subprocess.run(self.command("nft", "-f", "-"), input=DROP_EVERYTHING, text=True, check=True)

    def heal(self) -> None:
        self.run("nft", "delete", "table", "inet", "partition")

    def remove(self) -> None:
        subprocess.run(["ip", "link", "del", self.host_link], capture_output=True, check=False)
        subprocess.run(["ip", "netns", "del", self.name], capture_output=True, check=False)


class NamespacedPostgres(Postgres):
    """A PostgreSQL that listens only on the namespace's side of the pair."""

    def __init__(self, data: Path, namespace: Namespace) -> None:
        super().__init__(data, port=5432)
        self.namespace = namespace

    @property
    def address(self) -> str:
        return f"{self.namespace.peer_address}:{self.port}"

    def start(self) -> NamespacedPostgres:
        self.configure(f"listen_addresses = '{self.namespace.peer_address}'")
        with (self.data / "pg_hba.conf").open("a") as hba:
            hba.write(f"host all all {self.namespace.host_address}/32 trust\n")
        log = str(self.data / "server.log")
        command = [str(self.bin_dir / "pg_ctl"), "-D", str(self.data), "-w",
                   "-o", f"-p {self.port}", "-l", log, "start"]  # fmt: skip
        subprocess.run(
            self.namespace.command(*as_owner(command)), check=True, capture_output=True, timeout=60
        )
        return self


@dataclass
class Partitioned:
    namespace: Namespace
    postgres: NamespacedPostgres


@pytest.fixture
def partitioned() -> Iterator[Partitioned]:
    directory = scratch_directory("postbox-partition-")
    namespace = Namespace.create()
    postgres = NamespacedPostgres(directory / "data", namespace)
    try:
        postgres.initdb()
        postgres.start()
        yield Partitioned(namespace, postgres)
    finally:
        postgres.stop_if_running()
        namespace.remove()
        shutil.rmtree(directory, ignore_errors=True)


async def test_partition_under_load(partitioned: Partitioned):
    # The default settings: their timeouts are the ones this test holds to.
    server = ServerProcess(partitioned.postgres.url()).start()
    try:
        async with grpc.aio.insecure_channel(server.target, options=CHANNEL_OPTIONS) as channel:
            await _partition_under_load(partitioned.namespace, channel)
        assert server.process is not None
        assert server.process.poll() is None, "the server died"
    finally:
        server.stop()
    log = server.log()
    assert "does not answer: NOT_SERVING" in log, log
    assert "internal error" not in log, log
    assert " ERROR " not in log, log


async def _partition_under_load(namespace: Namespace, channel: grpc.aio.Channel) -> None:
    messages = message_service_pb2_grpc.MessageServiceStub(channel)
    queues = queue_service_pb2_grpc.QueueServiceStub(channel)
    checks = health_pb2_grpc.HealthStub(channel)
    for name in ("load", "waiting"):
        await queues.CreateQueue(qpb.CreateQueueRequest(queue=qpb.Queue(name=name)))
    load = Senders(messages, "load", deadline=SEND_DEADLINE)
    senders = load.start(8)
    # Long polls that wait through the partition: each ends by its deadline.
    polls: list[tuple[float, grpc.StatusCode]] = []

    async def poll() -> None:
        while not load.stop.is_set():
            started = time.monotonic()
            request = pb.ReceiveRequest(queue="waiting", wait_time={"seconds": 2})
            try:
                async for _ in messages.Receive(request, timeout=SEND_DEADLINE + 2):
                    pass
                code = grpc.StatusCode.OK
            except grpc.aio.AioRpcError as error:
                code = error.code()
                await asyncio.sleep(0.1)
            polls.append((time.monotonic() - started, code))

    pollers = [asyncio.ensure_future(poll()) for _ in range(2)]
    await wait_for(lambda: len(load.acknowledged) >= 100, 30, "sends before the partition")
    assert not load.failures, load.failures[:3]

    await asyncio.to_thread(namespace.drop)
    dropped_at = time.monotonic()
    not_serving = await wait_for_health(checks, NOT_SERVING, timeout=PARTITION_SECONDS)
    failures_before = len(load.failures)
    polls_before = len(polls)
    await asyncio.sleep(max(0.0, PARTITION_SECONDS - (time.monotonic() - dropped_at)))
    acknowledged_in_partition = len(load.acknowledged)
    await asyncio.to_thread(namespace.heal)
    healed_at = time.monotonic()
    # Service resumes: a send is acknowledged again, and health says SERVING.
    await wait_for(lambda: load.last_ack > healed_at, 30, "a send acknowledged after the heal")
    resumed = load.last_ack - healed_at
    serving = await wait_for_health(checks, SERVING, timeout=30)
    await asyncio.sleep(1.0)
    load.stop.set()
    await asyncio.gather(*senders, *pollers)

    during = load.failures[failures_before:]
    assert during, "no send failed during the partition"
    for took, code, details in load.failures:
        assert code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED), (
            code, details,
        )  # fmt: skip
        assert took < SEND_DEADLINE + DEADLINE_SLACK, (took, code, details)
    for took, code in polls:
        assert code in (grpc.StatusCode.OK, grpc.StatusCode.UNAVAILABLE,
                        grpc.StatusCode.DEADLINE_EXCEEDED), code  # fmt: skip
        assert took < SEND_DEADLINE + 2 + DEADLINE_SLACK, (took, code)
    assert len(polls) > polls_before, "no long poll ended during the partition"
    received = await receive_numbers(messages, "load")
    lost = load.acknowledged - received
    assert not lost, f"{len(lost)} acknowledged messages lost, e.g. {sorted(lost)[:5]}"
    codes = sorted({code.name for _, code, _ in during})
    print(
        f"NOT_SERVING {not_serving:.1f} s after the drop; {len(during)} sends failed in it "
        f"({', '.join(codes)}), {acknowledged_in_partition} acknowledged by its end; "
        f"first acknowledgement {resumed:.1f} s after the heal, SERVING {serving:.1f} s after"
    )
    assert not_serving <= 5.0, f"NOT_SERVING only {not_serving:.1f} s after the drop"
    assert resumed <= 10.0, f"the first send acknowledged {resumed:.1f} s after the heal"


def established_to(address: str) -> int:
    """TCP connections of this machine's namespace to `address`, in state ESTABLISHED."""
    done = subprocess.run(
        ["ss", "-Htn", "state", "established", "dst", address],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return len(done.stdout.splitlines())


async def test_half_open_connections(partitioned: Partitioned):
    """PostgreSQL restarts while the network drops everything, so its side of every
    connection is gone and the server's never heard: the server's sockets stay open
    (half-open) until it sends on them. --database-silence-timeout 60 keeps the silence
    from closing them first, so the path tested is the reset PostgreSQL's kernel
    answers once the network is back: calls fail UNAVAILABLE, the pool and the LISTEN
    connection are replaced, and wake-ups and sends resume with nothing lost. The
    LISTEN connection sends nothing while no stream starts waiting: only its TCP
    keepalives find it dead before its safety poll, 30 s apart here."""
    postgres = partitioned.postgres
    server = ServerProcess(
        postgres.url(), "--database-silence-timeout", "60", "--safety-poll-interval", "30"
    ).start()
    try:
        async with grpc.aio.insecure_channel(server.target, options=CHANNEL_OPTIONS) as channel:
            await _half_open(partitioned, channel)
    finally:
        server.stop()
    log = server.log()
    assert "internal error" not in log, log
    assert " ERROR " not in log, log


async def _half_open(partitioned: Partitioned, channel: grpc.aio.Channel) -> None:
    namespace, postgres = partitioned.namespace, partitioned.postgres
    messages = message_service_pb2_grpc.MessageServiceStub(channel)
    queues = queue_service_pb2_grpc.QueueServiceStub(channel)
    checks = health_pb2_grpc.HealthStub(channel)
    for name in ("load", "waiting"):
        await queues.CreateQueue(qpb.CreateQueueRequest(queue=qpb.Queue(name=name)))
    # A stream waiting on an empty queue through it all: the queue is listed on the
    # LISTEN connection that goes half-open.
    waiting = messages.Receive(pb.ReceiveRequest(queue="waiting", mode=pb.RECEIVE_MODE_CONTINUOUS))
    first = asyncio.ensure_future(waiting.read())
    load = Senders(messages, "load", deadline=SEND_DEADLINE)
    senders = load.start(4)
    await wait_for(lambda: len(load.acknowledged) >= 100, 30, "sends before the partition")
    assert not first.done()
    load.stop.set()  # no call in flight while PostgreSQL restarts: none is lost there
    await asyncio.gather(*senders)
    before = established_to(namespace.peer_address)
    assert before >= 2, before  # the pool's and the LISTEN connection

    await asyncio.to_thread(namespace.drop)
    await asyncio.to_thread(postgres.stop, "immediate")  # its resets go nowhere
    await asyncio.to_thread(postgres.start)
    # Every socket the server had is still open on its side, to a server that knows none.
    assert established_to(namespace.peer_address) == before
    await asyncio.to_thread(namespace.heal)
    healed_at = time.monotonic()

    load.stop.clear()
    senders = load.start(4)
    await wait_for(lambda: load.last_ack > healed_at, 30, "a send acknowledged after the heal")
    resumed = load.last_ack - healed_at
    serving = await wait_for_health(checks, SERVING, timeout=30)
    # The waiting stream is woken by a send from another client of the database, whose
    # NOTIFY only a live LISTEN connection hears: the half-open one has been replaced.
    sent_at = time.monotonic()
    conn = await asyncpg.connect(postgres.url())
    try:
        await conn.execute("SELECT postbox.send('waiting', 'wake')")
    finally:
        await conn.close()
    woken = await asyncio.wait_for(first, 30)
    woken_after = time.monotonic() - sent_at
    assert [m.body for m in woken.messages] == [b"wake"]
    waiting.cancel()
    load.stop.set()
    await asyncio.gather(*senders)

    for took, code, details in load.failures:
        assert code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED), (
            code, details,
        )  # fmt: skip
        assert took < SEND_DEADLINE + DEADLINE_SLACK, (took, code, details)
    received = await receive_numbers(messages, "load")
    lost = load.acknowledged - received
    assert not lost, f"{len(lost)} acknowledged messages lost, e.g. {sorted(lost)[:5]}"
    print(
        f"{before} half-open connections; {len(load.failures)} sends failed after the heal; "
        f"first acknowledgement {resumed:.1f} s after it, SERVING {serving:.1f} s after that; "
        f"the waiting stream woken {woken_after:.2f} s after a send"
    )
    assert resumed <= 10.0, f"the first send acknowledged {resumed:.1f} s after the heal"
    assert woken_after <= 5.0, f"the waiting stream woken only {woken_after:.1f} s after a send"
