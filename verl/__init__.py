"""verl: a HybridFlow-style single-controller RL trainer for language models.

`from verl import DataProto` works as in upstream verl once the data layer is importable.
"""

__version__ = "0.1.0"


def __getattr__(name):
    # Lazy so that `import verl` stays cheap (no torch / tensordict import until needed).
    if name in ("DataProto", "DataProtoItem", "DataProtoFuture"):
        from verl import protocol

        return getattr(protocol, name)
    raise AttributeError(f"module 'verl' has no attribute {name!r}")
