#!/usr/bin/python3
# TensorBoard event-file fixture from an implementation independent of ours: Debian's
# python3-protobuf serialises the Event/Summary schema (declared below with descriptor_pb2, as in
# tensorflow/core/util/event.proto and framework/summary.proto) and this file frames the records.
#
#   scripts/make_tensorboard_fixture.py                 # writes tests/fixtures/io/tb_fixture.tfevents
#   scripts/make_tensorboard_fixture.py --read FILE     # decodes one of ours, checking every CRC
#
# Needs python3-protobuf (apt-get install python3-protobuf); the C++ tests do not need Python.
import argparse
import os
import struct
import sys

from google.protobuf import descriptor_pb2, message_factory

F = descriptor_pb2.FieldDescriptorProto


def build_schema():
    """Event, Summary, Summary.Value, SummaryMetadata as message classes (field numbers as TF's)."""
    fp = descriptor_pb2.FileDescriptorProto(name="ska_tb_fixture.proto", package="tensorboard",
                                            syntax="proto3")

    def message(name, fields, parent=None):
        m = (parent.nested_type if parent else fp.message_type).add(name=name)
        for fname, number, ftype, label, type_name in fields:
            f = m.field.add(name=fname, number=number, type=ftype, label=label)
            if type_name:
                f.type_name = type_name
        return m

    opt, rep = F.LABEL_OPTIONAL, F.LABEL_REPEATED
    plugin = message("PluginData", [("plugin_name", 1, F.TYPE_STRING, opt, None),
                                    ("content", 2, F.TYPE_BYTES, opt, None)])
    del plugin
    message("SummaryMetadata", [("plugin_data", 1, F.TYPE_MESSAGE, opt, ".tensorboard.PluginData"),
                                ("display_name", 2, F.TYPE_STRING, opt, None),
                                ("summary_description", 3, F.TYPE_STRING, opt, None)])
    summary = message("Summary", [("value", 1, F.TYPE_MESSAGE, rep, ".tensorboard.Summary.Value")])
    value = message("Value", [("tag", 1, F.TYPE_STRING, opt, None),
                              ("simple_value", 2, F.TYPE_FLOAT, opt, None),
                              ("node_name", 7, F.TYPE_STRING, opt, None),
                              ("metadata", 9, F.TYPE_MESSAGE, opt, ".tensorboard.SummaryMetadata")],
                    parent=summary)
    value.oneof_decl.add(name="value")
    value.field[1].oneof_index = 0
    event = message("Event", [("wall_time", 1, F.TYPE_DOUBLE, opt, None),
                              ("step", 2, F.TYPE_INT64, opt, None),
                              ("file_version", 3, F.TYPE_STRING, opt, None),
                              ("summary", 5, F.TYPE_MESSAGE, opt, ".tensorboard.Summary")])
    event.oneof_decl.add(name="what")
    event.field[2].oneof_index = 0
    event.field[3].oneof_index = 0
    classes = message_factory.GetMessages([fp])
    return classes["tensorboard.Event"]


def crc32c(data):
    """CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), bit by bit."""
    crc = 0xFFFFFFFF
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def masked_crc(data):
    crc = crc32c(data)
    return ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF


def frame(data):
    length = struct.pack("<Q", len(data))
    return length + struct.pack("<I", masked_crc(length)) + data + struct.pack("<I", masked_crc(data))


def unframe(blob, path):
    pos, records = 0, []
    while pos < len(blob):
        (length,) = struct.unpack_from("<Q", blob, pos)
        (lcrc,) = struct.unpack_from("<I", blob, pos + 8)
        if lcrc != masked_crc(blob[pos:pos + 8]):
            sys.exit(f"{path}: length CRC mismatch at byte {pos}")
        data = blob[pos + 12:pos + 12 + length]
        (dcrc,) = struct.unpack_from("<I", blob, pos + 12 + length)
        if dcrc != masked_crc(data):
            sys.exit(f"{path}: data CRC mismatch at byte {pos}")
        records.append(data)
        pos += 12 + length + 4
    return records


def write_fixture(path, Event):
    assert crc32c(b"123456789") == 0xE3069283  # the CRC-32C check value
    events = [Event(wall_time=1700000000.5, file_version="brain.Event:2")]
    scalars = [(1, 1700000001.25, [("train/loss", 2.5), ("train/lr", 0.001)]),
               (2, 1700000002.0, [("train/loss", 1.25)]),
               (300, 1700000100.0, [("eval/top1", 87.5), ("eval/top5", 99.25)]),
               (2 ** 40 + 3, 1700000200.0, [("train/nonfinite_total", 0.0)])]
    for step, wall, values in scalars:
        e = Event(wall_time=wall, step=step)
        for tag, v in values:
            sv = e.summary.value.add(tag=tag, simple_value=v)
            if tag == "eval/top1":  # fields our reader must skip: metadata and node_name
                sv.metadata.plugin_data.plugin_name = "scalars"
                sv.metadata.display_name = "top-1"
                sv.node_name = "eval"
        events.append(e)
    with open(path, "wb") as f:
        for e in events:
            f.write(frame(e.SerializeToString()))
    print(f"wrote {path}: {len(events)} events, {os.path.getsize(path)} bytes")


def read_events(path, Event):
    with open(path, "rb") as f:
        blob = f.read()
    for data in unframe(blob, path):
        e = Event()
        e.ParseFromString(data)
        if e.SerializeToString() != data:
            sys.exit(f"{path}: an event re-serialises differently (not canonical protobuf)")
        if e.HasField("file_version"):
            print(f"wall_time {e.wall_time:.3f} file_version {e.file_version}")
        else:
            vals = ", ".join(f"{v.tag}={v.simple_value:.6g}" for v in e.summary.value)
            print(f"wall_time {e.wall_time:.3f} step {e.step}: {vals}")


def main():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("out", nargs="?", default=os.path.join(root, "tests/fixtures/io/tb_fixture.tfevents"))
    p.add_argument("--read", metavar="FILE", help="decode an event file (ours) instead")
    args = p.parse_args()
    Event = build_schema()
    if args.read:
        read_events(args.read, Event)
    else:
        write_fixture(args.out, Event)


if __name__ == "__main__":
    main()
