"""The SQS and SNS shims: an HTTP server speaking Amazon SQS's and SNS's protocols.

It is a process of its own (`postbox sqs`) that translates each action into calls of
the postbox gRPC API through the generated stubs; it keeps no state and never touches
the database. This package holds what both services share (the aiohttp app, the query
and JSON protocols, SigV4, errors, shapes, the backend); `sqs/` and `sns/` hold each
service's protocol and actions, and neither imports the other.
"""
