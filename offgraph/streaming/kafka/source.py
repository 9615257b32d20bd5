"""``kafka://HOST:PORT/TOPIC``: row deltas from every partition of a Kafka topic (confluent-kafka).

- Every partition is assigned by hand (no consumer-group rebalancing): every replica's
  updater reads every delta. The group id (``offgraph-update-<model>-<store hash>`` by
  default) only names the offsets committed to the broker, which are informational: the
  positions that decide what was applied are the ones the updater records IN THE STORE,
  one key per partition (``kafka/<topic>/<partition>`` -> the last applied offset,
  zero-padded), in the same atomic batch as the rows.
- A position is ``[r<EPOCH>:]<OFFSET, 20 digits>.<FINGERPRINT>`` (see :func:`position`): the
  fingerprint (a hash of the message's value and timestamp) lets a restart tell that the
  message at the recorded offset is still the one applied; the epoch counts the rebases of
  the partition (``--on-offset-reset rebase``), so that positions keep increasing.
- ``seek`` starts each partition AT its recorded offset and checks that message (then
  skips it); a partition with none starts where the live version's deltas begin
  (``<version dir>/stream-start.json``, written by the producer that started the version),
  else at the beginning.
- Offsets going backwards (the broker lost its log; the topic was deleted and re-created)
  are detected: the message at the recorded (or last fetched) offset differs, an offset at
  or below it is fetched again, or the partition ends before it. Then ``on_offset_reset``:
  "stop" raises :class:`OffsetResetError`; "rebase" reads the partition's new log from its
  beginning as a new epoch. After every broker outage the last fetched message is checked
  again (a restarted broker may have been refilled beyond the offset the consumer asks for).
- Messages are buffered in arrival order (in order within a partition); ``poll`` returns
  the buffer's head until items are acked or rejected.
- ``reject``: the message goes to the dead-letter topic (default ``<topic>.dead``) with
  the reason and its origin (topic/partition/offset) in headers; the updater goes on once
  the broker has it (a dead letter is never dropped; after a crash before the next store
  write, it may be dead-lettered twice). A payload the dead-letter topic cannot take (too
  big) is replaced by a reference: an empty value with the origin's topic, partition, offset
  and size in headers.
- ``backlog``: messages between the cursor and the end of each partition (as the broker
  reports it: informational, Tansu's can be off), rows counted in buffered messages and
  estimated for the rest, and the age of the oldest unapplied message (its timestamp).
"""

from __future__ import annotations

import hashlib
import logging
import re
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from offgraph.streaming import deltas
from offgraph.streaming.deltas import AnyDeltaBatch, DeltaFormatError, count_rows
from offgraph.streaming.kafka.admin import ensure_topic
from offgraph.streaming.kafka.health import BrokerHealth
from offgraph.streaming.kafka.messages import (
    H_ORIGIN,
    H_REASON,
    MAX_MESSAGE_BYTES,
    check_headers,
    dead_letter_reference,
    parse_kafka_url,
    read_version_start,
)
from offgraph.streaming.log_limit import RepeatLimiter
from offgraph.streaming.sources import Backlog, DeltaSource, SourceItem
from offgraph.streaming.updater_config import OFFSET_RESET

log = logging.getLogger("offgraph.update.kafka")

OFFSET_DIGITS = 20
BUFFER_BYTES = 64 << 20  # consumed, not yet applied messages held at most (about)


READ_LIMIT = 16 * MAX_MESSAGE_BYTES  # a message bigger than this is refused unread
_POSITION = re.compile(r"(?:r(\d{4}):)?(\d{20})(?:\.([0-9a-f]{16}))?")
_SIZE_ERRORS = {10, 18, 4}  # MSG_SIZE_TOO_LARGE, RECORD_LIST_TOO_LARGE, INVALID_MSG_SIZE
_GONE_ERRORS = {3, -188, -190}  # UNKNOWN_TOPIC_OR_PART, _UNKNOWN_TOPIC, _UNKNOWN_PARTITION


