"""The models of ``trtqat demo`` without ``--model`` (torch-free: the command's help reads it).

ResNet18 only: MobileNetV2 was measured as a second model (README, "MobileNetV2 as a second
demo model") and shows no PTQ loss on digits, so ``--model resnet18,mobilenet_v2`` puts it
in the report on request.
"""

DEMO_MODELS: tuple[str, ...] = ("resnet18",)

from trtqat.stages.compare import DEMO_RUNS  # noqa: F401,E402  (the demo's run folders)
