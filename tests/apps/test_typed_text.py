"""Text typed on a command line or piped in that is not UTF-8 (Python reads it with
surrogateescape: byte 0xff comes as U+DCFF), and stop= values that are no strings: one line each,
exit 2, before any output, for sample, plot and chat.
Run: pytest tests/apps/test_typed_text.py"""

from __future__ import annotations

import os
import subprocess
import sys
from types import SimpleNamespace

from helpers import REPO, assert_one_line_error, run_script

BAD = "RO\udcffMEO"  # an argument holding byte 0xff, as os.fsencode passes it on


def _piped(command: str, args: list[str], cwd, root, stdin: bytes):
    env = {**os.environ, "TINYGPT_DATA_DIR": str(root), "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-m", "gpt", command, *args], cwd=cwd, env=env, input=stdin, capture_output=True)
    return SimpleNamespace(
        returncode=proc.returncode, stdout=proc.stdout.decode(errors="replace"), stderr=proc.stderr.decode(errors="replace")
    )


def test_text_that_is_not_utf8_is_one_line_naming_the_byte(trained_run, data_root):
    cwd, run_dir, _ = trained_run
    root, _ = data_root
    proc = run_script("sample", [f"run_dir={run_dir}", f"prompt={BAD}", "max_new_tokens=3"], cwd, root)
    assert_one_line_error(proc, "prompt is not UTF-8 text (byte 0xff at character 2)")
    assert proc.stdout == ""  # not the sample's header first
    proc = _piped("sample", [f"run_dir={run_dir}", "prompt=-", "max_new_tokens=3"], cwd, root, b"ROMEO\xff:\n")
    assert_one_line_error(proc, "the prompt read from stdin (prompt=-) is not UTF-8 text (byte 0xff at character 5)")
    proc = run_script("sample", [f"run_dir={run_dir}", "prompt=ROMEO", "stop=a\udcff"], cwd, root)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    proc = run_script("plot", [f"run_dir={run_dir}", f"attention={BAD}"], cwd, root)
    assert_one_line_error(proc, "attention= is not UTF-8 text (byte 0xff at character 2)")
    assert not (run_dir / "attention.png").exists()


def test_a_chat_system_message_that_is_not_utf8_is_one_line_before_the_model_loads(trained_run, data_root):
    """(A piped message that is not UTF-8: tests/chat/test_commands.py, with a chat model.)"""
    cwd, run_dir, _ = trained_run
    root, _ = data_root
    proc = _piped("chat", [f"run_dir={run_dir}", f"system={BAD}"], cwd, root, b"hi\n")
    assert_one_line_error(proc, "system is not UTF-8 text (byte 0xff at character 2)")


def test_stop_takes_strings_only(trained_run, data_root):
    cwd, run_dir, _ = trained_run
    root, _ = data_root
    for value, shown in (("5", "5"), ("true", "True"), ("{a: 1}", "{'a': 1}"), ("[END,5]", "5"), ("[[a]]", "['a']")):
        proc = run_script("sample", [f"run_dir={run_dir}", "prompt=ROMEO", f"stop={value}"], cwd, root)
        assert_one_line_error(proc, f"stop takes strings, got {shown}; quote it")
    proc = run_script("sample", [f"run_dir={run_dir}", "prompt=ROMEO", 'stop="5"', "max_new_tokens=5"], cwd, root)
    assert proc.returncode == 0, proc.stderr
