"""Public names imported on first use (PEP 562), for packages whose imports must stay cheap."""

import importlib


def lazy_names(module: str, targets: dict[str, str], namespace: dict):
    """(__getattr__, __dir__) for `module`: name -> the module that defines it, cached in `namespace`."""

    def __getattr__(name: str):
        if name in targets:
            value = getattr(importlib.import_module(targets[name]), name)
            namespace[name] = value
            return value
        raise AttributeError(f"module {module!r} has no attribute {name!r}")

    def __dir__():
        return sorted(set(namespace) | set(namespace.get("__all__", ())))

    return __getattr__, __dir__
