"""A child agent's kernel-enforced access never exceeds its parent's: for random grant pairs,
the rules built from the parent's grants and from the child's (its parent's met with its own
table, as the fleet decides them) are entered by real confined processes, which probe reading
and creating a file in every directory of a small tree. The kernel answers, not ral."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exarch_actors.actors.landlock import abi
from exarch_actors.runtime.ral.grants import GrantPolicy, Grants
from exarch_actors.runtime.shell.confinement import Sandbox, SandboxMode, python_paths, ruleset

DIRS = ("a", "a/x", "b", "c")

PROBE = """
import json, os, sys
from exarch_actors.actors.landlock import enter
from exarch_actors.runtime.shell.confinement import Ruleset
r = json.loads(sys.argv[1])
enter(Ruleset(tuple(r["read"]), tuple(r["write"]), tuple(r["devices"]), r["network"]))
seen = {}
for d in sys.argv[2:]:
    try:
        open(os.path.join(d, "f")).read()
        seen[d + ":read"] = True
    except OSError:
        seen[d + ":read"] = False
    try:
        with open(os.path.join(d, "new-" + str(os.getpid())), "w"):
            pass
        seen[d + ":write"] = True
    except OSError:
        seen[d + ":write"] = False
print(json.dumps(seen))
"""

roots = st.none() | st.lists(st.sampled_from(DIRS), min_size=1, max_size=3, unique=True)


def _access(base: Path, grants: Grants, mode: SandboxMode) -> set[str]:
    sandbox = Sandbox(mode, (str(base),), False, None)
    rules = ruleset(sandbox, grants, python=python_paths())
    assert rules is not None
    p = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(rules.to_dict()), *(str(base / d) for d in DIRS)],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    return {k for k, ok in json.loads(p.stdout).items() if ok}


def _grants(base: Path, dirs: list[str] | None) -> Grants:
    return Grants(roots=None if dirs is None else tuple(str(base / x) for x in dirs))


@pytest.mark.skipif(abi() < 1, reason="needs Landlock")
@settings(max_examples=8)
@given(
    parent=roots,
    table=roots,
    mode=st.sampled_from([SandboxMode.WORKSPACE_WRITE, SandboxMode.READ_ONLY]),
)
def test_a_childs_kernel_access_never_exceeds_its_parents(
    parent: list[str] | None, table: list[str] | None, mode: SandboxMode
) -> None:
    with tempfile.TemporaryDirectory() as d:
        base = Path(d)
        for sub in DIRS:
            (base / sub).mkdir(parents=True, exist_ok=True)
            (base / sub / "f").write_text("x")
        policy = GrantPolicy(_grants(base, parent), (("child", _grants(base, table)),))
        parent_grants = policy.for_agent("trunk")
        child_grants = policy.for_agent("child", parent_grants)
        mine = _access(base, parent_grants, mode)
        theirs = _access(base, child_grants, mode)
        assert theirs <= mine
        if parent is not None:  # and the parent reaches exactly its own roots' files
            assert {k for k in mine if k.endswith(":read")} == {
                f"{base / x}:read"
                for x in DIRS
                if any(x == r or x.startswith(r + "/") for r in parent)
            }
