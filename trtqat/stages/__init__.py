"""The pipeline's stages, one verb each, family-agnostic, with their configs.

train -> calibrate -> qat -> export -> (build, benchmark) -> compare, plus sensitivity and
demo. Each stage finds the model's family once (:mod:`trtqat.families`) and calls its hooks;
the command line (:mod:`trtqat.cli`) and the Python API (:mod:`trtqat.api`) call these verbs.
"""
