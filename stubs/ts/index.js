// The generated messages and service descriptors of postbox.v1 (protoc-gen-es v2):
// usable with any Connect transport (connect-node here, connect-web in a browser).
export * from "./gen/postbox/v1/message_pb.js";
export * from "./gen/postbox/v1/message_service_pb.js";
export * from "./gen/postbox/v1/queue_service_pb.js";
export * from "./gen/postbox/v1/topic_service_pb.js";
export * from "./gen/postbox/v1/schedule_service_pb.js";
export * from "./gen/postbox/v1/access_service_pb.js";
