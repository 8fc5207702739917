"""What every model family's export shares: quantized variants, checkpoint averaging, the server's graphs, n-gram LMs, GPU packing."""
