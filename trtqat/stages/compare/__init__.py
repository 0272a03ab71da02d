"""Side-by-side comparison of FP32, FP16, PTQ and QAT engines: accuracy and speed."""
