"""Amazon EC2: the provider, its error sorting and its settings."""
