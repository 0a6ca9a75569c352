"""The HTTP/JSON front door: every RPC of the five services over the Connect protocol.

The servicers are the gRPC server's own objects, called through the same interceptors
(authorisation, counting, decoding refusals); this package only translates the wire.
"""
