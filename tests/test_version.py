"""test_version.py: the version is written once (src/quantmatmul/__init__.py) and the installed metadata reports it."""

import importlib.metadata
import re

import quantmatmul


def test_installed_metadata_version_is_the_package_version():
    assert importlib.metadata.version("quantmatmul") == quantmatmul.__version__


def test_version_is_a_release_number():
    assert re.fullmatch(r"\d+\.\d+\.\d+", quantmatmul.__version__)
