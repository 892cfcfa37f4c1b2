"""Kafka v2 record batches built by hand for the changelog reader's tests."""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

from aiokafka.record.default_records import DefaultRecordBatchBuilder
from aiokafka.record.util import calc_crc32c
from hypothesis import strategies as st

from streamjoin.runtime.table_state.changelog_records import Record

_ATTRIBUTES = 21  # v2 batch header: attributes int16, then lastOffsetDelta int32
_LAST_OFFSET_DELTA = 23
_CRC = 17
_CONTROL = 0x20


def batch(
    base: int,
    records: list[Record],
    *,
    producer_id: int = -1,
    transactional: bool = False,
    control: bool = False,
    last_offset: int | None = None,
) -> bytes:
    """A v2 record batch at ``base`` holding ``records`` (absolute offsets, gaps allowed).

    ``last_offset`` moves the batch's end past its last record, as compaction leaves it.
    """
    builder = DefaultRecordBatchBuilder(
        2,
        0,
        int(transactional),
        producer_id,
        0 if producer_id >= 0 else -1,
        0 if producer_id >= 0 else -1,
        1 << 20,
    )
    for offset, key, value in records:
        builder.append(offset - base, 1_700_000_000_000, key, value, [])
    buf = builder.build()
    struct.pack_into(">q", buf, 0, base)
    if control or last_offset is not None:
        if control:
            (attributes,) = struct.unpack_from(">h", buf, _ATTRIBUTES)
            struct.pack_into(">h", buf, _ATTRIBUTES, attributes | _CONTROL)
        if last_offset is not None:
            struct.pack_into(">i", buf, _LAST_OFFSET_DELTA, last_offset - base)
        struct.pack_into(">I", buf, _CRC, calc_crc32c(bytes(buf[_ATTRIBUTES:])))
    return bytes(buf)


def marker(offset: int, producer_id: int, *, commit: bool) -> bytes:
    key = struct.pack(">hh", 0, 1 if commit else 0)
    value = struct.pack(">hi", 0, 0)
    return batch(
        offset, [(offset, key, value)], producer_id=producer_id, transactional=True, control=True
    )


def rec(offset: int) -> Record:
    return (offset, b"k%d" % offset, b"v%d" % offset)


@dataclass
class Log:
    """A partition's log built from steps, with what each isolation level must read."""

    data: list[tuple[int, int, bytes]] = field(default_factory=list)  # (base, next, bytes)
    end: int = 0
    records: list[Record] = field(default_factory=list)
    aborted_records: set[int] = field(default_factory=set)
    #: (producer id, first offset, marker offset) of aborted transactions
    aborted: list[tuple[int, int, int]] = field(default_factory=list)
    open: dict[int, int] = field(default_factory=dict)  # producer id -> first offset
    pending: dict[int, list[int]] = field(default_factory=dict)

    @classmethod
    def built(cls, plan: list[tuple[str, int, bool, int]]) -> Log:
        """The log of a :data:`steps` plan; transactions left open are aborted at its end."""
        log = cls()
        for kind, n, flag, producer_id in plan:
            if kind == "end":
                log.end_txn(producer_id, flag)
            else:
                log.add_data(n, hole=flag and kind == "data", producer_id=producer_id)
        for producer_id in sorted(log.open):
            log.end_txn(producer_id, commit=False)
        return log

    def add_data(self, n: int, hole: bool, producer_id: int = -1) -> None:
        base = self.end
        offsets = list(range(base, base + n))
        kept = offsets[::2] if hole and n > 1 else offsets
        recs = [rec(o) for o in kept]
        self.append(
            batch(
                base,
                recs,
                producer_id=producer_id,
                transactional=producer_id >= 0,
                last_offset=base + n - 1,
            ),
            base + n,
        )
        self.records += recs
        if producer_id >= 0:
            self.open.setdefault(producer_id, base)
            self.pending.setdefault(producer_id, []).extend(kept)

    def end_txn(self, producer_id: int, commit: bool) -> None:
        if producer_id not in self.open:
            return
        first = self.open.pop(producer_id)
        offsets = self.pending.pop(producer_id)
        if not commit:
            self.aborted.append((producer_id, first, self.end))
            self.aborted_records.update(offsets)
        self.append(marker(self.end, producer_id, commit=commit), self.end + 1)

    def append(self, data: bytes, next_offset: int) -> None:
        self.data.append((self.end, next_offset, data))
        self.end = next_offset

    def fetch(self, offset: int, limit: int) -> bytes:
        """What a broker returns: from the batch holding ``offset``, cut at ``limit`` bytes
        (but never less than that whole first batch)."""
        out = b""
        for _, next_offset, data in self.data:
            if next_offset <= offset:
                continue
            if out and len(out) + len(data) > limit:
                return out + data[: limit - len(out)]
            out += data
        return out

    def aborted_for(self, offset: int) -> list[tuple[int, int]]:
        """The broker's aborted-transaction list for a fetch at ``offset``."""
        return [(pid, first) for pid, first, end in self.aborted if end >= offset]


steps = st.lists(
    st.one_of(
        st.tuples(st.just("data"), st.integers(1, 4), st.booleans(), st.just(-1)),
        st.tuples(st.just("txn"), st.integers(1, 3), st.booleans(), st.sampled_from([1, 2])),
        st.tuples(st.just("end"), st.just(0), st.booleans(), st.sampled_from([1, 2])),
    ),
    min_size=1,
    max_size=25,
)
