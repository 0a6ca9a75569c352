import type { Client, Transport } from "@connectrpc/connect";
import type { GrpcTransportOptions } from "@connectrpc/connect-node";
import type {
  AccessService,
  MessageService,
  QueueService,
  ScheduleService,
  TopicService,
} from "./index.js";

export { Code, ConnectError } from "@connectrpc/connect";

export declare function connect(
  target: string,
  options?: Partial<GrpcTransportOptions>,
): {
  transport: Transport;
  queues: Client<typeof QueueService>;
  messages: Client<typeof MessageService>;
  topics: Client<typeof TopicService>;
  schedules: Client<typeof ScheduleService>;
  access: Client<typeof AccessService>;
};
