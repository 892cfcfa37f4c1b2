"""Describe a running app's consumer group: members, epochs, active and standby partitions."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.coordinator.protocol import ConsumerProtocol
from aiokafka.errors import for_code

from streamjoin.assignor.protocol import decode_assignment, decode_subscription
from streamjoin.errors import ProvisioningError, UserdataError


@dataclass(frozen=True)
class MemberInfo:
    member_id: str
    instance_id: str | None
    client_host: str
    generation: int
    active: dict[str, list[int]] = field(default_factory=dict)
    standby: dict[str, list[int]] = field(default_factory=dict)
    #: what the member reported about its local stores: changelog -> partition -> lag
    state_lag: dict[str, dict[int, int]] = field(default_factory=dict)
    #: the address the member advertises for interactive queries (``host:port``), if any
    host: str | None = None
    client_id: str = ""
    #: active partitions withheld until their owner revokes them, and warm-up partitions
    pending: dict[str, list[int]] = field(default_factory=dict)
    warmup: dict[str, list[int]] = field(default_factory=dict)


@dataclass(frozen=True)
class GroupInfo:
    group_id: str
    state: str
    protocol: str
    members: tuple[MemberInfo, ...]


async def describe_group_raw(
    bootstrap_servers: str, group_id: str, **client_kwargs: object
) -> dict[str, Any]:
    """DescribeGroups of ``group_id`` as the broker answers it (state, members, metadata)."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap_servers, **client_kwargs)
    await admin.start()
    try:
        responses = await admin.describe_consumer_groups([group_id])
    finally:
        await admin.close()
    group: dict[str, Any] = responses[0].to_object()["groups"][0]
    if group["error_code"] != 0:
        raise ProvisioningError(
            f"describing group {group_id!r}: {for_code(group['error_code']).__name__}"
        )
    return group


async def describe_group(
    bootstrap_servers: str, group_id: str, **client_kwargs: object
) -> GroupInfo:
    """What the group coordinator knows about ``group_id``, with our userdata decoded."""
    group = await describe_group_raw(bootstrap_servers, group_id, **client_kwargs)
    members = []
    for m in group["members"]:
        instance_id = None
        host = None
        state_lag: dict[str, dict[int, int]] = {}
        generation = -1
        standby: dict[str, list[int]] = {}
        active: dict[str, list[int]] = {}
        pending: dict[str, list[int]] = {}
        warmup: dict[str, list[int]] = {}
        if m["member_metadata"]:
            try:
                meta = ConsumerProtocol.METADATA.decode(m["member_metadata"])
                subscription = decode_subscription(meta.user_data)
                instance_id = subscription.group_instance_id
                host = subscription.host
                state_lag = {t: dict(ps) for t, ps in subscription.state_lag.items()}
            except (UserdataError, ValueError):
                pass
        if m["member_assignment"]:
            assignment = ConsumerProtocol.ASSIGNMENT.decode(m["member_assignment"])
            active = {t: sorted(ps) for t, ps in assignment.assignment}
            try:
                userdata = decode_assignment(assignment.user_data)
                generation = userdata.generation
                standby = {t: list(ps) for t, ps in userdata.standby.items()}
                pending = {t: list(ps) for t, ps in userdata.pending.items()}
                warmup = {t: list(ps) for t, ps in userdata.warmup.items()}
            except (UserdataError, ValueError):
                pass
        members.append(
            MemberInfo(
                member_id=m["member_id"],
                instance_id=instance_id,
                client_host=m["client_host"].lstrip("/"),
                generation=generation,
                active=active,
                standby=standby,
                state_lag=state_lag,
                host=host,
                client_id=m.get("client_id") or "",
                pending=pending,
                warmup=warmup,
            )
        )
    members.sort(key=lambda x: x.instance_id or x.member_id)
    return GroupInfo(group_id, group["state"], group["protocol"], tuple(members))
