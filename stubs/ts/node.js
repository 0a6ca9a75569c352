// Clients for Node over gRPC (HTTP/2): connect("127.0.0.1:50051") returns one client
// per postbox service; unary, server-streaming and bidi calls all work.
import { createClient } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";
import {
  AccessService,
  MessageService,
  QueueService,
  ScheduleService,
  TopicService,
} from "./index.js";

export { Code, ConnectError } from "@connectrpc/connect";

export function connect(target, options = {}) {
  const baseUrl = /^https?:\/\//.test(target) ? target : `http://${target}`;
  const transport = createGrpcTransport({ baseUrl, ...options });
  return {
    transport,
    queues: createClient(QueueService, transport),
    messages: createClient(MessageService, transport),
    topics: createClient(TopicService, transport),
    schedules: createClient(ScheduleService, transport),
    access: createClient(AccessService, transport),
  };
}
