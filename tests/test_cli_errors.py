"""How a command ends when it is stopped: SIGTERM (timeout, kill, a container stopping) as Ctrl-C."""

import os
import signal
import time

import pytest
import typer

from pipeline.artifacts import atomic_dir
from pipeline.cli_errors import user_errors


@pytest.mark.parametrize("sig, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_stop_signal_mid_write_leaves_nothing_and_says_so(tmp_path, capsys, sig, code):
    @user_errors
    def stage():
        with atomic_dir(tmp_path / "graph") as tmp:
            (tmp / "model.onnx.data").write_bytes(b"half")
            os.kill(os.getpid(), sig)
            time.sleep(10)  # the signal's handler raises before this ends
        raise AssertionError("the stage ran to its end")

    before = signal.getsignal(signal.SIGTERM)
    # Python's own SIGINT handler, as a command started from a terminal has (a shell's background job ignores SIGINT)
    interactive = signal.signal(signal.SIGINT, signal.default_int_handler)
    started = time.monotonic()
    try:
        with pytest.raises(typer.Exit) as stopped:
            stage()
    finally:
        signal.signal(signal.SIGINT, interactive)
    assert stopped.value.exit_code == code and time.monotonic() - started < 5
    assert list(tmp_path.iterdir()) == []  # the temporary folder went with the stop
    out = capsys.readouterr().err
    assert f"interrupted ({sig.name})" in out and len(out.strip().splitlines()) == 1
    assert signal.getsignal(signal.SIGTERM) is before  # the command's handler does not outlive it
