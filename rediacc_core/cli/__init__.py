"""The `rdc` command line.

Errors reach the user as two lines on stderr, `Error: <what>` and `What to do: <next step>`, and
the process exits with the error's code (see `rediacc_core.errors`), so scripts can branch on it.
"""

from __future__ import annotations

import os
import sys
import warnings
from typing import Any

import click

from rediacc_core import __version__
from rediacc_core.cli.groups import COMPLETE_VAR, HintingGroup
from rediacc_core.cli.output import waiting
from rediacc_core.commands import LOCAL_ONLY
from rediacc_core.errors import EXIT_GENERAL, EXIT_INTERRUPTED, RdcError, from_os_error
from rediacc_core.statelock import notify_waits

DEBUG_ENV = "RDC_DEBUG"


def report_error(exc: RdcError) -> None:
    click.echo(f"Error: {exc.what}", err=True)
    if exc.todo:
        click.echo(f"What to do: {exc.todo}", err=True)


class RdcGroup(HintingGroup):
    """The root group: turns RdcError into the two-line report."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except RdcError as exc:
            report_error(exc)
            raise click.exceptions.Exit(exc.exit_code) from exc
        except OSError as exc:  # forgetting sudo, a file in the way: the operator's to fix, not a bug
            if os.environ.get(DEBUG_ENV):
                import traceback

                traceback.print_exc()
            error = from_os_error(exc)
            report_error(error)
            raise click.exceptions.Exit(error.exit_code) from exc


def _print_version(ctx: click.Context, param: click.Parameter, value: bool) -> None:
    """`rdc --version`: the core's version, then each plugin's (a bug report needs them all), read
    from the installed distributions without loading the plugins (`rdc plugins` loads them)."""
    if not value or ctx.resilient_parsing:
        return
    from rediacc_core.plugins import installed

    click.echo(f"rdc {__version__}")
    for info in installed():
        where = f" ({info.distribution})" if info.distribution else ""
        state = f" (failed to load: {info.error})" if info.error else ""
        click.echo(f"plugin {info.name} {info.version or 'unknown'}{where}{state}")
    ctx.exit()


@click.group(cls=RdcGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--version",
    is_flag=True,
    expose_value=False,
    is_eager=True,
    callback=_print_version,
    help="Show the version of rdc and of each plugin, and exit.",
)
def cli() -> None:
    """rdc: hand GPUs to isolated Docker workloads through CDI grants.

    \b
    Examples:
      rdc demo
      rdc machine setup localhost --dry-run
      rdc repo list localhost
    """
    notify_waits(waiting)  # a command blocked on another's lock says so rather than hang silently


def _show_warning(
    message: Warning | str,
    category: type[Warning],
    filename: str,
    lineno: int,
    file: Any = None,
    line: str | None = None,
) -> None:
    from rediacc_core.plugins import PluginLoadWarning  # loaded already: a plugin load warned

    if issubclass(category, PluginLoadWarning):
        click.echo(f"Warning: {message}", err=True)
    else:
        _default_showwarning(message, category, filename, lineno, file, line)


_default_showwarning = warnings.showwarning


def _confirm_delete(ref: str) -> bool:
    """`rdc repo delete`'s question, asked here for a repo on an SSH machine (imported only then)."""
    from rediacc_core.cli.repo import confirm_delete

    return confirm_delete(ref)


def main(argv: list[str] | None = None) -> None:
    """The `rdc` console script."""
    warnings.showwarning = _show_warning
    if os.environ.get(COMPLETE_VAR):  # only a shell asking for completions needs every completer
        from rediacc_core.cli.completion import attach_completers

        attach_completers(cli)
    try:
        args = sys.argv[1:] if argv is None else argv
        if args and args[0] not in LOCAL_ONLY:
            from rediacc_core.remote.dispatch import forward_if_remote

            # A command whose machine is reached over SSH runs there, whole (see rediacc_core.remote).
            forwarded = forward_if_remote(args, _confirm_delete, root=cli)
            if forwarded is not None:
                sys.exit(forwarded)
        # Not standalone, so unexpected exceptions reach the handler below; click then hands back
        # the exit code of a `ctx.exit(code)` (our commands return None otherwise).
        code = cli.main(args=argv, prog_name="rdc", standalone_mode=False)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except click.ClickException as exc:  # usage errors: click's own message and exit code (2)
        exc.show()
        sys.exit(exc.exit_code)
    except click.exceptions.Abort as exc:
        # click turns Ctrl-C into Abort; a refused confirmation is an Abort too, and stays a plain 1.
        if isinstance(exc.__cause__, KeyboardInterrupt):
            click.echo("Interrupted.", err=True)
            sys.exit(EXIT_INTERRUPTED)
        click.echo("Aborted.", err=True)
        sys.exit(EXIT_GENERAL)
    except RdcError as exc:  # raised outside a command (e.g. while building one)
        report_error(exc)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        click.echo("Interrupted.", err=True)
        sys.exit(EXIT_INTERRUPTED)
    except OSError as exc:  # outside a command, e.g. while a plugin builds its options
        report_error(from_os_error(exc))
        sys.exit(from_os_error(exc).exit_code)
    except Exception as exc:
        if os.environ.get(DEBUG_ENV):
            import traceback

            traceback.print_exc()
        click.echo(f"Error: unexpected {type(exc).__name__}: {exc}", err=True)
        click.echo(
            f"What to do: this is a bug in rdc or a plugin; rerun with {DEBUG_ENV}=1 to see where it "
            "happened, and report it",
            err=True,
        )
        sys.exit(EXIT_GENERAL)
    sys.exit(code if isinstance(code, int) and not isinstance(code, bool) else 0)
