"""Any cloud Apache Libcloud drives: the provider and its error sorting."""
