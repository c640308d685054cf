"""An app in one process: the executor that wires operators, and the reference outputs.

:mod:`agiledart.local.executor` (:class:`~agiledart.local.executor.Executor`,
:func:`~agiledart.local.executor.run_local`) drives the operators of
:mod:`agiledart.operators` with no I/O of its own: a peer runs one for the operators
placed on it, and ``run_local`` runs a whole app. :mod:`agiledart.local.reference`
computes an app's expected sink outputs in plain Python, independent of the operators.

Both stand on the application model (:mod:`agiledart.app`) and the operators; neither
is imported by them, so the dependencies go one way: ``app`` <- ``operators`` <-
``local``.
"""
