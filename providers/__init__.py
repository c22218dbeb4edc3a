"""Providers: everything that talks to the outside world about capacity, prices and carbon.

The ``Provider`` interface and its errors (``base``), the ``aws``, ``gcp``, ``libcloud`` and
``local`` providers, the boot script of rented machines (``userdata``), the offer catalog
(``catalog/``) and the carbon-intensity sources (``carbon/``). Cloud SDKs are optional extras,
imported lazily; an on-prem cluster configures no provider.
"""
