"""Spillway broker: model, store, scheduling cycle, actuator, client and CLI."""

__version__ = "0.1.0"
