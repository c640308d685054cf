"""agiledart: a decentralized, peer-to-peer stream processing engine for the edge.

Kept import-light on purpose: ``import agiledart.overlay`` must not drag in the
runtime, so submodules are imported where they are used.
"""

from agiledart.errors import AgiledartError

__version__ = "0.1.0"
__all__ = ["AgiledartError", "__version__"]
