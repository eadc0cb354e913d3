"""The wire contract: its strings never change, and connection info survives a round trip.

The literals below are spelled out on purpose, here and nowhere else: replicas of an older
release, stored gateway state, tests and clients depend on these exact strings.
"""

from __future__ import annotations

import enum
import json
from dataclasses import asdict, fields

import pytest

from kernelfleet import protocol
from kernelfleet.protocol import (
    CONNECTION_KEYS,
    METADATA_KEY,
    CellKey,
    Channel,
    ConnectionInfo,
    ErrorName,
    ForgetContent,
    JobEnv,
    JoinContent,
    MembershipContent,
    ReplicaEnv,
    Reply,
    Request,
    Role,
    gpu_request,
    options_of,
)

WIRE: dict[type[enum.StrEnum], dict[str, str]] = {
    Channel: {"SHELL": "shell", "CONTROL": "control"},
    Request: {
        "JOIN": "kernelfleet_join_request",
        "MEMBERSHIP": "kernelfleet_membership_request",
        "FORGET": "kernelfleet_forget_request",
        "STATUS": "kernelfleet_status_request",
        "RELEASE": "kernelfleet_release_request",
        "OUTCOME": "kernelfleet_outcome_request",
        "BIND": "kernelfleet_bind_request",
    },
    Reply: {
        "JOIN": "kernelfleet_join_reply",
        "MEMBERSHIP": "kernelfleet_membership_reply",
        "FORGET": "kernelfleet_forget_reply",
        "STATUS": "kernelfleet_status_reply",
        "RELEASE": "kernelfleet_release_reply",
        "OUTCOME": "kernelfleet_outcome_reply",
        "BIND": "kernelfleet_bind_reply",
    },
    Role: {"LEAD": "lead", "YIELD": "yield", "SETTLE": "settle"},
    ErrorName: {
        "REPLICA_ISOLATED": "ReplicaIsolated",
        "REPLICA_LOST": "ReplicaLost",
        "KERNEL_UNAVAILABLE": "KernelUnavailable",
        "GATEWAY_ERROR": "GatewayError",
        "INTERRUPTED": "KeyboardInterrupt",
        "USAGE_ERROR": "UsageError",
    },
    CellKey: {
        "GPUS": "gpus",
        "ROLE": "role",
        "EXECUTOR": "executor",
        "ATTEMPT": "attempt",
        "SUPERSEDED": "superseded",
        "DEVICES": "devices",
        "DUPLICATE_OF": "duplicate_of",
    },
    ReplicaEnv: {
        "KERNEL_ID": "KERNELFLEET_KERNEL_ID",
        "REPLICA_ID": "KERNELFLEET_REPLICA_ID",
        "REPLICA_DIR": "KERNELFLEET_REPLICA_DIR",
        "RAFT_ADDRESS": "KERNELFLEET_RAFT_ADDRESS",
        "GPUS": "KERNELFLEET_GPUS",
        "GATEWAY_URL": "KERNELFLEET_GATEWAY_URL",
        "KERNEL_TOKEN": "KERNELFLEET_KERNEL_TOKEN",
        "LOG_LEVEL": "KERNELFLEET_REPLICA_LOG_LEVEL",
        "KERNEL_STORE": "KERNELFLEET_KERNEL_STORE",
        "HOST_ADDRESS": "KERNELFLEET_HOST_ADDRESS",
        "CACHE_BROKER": "KERNELFLEET_CACHE_BROKER",
    },
    JobEnv: {
        "JOB_ID": "KERNELFLEET_JOB_ID",
        "JOB_TOKEN": "KERNELFLEET_JOB_TOKEN",
        "GATEWAY_URL": "KERNELFLEET_GATEWAY_URL",
        "STEPS": "KERNELFLEET_JOB_STEPS",
        "CHECKPOINT": "KERNELFLEET_JOB_CHECKPOINT",
        "CACHE_BROKER": "KERNELFLEET_CACHE_BROKER",
    },
}

CONNECTION = {
    "transport": "tcp",
    "ip": "10.0.0.7",
    "shell_port": 20001,
    "iopub_port": 20002,
    "stdin_port": 20003,
    "control_port": 20004,
    "hb_port": 20005,
    "key": "0b6c2f1e-signing-key",
    "signature_scheme": "hmac-sha256",
}