class OffsetResetError(ValueError):
    """The broker's offsets of a partition went backwards, and the policy is to stop."""


def position(offset: int, epoch: int = 0, fp: str = "") -> str:
    """``[r<epoch>:]<offset>[.<fp>]``: ordered as strings by (epoch, offset), as before for epoch 0."""
    s = f"{offset:0{OFFSET_DIGITS}d}"
    return (f"r{epoch:04d}:{s}" if epoch else s) + (f".{fp}" if fp else "")


def parse_position(pos: str) -> tuple[int, int, str]:
    """(epoch, offset, fingerprint or "") of a recorded position; ValueError if it is not one."""
    m = _POSITION.fullmatch(pos)
    if m is None:
        raise ValueError(f"{pos!r} is not a Kafka position ([rEPOCH:]OFFSET[.FINGERPRINT])")
    return int(m.group(1) or 0), int(m.group(2)), m.group(3) or ""


def fingerprint(value: bytes, timestamp_ms: int) -> str:
    """Of a message: the same offset holding another message after a reset has another one."""
    return hashlib.blake2b(value, digest_size=8, key=str(timestamp_ms).encode()).hexdigest()


@dataclass(frozen=True)
class KafkaItem(SourceItem):
    """One message; ``read`` refuses an oversized message before decoding, and one whose offgraph
    headers are malformed or disagree with its payload (``kafka.messages.check_headers``)."""

    partition: int = 0
    offset: int = 0
    headers: tuple = ()

    def read(self) -> AnyDeltaBatch:
        data = self.payload or b""
        if len(data) > READ_LIMIT:
            raise DeltaFormatError(
                f"message of {len(data)} bytes; at most {READ_LIMIT} are read "
                f"(producers split batches into messages of {MAX_MESSAGE_BYTES} bytes)"
            )
        check_headers(self.headers, data)  # malformed, or disagreeing with the payload: refused
        return deltas.read(data)


