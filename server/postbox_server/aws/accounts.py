"""Each caller's account: the account id its queue URLs and ARNs carry (issue 47).

A tenant's key sees its tenant's account id, the default tenant's keys the shim's
`--account-id`. The server says which (AccessService.GetCallerTenant); the answer is
kept per access key for a while, so that a request costs no extra call. A URL or ARN
naming any other account is a missing resource: the actions compare it with the
account of the settings they get.
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
        # access key ("" for the shim's own key) -> (settings, when they go stale)
        self._known: dict[str, tuple[ShimSettings, float]] = {}

    async def settings_for(self, access_key: str, backend: Backend) -> ShimSettings:
        """The settings for a request of this access key, whose calls `backend` makes;
        the server's refusal of the caller as the AWS error to report."""
        now = time.monotonic()
        known = self._known.get(access_key)
        if known is not None and known[1] > now:
            return known[0]
        response = await backend.call(backend.access.GetCallerTenant, GetCallerTenantRequest())
        account_id = response.tenant.account_id or self._settings.account_id
        settings = (
            self._settings
            if account_id == self._settings.account_id
            else dataclasses.replace(self._settings, account_id=account_id)
        )
        self._known.pop(access_key, None)
        while len(self._known) >= MAX_CALLERS:
            del self._known[next(iter(self._known))]
        self._known[access_key] = (settings, now + TTL_SECONDS)
        return settings
