"""Digest caps (runtime.fleet.digest): head + banner + tail, byte-accurate, fast on 50 MB."""

from __future__ import annotations

import re

from hypothesis import given, settings
from hypothesis import strategies as st

from exarch_actors.runtime.constants import OPAQUE_CAP, STDERR_CAP, STDOUT_CAP, VALUE_CAP
from exarch_actors.runtime.fleet.digest import (
    CAPS,
    Section,
    banner,
    clip_agent_reply,
    clip_middle,
    digest_tool_result,
)

BANNER_RE = re.compile(
    r"\n\[\.\.\. (.+?): (\d+) of (\d+) bytes elided from the middle\..*?\.\.\.\]\n", re.S
)


def split(out: str) -> tuple[str, str, int, int]:
    m = BANNER_RE.search(out)
    assert m is not None, "no banner"
    return out[: m.start()], out[m.end() :], int(m.group(2)), int(m.group(3))


def nbytes(s: str) -> int:
    return len(s.encode("utf-8"))


def test_the_section_caps_are_the_seed_figures() -> None:
    assert CAPS[Section.VALUE] == VALUE_CAP == 20 * 1024
    assert CAPS[Section.STDOUT] == STDOUT_CAP == 10 * 1024
    assert CAPS[Section.STDERR] == STDERR_CAP == 10 * 1024
    assert CAPS[Section.ERROR] == OPAQUE_CAP


def test_under_cap_text_passes_through_unchanged() -> None:
    text = "a" * 1000 + "é" * 100
    assert clip_middle(text, 2000, "stdout") == text


def test_oversize_text_keeps_head_and_tail_and_says_how_much_was_elided() -> None:
    text = "".join(f"line {i}\n" for i in range(10_000))
    out = clip_middle(text, 4096, "stdout")
    head, tail, elided, total = split(out)
    assert text.startswith(head) and text.endswith(tail)
    assert head.startswith("line 0\n") and tail.endswith("line 9999\n")
    assert total == nbytes(text)
    assert elided == total - nbytes(head) - nbytes(tail)
    assert nbytes(out) <= 4096
    assert "grep-files" in out and "view-text PATH FROM TO" in out and "in slices" in out


def test_a_multibyte_character_is_never_split() -> None:
    text = "€" * 10_000  # 3 bytes each
    out = clip_middle(text, 1000, "value")
    head, tail, _, _ = split(out)
    assert set(head) <= {"€"} and set(tail) <= {"€"}
    assert nbytes(out) <= 1000


def test_bytes_are_cut_raw_and_decoded_only_at_the_windows() -> None:
    raw = ("ü" * 50_000).encode()
    out = clip_middle(raw, 2048, "stdout")
    head, tail, elided, total = split(out)
    assert total == len(raw) and set(head + tail) == {"ü"}
    assert elided == total - nbytes(head) - nbytes(tail)
    assert nbytes(out) <= 2048


def test_invalid_utf8_bytes_still_fit_the_cap() -> None:
    raw = b"\xff\xfe" * 20_000
    out = clip_middle(raw, 1024, "stdout")
    assert nbytes(out) <= 1024
    assert "\ufffd" in out


def test_a_50_mb_result_is_digested_to_within_the_caps() -> None:
    # How long it takes (ms, against a 50 KB result) is benchmarks/digest_cost.py's figure.
    for big in ("x" * (50 << 20), "é" * (25 << 20), b"y" * (50 << 20)):
        out = digest_tool_result("unit", stdout=big)
        assert nbytes(out) < VALUE_CAP + STDOUT_CAP


def test_digest_renders_sections_in_order_and_only_when_present() -> None:
    out = digest_tool_result("42", stdout="hi\n", stderr="", notes=["note a"])
    assert out == "[value]\n42\n[stdout]\nhi\n\n[notes]\nnote a"
    err = digest_tool_result(None, stderr="boom", error="1:6 undefined variable nope")
    assert err == "[error]\n1:6 undefined variable nope\n[stderr]\nboom"


def test_an_empty_result_is_never_empty_text() -> None:
    assert digest_tool_result(None) == "[value]\nunit"


def test_each_section_gets_its_own_cap() -> None:
    out = digest_tool_result("v" * 100_000, stdout="o" * 100_000, stderr="e" * 100_000)
    parts = out.split("\n[stdout]\n")
    value = parts[0].removeprefix("[value]\n")
    stdout, stderr = parts[1].split("\n[stderr]\n")
    assert nbytes(value) <= VALUE_CAP and nbytes(value) > VALUE_CAP - 400
    assert nbytes(stdout) <= STDOUT_CAP and nbytes(stderr) <= STDERR_CAP
    assert "value: " in value and "stdout: " in stdout and "stderr: " in stderr


def test_an_agent_reply_is_clipped_to_its_cap() -> None:
    assert "agent reply: " in clip_agent_reply("r" * 100_000)


def test_a_cap_smaller_than_the_banner_yields_the_banner_alone() -> None:
    out = clip_middle("z" * 1000, 10, "value")
    assert out == banner("value", 1000, 1000)


@settings(max_examples=300)
@given(st.text(max_size=3000), st.integers(0, 4000))
def test_clip_fits_the_cap_keeps_a_prefix_and_a_suffix_and_is_idempotent(
    text: str, cap: int
) -> None:
    out = clip_middle(text, cap, "stdout")
    widest = nbytes(banner("stdout", nbytes(text), nbytes(text)))
    assert nbytes(out) <= max(cap, widest)
    if nbytes(text) <= cap:
        assert out == text
    else:
        head, tail, elided, total = split(out)
        assert text.startswith(head) and text.endswith(tail)
        assert total == nbytes(text) and elided == total - nbytes(head) - nbytes(tail)
        if cap >= widest:
            assert clip_middle(out, cap, "stdout") == out


@settings(max_examples=200)
@given(st.binary(max_size=3000), st.integers(200, 2000))
def test_clip_of_arbitrary_bytes_never_raises_and_fits(raw: bytes, cap: int) -> None:
    out = clip_middle(raw, cap, "stderr")
    widest = nbytes(banner("stderr", len(raw) * 3, len(raw) * 3))
    assert nbytes(out) <= max(cap, widest)
