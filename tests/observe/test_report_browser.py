"""``exarch-actors report``: the HTML report of a scripted 100-agent run, loaded in a real
headless Chromium (Debian's ``chromium``): it runs its script with no console error, works with
no network, and shows every agent."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

import exarch_actors
from tests.observe.conftest import FANOUT, exarch

CHROMIUM = "/usr/bin/chromium"

pytestmark = pytest.mark.skipif(
    shutil.which(CHROMIUM) is None,
    reason=f"no headless browser at {CHROMIUM} (Debian's chromium; .ci/run installs it)",
)

TEAMS = """
[fleet]
prompt = "go"

[[agents.trunk]]
ral = ['for i in (range 9) { agent "lead-$i" "Lead a team of ten." }']

[[agents.trunk]]
ral = ["let ends = agent-wait; reply (len (keys $ends))"]

[[agents.trunk]]
ral = ["reply 9"]

[[agents."lead-*"]]
ral = ['let parts = split (env EXARCH_SCRATCH) "/"; let bits = split $parts[-1] "-"; \
let n = $bits[1]; for i in (range 10) { agent "w-${n}-$i" "Work." }']

[[agents."lead-*"]]
ral = ["let ends = agent-wait; reply (len (keys $ends))"]

[[agents."w-*"]]
ral = ['let parts = split (env EXARCH_SCRATCH) "/"; let bits = split $parts[-1] "-"; \
if (eq $bits[2] "7") { read-text no-such-file.txt } else { 1 }', "reply 1"]
"""
"""The trunk, 9 leads and 90 workers: 100 agents; each worker ``w-N-7`` meets one ral error."""

AGENTS = ["trunk", *(f"lead-{i}" for i in range(9))] + [
    f"w-{i}-{j}" for i in range(9) for j in range(10)
]


def load(page: Path, profile: Path, fragment: str = "") -> tuple[str, str]:
    """The DOM of ``page`` after its scripts ran, and Chromium's log (console messages)."""
    done = subprocess.run(
        [
            CHROMIUM,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            f"--user-data-dir={profile}",
            "--enable-logging=stderr",
            "--v=0",
            "--dump-dom",
            page.as_uri() + fragment,
        ],
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout, done.stderr


def hidden_agents(dom: str) -> set[str]:
    return set(re.findall(r'<li class="agent hidden" data-agent="([^"]+)"', dom))


@pytest.mark.timeout(240)
def test_the_report_of_a_100_agent_run_loads_clean_in_chromium_and_shows_every_agent(
    tmp_path: Path,
) -> None:
    scenario = tmp_path / "teams.toml"
    scenario.write_text(TEAMS)
    session = tmp_path / "s"
    result = exarch_actors.run(str(scenario), session_dir=session, agents="thread")
    assert result.reply == "9"
    page = tmp_path / "report.html"
    done = exarch("report", str(session), "-o", str(page))
    assert done.returncode == 0, done.stderr
    source = page.read_text()
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", source), "a request at view time"
    dom, log = load(page, tmp_path / "profile")
    assert 'data-ready="1"' in dom, "the page's script did not finish"
    errors = re.search(r'<pre id="script-errors">(.*?)</pre>', dom, re.S)
    assert errors is not None and errors.group(1) == ""
    assert "CONSOLE" not in log, [line for line in log.splitlines() if "CONSOLE" in line]
    shown = re.findall(r'<li class="agent" data-agent="([^"]+)"', dom)
    assert sorted(shown) == sorted(AGENTS)
    assert "100 agents" in dom
    assert re.search(r'id="fact-errors">9<', dom)  # the nine workers' read-text errors
    assert "all invariants held" in dom
    listed = re.search(r'<section id="errors">(.*?)</section>', dom, re.S)
    assert listed is not None
    assert all(f"w-{j}-7" in listed.group(1) for j in range(9))


def test_a_report_link_with_a_search_opens_with_only_the_matches_and_their_ancestors(
    tmp_path: Path,
) -> None:
    session = tmp_path / "s"
    exarch_actors.run(str(FANOUT), session_dir=session, agents="thread")
    page = tmp_path / "report.html"
    exarch_actors.report(session, page)
    dom, _ = load(page, tmp_path / "profile", "#q=hi")
    assert hidden_agents(dom) == {"lo"}  # trunk stays: it holds the match
    assert "1 agents match" in dom
