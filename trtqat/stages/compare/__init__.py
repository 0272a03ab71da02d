"""Side-by-side comparison of FP32, FP16, PTQ and QAT engines: accuracy and speed."""

# where ``trtqat demo`` writes its run folders (one sub-folder per model) and where
# ``trtqat compare`` looks without --run (torch-free: the commands' help reads it)
DEMO_RUNS = "runs/demo"
