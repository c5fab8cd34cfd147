"""Tooling for the downstream NVFP4-on-Marlin patch series for SGLang."""

__version__ = "0.1.0"
