"""Log entries: validation, the wire form, versions, and the size limit."""

from __future__ import annotations

import pickle

import pytest

from kernelfleet.errors import InvalidRequest
from kernelfleet.raft.entries import (
    MAX_ENTRY_BYTES,
    Proposal,
    Role,
    StateDelta,
    UnknownEntry,
    decode,
    decode_or_unknown,
    encode,
    first_per_key,
    wire_size,
)
from kernelfleet.raft.errors import EntryFormatError, EntryTooLarge, InvalidEntry

BUILTINS = (str, int, bytes, type(None))

EXAMPLES = [
    Proposal("cell-1", "r0", Role.LEAD),
    Proposal("cell-1", "r1", Role.YIELD, attempt=2),
    StateDelta(
        "cell-1",
        "r0",
        changed={"x": pickle.dumps(41), "df": b"\x80\xff"},
        pointers={"model": "kernels/k1/cell-1/model"},
        deleted=["tmp"],
        execution_count=7,
    ),
    StateDelta("cell-2", "r0"),
    StateDelta(
        "cell-3",
        "r1",
        imports={"np": "numpy"},
        problems={"sock": "cannot pickle"},
        digests={"a,b": "0f3c"},
        execution_count=9,
    ),
]


def only_builtins(value: object) -> bool:
    if isinstance(value, tuple | list):
        return all(only_builtins(item) for item in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and only_builtins(v) for k, v in value.items())
    return type(value) in BUILTINS


@pytest.mark.parametrize("entry", EXAMPLES, ids=lambda entry: type(entry).__name__)
def test_round_trip_through_plain_data(entry):
    wire = entry.to_wire()
    kind, version, fields = wire
    assert kind == entry.KIND
    assert version == 1
    assert isinstance(fields, dict)
    assert only_builtins(wire)
    assert type(entry).from_wire(wire) == entry
    assert decode(wire) == entry
    # what the journal holds unpickles without any class of ours
    assert pickle.loads(pickle.dumps(wire, protocol=2)) == wire
    # JSON-ish lists decode too
    assert decode(list(wire)) == entry


def test_string_values_are_coerced_to_enums():
    assert Proposal("c", "r", "lead").role is Role.LEAD
    assert Proposal("c", "r", "yield").role is Role.YIELD


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: Proposal("", "r0", Role.LEAD), "cell_id"),
        (lambda: Proposal("c", "", Role.LEAD), "replica_id"),
        (lambda: Proposal("c", "r0", "execute"), "role must be one of lead, yield"),
        (lambda: Proposal("c", "r0", Role.LEAD, attempt=-1), "attempt"),
        (lambda: Proposal("c", "r0", Role.LEAD, attempt=True), "attempt"),
        (lambda: StateDelta("c", "r0", changed={"x": 1}), "must be bytes"),
        (lambda: StateDelta("c", "r0", changed={"": b""}), "changed name"),
        (lambda: StateDelta("c", "r0", pointers={"m": ""}), "pointers"),
        (lambda: StateDelta("c", "r0", deleted="abc"), "not a string"),
        (lambda: StateDelta("c", "r0", execution_count=-3), "execution_count"),
        (lambda: StateDelta("c", "r0", imports={"np": 1}), "must be a string"),
    ],
)
def test_invalid_fields_are_refused(make, message):
    with pytest.raises(InvalidEntry, match=message) as error:
        make()
    assert isinstance(error.value, InvalidRequest)
    assert error.value.reason == "invalid-entry"


def test_entries_are_frozen_and_copy_their_mappings():
    changed = {"x": b"1"}
    delta = StateDelta("c", "r0", changed=changed, deleted=["a"])
    changed["y"] = b"2"
    assert dict(delta.changed) == {"x": b"1"}
    assert delta.deleted == ("a",)
    with pytest.raises(AttributeError):
        delta.cell_id = "other"


@pytest.mark.parametrize(
    ("wire", "message"),
    [
        ("proposal", "triple"),
        (("proposal", 1), "triple"),
        (("cell", 1, {}), "unknown entry kind 'cell'"),
        ((7, 1, {}), "unknown entry kind"),
        (("proposal", 2, {}), "version 2 is not supported"),
        (("proposal", 0, {}), "version 0"),
        (("proposal", "1", {}), "version"),
        (("proposal", 1, ["c", "r", "lead"]), "fields must be a dict"),
        (("proposal", 1, {"cell_id": "c"}), "fields do not match"),
        (
            ("proposal", 1, {"cell_id": "c", "replica_id": "r", "role": "lead", "x": 1}),
            "fields do not match",
        ),
    ],
)
def test_malformed_wire_is_refused(wire, message):
    with pytest.raises(EntryFormatError, match=message):
        decode(wire)


