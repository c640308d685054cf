"""Exceptions of :mod:`agiledart.recovery`.

::

    AgiledartError
    └── RecoveryError                anything this package raises on purpose
        ├── CodecConfigError         local misuse: bad m, k, block size, ids, policy input
        ├── FragmentError            remote misbehaviour: a malformed or corrupt fragment
        │   └── MixedFragmentsError  fragments of different checkpoints handed to one decode
        └── NotEnoughFragments       fewer than m intact fragments of one stripe

Local misuse (our own caller got it wrong) and remote misbehaviour (a holder sent bytes
that cannot be right) are separate types: a holder or a restoring peer logs, counts and
drops a :class:`FragmentError`, and asks another holder, while a
:class:`CodecConfigError` stays a bug. :class:`NotEnoughFragments` is neither: too many
holders are gone or corrupt, so the checkpoint cannot be rebuilt and the operator
restarts from empty state (or an older epoch).
"""

from __future__ import annotations

from agiledart.errors import AgiledartError, crosses_peers


@crosses_peers("RecoveryError")
class RecoveryError(AgiledartError):
    """Base class of every error :mod:`agiledart.recovery` raises on purpose."""


@crosses_peers("CodecConfigError")
class CodecConfigError(RecoveryError):
    """The caller misused the API: m < 1, k < 0, m + k > 256, a bad block size or id."""


@crosses_peers("FragmentError")
class FragmentError(RecoveryError):
    """A fragment is malformed (bad encoding, out-of-range field) or corrupt (bad digest)."""


@crosses_peers("MixedFragmentsError")
class MixedFragmentsError(FragmentError):
    """Intact fragments of different checkpoints (app, instance, epoch) or stripes were mixed.

    A holder that answers with a fragment of another epoch or instance than the one asked
    for misbehaves; filter replies by :attr:`Fragment.checkpoint` before decoding.
    """


@crosses_peers("NotEnoughFragments")
class NotEnoughFragments(RecoveryError):
    """Fewer than m intact, distinct fragments of a stripe are left: it cannot be rebuilt."""
