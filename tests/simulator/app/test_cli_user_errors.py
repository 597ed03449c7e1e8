"""The CLI's list of user errors (one line, exit 2) names each class by the module that
defines it: the CLI looks them up among the modules loaded (it imports none to start a run),
so a class that moved would silently stop being caught."""

import importlib

from kvsim.simulator.app.cli import USER_ERRORS, UsageError, _user_errors


def test_every_user_error_is_named_by_its_defining_module():
    for module, name in USER_ERRORS:
        cls = getattr(importlib.import_module(module), name)
        assert issubclass(cls, Exception) and cls.__module__ == module, (module, name)
    assert len(_user_errors()) == len(USER_ERRORS) + 1 and UsageError in _user_errors()
