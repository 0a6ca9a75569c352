"""postbox: a message-queue service whose only state is PostgreSQL."""

import os

__version__ = "0.1.0"

# The server forks only to exec (pg_ctl, its --workers), never to run gRPC in the
# child, so it needs none of gRPC's fork handlers; with them on, a fork while gRPC's
# threads live prints "Other threads are currently calling into gRPC, skipping
# fork() handlers" on every Ctrl-C of an embedded-PostgreSQL server. Read once,
# when grpc is first imported, which every entry point does after this.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
