"""Background work of a server process."""
