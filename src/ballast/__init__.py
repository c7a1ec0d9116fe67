"""Ballast: a self-balancing messaging cluster and load-placement toolkit."""

__version__ = "0.1.0"
