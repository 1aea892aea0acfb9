import importlib


def test_package_imports_and_has_version():
    verl = importlib.import_module("verl")
    assert verl.__version__.count(".") == 2
