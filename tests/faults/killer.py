"""Run one trtqat command and SIGKILL it just before its Nth finished temporary file named
TARGET is renamed into place (the temporary file is complete, the final name untouched).

    python killer.py TARGET N trtqat ARGS...        (the tiny model stands in for every model)
    python killer.py TARGET N trtqat-exec ARGS...
    python killer.py TARGET N write_checked SRC.onnx OUT.onnx
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))


def _install_killer(target: str, nth: int) -> None:
    import trtqat.atomic as atomic
    import trtqat.engines.fileformat as fileformat
    import trtqat.export.result as export_result
    import trtqat.runs.checkpoint as checkpoint

    real = atomic.publish
    seen = {"n": 0}

    def publish(tmp, path):
        if Path(path).name == target:
            seen["n"] += 1
            if seen["n"] == nth:
                os.kill(os.getpid(), signal.SIGKILL)
        return real(tmp, path)

    for module in (atomic, export_result, checkpoint, fileformat):
        module.publish = publish


def main() -> int:
    target, nth, command, *argv = sys.argv[1:]
    _install_killer(target, int(nth))
    if command == "trtqat-exec":
        from trtqat.cli.exec_cmd import main as exec_main

        return exec_main(argv)
    if command == "write_checked":
        import onnx

        from trtqat.export.result import ExportResult, write_checked

        write_checked(onnx.load(argv[0]), ExportResult(Path(argv[1]), "fp32", 17, True))
        return 0
    from tiny import tiny_model

    from trtqat.cli import main as trtqat_main
    from trtqat.families.cnn import CNNFamily

    CNNFamily.build = lambda self, name, num_classes=None, **_: tiny_model(name, num_classes)
    return trtqat_main(argv)


if __name__ == "__main__":
    sys.exit(main())
