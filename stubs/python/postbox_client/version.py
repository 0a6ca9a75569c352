"""This client's version and the API it speaks (docs/operations/versions.md).

The client and the server share one version number, and a server of any version serves
every client of the same API: postbox.v1 only ever gains fields and RPCs (CI runs
`buf breaking` against the frozen v1), so this client works with every postbox server.
"""

__version__ = "0.1.0"
# The gRPC package every call of this client names.
API = "postbox.v1"
