"""The ``exarch-actors`` command (click); what every subcommand shares lives here."""

from __future__ import annotations

from typing import Any

import click

HELP_SETTINGS: dict[str, Any] = {"help_option_names": ["-h", "--help"]}
"""Every command's own ``-h``: a subcommand that only inherited it from the group's context
had click cache its help option from whichever context built it first, so a command invoked
on its own (``CliRunner().invoke(check_command, ...)``) lost ``-h`` under the group too."""


class Refused(click.ClickException):
    """A typed refusal, printed as ``Error: ...`` with exit 2 and no usage text (the command
    line was fine; the state it names refused it: a live session, a finished run)."""

    exit_code = 2
