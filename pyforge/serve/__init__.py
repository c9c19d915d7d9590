"""Serving: a compiled model (or an ONNX Runtime session, for A/B) behind Ray Serve."""
