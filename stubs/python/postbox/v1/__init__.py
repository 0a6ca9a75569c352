"""Generated protobuf and gRPC code for postbox.v1: run scripts/generate-stubs, never edit."""
