"""Generated code of the postbox API (package postbox.v1)."""
