"""The configuration: its file, loaded and checked (core: ``load_config`` and every public
name; fields: the Config; check: its scalar keys; classes: priority classes and teams), and
its providers:, energy: and carbon: sections."""
