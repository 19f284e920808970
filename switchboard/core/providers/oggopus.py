"""OGG/Opus, the audio of voice notes: reading a stream's length, and writing a silent one for fakes and the kit.

Only what the gateway needs: the container's page framing (RFC 3533) and Opus's identification header (RFC 7845).
A voice reply is checked to be OGG/Opus and measured before any channel sends it as a voice note.
"""

from __future__ import annotations

import binascii
import struct

from switchboard.errors import SpeechError

__all__ = ["OPUS_RATE", "opus_duration", "silent_opus"]

OPUS_RATE = 48_000
"""Opus granule positions count 48 kHz samples, whatever the input rate."""
_PRE_SKIP = 312
_FRAME = 960
"""Samples of one 20 ms Opus frame."""
_SILENT_FRAME = b"\xf8\xff\xfe"
"""One 20 ms CELT fullband mono frame that decodes to silence."""


_BIT_REVERSED = bytes(int(f"{n:08b}"[::-1], 2) for n in range(256))


def _crc(data: bytes) -> int:
    """OGG's page checksum (CRC-32, polynomial 0x04C11DB7, not reflected, no initial value or final XOR).

    Computed in C: it is the bit reversal of zlib's reflected CRC-32 (without its initial value and final XOR) over
    the bit-reversed bytes, so checking a few megabytes of pages takes milliseconds on the event loop.
    """
    reflected = binascii.crc32(data.translate(_BIT_REVERSED), 0xFFFFFFFF) ^ 0xFFFFFFFF
    return int(f"{reflected:032b}"[::-1], 2)


def _page(packets: list[bytes], *, granule: int, serial: int, sequence: int, flags: int) -> bytes:
    lacing = bytearray()
    for packet in packets:
        lacing += b"\xff" * (len(packet) // 255) + bytes([len(packet) % 255])
    header = struct.pack("<4sBBqIIIB", b"OggS", 0, flags, granule, serial, sequence, 0, len(lacing))
    page = bytearray(header + lacing + b"".join(packets))
    struct.pack_into("<I", page, 22, _crc(bytes(page)))
    return bytes(page)


def silent_opus(seconds: float = 1.0, *, serial: int = 0x5B0A) -> bytes:
    """A valid mono OGG/Opus stream of ``seconds`` of silence (50 frames a page)."""
    head = struct.pack("<8sBBHIhB", b"OpusHead", 1, 1, _PRE_SKIP, OPUS_RATE, 0, 0)
    vendor = b"switchboard"
    tags = b"OpusTags" + struct.pack("<I", len(vendor)) + vendor + struct.pack("<I", 0)
    pages = [
        _page([head], granule=0, serial=serial, sequence=0, flags=0x02),
        _page([tags], granule=0, serial=serial, sequence=1, flags=0),
    ]
    frames = max(1, round(seconds * 50))
    done = 0
    while done < frames:
        count = min(50, frames - done)
        done += count
        last = done == frames
        pages.append(
            _page(
                [_SILENT_FRAME] * count,
                granule=_PRE_SKIP + done * _FRAME,
                serial=serial,
                sequence=len(pages),
                flags=0x04 if last else 0,
            )
        )
    return b"".join(pages)


def opus_duration(data: bytes) -> float:
    """Seconds of audio in an OGG/Opus stream: the last page's granule position less the pre-skip.

    Every page's framing and checksum is checked, so a truncated or corrupted stream is refused too.

    Raises:
        SpeechError: ``data`` is not an intact OGG stream whose first packet is an Opus header.
    """
    offset, granule, pre_skip, first = 0, 0, 0, True
    while offset < len(data):
        if data[offset : offset + 4] != b"OggS" or offset + 27 > len(data):
            raise SpeechError("the audio is not an intact OGG stream")
        segments = data[offset + 26]
        lacing = data[offset + 27 : offset + 27 + segments]
        end = offset + 27 + segments + sum(lacing)
        if len(lacing) != segments or end > len(data):
            raise SpeechError("the audio is not an intact OGG stream")
        page = bytearray(data[offset:end])
        expected = struct.unpack_from("<I", page, 22)[0]
        struct.pack_into("<I", page, 22, 0)
        if _crc(bytes(page)) != expected:
            raise SpeechError("the audio is not an intact OGG stream (a page checksum does not match)")
        body = offset + 27 + segments
        if first and (data[body : body + 8] != b"OpusHead" or end - body < 19):
            raise SpeechError("the audio is OGG but not Opus")
        if first:
            pre_skip = int(struct.unpack_from("<H", data, body + 10)[0])
            first = False
        page_granule = int(struct.unpack_from("<q", data, offset + 6)[0])
        if page_granule >= 0:
            granule = page_granule
        offset = end
    if first:
        raise SpeechError("the audio is empty")
    return max(granule - pre_skip, 0) / OPUS_RATE
