"""setuptools entry point for tools that look for a setup.py (`python setup.py --version`, older
`pip install -e .`). It holds no metadata of its own: name, version, dependencies (requirements.txt)
and package data all come from pyproject.toml, the single source."""

from setuptools import setup

setup()
