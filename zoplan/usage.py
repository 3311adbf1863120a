"""The command lines' usage errors as one line: an unknown option, a missing argument, a
value click cannot parse ("error: No such option: --foo (see zoexec run --help)", exit
2) instead of typer's usage text and boxed message. Both `zoplan` and
`zoexec` build their typer app with `cls=OneLineUsage`; it applies to every way the
app is called (the console scripts and typer's CliRunner alike).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import typer
from typer._click import exceptions as click_errors  # typer 0.29 (pinned) vendors click
from typer.core import TyperGroup

from zoplan.errors import EXIT_USER_ERROR, exit_with_error


class OneLineUsage(TyperGroup):
    """A typer group whose usage errors are one `error:` line (module docstring); bare
    `zoplan` / `zoexec` (no command) still shows the help."""

    def main(self, args: Sequence[str] | None = None, prog_name: str | None = None,
             complete_var: str | None = None, standalone_mode: bool = True,
             windows_expand_args: bool = True, **extra: Any) -> Any:
        try:
            code = super().main(args=args, prog_name=prog_name, complete_var=complete_var,
                                standalone_mode=False, windows_expand_args=windows_expand_args,
                                **extra)
        except click_errors.NoArgsIsHelpError as exc:
            exc.show()
            raise SystemExit(exc.exit_code) from None
        except typer.Abort:
            exit_with_error("aborted", 1)
        except click_errors.ClickException as exc:
            exit_with_error(usage_line(exc), EXIT_USER_ERROR)
        if not standalone_mode:
            return code
        raise SystemExit(code if isinstance(code, int) else 0)


def usage_line(exc: click_errors.ClickException) -> str:
    """A usage error in one line, with the command whose --help lists the options."""
    context = getattr(exc, "ctx", None)
    where = f" (see {context.command_path} --help)" if context is not None else ""
    return " ".join(exc.format_message().split()) + where
