"""pytorch-quantization's ``optim`` package (see :mod:`trtqat.optim.helper`)."""
