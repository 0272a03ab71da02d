"""``import trtqat.engines`` (and the engine CLI) loads neither torch nor the quantization
core; ``import trtqat`` still offers every top-level name, loading torch on first use."""

from __future__ import annotations

import subprocess
import sys


def _assert_prints_ok(code: str) -> None:
    proc = subprocess.run([sys.executable, "-c", code + "print('ok')\n"], capture_output=True,
                          text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "ok"


def test_import_engines_does_not_import_torch() -> None:
    code = (
        "import sys\n"
        "import trtqat.engines, trtqat.engines.ort, trtqat.engines.ort_qdq\n"
        "import trtqat.engines.trt, trtqat.engines.trtexec_io, trtqat.engines.timing\n"
        "import trtqat.cli.exec_cmd, trtqat.cli.cmd_build\n"
        "from trtqat.engines.registry import backend_info\n"
        "backend_info('ort')\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] == 'torch'\n"
        "             or m.startswith(('trtqat.quant', 'trtqat.export', 'trtqat.stages')))\n"
        "assert not bad, bad[:5]\n"
    )
    _assert_prints_ok(code)


def test_top_level_names_load_on_first_use() -> None:
    code = (
        "import sys, trtqat\n"
        "assert 'torch' not in sys.modules\n"
        "names = [n for n in trtqat.__all__ if n != '__version__']\n"
        "assert all(callable(getattr(trtqat, n)) for n in names), names\n"
        "from trtqat import quantize, initialize, QuantDescriptor\n"
        "assert 'torch' in sys.modules and trtqat.quant.quantize is quantize\n"
        "assert set(trtqat.__all__) <= set(dir(trtqat))\n"
        "try:\n"
        "    trtqat.no_such_name\n"
        "except AttributeError as exc:\n"
        "    assert 'no_such_name' in str(exc)\n"
        "else:\n"
        "    raise SystemExit('no AttributeError')\n"
    )
    _assert_prints_ok(code)
