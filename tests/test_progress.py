"""Progress: bars on a terminal, plain lines in a log."""

from pipeline import progress as progress_module


def test_progress_in_a_log_is_a_line_every_few_seconds(monkeypatch, capsys):
    """Output that is not a terminal gets plain progress lines (a bar would show only its end)."""
    monkeypatch.setattr(progress_module, "LOG_EVERY_S", 0.0)
    with progress_module.progress_task("finetune", 3) as task:
        for loss in (3.0, 2.0, 1.0):
            task.advance(1, status=f"loss {loss}")
    lines = capsys.readouterr().err.splitlines()
    assert [line.split()[:2] for line in lines] == [["finetune:", "1/3"], ["finetune:", "2/3"], ["finetune:", "3/3"],
                                                   ["finetune:", "3/3"]]
    assert lines[-1].endswith("loss 1.0")
