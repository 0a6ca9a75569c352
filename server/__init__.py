"""postbox: a message-queue service whose only state is PostgreSQL."""

__version__ = "0.1.0"
