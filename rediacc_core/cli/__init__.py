"""The `rdc` command line."""

from __future__ import annotations

import click


@click.group()
def cli() -> None:
    """rdc: hand GPUs to isolated Docker workloads through CDI grants."""


def main() -> None:
    cli()
