"""A click group whose subcommands are imported only when used (click's documented LazyGroup pattern).

`tracekit diff --help` must not pay for `record`'s imports (torch), nor `show` for the diff engine's.
"""

from __future__ import annotations

import importlib

import click


class LazyGroup(click.Group):
    """click.Group taking lazy_subcommands={name: "module.path.attribute"}, imported on first use."""

    def __init__(self, *args, lazy_subcommands: dict[str, str] | None = None,
                 lazy_help: dict[str, str] | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.lazy_subcommands = dict(lazy_subcommands or {})
        # each command's first docstring line, so that the group's --help lists the commands without
        # importing them (their modules import the store, hence zarr and numpy); tests/cli check
        # these against the commands' own help
        self.lazy_help = dict(lazy_help or {})

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted([*super().list_commands(ctx), *self.lazy_subcommands])

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in self.lazy_subcommands:
            return self._load(cmd_name)
        return super().get_command(ctx, cmd_name)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """click's listing, short help taken from lazy_help instead of the loaded commands."""
        names = self.list_commands(ctx)
        if not names or any(n not in self.lazy_help for n in names):
            return super().format_commands(ctx, formatter)
        limit = formatter.width - 6 - max(map(len, names))
        rows = [(n, click.utils.make_default_short_help(self.lazy_help[n], limit)) for n in names]
        with formatter.section("Commands"):
            formatter.write_dl(rows)

    def _load(self, cmd_name: str) -> click.Command:
        module_name, attribute = self.lazy_subcommands[cmd_name].rsplit(".", 1)
        command = getattr(importlib.import_module(module_name), attribute)
        if not isinstance(command, click.Command):
            raise TypeError(f"lazy command {cmd_name!r}: {self.lazy_subcommands[cmd_name]} is not a click command")
        return command
