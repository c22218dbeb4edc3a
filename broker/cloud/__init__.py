"""Rented machines: the provisioner, its provision queue, the machines' lifecycle and the spot
signals."""
