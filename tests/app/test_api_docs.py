"""The Python examples of docs/api.md run as written (the page's blocks in order, as one script, in a fresh process
and an empty folder): the public API, an Opacus-trained model scored by dpeval (its ε from Opacus' accountant and
dpeval's ledger agree), a user's training function used for the shadows, and a notebook-style release function
attacked. The README's example is api.md's first one, word for word, so it runs there too."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def python_blocks(page: Path) -> str:
    return "\n\n".join(re.findall(r"```python\n(.*?)```", page.read_text(), flags=re.S))


def test_the_readmes_python_is_part_of_the_api_pages():
    readme = python_blocks(ROOT / "README.md")
    assert "import dpeval" in readme and readme.strip() in python_blocks(ROOT / "docs/api.md")


@pytest.mark.slow
def test_the_api_pages_python_runs_as_written(tmp_path):
    code = python_blocks(ROOT / "docs/api.md")
    assert "import dpeval" in code
    script = tmp_path / "example.py"
    script.write_text(code)
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, cwd=tmp_path,
                          env={**os.environ, "OMP_NUM_THREADS": "1",  # `dpeval` beside this Python, as installed
                               "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"},
                          timeout=1500)
    assert proc.returncode == 0, proc.stderr[-3000:]
