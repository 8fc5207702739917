"""What every model family's export shares: the ONNX tracing and graph names, recurrent layers, the training
clock and checkpoint format, model card pieces, vocabulary conventions, quantized variants, checkpoint
averaging, n-gram LMs, the server's small graphs and GPU-run packing. It imports no family."""
