"""tools/exhaustive_compare.py on a few inputs, with this checkout's HEAD as the oracle (in
CI the tree itself; uncommitted changes to portable/ would show here): the finished
functions agree with it, and without its table erf differs exactly at the key of
the range, which comes out as a MISROUNDED line that make_hardcases.py reads."""

import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
TOOL = ROOT / "tests" / "numerics" / "tools" / "exhaustive_compare.py"
sys.path.insert(0, str(TOOL.parent))


def _run(tmp_path, *args):
    if subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True).returncode:
        pytest.skip("not a git checkout")
    done = subprocess.run([sys.executable, str(TOOL), "--oracle", "HEAD", "--jobs", "1",
                           "--out", str(tmp_path), *args], capture_output=True, text=True,
                          env={"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin"}, check=True)
    return done.stdout


def test_the_finished_functions_agree_with_the_oracle(tmp_path):
    out = _run(tmp_path, "--first", "0x40084000", "--last", "0x40086000", "erf", "exp")
    assert "erf: 8192 inputs compared with HEAD, 0 mismatches" in out
    assert "exp: 8192 inputs compared with HEAD, 0 mismatches" in out


def test_without_the_table_the_key_is_listed(tmp_path):
    import make_hardcases

    out = _run(tmp_path, "--first", "0x40084000", "--last", "0x40086000", "--no-table", "erf")
    assert "erf: 8192 inputs compared with HEAD (no hard-case table), 1 mismatches" in out
    line = (tmp_path / "erf.txt").read_text()
    match = make_hardcases.LINE.match(line)
    assert match and match.group(1, 2, 3) == ("MISROUNDED", "erf", "0x400845b0"), line
    assert float(re.search(r"d=2\^(\S+)", line).group(1)) < -13
