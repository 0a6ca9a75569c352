import type { Client, Transport } from "@connectrpc/connect";
import type {
  ConnectTransportOptions,
  GrpcTransportOptions,
} from "@connectrpc/connect-node";
import type {
  AccessService,
  MessageService,
  QueueService,
  ScheduleService,
  TopicService,
} from "./index.js";

export { Code, ConnectError } from "@connectrpc/connect";

export interface Clients {
  transport: Transport;
  queues: Client<typeof QueueService>;
  messages: Client<typeof MessageService>;
  topics: Client<typeof TopicService>;
  schedules: Client<typeof ScheduleService>;
  access: Client<typeof AccessService>;
}

/** Over gRPC (HTTP/2), to a server's gRPC port. */
export declare function connect(
  target: string,
  options?: Partial<GrpcTransportOptions>,
): Clients;

/** Over HTTP/1.1 + JSON (the Connect protocol), to a server's --http-port. */
export declare function connectHttp(
  baseUrl: string,
  options?: Partial<ConnectTransportOptions>,
): Clients;
