// The console's calls: the committed TypeScript stubs over connect-web, in proto3 JSON,
// to /api/ on the console's own origin. The server adds the key from the session; the
// page adds the session's CSRF token, which it learns from /console/session.
import { Code, ConnectError, createClient } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-web";
import { AccessService } from "../../stubs/ts/gen/postbox/v1/access_service_pb.js";
import { MessageService } from "../../stubs/ts/gen/postbox/v1/message_service_pb.js";
import { QueueService } from "../../stubs/ts/gen/postbox/v1/queue_service_pb.js";
import { ScheduleService } from "../../stubs/ts/gen/postbox/v1/schedule_service_pb.js";
import { StreamService } from "../../stubs/ts/gen/postbox/v1/stream_service_pb.js";
import { TopicService } from "../../stubs/ts/gen/postbox/v1/topic_service_pb.js";

let csrf = null;
let onSignedOut = () => {};

export function useSession(token, signedOut) {
  csrf = token;
  onSignedOut = signedOut;
}

const transport = createConnectTransport({
  baseUrl: "/api",
  useBinaryFormat: false,
  interceptors: [
    (next) => async (request) => {
      if (csrf) request.header.set("X-CSRF-Token", csrf);
      try {
        return await next(request);
      } catch (error) {
        // The key was revoked or has expired, or the server restarted: log in again.
        if (ConnectError.from(error).code === Code.Unauthenticated) onSignedOut();
        throw error;
      }
    },
  ],
});

export const queues = createClient(QueueService, transport);
export const messages = createClient(MessageService, transport);
export const topics = createClient(TopicService, transport);
export const schedules = createClient(ScheduleService, transport);
export const streams = createClient(StreamService, transport);
export const access = createClient(AccessService, transport);

export function errorText(error) {
  const connect = ConnectError.from(error);
  return `${Code[connect.code] ?? connect.code}: ${connect.rawMessage}`;
}

async function post(path, body) {
  const headers = { "Content-Type": "application/json" };
  if (csrf) headers["X-CSRF-Token"] = csrf;
  const response = await fetch(path, {
    method: "POST",
    headers,
    body: JSON.stringify(body ?? {}),
    credentials: "same-origin",
  });
  const answer = await response.json().catch(() => ({}));
  if (!response.ok) throw new Error(answer.message || `HTTP ${response.status}`);
  return answer;
}

export async function currentSession() {
  const response = await fetch("/console/session", { credentials: "same-origin" });
  if (!response.ok) throw new Error(`HTTP ${response.status}`);
  return response.json();
}

export const login = (secret) => post("/console/login", { secret });
export const logout = () => post("/console/logout");

// Every page of a List call, `field` being the repeated field of its response.
export async function listAll(call, request, field, pageSize = 1000) {
  const items = [];
  let pageToken = "";
  do {
    const response = await call({ ...request, pageSize, pageToken });
    items.push(...response[field]);
    pageToken = response.nextPageToken;
  } while (pageToken);
  return items;
}
