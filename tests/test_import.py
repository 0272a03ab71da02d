"""`import trtqat` works without TensorRT/CUDA and never initialises CUDA."""

import subprocess
import sys


def test_import_does_not_pull_tensorrt_or_cuda():
    code = (
        "import sys, torch\n"
        "before = set(sys.modules)\n"
        "import trtqat, trtqat.nn, trtqat.calib, trtqat.quant_modules, trtqat.tensor_quant\n"
        "import trtqat.cli\n"
        "new = set(sys.modules) - before\n"
        "bad = [m for m in new if m.split('.')[0] in ('tensorrt', 'pycuda', 'cuda')]\n"
        "assert not bad, bad\n"
        "assert not torch.cuda.is_initialized()\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


def test_engines_is_an_attribute_after_import_trtqat():
    """README spells `trtqat.engines.load_engine(...)` after a bare `import trtqat`."""
    code = ("import sys, trtqat; f = trtqat.engines.load_engine; "
            "assert 'torch' not in sys.modules, 'trtqat.engines loaded torch'")
    subprocess.run([sys.executable, "-c", code], check=True)
