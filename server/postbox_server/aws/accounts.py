"""Each caller's account: the account id its queue URLs and ARNs carry (issue 47).

A tenant's key sees its tenant's account id, the default tenant's keys the shim's
`--account-id`. The server says which (AccessService.GetCallerTenant); the answer is
kept per access key for a while, so that a request costs no extra call. A URL or ARN
naming any other account is a missing resource: the actions compare it with the
account of the settings they get.

The settings carry the region the request is signed for, as AWS's answers name the
region of the endpoint a request reached: a shim answers every region, and all of
them see the caller's one set of queues and topics.
"""

from __future__ import annotations

import dataclasses
import time

from postbox.v1.access_service_pb2 import GetCallerTenantRequest

from postbox_server.aws.backend import Backend
from postbox_server.aws.settings import ShimSettings

# Seconds an answer is kept: a tenant's changed account id shows within this. A stale
# answer only labels URLs; the server's tenant door decides what a key reaches.
TTL_SECONDS = 30.0
# Callers remembered at most (the oldest answer goes first).
MAX_CALLERS = 10_000


class CallerAccounts:
    """The settings of each caller's requests: the shim's, with the caller's account id."""

    def __init__(self, settings: ShimSettings) -> None:
        self._settings = settings
        # (access key ("" for the shim's own key), region) -> (settings, when they go stale)
        self._known: dict[tuple[str, str], tuple[ShimSettings, float]] = {}

    async def settings_for(
        self, access_key: str, region: str | None, backend: Backend
    ) -> ShimSettings:
        """The settings for a request of this access key signed for this region (None:
        the shim's), whose calls `backend` makes; the server's refusal of the caller as
        the AWS error to report."""
        now = time.monotonic()
        key = (access_key, region or self._settings.region)
        known = self._known.get(key)
        if known is not None and known[1] > now:
            return known[0]
        response = await backend.call(backend.access.GetCallerTenant, GetCallerTenantRequest())
        account_id = response.tenant.account_id or self._settings.account_id
        settings = self._settings
        if (account_id, key[1]) != (settings.account_id, settings.region):
            settings = dataclasses.replace(settings, account_id=account_id, region=key[1])
        self._known.pop(key, None)
        while len(self._known) >= MAX_CALLERS:
            del self._known[next(iter(self._known))]
        self._known[key] = (settings, now + TTL_SECONDS)
        return settings
