"""The browser demo: an HTTP gateway to the gRPC API and the page it serves (`attnserve web`)."""
