"""pytorch-quantization's ``nn.modules`` package: one module per layer family."""
