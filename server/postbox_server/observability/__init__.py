"""What an operator sees of a running server: metrics."""
