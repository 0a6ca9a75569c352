"""The SQS shim: an HTTP server speaking the Amazon SQS JSON and query protocols.

It is a process of its own (`postbox sqs`) that translates each SQS action into calls
of the postbox gRPC API through the generated stubs; it keeps no state and never
touches the database.
"""
