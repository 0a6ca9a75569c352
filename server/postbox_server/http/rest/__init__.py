"""The native REST API under /v1, path for path as beyond-queue serves it, on the same
servicers (and interceptors: keys, grants, limits) as gRPC and Connect."""
