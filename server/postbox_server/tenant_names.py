"""How a tenant's resource names are stored: `<tenant>/<name>`, the default tenant's
without a prefix (issue 47). The caller's tenant for the call in progress, so that an
error message never shows a caller its own prefix."""

from __future__ import annotations

import re
from contextvars import ContextVar

SEPARATOR = "/"
DEFAULT_TENANT = ""
# postbox.tenant_problem checks the same: 1-32 characters of a-z, 0-9 and "-".
TENANT_PATTERN = re.compile(r"[a-z0-9][a-z0-9-]{0,31}")

# The tenant of the call in progress ("" for the default tenant), set by the
# authorisation interceptor before the servicer runs.
CALLER_TENANT: ContextVar[str] = ContextVar("postbox_caller_tenant", default=DEFAULT_TENANT)


def qualified(tenant: str, name: str) -> str:
    """The stored name of a tenant's resource; the default tenant's are stored as given."""
    return f"{tenant}{SEPARATOR}{name}" if tenant else name


def unqualified(tenant: str, name: str) -> str:
    """The name a tenant's caller knows for a stored name of its own tenant."""
    prefix = tenant + SEPARATOR
    return name[len(prefix) :] if tenant and name.startswith(prefix) else name


def belongs(tenant: str, name: str) -> bool:
    """Whether a stored name is one of the tenant's (the default tenant's have no "/")."""
    if tenant:
        return name.startswith(tenant + SEPARATOR)
    return SEPARATOR not in name


def without_caller_prefix(message: str) -> str:
    """A message as the caller may read it: its own tenant's prefix taken out of every
    name it quotes, so that it reads the names it sent."""
    tenant = CALLER_TENANT.get()
    if not tenant or tenant + SEPARATOR not in message:
        return message
    return re.sub(rf"(?<![a-z0-9-]){re.escape(tenant + SEPARATOR)}", "", message)
