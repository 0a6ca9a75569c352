import datetime

from google.protobuf import field_mask_pb2 as _field_mask_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Permission(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PERMISSION_UNSPECIFIED: _ClassVar[Permission]
    PERMISSION_SEND: _ClassVar[Permission]
    PERMISSION_RECEIVE: _ClassVar[Permission]
    PERMISSION_PUBLISH: _ClassVar[Permission]
    PERMISSION_READ: _ClassVar[Permission]
    PERMISSION_MANAGE: _ClassVar[Permission]
    PERMISSION_ADMIN: _ClassVar[Permission]
PERMISSION_UNSPECIFIED: Permission
PERMISSION_SEND: Permission
PERMISSION_RECEIVE: Permission
PERMISSION_PUBLISH: Permission
PERMISSION_READ: Permission
PERMISSION_MANAGE: Permission
PERMISSION_ADMIN: Permission

class Grant(_message.Message):
    __slots__ = ("permission", "pattern")
    PERMISSION_FIELD_NUMBER: _ClassVar[int]
    PATTERN_FIELD_NUMBER: _ClassVar[int]
    permission: Permission
    pattern: str
    def __init__(self, permission: _Optional[_Union[Permission, str]] = ..., pattern: _Optional[str] = ...) -> None: ...

class Key(_message.Message):
    __slots__ = ("name", "grants", "expire_time", "create_time", "update_time", "last_used_time", "rate_limits", "tenant")
    NAME_FIELD_NUMBER: _ClassVar[int]
    GRANTS_FIELD_NUMBER: _ClassVar[int]
    EXPIRE_TIME_FIELD_NUMBER: _ClassVar[int]
    CREATE_TIME_FIELD_NUMBER: _ClassVar[int]
    UPDATE_TIME_FIELD_NUMBER: _ClassVar[int]
    LAST_USED_TIME_FIELD_NUMBER: _ClassVar[int]
    RATE_LIMITS_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    name: str
    grants: _containers.RepeatedCompositeFieldContainer[Grant]
    expire_time: _timestamp_pb2.Timestamp
    create_time: _timestamp_pb2.Timestamp
    update_time: _timestamp_pb2.Timestamp
    last_used_time: _timestamp_pb2.Timestamp
    rate_limits: RateLimits
    tenant: str
    def __init__(self, name: _Optional[str] = ..., grants: _Optional[_Iterable[_Union[Grant, _Mapping]]] = ..., expire_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., create_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., update_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., last_used_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., rate_limits: _Optional[_Union[RateLimits, _Mapping]] = ..., tenant: _Optional[str] = ...) -> None: ...

class RateLimits(_message.Message):
    __slots__ = ("sends_per_second", "send_burst", "receives_per_second", "receive_burst", "calls_per_second", "call_burst")
    SENDS_PER_SECOND_FIELD_NUMBER: _ClassVar[int]
    SEND_BURST_FIELD_NUMBER: _ClassVar[int]
    RECEIVES_PER_SECOND_FIELD_NUMBER: _ClassVar[int]
    RECEIVE_BURST_FIELD_NUMBER: _ClassVar[int]
    CALLS_PER_SECOND_FIELD_NUMBER: _ClassVar[int]
    CALL_BURST_FIELD_NUMBER: _ClassVar[int]
    sends_per_second: float
    send_burst: int
    receives_per_second: float
    receive_burst: int
    calls_per_second: float
    call_burst: int
    def __init__(self, sends_per_second: _Optional[float] = ..., send_burst: _Optional[int] = ..., receives_per_second: _Optional[float] = ..., receive_burst: _Optional[int] = ..., calls_per_second: _Optional[float] = ..., call_burst: _Optional[int] = ...) -> None: ...

class CreateKeyRequest(_message.Message):
    __slots__ = ("key",)
    KEY_FIELD_NUMBER: _ClassVar[int]
    key: Key
    def __init__(self, key: _Optional[_Union[Key, _Mapping]] = ...) -> None: ...

class CreateKeyResponse(_message.Message):
    __slots__ = ("key", "secret", "sigv4_secret_access_key")
    KEY_FIELD_NUMBER: _ClassVar[int]
    SECRET_FIELD_NUMBER: _ClassVar[int]
    SIGV4_SECRET_ACCESS_KEY_FIELD_NUMBER: _ClassVar[int]
    key: Key
    secret: str
    sigv4_secret_access_key: str
    def __init__(self, key: _Optional[_Union[Key, _Mapping]] = ..., secret: _Optional[str] = ..., sigv4_secret_access_key: _Optional[str] = ...) -> None: ...

class GetKeyRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class GetKeyResponse(_message.Message):
    __slots__ = ("key",)
    KEY_FIELD_NUMBER: _ClassVar[int]
    key: Key
    def __init__(self, key: _Optional[_Union[Key, _Mapping]] = ...) -> None: ...

class ListKeysRequest(_message.Message):
    __slots__ = ("page_size", "page_token")
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    page_size: int
    page_token: str
    def __init__(self, page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListKeysResponse(_message.Message):
    __slots__ = ("keys", "next_page_token")
    KEYS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    keys: _containers.RepeatedCompositeFieldContainer[Key]
    next_page_token: str
    def __init__(self, keys: _Optional[_Iterable[_Union[Key, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class UpdateKeyRequest(_message.Message):
    __slots__ = ("key", "update_mask")
    KEY_FIELD_NUMBER: _ClassVar[int]
    UPDATE_MASK_FIELD_NUMBER: _ClassVar[int]
    key: Key
    update_mask: _field_mask_pb2.FieldMask
    def __init__(self, key: _Optional[_Union[Key, _Mapping]] = ..., update_mask: _Optional[_Union[_field_mask_pb2.FieldMask, _Mapping]] = ...) -> None: ...

class UpdateKeyResponse(_message.Message):
    __slots__ = ("key",)
    KEY_FIELD_NUMBER: _ClassVar[int]
    key: Key
    def __init__(self, key: _Optional[_Union[Key, _Mapping]] = ...) -> None: ...

class DeleteKeyRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class DeleteKeyResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class Tenant(_message.Message):
    __slots__ = ("name", "account_id", "description", "create_time", "update_time", "quota", "rate_limits")
    NAME_FIELD_NUMBER: _ClassVar[int]
    ACCOUNT_ID_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    CREATE_TIME_FIELD_NUMBER: _ClassVar[int]
    UPDATE_TIME_FIELD_NUMBER: _ClassVar[int]
    QUOTA_FIELD_NUMBER: _ClassVar[int]
    RATE_LIMITS_FIELD_NUMBER: _ClassVar[int]
    name: str
    account_id: str
    description: str
    create_time: _timestamp_pb2.Timestamp
    update_time: _timestamp_pb2.Timestamp
    quota: TenantQuota
    rate_limits: RateLimits
    def __init__(self, name: _Optional[str] = ..., account_id: _Optional[str] = ..., description: _Optional[str] = ..., create_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., update_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., quota: _Optional[_Union[TenantQuota, _Mapping]] = ..., rate_limits: _Optional[_Union[RateLimits, _Mapping]] = ...) -> None: ...

class TenantQuota(_message.Message):
    __slots__ = ("max_queues", "max_topics", "max_messages", "max_bytes")
    MAX_QUEUES_FIELD_NUMBER: _ClassVar[int]
    MAX_TOPICS_FIELD_NUMBER: _ClassVar[int]
    MAX_MESSAGES_FIELD_NUMBER: _ClassVar[int]
    MAX_BYTES_FIELD_NUMBER: _ClassVar[int]
    max_queues: int
    max_topics: int
    max_messages: int
    max_bytes: int
    def __init__(self, max_queues: _Optional[int] = ..., max_topics: _Optional[int] = ..., max_messages: _Optional[int] = ..., max_bytes: _Optional[int] = ...) -> None: ...

class TenantUsage(_message.Message):
    __slots__ = ("queues", "topics", "messages", "bytes", "count_time")
    QUEUES_FIELD_NUMBER: _ClassVar[int]
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    COUNT_TIME_FIELD_NUMBER: _ClassVar[int]
    queues: int
    topics: int
    messages: int
    bytes: int
    count_time: _timestamp_pb2.Timestamp
    def __init__(self, queues: _Optional[int] = ..., topics: _Optional[int] = ..., messages: _Optional[int] = ..., bytes: _Optional[int] = ..., count_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class CreateTenantRequest(_message.Message):
    __slots__ = ("tenant",)
    TENANT_FIELD_NUMBER: _ClassVar[int]
    tenant: Tenant
    def __init__(self, tenant: _Optional[_Union[Tenant, _Mapping]] = ...) -> None: ...

class CreateTenantResponse(_message.Message):
    __slots__ = ("tenant",)
    TENANT_FIELD_NUMBER: _ClassVar[int]
    tenant: Tenant
    def __init__(self, tenant: _Optional[_Union[Tenant, _Mapping]] = ...) -> None: ...

class GetTenantRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class GetTenantResponse(_message.Message):
    __slots__ = ("tenant", "usage")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    tenant: Tenant
    usage: TenantUsage
    def __init__(self, tenant: _Optional[_Union[Tenant, _Mapping]] = ..., usage: _Optional[_Union[TenantUsage, _Mapping]] = ...) -> None: ...

class ListTenantsRequest(_message.Message):
    __slots__ = ("page_size", "page_token")
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    page_size: int
    page_token: str
    def __init__(self, page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListTenantsResponse(_message.Message):
    __slots__ = ("tenants", "next_page_token")
    TENANTS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    tenants: _containers.RepeatedCompositeFieldContainer[Tenant]
    next_page_token: str
    def __init__(self, tenants: _Optional[_Iterable[_Union[Tenant, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class UpdateTenantRequest(_message.Message):
    __slots__ = ("tenant", "update_mask")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    UPDATE_MASK_FIELD_NUMBER: _ClassVar[int]
    tenant: Tenant
    update_mask: _field_mask_pb2.FieldMask
    def __init__(self, tenant: _Optional[_Union[Tenant, _Mapping]] = ..., update_mask: _Optional[_Union[_field_mask_pb2.FieldMask, _Mapping]] = ...) -> None: ...

class UpdateTenantResponse(_message.Message):
    __slots__ = ("tenant",)
    TENANT_FIELD_NUMBER: _ClassVar[int]
    tenant: Tenant
    def __init__(self, tenant: _Optional[_Union[Tenant, _Mapping]] = ...) -> None: ...

class DeleteTenantRequest(_message.Message):
    __slots__ = ("name", "force")
    NAME_FIELD_NUMBER: _ClassVar[int]
    FORCE_FIELD_NUMBER: _ClassVar[int]
    name: str
    force: bool
    def __init__(self, name: _Optional[str] = ..., force: _Optional[bool] = ...) -> None: ...

class DeleteTenantResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetCallerTenantRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetCallerTenantResponse(_message.Message):
    __slots__ = ("tenant",)
    TENANT_FIELD_NUMBER: _ClassVar[int]
    tenant: Tenant
    def __init__(self, tenant: _Optional[_Union[Tenant, _Mapping]] = ...) -> None: ...
