"""``--record FILE.toml`` for ``run``, ``fleet`` and ``chat``: write every agent's model replies
as a scenario while the run goes on (the format and its writer: ``runtime/replay/recording.py``).

The recording is written twice, block by block: to ``FILE.toml`` and to the session directory's
``recording.toml`` (so ``exarch-actors replay SESSION_DIR`` needs nothing else). A path that
cannot be written is refused before the session directory is made, and so is a file another
live run is recording into (each recorder holds an ``flock`` on its files while it writes: two
runs once interleaved their blocks into one file that still parsed and replayed as neither).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

import click

from exarch_actors.cli import Refused
from exarch_actors.runtime.constants import TRUNK_NAME
from exarch_actors.runtime.providers.base import Provider
from exarch_actors.runtime.providers.scenario import Scenario
from exarch_actors.runtime.replay.provider import recorded
from exarch_actors.runtime.replay.recording import (
    Recorder,
    RecordingBusy,
    RecordingHeader,
    recording_busy,
)
from exarch_actors.runtime.state.durable import now_iso
from exarch_actors.runtime.state.session_dir import SessionDir

F = TypeVar("F", bound=Callable[..., Any])


class RecordedRun(Protocol):
    """What a recording needs to know of the run it records (``cli.runner.RunSpec`` has it)."""

    @property
    def record(self) -> str | None: ...
    @property
    def grant_exec(self) -> tuple[str, ...]: ...
    @property
    def grant_root(self) -> tuple[str, ...]: ...
    @property
    def scenario(self) -> Scenario | None: ...
    @property
    def chat(self) -> bool: ...


def _writable(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    if value is None:
        return None
    path = Path(value)
    if path.is_dir():
        raise click.BadParameter(f"{value} is a directory; give a FILE.toml", ctx, param)
    if not path.resolve().parent.is_dir():
        raise click.BadParameter(f"{path.parent} is not a directory", ctx, param)
    if recording_busy(path):  # refused before a session is made; the recorder's lock decides
        raise Refused(str(RecordingBusy(path)))
    return value


def record_option(f: F) -> F:
    """Add ``--record FILE.toml`` to a running command."""
    return click.option(
        "--record",
        metavar="FILE.toml",
        callback=_writable,
        help="Record every agent's model replies to FILE.toml (and to the session's "
        "recording.toml) as they arrive: replay it offline with `run FILE.toml`, compare with "
        "`replay SESSION_DIR`. A FILE another live run is recording into is refused (exit 2).",
    )(f)


@dataclass
class RunRecording:
    """A run being recorded: the provider factory to build the fleet with, and the writer."""

    factory: Callable[[str], Provider]
    recorder: Recorder

    def close(self) -> None:
        self.recorder.close()
        if self.recorder.error is not None:
            click.echo(f"warning: --record: {self.recorder.error}", err=True)


def open_recording(
    spec: RecordedRun,
    session: SessionDir,
    factory: Callable[[str], Provider],
    *,
    prompt: str | None,
    system: str | None,
    interactive: bool = False,
) -> RunRecording | None:
    """Start recording ``spec``'s run when ``--record`` was given (else None)."""
    if spec.record is None:
        return None
    probe = factory(TRUNK_NAME)  # provider, model and window as the trunk will have them
    flags = [f"--grant-exec {g}" for g in spec.grant_exec]
    flags += [f"--grant-root {g}" for g in spec.grant_root]
    scenario = spec.scenario
    header = RecordingHeader(
        provider=probe.name,
        model=probe.model,
        started=now_iso(),
        prompt=prompt,
        system=system,
        window_tokens=probe.window_tokens,
        chat=spec.chat,
        interactive=interactive,
        source=str(Path(scenario.source).resolve()) if scenario is not None else None,
        grant_flags=tuple(flags),
        grants=tuple((t.pattern, {"exec": t.exec, "roots": t.roots}) for t in scenario.grants)
        if scenario is not None
        else (),
    )
    try:
        recorder = Recorder([Path(spec.record), session.recording], header)
    except RecordingBusy as e:
        raise Refused(str(e)) from None
    except OSError as e:
        raise click.UsageError(f"--record {spec.record}: {e.strerror or e}") from None
    return RunRecording(recorded(factory, recorder), recorder)
