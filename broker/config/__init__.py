"""The configuration: its file, checked when it loads (core), and its providers:, energy: and
carbon: sections."""
