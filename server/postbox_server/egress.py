"""Where outbound HTTP (webhook deliveries) may go: public addresses, and the ranges the
operator allows.

A webhook URL is the caller's choice, and the server POSTs to it from inside the
operator's network: without a policy anyone who may create a subscription could make
the server call the cloud metadata service, the database, or an admin port on
localhost. So loopback, private (10/8, 172.16/12, 192.168/16, fc00::/7), link-local
(169.254/16, cloud metadata included; fe80::/10), unspecified, multicast and other
non-global addresses are refused, IPv4-mapped IPv6 addresses by the IPv4 address
they carry, unless `--webhook-allow-cidr` names a range that holds them.

The check runs twice: when a subscription is created or changed (on the addresses
its host resolves to then, for a clear error), and at every delivery, inside the
HTTP client's resolver, on the very addresses it then connects to, so a name that
resolves elsewhere later (DNS rebinding) gets no further.
"""

from __future__ import annotations

import asyncio
import errno
import ipaddress
import socket
from collections.abc import Iterable, Sequence
from urllib.parse import urlsplit

from aiohttp.abc import AbstractResolver, ResolveResult
from aiohttp.resolver import ThreadedResolver

from postbox_server.errors import quoted

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network

FLAG = "--webhook-allow-cidr"


class Refused(Exception):
    """An address the policy does not allow; the message says which and how to allow it."""


class EgressPolicy:
    def __init__(self, allowed: Iterable[str] = ()) -> None:
        self.allowed: list[Network] = [ipaddress.ip_network(cidr, strict=False) for cidr in allowed]

    def check_address(self, host: str, address: Address) -> None:
        """Refused unless the address is public or in an allowed range."""
        if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
            address = address.ipv4_mapped
        if address.is_global and not address.is_multicast:
            return
        if any(address in network for network in self.allowed):
            return
        raise Refused(
            f"webhook host {quoted(host)} is {address}, {_kind(address)}, which webhooks may "
            f"not reach; the operator can allow it with {FLAG}"
        )

    async def check_url(self, url: str) -> None:
        """Refused when the URL's host is, or resolves now to, a refused address. A name
        that does not resolve yet passes: every delivery checks again."""
        host = urlsplit(url).hostname or ""
        literal = _literal(host)
        if literal is not None:
            self.check_address(host, literal)
            return
        try:
            infos = await asyncio.get_running_loop().getaddrinfo(
                host, None, proto=socket.IPPROTO_TCP
            )
        except (OSError, UnicodeError):
            return
        for info in infos:
            # An IP socket address starts with its text; the stubs' union admits other families'.
            address = str(info[4][0])
            self.check_address(host, ipaddress.ip_address(address.split("%")[0]))

    def resolver(self) -> AbstractResolver:
        """An aiohttp resolver that hands the client only addresses this policy allows."""
        return _CheckingResolver(self)

    def check_literal_url(self, url: str) -> None:
        """Refused when the URL names a refused address literally (aiohttp resolves no
        literal, so its resolver cannot check it)."""
        host = urlsplit(url).hostname or ""
        literal = _literal(host)
        if literal is not None:
            self.check_address(host, literal)


class _CheckingResolver(AbstractResolver):
    def __init__(self, policy: EgressPolicy) -> None:
        self._policy = policy
        self._inner = ThreadedResolver()

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        results = await self._inner.resolve(host, port, family)
        for result in results:
            try:
                self._policy.check_address(host, ipaddress.ip_address(result["host"]))
            except Refused as refused:
                # aiohttp reports an OSError as "cannot connect", with its strerror.
                raise OSError(errno.EACCES, str(refused)) from None
        return results

    async def close(self) -> None:
        await self._inner.close()


def _literal(host: str) -> Address | None:
    try:
        return ipaddress.ip_address(host.strip("[]").split("%")[0])
    except ValueError:
        return None


def _kind(address: Address) -> str:
    for name in ("unspecified", "loopback", "link_local", "private", "multicast", "reserved"):
        if getattr(address, f"is_{name}"):
            kind = name.replace("_", "-")
            return f"{'an' if kind[0] in 'aeiou' else 'a'} {kind} address"
    return "a non-public address"


def parse_cidrs(values: Sequence[str]) -> list[str]:
    """The --webhook-allow-cidr values, checked; ValueError naming a bad one."""
    for value in values:
        try:
            ipaddress.ip_network(value, strict=False)
        except ValueError:
            raise ValueError(
                f"{FLAG} {value[:80]!r} is not a CIDR range such as 10.0.0.0/8"
            ) from None
    return list(values)
