"""An independent reader of TensorBoard event files, for checking
trainwatchctl import: TFRecord framing with both masked CRC32C checks, and
the Event / Summary / TensorProto wire format decoded by hand. Shares no code
with the C++ reader (client/import/import_tensorboard.cc). Standard library
only."""

import struct


def _crc32c_table():
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


_TABLE = _crc32c_table()


def crc32c(data):
    crc = 0xFFFFFFFF
    for b in data:
        crc = _TABLE[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def masked_crc(data):
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def _varint(buf, i):
    shift = value = 0
    while True:
        b = buf[i]
        i += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, i
        shift += 7


def fields(buf):
    """Yields (field number, wire type, value) of a protobuf message."""
    i = 0
    while i < len(buf):
        key, i = _varint(buf, i)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, i = _varint(buf, i)
        elif wire == 1:
            value, i = buf[i:i + 8], i + 8
        elif wire == 2:
            n, i = _varint(buf, i)
            value, i = buf[i:i + n], i + n
        elif wire == 5:
            value, i = buf[i:i + 4], i + 4
        else:
            raise ValueError(f"wire type {wire}")
        yield number, wire, value


def _tensor_scalar(buf):
    dtype, value, content = None, None, None
    for number, wire, v in fields(buf):
        if number == 1:
            dtype = v
        elif number == 4:
            content = v
        elif number == 5:
            value = struct.unpack("<f", v[:4] if wire == 2 else v)[0]
        elif number == 6:
            value = struct.unpack("<d", v[:8] if wire == 2 else v)[0]
    if dtype == 1:
        return value if value is not None else struct.unpack("<f", content)[0]
    if dtype == 2:
        return value if value is not None else struct.unpack("<d", content)[0]
    return None


def scalars(path):
    """Every (tag, step, value) scalar of an event file, in file order."""
    data = open(path, "rb").read()
    out = []
    i = 0
    while i + 12 <= len(data):
        header = data[i:i + 8]
        (length,) = struct.unpack("<Q", header)
        (crc,) = struct.unpack("<I", data[i + 8:i + 12])
        assert crc == masked_crc(header), f"{path}: length CRC at {i}"
        body = data[i + 12:i + 12 + length]
        (dcrc,) = struct.unpack("<I", data[i + 12 + length:i + 16 + length])
        assert dcrc == masked_crc(body), f"{path}: data CRC at {i}"
        step = 0
        summary = None
        for number, _, v in fields(body):
            if number == 2:
                step = v
            elif number == 5:
                summary = v
        if summary is not None:
            for number, _, value in fields(summary):
                if number != 1:
                    continue
                tag, simple, tensor = None, None, None
                for n, _, v in fields(value):
                    if n == 1:
                        tag = v.decode()
                    elif n == 2:
                        simple = struct.unpack("<f", v)[0]
                    elif n == 8:
                        tensor = v
                if simple is None and tensor is not None:
                    simple = _tensor_scalar(tensor)
                if simple is not None:
                    out.append((tag, step, simple))
        i += 16 + length
    return out
