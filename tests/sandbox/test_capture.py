"""Head-and-tail capture of a stream, whatever its length."""

from __future__ import annotations

from switchboard.sandbox.capture import StreamCapture, marker


def captured(limit: int, *chunks: bytes) -> str:
    capture = StreamCapture(limit)
    for chunk in chunks:
        capture.feed(chunk)
    return capture.text()


def test_short_output_is_whole() -> None:
    assert captured(10, b"hello", b"\n") == "hello\n"
    assert captured(6, b"hello\n") == "hello\n"


def test_output_one_over_the_limit_is_cut_in_the_middle() -> None:
    assert captured(6, b"abcdefg") == "abc" + marker(1) + "efg"


def test_multibyte_characters_are_counted_as_characters() -> None:
    text = "é" * 100 + "日本" * 50
    assert captured(20, text.encode()) == "é" * 10 + marker(180) + "日本" * 5


def test_a_huge_stream_keeps_memory_bounded_and_counts_the_cut() -> None:
    capture = StreamCapture(8)
    capture.feed(b"HEAD")
    for _ in range(1000):
        capture.feed(b"." * 1000)
    capture.feed(b"TAIL")
    assert capture.text() == "HEAD" + marker(1_000_000) + "TAIL"


def test_a_limit_of_one_keeps_the_last_character() -> None:
    assert captured(1, b"xyz") == marker(2) + "z"
