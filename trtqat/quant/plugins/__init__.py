"""Quantization of third-party modules (Hugging Face BERT-family attention, torchvision
attention), plugged into the core: what ``trtqat.quant`` does for layers, these do for
attention's matrix products."""
