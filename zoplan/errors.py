"""The project's user-facing error type, and how a command line reports it.

Anything a user can cause (bad file, unknown model, layout that does not fit) raises
ZoError with the numbers in the message. The CLIs catch it, print one red line and exit
with code 2 (`exit_with_error`). `assert` is kept for programmer errors only.
"""

from __future__ import annotations

from typing import NoReturn

from rich.console import Console
from rich.markup import escape

EXIT_USER_ERROR = 2


class ZoError(Exception):
    """A problem the user can fix; the message is shown as one line."""


def first_line(exc: BaseException) -> str:
    """The first line of an exception's message, stripped (its type's name when the
    message is empty): what a one-line report quotes of a library's error."""
    text = str(exc).strip()
    return text.splitlines()[0].strip() if text else type(exc).__name__


EXEC_PACKAGES = ("torch", "transformers", "safetensors", "psutil", "numpy", "gguf")


def need_exec_extra(exc: ModuleNotFoundError, what: str) -> ZoError:
    """The ZoError for `what` run where the executor's packages are missing (a planner-
    only install); any other missing module is re-raised as it is."""
    if (exc.name or "").split(".")[0] not in EXEC_PACKAGES:
        raise exc
    return ZoError(f"{what} needs the executor's packages ({exc.name} is not installed): "
                   f"pip install 'zoplan[exec]'")


def exit_with_error(message: str, code: int = EXIT_USER_ERROR) -> NoReturn:
    """Print "error: <message>" as one red line on stderr and exit with `code`. The
    message is printed as it is: brackets in it (paths, library messages) are not
    read as markup."""
    line = " ".join(message.split("\n"))   # one line, whatever the message carries
    Console(stderr=True).print(f"[bold red]error:[/] {escape(line)}", highlight=False,
                               soft_wrap=True)
    raise SystemExit(code)
