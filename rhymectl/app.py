"""The typer application and the one place exit codes and error lines are decided.

Exit codes: 0 success, 1 runtime failure, 2 usage or configuration error. Errors are one
line on stderr; `--debug` (anywhere on the command line) shows the traceback instead.
"""

from __future__ import annotations

import os
import sys

import typer

try:  # typer >= 0.20 vendors click
    from typer._click import exceptions as click_exc
except ImportError:  # pragma: no cover
    from click import exceptions as click_exc

from pipeline import children
from pipeline.errors import DEBUG_ENV, UsageError
from pipeline.process_exit import exit_code, exit_now
from rhymectl import __version__, output
from rhymectl import (cmd_bench, cmd_doctor, cmd_index, cmd_init_model, cmd_profile, cmd_report,
                      cmd_train)

app = typer.Typer(
    name="rhymectl",
    help="Synchronous GRPO whose rollouts rhyme: history and sibling drafts inside vLLM.\n\n"
         "Example: rhymectl init-model && rhymectl train sample_configs/tiny.yaml",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)
for module in (cmd_init_model, cmd_train, cmd_report, cmd_profile, cmd_bench, cmd_index,
               cmd_doctor):
    module.register(app)


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"rhymectl {__version__}")
        raise typer.Exit(0)


@app.callback()
def _options(version: bool = typer.Option(False, "--version", callback=_print_version,
                                          is_eager=True, help="Print the version and exit.")
             ) -> None:
    """Options before the command (the help text is the app's)."""


def main(argv: list[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in args or os.environ.get(DEBUG_ENV) == "1"
    args = [a for a in args if a != "--debug"]
    if debug:
        os.environ[DEBUG_ENV] = "1"  # torchrun children inherit it
    if "--json" in args:
        output.reserve_stdout_for_json()
    try:
        _run(args, debug)
    finally:
        output.release_stdout()


def entry() -> None:
    """The `rhymectl` program (its console script and `python -m rhymectl`): `main`, then the
    process ends without the interpreter's teardown (pipeline.process_exit). A traceback
    under --debug propagates as usual."""
    try:
        main()
    except SystemExit as exc:
        exit_now(exit_code(exc.code))
    exit_now(0)


def _run(args: list[str], debug: bool) -> None:
    try:
        result = app(args=args, prog_name="rhymectl", standalone_mode=False)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except typer.Abort:
        _fail("aborted", 130)
    except click_exc.NoArgsIsHelpError:
        sys.exit(2)  # the help was shown; nothing was asked for
    except click_exc.ClickException as exc:
        if debug:
            raise
        command = "".join(f"{name} " for name in _command_path(args))
        _fail(f"{exc.format_message()} (see `rhymectl {command}--help`)", exc.exit_code)
    except UsageError as exc:
        if debug:
            raise
        _fail(str(exc), 2)
    except children.Stopped as exc:  # the child (torchrun, a training run) has ended too
        _fail(str(exc), exc.exit_code)
    except KeyboardInterrupt:
        _fail("interrupted", 130)
    except Exception as exc:  # noqa: BLE001 — the one place a crash becomes an exit code
        if debug:
            raise
        _fail(f"{type(exc).__name__}: {exc} (rerun with --debug for the traceback)",
              getattr(exc, "exit_code", 1))
    # With standalone_mode=False typer hands back Exit codes (Ctrl-C becomes 130) as values.
    code = getattr(result, "exit_code", result if isinstance(result, int) else 0)
    if code == 130:
        _fail("interrupted", 130)
    sys.exit(code)


def _command_path(args: list[str]) -> list[str]:
    """The command (and subcommand: `bench sched`) that `args` start with."""
    path, group = [], app
    for arg in args:
        commands = {c.name for c in group.registered_commands}
        groups = {g.name: g.typer_instance for g in group.registered_groups}
        if arg in groups:
            path.append(arg)
            group = groups[arg]
        elif arg in commands:
            return path + [arg]
        else:
            break
    return path


def _fail(message: str, code: int) -> None:
    sys.stderr.write(f"error: {message}\n")
    sys.stderr.flush()
    sys.exit(code)
