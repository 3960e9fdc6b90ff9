"""bench/server_ab.py: the other side's checkout, and its flags refused with a reason. The A/B
itself (two servers under load) is measured by hand, not here."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from bench.peers_arrivals import ROOT
from bench.server_ab import main, worktree


def test_the_other_side_is_the_revision_checked_out_apart(tmp_path: Path) -> None:
    head = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()
    with worktree("HEAD", tmp_path / "checkout") as other:
        assert (other / "layerbatch.py").is_file() and (other / "server" / "runtime.py").is_file()
        at = subprocess.run(
            ["git", "-C", str(other), "rev-parse", "HEAD"], capture_output=True, text=True
        )
        assert at.stdout.strip() == head


def test_a_revision_git_does_not_know_is_refused_with_gits_reason(tmp_path: Path) -> None:
    refused = pytest.raises(SystemExit, match=r"--against: git could not check out 'no-such-rev'")
    with refused, worktree("no-such-rev", tmp_path / "checkout"):
        pass
    assert not (tmp_path / "checkout" / "layerbatch.py").exists()


@pytest.mark.parametrize("flag", ["--rate", "--pairs", "--seconds", "--requests"])
def test_a_count_or_rate_that_is_not_positive_is_refused(
    flag: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "argv", ["server_ab.py", "--against", "HEAD", flag, "0"])
    with pytest.raises(SystemExit, match=f"{flag}: expected a positive number, got 0"):
        main()


@pytest.mark.parametrize("flag", ["--policy", "--against-policy"])
def test_a_policy_the_server_does_not_have_is_refused_with_the_choices(
    flag: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(sys, "argv", ["server_ab.py", "--against", "HEAD", flag, "fifo"])
    with pytest.raises(SystemExit):
        main()
    err = capsys.readouterr().err
    assert f"argument {flag}: invalid choice: 'fifo'" in err and "'dp-tardy'" in err
