"""API keys: secrets, grants, the per-process cache and the gRPC interceptor."""
