"""tiermem: a gRPC memory server for AI agents.

Sub-packages: ``tiermem.v1`` (generated Protobuf/gRPC stubs), ``tiermem.server``,
``tiermem.client`` and ``tiermem.kernels``.
"""

__version__ = "0.1.0"
