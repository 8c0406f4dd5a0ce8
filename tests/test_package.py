"""The package as users get it: a wheel that holds the code, every config and py.typed, installed
in a fresh virtual environment, whose `tinygpt` command trains, samples and evaluates from an
empty directory, with no checkout on the path. Run: pytest -m slow tests/test_package.py"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from helpers import REPO


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """A wheel built from a clean copy of the sources: a checkout's own build leftovers (an
    egg-info's file list) must not smuggle in files the packaging settings would miss."""
    source, out = tmp_path_factory.mktemp("source") / "tinygpt", tmp_path_factory.mktemp("dist")
    junk = shutil.ignore_patterns("*.egg-info", "build", "dist", "outputs", ".git", "__pycache__", ".pytest_cache", "*venv")
    shutil.copytree(REPO, source, ignore=junk)
    subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--outdir", str(out), str(source)],
        check=True,
        capture_output=True,
        text=True,
        timeout=600,
    )
    (found,) = out.glob("tinygpt-*.whl")
    return found


@pytest.mark.slow
def test_the_wheel_holds_every_config(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    configs = {f"gpt/configs/{p.relative_to(REPO / 'configs')}" for p in (REPO / "configs").rglob("*.yaml")}
    assert configs and configs <= names, sorted(configs - names)
    assert {"gpt/py.typed", "gpt/apps/main.py", "gpt/training/loop.py"} <= names
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    assert "tinygpt = gpt.apps.main:main" in zipfile.ZipFile(wheel).read(entry_points).decode()


@pytest.mark.slow
def test_installed_wheel_trains_samples_and_evaluates_outside_the_checkout(wheel, tmp_path, data_root):
    root, data_overrides = data_root
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    bin_dir = venv / ("Scripts" if os.name == "nt" else "bin")
    # The dependencies (torch & co.) come from this environment through a path entry, so the test
    # needs no network; tinygpt itself only from the wheel (this environment's editable install
    # is a .pth hook, which a plain path entry does not run).
    site = Path(
        subprocess.run(
            [bin_dir / "python", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
    )
    (site / "borrowed_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run([bin_dir / "python", "-m", "pip", "install", "--quiet", "--no-deps", str(wheel)], check=True)
    work = tmp_path / "empty"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(TINYGPT_DATA_DIR=str(root), PATH=f"{bin_dir}{os.pathsep}{env['PATH']}")

    def tinygpt(*args: str) -> subprocess.CompletedProcess:
        proc = subprocess.run([bin_dir / "tinygpt", *args], cwd=work, env=env, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        return proc

    where = subprocess.run(
        [bin_dir / "python", "-c", "import gpt; print(gpt.__file__)"],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert where.startswith(str(venv)) and not where.startswith(str(REPO))
    trained = tinygpt(
        "train", "model=gpt-nano", "train.max_iters=20", "train.eval_interval=10", "train.eval_iters=2", *data_overrides
    )
    assert "best val loss" in trained.stdout and "sample with: tinygpt sample run_dir=" in trained.stdout
    sampled = tinygpt("sample", "prompt=KING:", "num_samples=1", "max_new_tokens=20")
    assert sampled.stdout.count("KING:") == 1
    evaluated = tinygpt("eval")
    assert "shakespeare_bytes val" in evaluated.stdout and "bits per byte" in evaluated.stdout
    assert sorted(p.name for p in work.iterdir()) == ["outputs"]
