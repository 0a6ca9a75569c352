// Clients for Node: connect("127.0.0.1:50051") over gRPC (HTTP/2), where unary,
// server-streaming and bidi calls all work; connectHttp("http://127.0.0.1:8080") over
// a server's HTTP/JSON port (serve --http-port), in the Connect protocol that
// @connectrpc/connect-web speaks in browsers: unary and server-streaming calls.
import { createClient } from "@connectrpc/connect";
import { createConnectTransport, createGrpcTransport } from "@connectrpc/connect-node";
import {
  AccessService,
  MessageService,
  QueueService,
  ScheduleService,
  TopicService,
} from "./index.js";

export { Code, ConnectError } from "@connectrpc/connect";

function clients(transport) {
  return {
    transport,
    queues: createClient(QueueService, transport),
    messages: createClient(MessageService, transport),
    topics: createClient(TopicService, transport),
    schedules: createClient(ScheduleService, transport),
    access: createClient(AccessService, transport),
  };
}

export function connect(target, options = {}) {
  const baseUrl = /^https?:\/\//.test(target) ? target : `http://${target}`;
  return clients(createGrpcTransport({ baseUrl, ...options }));
}

export function connectHttp(baseUrl, options = {}) {
  return clients(createConnectTransport({ baseUrl, httpVersion: "1.1", ...options }));
}
