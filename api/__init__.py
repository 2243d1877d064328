"""The planning service: an HTTP API over the planner, a plan store and a client for trainers.

Importing this package pulls in nothing heavy; ``api.client`` needs only httpx, everything else
needs the ``service`` extra.
"""