@pytest.mark.parametrize("kind", list(WIRE), ids=lambda kind: kind.__name__)
def test_the_wire_strings_never_change(kind: type[enum.StrEnum]) -> None:
    assert {member.name: member.value for member in kind} == WIRE[kind]


def test_every_enum_of_the_protocol_is_pinned() -> None:
    enums = {
        value
        for value in vars(protocol).values()
        if isinstance(value, type) and issubclass(value, enum.Enum) and value is not enum.StrEnum
    }
    assert enums == set(WIRE)


def test_the_metadata_key_and_the_connection_keys_never_change() -> None:
    assert METADATA_KEY == "kernelfleet"
    assert protocol.KERNEL_TOKEN_PREFIX == "kfk1"
    assert protocol.GPUS_MAGIC == "%%gpus"
    assert tuple(CONNECTION) == CONNECTION_KEYS


def test_each_request_has_its_reply_and_its_channel() -> None:
    assert {request.name: request.reply for request in Request} == {
        reply.name: reply for reply in Reply
    }
    channels = {request: request.channel for request in Request}
    # The join and a pooled group's bind run on the main thread, where the Raft log's callbacks
    # arrive and no cell runs yet; the others must get through while a cell runs.
    assert channels == {
        Request.JOIN: Channel.SHELL,
        Request.MEMBERSHIP: Channel.CONTROL,
        Request.FORGET: Channel.CONTROL,
        Request.STATUS: Channel.CONTROL,
        Request.RELEASE: Channel.CONTROL,
        Request.OUTCOME: Channel.CONTROL,
        Request.BIND: Channel.SHELL,
    }


def test_request_contents_have_the_keys_the_replica_reads() -> None:
    assert list(JoinContent.__annotations__) == [
        "replica_id",
        "address",
        "peers",
        "password",
        "store_root",
        "timeout",
        "forget",
    ]
    assert list(MembershipContent.__annotations__) == ["remove", "add"]
    assert list(ForgetContent.__annotations__) == ["replicas"]


def test_connection_info_round_trips_through_json() -> None:
    info = ConnectionInfo.from_dict(json.loads(json.dumps(CONNECTION)))
    assert info.to_dict() == CONNECTION
    assert list(info.to_dict()) == list(CONNECTION_KEYS)
    assert ConnectionInfo.from_dict(asdict(info)) == info  # how the gateway stores it
    assert {field.name for field in fields(ConnectionInfo)} == set(CONNECTION_KEYS)


def test_connection_info_ignores_unknown_keys_and_fills_defaults() -> None:
    reported = {**CONNECTION, "kernel_name": "python3"}
    del reported["transport"], reported["signature_scheme"]
    info = ConnectionInfo.from_dict(reported)
    assert (info.transport, info.signature_scheme) == ("tcp", "hmac-sha256")
    assert info.url(Channel.CONTROL) == "tcp://10.0.0.7:20004"
    assert info.url("iopub") == "tcp://10.0.0.7:20002"


def test_a_cell_asks_for_gpus_in_its_metadata() -> None:
    assert gpu_request(2) == {"kernelfleet": {"gpus": 2}}
    assert options_of(gpu_request(0)) == {"gpus": 0}


def test_options_of_reads_kernelfleet_options_and_tolerates_anything_else() -> None:
    metadata = json.loads('{"kernelfleet": {"gpus": 2, "role": "lead"}, "other": 1}')
    assert options_of(metadata)[CellKey.GPUS] == 2
    assert options_of(metadata)[CellKey.ROLE] == Role.LEAD
    for odd in (None, [], "kernelfleet", {"kernelfleet": None}, {"kernelfleet": [1]}, {}):
        assert options_of(odd) == {}


def test_enum_members_serialize_as_their_wire_strings() -> None:
    # Members go into JSON messages as values; keys are written with `.value`.
    message = {"msg_type": Request.JOIN, CellKey.ROLE.value: Role.YIELD}
    assert json.dumps(message) == '{"msg_type": "kernelfleet_join_request", "role": "yield"}'
    assert f"{ErrorName.REPLICA_ISOLATED}: why" == "ReplicaIsolated: why"
