"""The Lua scripts ship in the wheel and load from the installed package."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from importlib import resources
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = {
    "_value.lua",
    "_claim.lua",
    "_settle.lua",
    "dedupe_keep.lua",
    "forget_claim.lua",
    "acquire.lua",
    "release.lua",
    "extend.lua",
    "inspect.lua",
    "abandon.lua",
    "force_release.lua",
    "inbox_accept.lua",
    "_inbox_step.lua",
    "_inbox_take.lua",
    "inbox_requeue.lua",
    "inbox_ready.lua",
    "_hold.lua",
    "_listed.lua",
    "_handout.lua",
    "inbox_adopt.lua",
    "inbox_unlist.lua",
    "inbox_forget_slot.lua",
    "inbox_directory.lua",
    "_fair_open.lua",
    "fair_acquire.lua",
    "fair_leave.lua",
    "_semaphore.lua",
    "semaphore_acquire.lua",
    "semaphore_release.lua",
    "semaphore_abandon.lua",
    "semaphore_extend.lua",
    "semaphore_inspect.lua",
    "supersede.lua",
    "supersede_carry.lua",
    "supersede_collect.lua",
}


def test_every_script_loads_from_the_package() -> None:
    folder = resources.files("asynclock.state.redis")
    for name in SCRIPTS:
        text = folder.joinpath(name).read_text(encoding="utf-8")
        assert text.startswith("--"), f"{name} must open with its contract comment"


def test_every_script_the_state_runs_exists() -> None:
    from asynclock.state.redis import _scripts

    loaded = _scripts()
    folder = resources.files("asynclock.state.redis")
    for script in loaded.values():
        assert len(script.sha) == 40
        # every script is the prelude plus files of this folder, all of which ship
        assert script.text.startswith(folder.joinpath("_value.lua").read_text(encoding="utf-8"))
    shipped = {p.name for p in folder.iterdir() if p.name.endswith(".lua")}
    assert shipped == SCRIPTS


@pytest.mark.slow
def test_the_wheel_contains_the_scripts_and_py_typed(tmp_path: Path) -> None:
    built = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--quiet",
            "-w",
            str(tmp_path),
            str(ROOT),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert built.returncode == 0, built.stderr
    (wheel,) = tmp_path.glob("asynclock-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for name in SCRIPTS:
        assert f"asynclock/state/redis/{name}" in names
    assert "asynclock/py.typed" in names
    for name in ("dashboard.js", "dashboard.css"):  # the dashboard's page (asynclock.web)
        assert f"asynclock/web/static/{name}" in names
