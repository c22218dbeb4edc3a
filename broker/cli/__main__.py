"""``python -m broker.cli``: the same as the ``spillway`` console script."""

from broker.cli import main

main()
