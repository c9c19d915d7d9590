"""ONNX -> IR: loading, per-op import rules (``normalize/``), shape and dtype inference."""

from .importer import import_onnx, load_model

__all__ = ["import_onnx", "load_model"]
