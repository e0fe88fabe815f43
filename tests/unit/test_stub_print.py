"""``stubside/_stub_print.py`` and its reader in ``server/process.py``: a backend callable's print, line by line.

No stub and no server: the forwarder writes into a StringIO, the reader's writer into pytest's capture.
"""

from __future__ import annotations

import io
import sys
import threading

from pytriton.proxy.stubside import _stub_print
from pytriton.server import process


def _lines(target: io.StringIO) -> list:
    return [_stub_print.parse(line) for line in target.getvalue().splitlines()]


def test_complete_lines_are_forwarded_with_stream_and_label_and_partial_ones_wait():
    target = io.StringIO()
    out = _stub_print.LineForwarder(target, "stdout", "Model/0")
    print("hello", "world", file=out)
    out.write("no newline yet")
    assert _lines(target) == [("stdout", "Model/0", "hello world")]
    out.write(" - now\nand a second\n")
    assert _lines(target)[1:] == [("stdout", "Model/0", "no newline yet - now"), ("stdout", "Model/0", "and a second")]
    out.write("tail")
    out.flush()
    assert _lines(target)[-1] == ("stdout", "Model/0", "tail")


def test_a_very_long_line_is_forwarded_in_pieces():
    target = io.StringIO()
    out = _stub_print.LineForwarder(target, "stderr", "M/1")
    out.write("x" * (_stub_print.MAX_LINE * 2 + 5))
    pieces = _lines(target)
    assert [len(text) for _, _, text in pieces] == [_stub_print.MAX_LINE, _stub_print.MAX_LINE]
    out.flush()
    assert _lines(target)[-1] == ("stderr", "M/1", "xxxxx")


def test_lines_from_several_threads_stay_whole():
    target = io.StringIO()
    out = _stub_print.LineForwarder(target, "stdout", "M/0")

    def talk(n: int) -> None:
        for i in range(200):
            print(f"thread {n} line {i}", file=out)

    threads = [threading.Thread(target=talk, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    texts = [text for _, _, text in _lines(target)]
    assert len(texts) == 800 and all(text.startswith("thread ") for text in texts)


def test_other_server_output_is_not_taken_for_a_print():
    assert _stub_print.parse('I1129 04:36:44 model_lifecycle.cc:472] "loading: M:1"') is None
    assert _stub_print.parse(_stub_print.PREFIX + "stdin M/0|x") is None
    assert _stub_print.parse(_stub_print.PREFIX + "stdout no-separator") is None
    # A label with a '|' cannot cut the text short: the forwarder replaces it.
    target = io.StringIO()
    print("a|b", file=_stub_print.LineForwarder(target, "stdout", "odd|name/0"))
    assert _lines(target) == [("stdout", "odd/name/0", "a|b")]


def test_install_only_where_the_launching_pytriton_asked_for_it(monkeypatch):
    monkeypatch.setattr(sys, "stdout", io.StringIO())
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    monkeypatch.delenv(_stub_print.FORWARD_VARIABLE, raising=False)
    assert not _stub_print.install("M/0") and not isinstance(sys.stdout, _stub_print.LineForwarder)
    monkeypatch.setenv(_stub_print.FORWARD_VARIABLE, "1")
    assert _stub_print.install("M/0")
    first = sys.stdout
    assert isinstance(first, _stub_print.LineForwarder) and isinstance(sys.stderr, _stub_print.LineForwarder)
    _stub_print.install("M/0")
    assert sys.stdout is first  # idempotent: not wrapped twice


def test_the_reader_writes_the_text_to_this_process(capsys):
    process._write_forwarded("stdout", "M/0", "printed in the stub")
    process._write_forwarded("stderr", "M/0", "warned in the stub")
    captured = capsys.readouterr()
    assert captured.out == "printed in the stub\n" and captured.err == "warned in the stub\n"


def test_the_forwarder_keeps_the_original_descriptor_for_code_that_writes_to_it_directly(tmp_path):
    # faulthandler (stubside/_stub_exit.py) asks sys.stderr for its fileno(); a forwarder without
    # one failed a backend stub's failing initialize with UnsupportedOperation instead of its error.
    with open(tmp_path / "err", "w") as original:
        forwarder = _stub_print.LineForwarder(original, "stderr", "M/0")
        assert forwarder.fileno() == original.fileno() and not forwarder.isatty()
