"""A fake ``tensorrt`` package for tests, in a TensorRT 10 or TensorRT 11 flavour.

``make_module("11.4.0.106")`` returns a fresh module object to put in ``sys.modules``. Its
enums are generated from the API lists in ``api/`` (so a member that the flavour lacks,
e.g. ``BuilderFlag.INT8`` in 11, does not exist), its classes expose only names from the
list (checked by ``test_fake_tensorrt.py``), it checks argument types and call order the
way TensorRT does, records every call in ``module._calls``, and really runs the network
(through ONNX Runtime) on the fake device memory of ``tests/engines/fake_cuda``.
"""

from .core import API_FILES, api_names, make_module

__all__ = ["API_FILES", "api_names", "make_module"]
