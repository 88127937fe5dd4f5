"""The ``shmbus`` command line (typer): a thin layer over the library."""

from __future__ import annotations

from typing import Annotated

import typer

from shmbus.context import Context
from shmbus.driver import DriverAlreadyRunningError, run_driver

app = typer.Typer(help="shmbus: a shared-memory message bus (Aeron's design, in Python).",
                  no_args_is_help=True, add_completion=False)

@app.callback()
def _group() -> None:
    """shmbus: a shared-memory message bus (Aeron's design, in Python)."""


DirOption = Annotated[str | None, typer.Option("--dir", help="bus directory (default: "
                                                "$SHMBUS_DIR or /dev/shm/shmbus-$USER)")]


@app.command()
def driver(
    dir: DirOption = None,
    idle_timeout: Annotated[float | None, typer.Option(
        help="exit after this many seconds without a client (default: run until stopped)")] = None,
    term_length: Annotated[int | None, typer.Option(help="IPC term length in bytes")] = None,
) -> None:
    """Run a driver in the foreground; Ctrl-C stops it and removes its files."""
    settings: dict[str, object] = {"dir": dir, "ipc_term_length": term_length}
    if idle_timeout is not None:
        settings["driver_idle_timeout"] = idle_timeout
    context = Context.resolve(**settings)
    typer.echo(f"shmbus driver serving {context.dir} (Ctrl-C to stop)", err=True)
    try:
        run_driver(context, embedded=idle_timeout is not None)
    except (DriverAlreadyRunningError, PermissionError, OSError) as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(1) from None
    typer.echo("shmbus driver stopped", err=True)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
