"""Helpers of the worker engines (upstream path): `losses` holds the loss functions."""
