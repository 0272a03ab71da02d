"""``import trtqat.families.encoder`` does not import the transformers library."""

from __future__ import annotations

import subprocess
import sys


def test_import_is_lazy():
    code = ("import sys, trtqat, trtqat.families.encoder\n"
            "assert 'transformers' not in sys.modules, 'transformers imported eagerly'\n"
            "print('ok')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"
