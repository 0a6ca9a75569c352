// The TypeScript conformance scenario: the committed stubs (stubs/ts) over gRPC with
// Connect for Node against a running server. Usage: node scenario.mjs HOST:PORT PREFIX
// (tests/sdk/test_polyglot.py runs it against the real server fixture).
import assert from "node:assert/strict";
import { ReceiveMode } from "../../../../stubs/ts/index.js";
import { Code, ConnectError, connect } from "../../../../stubs/ts/node.js";

const [target, prefix] = process.argv.slice(2);
const { queues, messages, topics } = connect(target);
const queue = `${prefix}-ts`;
const topic = `${prefix}-ts-topic`;
const text = (message) => new TextDecoder().decode(message.body);
const body = (s) => new TextEncoder().encode(s);
let passed = 0;

async function step(name, run) {
  await run();
  passed += 1;
  console.log(`ok ${name}`);
}

// Requests that can be pushed while a bidi call is open.
function pushable() {
  const items = [];
  let wake = null;
  return {
    push(item) {
      items.push(item);
      wake?.();
    },
    async *[Symbol.asyncIterator]() {
      for (;;) {
        while (items.length) yield items.shift();
        await new Promise((resolve) => (wake = resolve));
      }
    },
  };
}

await step("create a queue", async () => {
  const { queue: created } = await queues.createQueue({ queue: { name: queue } });
  assert.equal(created.name, queue);
});

await step("SendBatch", async () => {
  const sent = await messages.sendBatch({
    queue,
    entries: ["one", "two", "three"].map((s) => ({ body: body(s) })),
  });
  assert.equal(sent.messageIds.length, 3);
});

await step("StreamingReceive with settle", async () => {
  const requests = pushable();
  const abort = new AbortController();
  requests.push({ queue, maxMessages: 10, visibilityTimeout: { seconds: 30n } });
  const received = [];
  for await (const { frame } of messages.streamingReceive(requests, { signal: abort.signal })) {
    if (frame.case === "batch") {
      received.push(...frame.value.messages);
      if (received.length === 3) {
        requests.push({ deleteReceipts: received.map((m) => m.receipt) });
      }
    } else if (frame.case === "settleResults") {
      // google.rpc.Status per receipt: code 0 is OK.
      assert.deepEqual(frame.value.deletes.map((s) => s.code), [0, 0, 0]);
      break;
    }
  }
  abort.abort();
  assert.deepEqual(received.map(text).sort(), ["one", "three", "two"]);
});

await step("a long-poll Receive answered by a later send", async () => {
  // The queue is empty: the call waits (up to 20 s) until the send below commits.
  const stream = messages.receive({ queue, maxMessages: 1, waitTime: { seconds: 20n } });
  const pending = stream[Symbol.asyncIterator]().next();
  await messages.send({ queue, body: body("awaited") });
  const { value } = await pending;
  assert.equal(text(value.messages[0]), "awaited");
  await messages.delete({ queue, receipt: value.messages[0].receipt });
});

await step("a continuous Receive stream woken by a later send", async () => {
  await messages.send({ queue, body: body("first") });
  const stream = messages.receive({
    queue,
    maxMessages: 1,
    mode: ReceiveMode.CONTINUOUS,
    maxTotalMessages: 2n,
    idleTimeout: { seconds: 20n },
    visibilityTimeout: { seconds: 30n },
  })[Symbol.asyncIterator]();
  const first = await stream.next();
  assert.equal(text(first.value.messages[0]), "first");
  // The stream has taken everything there was: only this send can answer it.
  const started = Date.now();
  await messages.send({ queue, body: body("later") });
  const later = await stream.next();
  assert.equal(text(later.value.messages[0]), "later");
  // Well inside the 20 s idle limit: woken by the send, not by the wait running out.
  assert.ok(Date.now() - started < 15000, `woken after ${Date.now() - started} ms`);
  await stream.return?.();
  await messages.deleteBatch({
    queue,
    receipts: [first.value.messages[0].receipt, later.value.messages[0].receipt],
  });
});

await step("Publish to a topic with a queue subscription", async () => {
  await topics.createTopic({ topic: { name: topic } });
  await topics.createSubscription({
    subscription: { name: "to-queue", topic, destination: { case: "queue", value: queue } },
  });
  const published = await topics.publish({ topic, routingKey: "a.b", body: body("news") });
  assert.equal(published.messageIds.length, 1);
  for await (const response of messages.receive({ queue, maxMessages: 1, waitTime: { seconds: 10n } })) {
    assert.equal(text(response.messages[0]), "news");
    break;
  }
});

await step("a missing queue is NOT_FOUND", async () => {
  await assert.rejects(
    messages.sendBatch({ queue: `${queue}-missing`, entries: [{ body: body("x") }] }),
    (error) => error instanceof ConnectError && error.code === Code.NotFound,
  );
});

await topics.deleteTopic({ name: topic });
await queues.deleteQueue({ name: queue });
console.log(`${passed} passed, 0 failed`);