def test_from_wire_checks_the_kind():
    with pytest.raises(EntryFormatError, match="expected a 'state-delta' entry"):
        StateDelta.from_wire(Proposal("c", "r", Role.LEAD).to_wire())


def test_undecodable_wire_becomes_unknown_entry():
    newer = ("proposal", 9, {"cell_id": "c"})
    unknown = decode_or_unknown(newer)
    assert isinstance(unknown, UnknownEntry)
    assert unknown.wire == newer
    assert "version 9" in unknown.error
    with pytest.raises(EntryFormatError):
        unknown.to_wire()
    invalid = decode_or_unknown(("proposal", 1, {"cell_id": "", "replica_id": "r", "role": "lead"}))
    assert isinstance(invalid, UnknownEntry)
    assert "cell_id" in invalid.error


@pytest.mark.parametrize(
    "wire",
    [
        ("vote", 1, {"cell_id": "c", "replica_id": "r1", "winner": "r0", "attempt": 0}),
        ("completion", 1, {"cell_id": "c", "replica_id": "r0", "status": "ok"}),
        ("membership", 1, {"replica_id": "r3", "address": "10.0.0.4:7000", "change": "joined"}),
    ],
    ids=lambda wire: wire[0],
)
def test_removed_kinds_are_no_entries_but_still_read_as_unknown(wire):
    """The election's entry kinds are gone; a journal written with one still reads."""
    with pytest.raises(EntryFormatError, match=f"unknown entry kind '{wire[0]}'"):
        decode(wire)
    unknown = decode_or_unknown(wire)
    assert isinstance(unknown, UnknownEntry)
    assert unknown.wire == wire


def test_encode_measures_what_pysyncobj_sends():
    entry = Proposal("cell", "r0", Role.LEAD)
    wire = encode(entry)
    assert wire == entry.to_wire()
    assert wire_size(wire) == len(pickle.dumps(wire, protocol=2))
    assert wire_size(wire) < 200


def test_oversized_entries_are_refused_with_a_clear_error():
    limit = 4096
    ok = StateDelta("c", "r0", changed={"x": b"a" * 3000})
    encode(ok, max_bytes=limit)
    with pytest.raises(EntryTooLarge) as error:
        encode(StateDelta("c", "r0", changed={"x": b"a" * 5000}), max_bytes=limit)
    assert error.value.reason == "entry-too-large"
    assert error.value.limit == limit
    assert error.value.size >= 5000
    assert "object store" in error.value.message
    # bytes >= 0x80 take two bytes in pysyncobj's protocol-2 pickles: measured, not guessed
    with pytest.raises(EntryTooLarge):
        encode(StateDelta("c", "r0", changed={"x": b"\xff" * 3000}), max_bytes=limit)
    # a long id alone can also be too large
    with pytest.raises(EntryTooLarge):
        encode(Proposal("c" * 5000, "r0", Role.LEAD), max_bytes=limit)


def test_default_limit_is_256_kib():
    assert MAX_ENTRY_BYTES == 256 * 1024
    encode(StateDelta("c", "r0", changed={"x": b"a" * 200_000}))
    with pytest.raises(EntryTooLarge):
        encode(StateDelta("c", "r0", changed={"x": b"a" * (MAX_ENTRY_BYTES + 1)}))


def test_encode_refuses_non_entries():
    with pytest.raises(InvalidEntry, match="not a log entry"):
        encode(("proposal", 1, {}))


def test_first_per_key_drops_retried_duplicates():
    a = Proposal("c", "r0", Role.LEAD)
    b = Proposal("c", "r1", Role.YIELD)
    again = Proposal("c", "r0", Role.YIELD)  # same replica, same election: a duplicate
    other_attempt = Proposal("c", "r0", Role.LEAD, attempt=1)
    delta = StateDelta("c", "r0", execution_count=1)
    assert first_per_key([a, b, again, delta, delta, other_attempt]) == [
        a,
        b,
        delta,
        other_attempt,
    ]
