"""Reading scalars back from TensorBoard event files (needs ``tensorboardX``).

Event files are TFRecord files: each record is a little-endian uint64 length,
its masked CRC-32C, the serialized ``Event`` proto and that one's masked CRC.
"""

from __future__ import annotations

import struct
from pathlib import Path


def read_records(path: Path) -> list[bytes]:
    """The records of one event file, checking both CRCs of each."""
    from tensorboardX.record_writer import masked_crc32c

    data = Path(path).read_bytes()
    out, pos = [], 0
    while pos < len(data):
        if pos + 12 > len(data):
            raise ValueError(f"{path}: truncated record header at byte {pos}")
        header = data[pos:pos + 8]
        (length,) = struct.unpack("<Q", header)
        (crc,) = struct.unpack("<I", data[pos + 8:pos + 12])
        if crc != masked_crc32c(header):
            raise ValueError(f"{path}: bad length CRC at byte {pos}")
        body = data[pos + 12:pos + 12 + length]
        end = pos + 12 + length
        if len(body) != length or end + 4 > len(data):
            raise ValueError(f"{path}: truncated record at byte {pos}")
        if struct.unpack("<I", data[end:end + 4])[0] != masked_crc32c(body):
            raise ValueError(f"{path}: bad data CRC at byte {pos}")
        out.append(body)
        pos = end + 4
    return out


def read_scalars(logdir: Path) -> dict[str, list[tuple[int, float]]]:
    """``{tag: [(step, value), ...]}`` over every event file in ``logdir``, in file
    (creation) order then record order."""
    from tensorboardX.proto import event_pb2

    out: dict[str, list[tuple[int, float]]] = {}
    for path in sorted(Path(logdir).glob("events.out.tfevents.*")):
        for record in read_records(path):
            event = event_pb2.Event.FromString(record)
            if event.HasField("summary"):
                for value in event.summary.value:
                    if value.HasField("simple_value"):
                        out.setdefault(value.tag, []).append((event.step, value.simple_value))
    return out
