"""Object detectors (the built-in ``yolo_digits``, ``detect:FILE.py:FACTORY``, Ultralytics
YOLO): COCO mAP, detection data (digits canvases, COCO and YOLO folders), the final
prediction convs kept in float, exports with raw head outputs or NMS.

Its package holds model building (``sources``, ``yolo``, ``ultralytics``), data (``data``,
``digits``), the loss and metric (``loss``, ``metrics``) and the detector halves of the
stages (``runs``, ``loop``, ``export``, ``nms``, ``compare_data``).
"""

from trtqat.families.detect.family import DetectFamily

__all__ = ["DetectFamily"]
