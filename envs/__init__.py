"""Cluster environments: trace loaders and the simulated cluster backend.

Nothing here imports the daemon or the API; importing this package stays light (no
gymnasium, Ray or torch at import time).
"""
