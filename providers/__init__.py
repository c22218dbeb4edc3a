"""Providers: everything that talks to the outside world about capacity, prices and carbon.

Empty until cloud bursting lands: the on-prem broker needs no provider. The ``Provider``
interface, the offer catalog and the ``aws``/``gcp``/``libcloud``/``local`` modules go here.
"""
