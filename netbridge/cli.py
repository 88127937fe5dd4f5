"""The ``netbridge`` command: run a netbridge for a bus directory in the foreground."""

from __future__ import annotations

from typing import Annotated

import typer

from netbridge.loss_filter import LossSpec, LossSpecError
from shmbus.settings.context import Context
from shmbus.settings.errors import ShmbusError

app = typer.Typer(add_completion=False, help="Carry a bus's udp channels over the network.")


@app.command()
def main(
    dir: Annotated[str | None, typer.Option("--dir", help="bus directory")] = None,
    loss: Annotated[str, typer.Option(help="inject loss, for tests: drop=0.05,dup=0.01,"
                                           "reorder=0.05,delay=0.001,seed=1")] = "",
) -> None:
    """Run the netbridge of a bus (its driver must be running) until Ctrl-C."""
    from netbridge.bridge import run_bridge

    try:
        LossSpec.parse(loss)
        context = Context.resolve(dir=dir, netbridge_loss=loss or None)
        run_bridge(context)
    except (LossSpecError, ShmbusError) as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(1) from None


if __name__ == "__main__":
    app()
