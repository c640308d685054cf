"""The ``agiledart`` command line, one module per group of commands.

===============  ==================================================================
``entry``        the parser and ``main`` (the console script); ``peer``, ``ring``,
                 ``route``, ``keygen``; what every client command shares (``--via``,
                 the cluster key, one request to a peer)
``apps``         ``register``, ``submit``, ``apps``, ``status``, ``stop``
``emulate``      ``emulate``: a bundled app on a local cluster
                 (:mod:`agiledart.emulation`), with a live view
``sensors``      ``sensors``: a dataset published to MQTT live
``analyze``      ``analyze``: traces to tables and plots (:mod:`agiledart.analysis`)
``dashboard``    ``dashboard-url``: where a peer serves its dashboard
===============  ==================================================================

Only the module of the command being run is imported (:mod:`agiledart.cli.entry`), so
a one-shot query does not load the runtime. ``python -m agiledart.cli`` runs ``main``.
Any :class:`~agiledart.errors.AgiledartError` is printed as ``Error: message``, exit 1.
"""
