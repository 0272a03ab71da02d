"""CNN image classifiers (torchvision, timm, ``file.py:factory``): the fallback family.

Its package holds what image classifiers need beyond the stages: model building
(``model_source``, ``models``), image data (``data``, ``data_sources``) and the classifier
halves of the stages (``fp32``, ``ptq``, ``qat``, ``export``, ``compare_data``,
``sensitivity``).
"""

from trtqat.families.cnn.family import CNNFamily, fit_checkpoint_state

__all__ = ["CNNFamily", "fit_checkpoint_state"]
