"""How the `gpt2-deploy` commands end on a failure: one line on stderr and a non-zero exit, whatever
failed (tracebacks with `gpt2-deploy --debug`)."""

from __future__ import annotations

import contextlib
import errno
import functools
import signal
import threading
from typing import NoReturn

import click
import typer
from rich.markup import escape

from pipeline.errors import Interrupted, UserError
from pipeline.progress import console

DEBUG = {"on": False}  # set by the command's --debug


class Terminated(KeyboardInterrupt):
    """SIGTERM (`timeout`, `kill`, a container or service stopping) taken as Ctrl-C is: the stage's
    temporary files, and the libraries' own (ModelOpt's copies of a graph), go on the way out. Its
    default action ended the process where it stood and left them, gigabytes at gpt2-xl."""


@contextlib.contextmanager
def sigterm_as_interrupt():
    """SIGTERM raises Terminated for the block's length. A command that installs its own handler
    (serve, finetune's loop) replaces this one while it runs."""
    if threading.current_thread() is not threading.main_thread():  # signals reach the main thread only
        yield
        return

    def stop(signum, frame):
        raise Terminated()
    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        if previous is not None:  # None: a handler set outside Python, which cannot be put back from here
            signal.signal(signal.SIGTERM, previous)


def user_errors(fn):
    """Print a UserError, a full disk, an interruption (SIGINT, SIGTERM) and any other exception as
    one line and exit non-zero; tracebacks only with --debug."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            with sigterm_as_interrupt():
                return fn(*args, **kwargs)
        except (typer.Exit, typer.Abort, click.exceptions.Exit, click.exceptions.ClickException, click.exceptions.Abort):
            raise  # typer's and click's own ways out (an exit code, a usage error)
        except UserError as e:
            if DEBUG["on"]:
                raise
            console.print(f"[red]error:[/red] {escape(str(e))}", highlight=False, soft_wrap=True)
            raise typer.Exit(e.exit_code if isinstance(e, Interrupted) else 1) from None
        except OSError as e:
            if e.errno not in (errno.ENOSPC, errno.EDQUOT):
                unexpected(e, fn.__name__)
            if DEBUG["on"]:
                raise
            # a full disk is the machine's state, not a bug: writes go through temp files, so nothing half-written stays
            console.print(f"[red]error:[/red] {escape(e.filename or 'a file')}: {e.strerror}; free some space and run "
                          "the stage again (outputs are replaced only when complete)", highlight=False, soft_wrap=True)
            raise typer.Exit(1) from None
        except KeyboardInterrupt as e:  # stages write through temp files and renames: nothing half-written stays
            if DEBUG["on"]:
                raise
            by = signal.SIGTERM if isinstance(e, Terminated) else signal.SIGINT
            console.print(f"[red]interrupted[/red] ({by.name}): stopped before the end; outputs are written only "
                          "when complete", highlight=False)
            raise typer.Exit(128 + by) from None
        except Exception as e:
            unexpected(e, fn.__name__)
    return wrapper


def unexpected(e: Exception, command: str) -> NoReturn:
    """A failure no check foresaw: one line, exit 1 (the stage's outputs are written only when whole);
    the traceback with --debug."""
    if DEBUG["on"]:
        raise e
    console.print(f"[red]error:[/red] {command} failed: {type(e).__name__}: {escape(str(e))[:500]} (unexpected; "
                  f"`gpt2-deploy --debug {command.replace('_', '-')} ...` shows the traceback)", highlight=False,
                  soft_wrap=True)
    raise typer.Exit(1) from None
