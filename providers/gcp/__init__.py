"""Google Compute Engine: the provider, its error sorting and its machine shapes."""
