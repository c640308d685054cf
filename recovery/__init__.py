"""agiledart.recovery: erasure-coded checkpoints of operator state (paper §IV-D, §VII-D).

The pure core, without I/O: the checkpoint store, barriers and restore over the network
drive it and only ever hand it bytes and :class:`Fragment` values.

* :mod:`~agiledart.recovery.snapshot`: the :class:`Snapshottable` protocol of stateful
  operators and :func:`default_policy`, the paper's restart / replicate / erasure-code
  choice with m, k and the checkpoint interval.
* :mod:`~agiledart.recovery.erasure`: :func:`encode` a state into n = m + k fragments
  per stripe, :func:`decode` it from any m intact ones; :func:`encode_stream`,
  :func:`decode_stream` and the push-style :class:`StripeEncoder` and
  :class:`StripeDecoder` for states too large to hold twice; :func:`replicate` (m = 1).
* :mod:`~agiledart.recovery.fragment`: :class:`Fragment`, self-checking, with its
  msgpack wire format (:meth:`Fragment.to_bytes`, :meth:`Fragment.from_bytes`).

Exceptions (:mod:`~agiledart.recovery.errors`)::

    RecoveryError(AgiledartError)
    ├── CodecConfigError         local misuse
    ├── FragmentError            malformed or corrupt fragment
    │   └── MixedFragmentsError  fragments of different checkpoints in one decode
    └── NotEnoughFragments       fewer than m intact fragments of a stripe
"""

from agiledart.recovery.erasure import (
    DEFAULT_BLOCK_SIZE,
    StripeDecoder,
    StripeEncoder,
    decode,
    decode_stream,
    encode,
    encode_stream,
    replicate,
)
from agiledart.recovery.errors import (
    CodecConfigError,
    FragmentError,
    MixedFragmentsError,
    NotEnoughFragments,
    RecoveryError,
)
from agiledart.recovery.fragment import MAX_BLOCK_SIZE, MAX_FRAGMENTS, CheckpointId, Fragment
from agiledart.recovery.snapshot import (
    CheckpointPolicy,
    RecoveryMode,
    Snapshottable,
    default_policy,
)

__all__ = [
    "DEFAULT_BLOCK_SIZE",
    "MAX_BLOCK_SIZE",
    "MAX_FRAGMENTS",
    "CheckpointId",
    "CheckpointPolicy",
    "CodecConfigError",
    "Fragment",
    "FragmentError",
    "MixedFragmentsError",
    "NotEnoughFragments",
    "RecoveryError",
    "RecoveryMode",
    "Snapshottable",
    "StripeDecoder",
    "StripeEncoder",
    "decode",
    "decode_stream",
    "default_policy",
    "encode",
    "encode_stream",
    "replicate",
]
