"""What every training run shares, below the model families: the run folder and its lock,
checkpoints, the training loop and its health checks, speed options and torch.distributed.

Stages (:mod:`trtqat.stages`) and families (:mod:`trtqat.families`) build on these; nothing
here knows a model family.
"""
