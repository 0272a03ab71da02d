"""Training side: data, models, checkpoints and the FP32 / PTQ / QAT recipes."""
