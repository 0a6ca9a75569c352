// The committed TypeScript stubs over HTTP/JSON: Connect for Node's Connect transport on
// HTTP/1.1 with JSON (stubs/ts/node.js connectHttp), the protocol @connectrpc/connect-web
// speaks in a browser. Usage:
// node http_scenario.mjs http://HOST:PORT PREFIX (tests/api/test_http_api.py runs it).
import assert from "node:assert/strict";
import { ReceiveMode } from "../../../../stubs/ts/index.js";
import { Code, ConnectError, connectHttp } from "../../../../stubs/ts/node.js";

const [baseUrl, prefix] = process.argv.slice(2);
const { queues, messages } = connectHttp(baseUrl, { useBinaryFormat: false });
const queue = `${prefix}-connect`;
const body = (s) => new TextEncoder().encode(s);
const text = (message) => new TextDecoder().decode(message.body);
let passed = 0;

async function step(name, run) {
  await run();
  passed += 1;
  console.log(`ok ${name}`);
}

await step("create a queue", async () => {
  const { queue: created } = await queues.createQueue({ queue: { name: queue } });
  assert.equal(created.name, queue);
  assert.equal(created.visibilityTimeout.seconds, 30n);
});

await step("send", async () => {
  for (const s of ["one", "two"]) {
    const { messageId } = await messages.send({ queue, body: body(s) });
    assert.ok(messageId > 0n);
  }
});

await step("receive, a server stream, then delete", async () => {
  const received = [];
  const request = { queue, maxMessages: 1, mode: ReceiveMode.CONTINUOUS, maxTotalMessages: 2n };
  for await (const response of messages.receive(request)) received.push(...response.messages);
  assert.deepEqual(received.map(text), ["one", "two"]);
  await messages.deleteBatch({ queue, receipts: received.map((m) => m.receipt) });
});

await step("a long-poll receive that finds nothing ends empty", async () => {
  const responses = [];
  for await (const r of messages.receive({ queue, waitTime: { seconds: 0n } })) responses.push(r);
  assert.equal(responses.length, 0);
});

await step("errors arrive as ConnectError with the gRPC code and message", async () => {
  await assert.rejects(queues.getQueue({ name: `${prefix}-absent` }), (error) => {
    assert.ok(error instanceof ConnectError);
    assert.equal(error.code, Code.NotFound);
    assert.equal(error.rawMessage, `queue '${prefix}-absent' does not exist`);
    return true;
  });
});

await step("delete the queue", async () => {
  await queues.deleteQueue({ name: queue });
});

console.log(`${passed} passed, 0 failed`);
