"""Image readers never go through Ultralytics' process-wide patch of PIL.Image.open, which
answers an unreadable file by trying to install a HEIF plugin (pip, or offline warnings)."""

import sys
import types

import pytest
from PIL import Image

from trtqat.families.images import open_image


def test_images_open_with_pils_own_function_after_ultralytics_patched_it(tmp_path, monkeypatch):
    calls = []

    def patched(*args, **kwargs):  # what ultralytics.utils.patches.image_open does first
        calls.append(args)
        raise AssertionError("the patched opener ran")

    pil_open = Image.open  # PIL's own, unless this process imported ultralytics already
    real = sys.modules.get("ultralytics.utils.patches")
    if real is not None and pil_open is getattr(real, "image_open", None):
        pil_open = real._image_open
    fake = types.ModuleType("ultralytics.utils.patches")
    fake.image_open, fake._image_open = patched, pil_open
    monkeypatch.setitem(sys.modules, "ultralytics.utils.patches", fake)
    monkeypatch.setattr(Image, "open", patched)
    (tmp_path / "bad.png").write_bytes(b"not an image")
    Image.new("RGB", (4, 3)).save(tmp_path / "ok.png")
    with pytest.raises(Image.UnidentifiedImageError):
        open_image(tmp_path / "bad.png")
    with open_image(tmp_path / "ok.png") as im:
        assert im.size == (4, 3)
    assert calls == []