class KafkaSource(DeltaSource):
    scheme = "kafka"
    wakeup = "kafka"

    def __init__(
        self,
        location: str,
        *,
        dead_letter_dir: str | None = None,
        delete_applied: bool = False,
        group_id: str | None = None,
        store_hint: str = "",
        metadata_timeout_s: float = 30.0,
        on_offset_reset: str = "stop",
        config: dict | None = None,
    ) -> None:
        from confluent_kafka import Consumer

        super().__init__(None)
        self.url = f"kafka:{location}"
        self.bootstrap, self.topic = parse_kafka_url(self.url)
        if on_offset_reset not in OFFSET_RESET:
            raise ValueError(f"--on-offset-reset must be one of {', '.join(OFFSET_RESET)}, got {on_offset_reset!r}")
        self.on_offset_reset = on_offset_reset
        self.health = BrokerHealth(self.bootstrap, log, on_down=self._recheck)
        self.dead_topic = str(dead_letter_dir) if dead_letter_dir else f"{self.topic}.dead"
        if "/" in self.dead_topic:
            raise ValueError(f"--dead-letter for a Kafka source names a topic, got {self.dead_topic!r}")
        gid = group_id or "offgraph-update-" + hashlib.sha1(store_hint.encode()).hexdigest()[:12]
        self._consumer = Consumer(
            {
                "bootstrap.servers": self.bootstrap,
                "group.id": gid,
                "group.protocol": "classic",
                "enable.auto.commit": True,
                "enable.auto.offset.store": False,
                "auto.offset.reset": "earliest",
                "enable.partition.eof": False,
                "fetch.message.max.bytes": READ_LIMIT,
                "socket.connection.setup.timeout.ms": 10000,
                **self.health.client_config(),
                **(config or {}),
            }
        )
        self._producer = None
        self.partitions = self._wait_for_partitions(metadata_timeout_s)
        ensure_topic(self.bootstrap, self.dead_topic, 1)
        self._buf: dict[tuple[int, int], KafkaItem] = {}  # (partition, offset) -> item, in arrival order
        self._buf_bytes = 0
        self._rows: dict[tuple[int, int], int] = {}
        self._cursor: dict[int, int] = {}  # partition -> last consumed offset
        self._cursor_pos: dict[int, str] = {}  # partition -> the position of that message
        self._epoch: dict[int, int] = {}  # partition -> rebases so far (recorded in its positions)
        self._seen: dict[int, tuple[int, str]] = {}  # partition -> (offset, fingerprint) of the last known message
        self._verify: dict[int, tuple[int, str]] = {}  # partition -> the message the next fetch must begin with
        self._recheck_due = False
        self._ends_t = 0.0
        self._rows_per_message = 0.0
        self._ends: dict[int, int] = {}
        self._stop = threading.Event()
        self._dead_letter_log = RepeatLimiter(log)  # a broker down fails every dead letter alike

    # -- set-up ---------------------------------------------------------------------
    def _wait_for_partitions(self, timeout_s: float) -> list[int]:
        t_end = time.monotonic() + timeout_s
        last = "no answer"
        while True:
            try:
                md = self._consumer.list_topics(timeout=5)  # all: asking for one may auto-create it
                t = md.topics.get(self.topic)
                if t is not None and t.error is None and t.partitions:
                    return sorted(t.partitions)
                last = str(t.error) if t is not None and t.error is not None else "no partitions"
            except Exception as e:  # noqa: BLE001 - KafkaException: broker not reachable yet
                last = str(e)
            if time.monotonic() > t_end:
                self._consumer.close()
                raise ValueError(
                    f"{self.url}: topic {self.topic!r} not found on {self.bootstrap} within "
                    f"{timeout_s:g}s ({last}); create it (e.g. by starting the producer) first"
                )
            time.sleep(0.5)

    def key(self, partition: int) -> bytes:
        return f"kafka/{self.topic}/{partition}".encode()

    def position_keys(self) -> list[bytes]:
        return [self.key(p) for p in self.partitions]

    def seek(self, positions: dict[bytes, str | None]) -> None:
        from confluent_kafka import OFFSET_BEGINNING, TopicPartition

        assign = []
        for p in self.partitions:
            pos = positions.get(self.key(p))
            if pos:
                epoch, off, fp = parse_position(pos)
                self._cursor[p], self._cursor_pos[p], self._epoch[p] = off, pos, epoch
                self._seen[p] = (off, fp)
                if fp:  # read the recorded message again: is it still the one applied?
                    self._verify[p] = (off, fp)
                assign.append(TopicPartition(self.topic, p, off if fp else off + 1))
            else:  # from the start, as if new: what this source read before (a seek back) is forgotten
                for known in (self._cursor, self._cursor_pos, self._seen, self._verify):
                    known.pop(p, None)
                assign.append(TopicPartition(self.topic, p, OFFSET_BEGINNING))
        self._buf.clear()
        self._buf_bytes = 0
        self._consumer.assign(assign)
        log.info(
            "%s: %d partitions assigned from %s", self.url, len(assign), {tp.partition: tp.offset for tp in assign}
        )

    def version_start(self, version_dir: Path) -> dict[bytes, str]:
        rec, path = read_version_start(version_dir, log)
        if rec is None or rec.topic != self.topic:
            return {}
        log.info("%s: the version begins at %s (from %s)", self.url, rec.partitions, path)
        return {self.key(p): position(off - 1) for p, off in rec.partitions.items() if off > 0}

    # -- delivery -------------------------------------------------------------------
    def _take(self, timeout: float, n: int = 1000) -> int:
        """Consume up to ``n`` messages (waiting up to ``timeout`` for the first) into the buffer."""
        if self._buf_bytes >= BUFFER_BYTES:
            return 0
        got = 0
        refetch = self._recheck_now()
        for m in self._consumer.consume(n, timeout):
            err = m.error()
            if err is not None:
                if err.fatal():
                    raise OSError(f"{self.url}: fatal consumer error: {err}")
                self.health.error(err)
                if err.code() in _GONE_ERRORS:  # deleted? check the offsets once it is back
                    self._recheck()
                continue
            p, off = m.partition(), m.offset()
            refetch |= self._recheck_now()  # the broker dropped out meanwhile: these are fetched again, checked
            if p in refetch:
                continue
            self.health.reached()
            value = m.value() or b""
            ts = m.timestamp()[1]
            fp = fingerprint(value, ts)
            verdict = self._continues(p, off, fp)
            if verdict is None:  # a reset, rebased: the rest of this batch is old news, the new log comes next
                refetch.add(p)
            if not verdict:
                continue
            item = KafkaItem(
                position=position(off, self._epoch.get(p, 0), fp),
                key=self.key(p),
                payload=value,
                mtime=ts / 1000.0 if ts and ts > 0 else time.time(),
                partition=p,
                offset=off,
                headers=tuple(m.headers() or ()),
            )
            self._buf[(p, off)] = item
            self._buf_bytes += len(value)
            got += 1
        self._check_ends()
        return got

    # -- offset resets ----------------------------------------------------------------
    def _continues(self, p: int, off: int, fp: str) -> bool | None:
        """Whether message ``(p, off)`` continues the partition's stream: False for a duplicate to
        skip, None for a reset (handled here: it raises, or the partition is rebased)."""
        want = self._verify.pop(p, None)
        seen = want or self._seen.get(p)
        if seen is not None and off <= seen[0]:
            if (off, fp) == seen:  # the message recorded or fetched last, read again to check it
                return False
            self._reset(
                p,
                f"offset {off} was fetched after offset {seen[0]}"
                if off < seen[0]
                else f"offset {off} holds another message than the one read there before",
            )
            return None
        if want is not None and off > want[0] + 1:
            log.warning(
                "%s partition %d: offset %d, recorded last, is gone (retention?); going on at %d",
                self.url,
                p,
                want[0],
                off,
            )
        self._seen[p] = (off, fp)
        return True

    def _check_ends(self) -> None:
        """A partition that ends at or before an offset known to hold a message was reset."""
        from confluent_kafka import TopicPartition

        now = time.monotonic()
        if now - self._ends_t < 0.5:
            return
        self._ends_t = now
        for p in self.partitions:
            seen = self._verify.get(p) or self._seen.get(p)
            if seen is None:
                continue
            try:
                hi = self._consumer.get_watermark_offsets(TopicPartition(self.topic, p), cached=True)[1]
            except Exception:  # noqa: BLE001 - not known yet
                continue
            if 0 <= hi <= seen[0]:
                self._reset(p, f"the partition now ends at offset {hi}, before offset {seen[0]} read earlier")

    def _reset(self, p: int, why: str) -> None:
        from confluent_kafka import OFFSET_BEGINNING, TopicPartition

        self.health.resets += 1
        what = (
            f"{self.url} partition {p}: the broker's offsets went backwards ({why}): it lost its log, or the "
            "topic was deleted and re-created"
        )
        if self.on_offset_reset == "stop":
            log.error("%s; --on-offset-reset stop: stopping", what)
            raise OffsetResetError(
                f"{what}; stopped by --on-offset-reset stop (nothing after the recorded offset "
                "was acknowledged). See offgraph/streaming/README.md, 'Offset resets'"
            )
        self._epoch[p] = self._epoch.get(p, 0) + 1
        log.error(
            "%s; --on-offset-reset rebase: reading its new log from the beginning as epoch %d", what, self._epoch[p]
        )
        self._seen.pop(p, None)
        self._verify.pop(p, None)
        self._consumer.seek(TopicPartition(self.topic, p, OFFSET_BEGINNING))

    def _recheck(self) -> None:
        """(a callback: the broker dropped out) check each partition's last message once it is back."""
        self._recheck_due = True

    def _recheck_now(self) -> set[int]:
        """The partitions sought back to their last message (to check it) if a recheck was due."""
        from confluent_kafka import TopicPartition

        if not self._recheck_due:
            return set()
        self._recheck_due = False
        out = set()
        for p, (off, fp) in self._seen.items():
            if fp and p not in self._verify:
                self._verify[p] = (off, fp)
                self._consumer.seek(TopicPartition(self.topic, p, off))
                out.add(p)
        return out

    def poll(self, max_items: int) -> list[SourceItem]:
        if max_items < 1:
            raise ValueError(f"max_items must be >= 1, got {max_items}")
        if len(self._buf) < max_items:
            self._take(0.0, max_items - len(self._buf))
        out = []
        for item in self._buf.values():
            out.append(item)
            if len(out) == max_items:
                break
        return out

    def wait(self, timeout: float) -> None:
        """Wait for messages by consuming them (into the buffer), in slices so that
        :meth:`interrupt` ends it soon."""
        t_end = time.monotonic() + max(0.0, timeout)
        while not self._stop.is_set():
            left = t_end - time.monotonic()
            if left <= 0 or self._take(min(left, 0.1)):
                break
        self._stop.clear()

    def interrupt(self) -> None:
        self._stop.set()

    def _done(self, item: KafkaItem) -> None:
        from confluent_kafka import TopicPartition

        gone = self._buf.pop((item.partition, item.offset), None)
        if gone is not None:
            self._buf_bytes -= len(gone.payload or b"")
        n = self._rows.pop((item.partition, item.offset), None)
        if n is not None:
            self._rows_per_message = 0.9 * self._rows_per_message + 0.1 * n if self._rows_per_message else n
        if item.position > self._cursor_pos.get(item.partition, ""):
            self._cursor[item.partition], self._cursor_pos[item.partition] = item.offset, item.position
        try:  # informational: for tools that show a group's lag
            self._consumer.store_offsets(offsets=[TopicPartition(self.topic, item.partition, item.offset + 1)])
        except Exception as e:  # noqa: BLE001 - never fatal: the store's record decides
            log.debug("store_offsets: %s", e)

    def ack(self, item: SourceItem) -> None:
        self._done(item)

    def reject(self, item: SourceItem, reason: str) -> str:
        """The message's copy to the dead-letter topic; where the payload cannot be copied (too
        big for the producer or the broker), a reference to it (empty value, origin in headers)."""
        origin = f"{self.topic}/{item.partition}/{item.offset}"
        payload = item.payload or b""
        hdrs = [h for h in item.headers if h[0] not in (H_REASON, H_ORIGIN)]
        hdrs += [(H_REASON, reason.encode("utf-8", "backslashreplace")), (H_ORIGIN, origin.encode())]
        err = self._dead_letter(payload, hdrs) if len(payload) <= READ_LIMIT else "bigger than the read limit"
        if err is not None and (len(payload) > MAX_MESSAGE_BYTES or getattr(err, "code", lambda: 0)() in _SIZE_ERRORS):
            log.warning(
                "%s: the %d-byte payload of %s cannot be dead-lettered (%s): sending a reference to it",
                self.url,
                len(payload),
                origin,
                err,
            )
            err = self._dead_letter(
                b"", dead_letter_reference(reason, self.topic, item.partition, item.offset, len(payload), str(err))
            )
        if err is not None:  # never advance past a message that is neither applied nor dead-lettered
            raise OSError(f"{self.url}: could not dead-letter {origin} to topic {self.dead_topic!r}: {err}")
        self._done(item)
        return f"kafka topic {self.dead_topic} ({origin})"

    def _dead_letter(self, value: bytes, hdrs: list) -> object | None:
        """Produce one message to the dead-letter topic and wait for it; the error (None: delivered).
        Compressed: a payload that reached the broker compressed fits again. Not idempotent: a
        broker that lost its log (and the producer's id with it) would refuse an idempotent
        producer's next message for good; a duplicate dead letter is allowed. A failure other than
        the size is tried once more with a new producer (the topic re-created if it is gone)."""
        from confluent_kafka import KafkaException, Producer

        err = None
        for attempt in range(2):
            if self._producer is None:
                self._producer = Producer(
                    {
                        "bootstrap.servers": self.bootstrap,
                        "compression.type": "zstd",
                        "message.max.bytes": READ_LIMIT + 65536,
                        "message.timeout.ms": 30000,
                        **self.health.client_config(),
                    }
                )
            errors: list = []
            try:
                self._producer.produce(
                    self.dead_topic, value=value, headers=hdrs, on_delivery=lambda e, _msg: e and errors.append(e)
                )
            except KafkaException as e:  # refused at once (MSG_SIZE_TOO_LARGE)
                return e.args[0]
            if self._producer.flush(35):
                self._producer.purge()  # not later, after a reference was sent in its place
                self._producer.flush(1)
                err = "not delivered within 35s"
            elif not errors:
                return None
            else:
                err = errors[0]
                if err.code() in _SIZE_ERRORS:
                    return err
            if attempt == 0:
                self._dead_letter_log.log(
                    logging.WARNING,
                    "%s: a dead letter was not delivered (%s): trying again with a new producer",
                    self.url,
                    err,
                    key=str(err),
                )
                self._producer = None
                ensure_topic(self.bootstrap, self.dead_topic, 1)
        return err

    def positions(self) -> dict[bytes, str]:
        return {self.key(p): pos for p, pos in self._cursor_pos.items()}

    def connectivity(self) -> dict:
        """For /metrics: whether the broker is reachable (None: not known yet), connection errors
        and offset resets so far."""
        return {"up": self.health.up, "errors": self.health.errors, "resets": self.health.resets}

    # -- backlog --------------------------------------------------------------------
    def _end_offsets(self) -> dict[int, int]:
        """Each partition's end as the last fetch response reported it (no round trip: asking the
        broker blocks, and Tansu's direct answer can be wrong; -1001: not known yet)."""
        from confluent_kafka import TopicPartition

        for p in self.partitions:
            try:
                hi = self._consumer.get_watermark_offsets(TopicPartition(self.topic, p), cached=True)[1]
            except Exception as e:  # noqa: BLE001 - informational only
                log.debug("watermarks of partition %d: %s", p, e)
                continue
            if hi >= 0:
                self._ends[p] = hi
        return self._ends

    def lag(self) -> dict[int, dict[str, float]]:
        """Per partition: messages behind the end the broker reports, their rows (counted in
        buffered messages, estimated for the rest), the oldest unapplied one's age, and the
        offset consumed last (-1: none yet)."""
        ends = self._end_offsets()
        now = time.time()
        per: dict[int, dict[str, float]] = {}
        for (p, off), item in list(self._buf.items()):
            if (p, off) not in self._rows:
                self._rows[(p, off)] = count_rows(item.payload or b"")
            d = per.setdefault(p, {"buffered": 0, "rows": 0, "oldest_s": 0.0})
            d["buffered"] += 1
            d["rows"] += self._rows[(p, off)]
            d["oldest_s"] = max(d["oldest_s"], now - item.mtime)
        out = {}
        for p in self.partitions:
            d = per.get(p, {"buffered": 0, "rows": 0, "oldest_s": 0.0})
            behind = max(d["buffered"], ends.get(p, 0) - (self._cursor.get(p, -1) + 1))
            rows = d["rows"] + (behind - d["buffered"]) * self._rows_per_message
            out[p] = {
                "messages": behind,
                "rows": int(round(rows)),
                "seconds": d["oldest_s"],
                "offset": self._cursor.get(p, -1),
            }  # the last consumed (applied or refused) offset
        return out

    def pending(self) -> int:
        return len(self._buf)

    def backlog(self) -> Backlog:
        lag = self.lag()
        return Backlog(
            int(sum(d["messages"] for d in lag.values())),
            int(sum(d["rows"] for d in lag.values())),
            max((d["seconds"] for d in lag.values()), default=0.0),
        )

    def close(self) -> None:
        try:
            self._consumer.close()
        finally:
            if self._producer is not None:
                self._producer.flush(10)

    def describe(self) -> str:
        return self.url
