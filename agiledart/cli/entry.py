"""The ``agiledart`` command line: the parser, ``main``, and the commands that talk to the ring.

Exit codes: 0 success, 1 a reported error (``Error: ...`` on stderr), 2 a usage error.
Client commands reach a peer with ``--via HOST:PORT`` (default ``$AGILEDART_PEER``)
and read the cluster key as the peer does (``--cluster-key-file`` or
``$AGILEDART_CLUSTER_KEY``, ``--insecure`` for test clusters).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import logging
import os
import signal
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from agiledart import __version__
from agiledart.errors import AgiledartError
from agiledart.runtime.epochs import CHECKPOINT_RATE
from agiledart.runtime.execution import LACHESIS_POLICIES, SCHEDULERS

__all__ = ["main"]

ENV_PEER = "AGILEDART_PEER"


def _add_key_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--cluster-key-file", metavar="F", help="file holding the cluster key")
    p.add_argument(
        "--insecure",
        action="store_true",
        help="run without a cluster key (trusted test networks only)",
    )


def _add_via(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--via",
        metavar="HOST:PORT|NAME",
        default=os.environ.get(ENV_PEER),
        help=f"any peer of the cluster (default ${ENV_PEER}); a peer's name is looked up "
        f"through ${ENV_PEER}'s peer",
    )
    p.add_argument("--timeout", type=float, default=10.0, help="seconds to wait (default 10)")
    _add_key_options(p)


def _non_negative(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        msg = f"expected a whole number >= 0, got {text!r}"
        raise argparse.ArgumentTypeError(msg)
    return value


def _non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0:  # NaN too
        msg = f"expected a number >= 0, got {text!r}"
        raise argparse.ArgumentTypeError(msg)
    return value


def _rtt_ms(text: str) -> float:
    value = _non_negative_float(text)
    if value > 10_000:
        msg = f"expected at most 10000 ms, got {text!r}"
        raise argparse.ArgumentTypeError(msg)
    return value


def _finite_positive(what: str) -> Callable[[str], float]:
    """An argument type: a finite number > 0 of ``what``."""

    def parse(text: str) -> float:
        value = _non_negative_float(text)
        if not 0 < value < float("inf"):
            msg = f"expected a number of {what} > 0, got {text!r}"
            raise argparse.ArgumentTypeError(msg)
        return value

    return parse


_checkpoint_rate = _finite_positive("epochs per second")
_positive_seconds = _finite_positive("seconds")


def _positive(text: str) -> int:
    value = _non_negative(text)
    if value == 0:
        msg = f"expected a whole number >= 1, got {text!r}"
        raise argparse.ArgumentTypeError(msg)
    return value


def _port(text: str) -> int:
    value = _non_negative(text)
    if value > 65535:
        msg = f"expected a port number (0-65535; 0: any free port), got {text!r}"
        raise argparse.ArgumentTypeError(msg)
    return value


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The whole command line; with ``only``, the commands of other modules except
    ``only`` are named but not built (their modules are not imported)."""
    parser = argparse.ArgumentParser(
        prog="agiledart",
        description="A decentralized stream processing engine for edge networks.",
    )
    parser.add_argument("--version", action="version", version=f"agiledart {__version__}")
    parser.add_argument(
        "--log-level",
        default=os.environ.get("AGILEDART_LOG", "info"),
        choices=["debug", "info", "warning", "error"],
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("peer", help="run a peer", description="Run one peer of the ring.")
    p.add_argument(
        "--listen",
        required=True,
        metavar="HOST:PORT",
        help="address for PORT/udp (overlay) and PORT/tcp (frames)",
    )
    p.add_argument(
        "--bootstrap",
        action="append",
        default=[],
        metavar="HOST:PORT",
        help="a peer to join through (repeatable; host names are resolved)",
    )
    p.add_argument("--name", default="", help="this peer's name (default HOSTNAME:PORT)")
    p.add_argument("--zone", default="default", help="scheduling zone (default 'default')")
    p.add_argument(
        "--scheduling",
        choices=["zones", "central", "local"],
        default="zones",
        help="who schedules submitted apps: the zone's schedulers (default), one "
        "central FCFS master (--master; the paper's baseline), or the receiving peer",
    )
    p.add_argument("--master", default="", metavar="NAME", help="the master peer (central)")
    p.add_argument("--advertise", metavar="HOST", help="address other peers should use")
    p.add_argument(
        "--state-dir",
        type=Path,
        help="where the node id and state live, held by one peer at a time (default "
        "./state/NAME, or ./state where it already holds a node id)",
    )
    p.add_argument(
        "--trace-dir",
        type=Path,
        help="write traces here (NDJSON, one folder per peer; docs/traces.md)",
    )
    p.add_argument(
        "--links",
        type=Path,
        metavar="FILE",
        help="emulated link model (docs/bandit-graphs.md format, nodes named after peers): "
        "data to peers that are not direct neighbours is relayed hop by hop by the KL-UCB "
        "rule, and every link loses and delays attempts as the file says",
    )
    p.add_argument(
        "--control-rtt-ms",
        type=_rtt_ms,
        default=0.0,
        metavar="MS",
        help="emulation: add this round-trip time to every control request to another "
        "peer (deploy, records, scheduling; 0-10000, default 0), as an edge network "
        "would; local clusters on loopback otherwise have almost none",
    )
    p.add_argument(
        "--checkpoint-rate",
        type=_checkpoint_rate,
        default=CHECKPOINT_RATE,
        metavar="N",
        help="checkpoint epochs this peer starts per second, at most, over all the apps "
        f"it schedules (default {CHECKPOINT_RATE:g}); past N x interval such apps, each "
        "app's checkpoint interval stretches to about apps / N seconds",
    )
    p.add_argument(
        "--pinned-grace-s",
        type=_non_negative_float,
        metavar="S",
        help="seconds the peer of a source or sink that died is waited for before the "
        "apps this peer schedules fail (it keeps its part if it restarts meanwhile; "
        "default 20)",
    )
    p.add_argument(
        "--report-timeout-s",
        type=_positive_seconds,
        metavar="S",
        help="seconds an app instance here waits for its scheduler to take a sink's end "
        "or a failure before it sends it again, to the scheduler the app's record names "
        "by then (default 30)",
    )
    p.add_argument(
        "--workers",
        type=_non_negative,
        default=os.cpu_count() or 1,
        metavar="N",
        help="worker processes of the pool (default: number of cores); 0 runs operators "
        "in the peer's own loop",
    )
    p.add_argument(
        "--scheduler",
        choices=SCHEDULERS,
        default="edgewise",
        help="who runs operator instances: edgewise (default: worker pool, longest queue "
        "first), random (worker pool, random queue), os (a process per instance), "
        "lachesis (os, prioritised by --lachesis-policy)",
    )
    p.add_argument(
        "--lachesis-policy",
        choices=LACHESIS_POLICIES,
        default="qs",
        help="lachesis: qs (longest queue), fcfs (oldest tuple), hr (highest rate); default qs",
    )
    p.add_argument(
        "--turn",
        type=_positive,
        default=50,
        metavar="N",
        help="tuples a worker runs per scheduling turn, at most (default 50)",
    )
    p.add_argument(
        "--offload-us",
        type=_non_negative_float,
        default=10.0,
        metavar="US",
        help="an operator runs in the peer's own loop until its records cost more than "
        "this many microseconds each (measured), then in the workers; 0 puts every "
        "operator in the workers (default 10)",
    )
    p.add_argument(
        "--metrics-port",
        type=_port,
        metavar="P",
        help="serve Prometheus metrics at http://METRICS-HOST:P/metrics",
    )
    p.add_argument(
        "--metrics-host",
        metavar="HOST",
        help="address the metrics endpoint listens on (default: a loopback address, the "
        "--listen host when it is one, else 127.0.0.1); beyond loopback it needs a token",
    )
    p.add_argument(
        "--metrics-token-file",
        type=Path,
        metavar="F",
        help="scrapers must send the token in F (its first line, 16+ characters) as "
        "Authorization: Bearer (default: $AGILEDART_METRICS_TOKEN, else no token)",
    )
    p.add_argument(
        "--dashboard-port",
        type=_port,
        metavar="P",
        help="serve the web dashboard on this port (off by default; its URL, with the "
        "token, is printed at start-up and by `agiledart dashboard-url`)",
    )
    p.add_argument(
        "--dashboard-host",
        default="127.0.0.1",
        metavar="HOST",
        help="address the dashboard listens on (default 127.0.0.1)",
    )
    p.add_argument(
        "--show-dashboard-url",
        action="store_true",
        help="print the dashboard's URL with its token once to the console at start-up "
        "(the log names the dashboard without its token)",
    )
    p.add_argument(
        "--data-root",
        type=Path,
        metavar="DIR",
        help="file sources read and file sinks write inside DIR only (sinks under "
        "DIR/output/APP-ID/; default: the --state-dir)",
    )
    p.add_argument(
        "--allow-path",
        action="append",
        type=Path,
        default=[],
        metavar="DIR",
        help="also let file sources and sinks use DIR (repeatable)",
    )
    p.add_argument(
        "--allow-env",
        action="append",
        default=[],
        metavar="NAME",
        help="also let app specs read the environment variable NAME (password_env; "
        "repeatable; names starting AGILEDART_SECRET_ are always readable)",
    )
    _add_key_options(p)
    p.set_defaults(func=_cmd_peer)

    p = sub.add_parser(
        "ring", help="show the peers a peer knows", description="Show the ring as one peer sees it."
    )
    _add_via(p)
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=_cmd_ring)

    p = sub.add_parser(
        "route",
        help="trace the overlay route to a peer or key",
        description="Route a probe from the --via peer to the peer closest "
        "to a key (or to a named peer) and print the path.",
    )
    p.add_argument("to", help="a peer name or a 40-hex-digit key")
    _add_via(p)
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=_cmd_route)

    p = sub.add_parser(
        "keygen",
        help="make a cluster key",
        description="Write a new random 256-bit cluster key (mode 0600), or take an "
        "existing key file one step through a rotation: `add` a new key that is accepted "
        "but does not seal yet, `promote` it to seal (the old one still accepted), "
        "`retire` the old one. Copy the file to every peer after each step.",
    )
    p.add_argument("--out", required=True, type=Path, help="the key file")
    p.add_argument("--force", action="store_true", help="overwrite an existing file")
    p.add_argument(
        "--rotate",
        choices=("add", "promote", "retire"),
        help="change the existing key file one rotation step",
    )
    p.set_defaults(func=_cmd_keygen)

    for module, names in _ELSEWHERE.items():
        if only is None or only in names:
            _add_commands_of(module, sub)
        else:  # named, for `invalid choice` errors; never parsed into
            for name in names:
                sub.add_parser(name)
    return parser


#: The commands other modules define, by module. Only the module of the command being
#: run is imported (every one for the top-level help), so a one-shot query such as
#: ``status`` or ``ring`` does not load the runtime, the emulator and the MQTT client,
#: which on a Raspberry Pi is seconds of start-up.
_ELSEWHERE: dict[str, tuple[str, ...]] = {
    "agiledart.cli.apps": ("register", "submit", "apps", "status", "stop"),
    "agiledart.cli.emulate": ("emulate",),
    "agiledart.cli.analyze": ("analyze",),
    "agiledart.cli.sensors": ("sensors",),
    "agiledart.cli.dashboard": ("dashboard-url",),
}


def _add_commands_of(module: str, sub: Any) -> None:
    if module == "agiledart.cli.apps":
        from agiledart.cli.apps import add_parsers

        add_parsers(sub, _add_via, call_peer, _run)
    elif module == "agiledart.cli.emulate":
        from agiledart.cli.emulate import add_parser as add_emulate

        add_emulate(sub)
    elif module == "agiledart.cli.analyze":
        from agiledart.cli.analyze import add_parser as add_analyze

        add_analyze(sub)
    elif module == "agiledart.cli.sensors":
        from agiledart.cli.sensors import add_parser as add_sensors

        add_sensors(sub)
    elif module == "agiledart.cli.dashboard":
        from agiledart.cli.dashboard import add_parser as add_dashboard_url

        add_dashboard_url(sub, _add_via, call_peer, _run)
    else:
        msg = f"no commands registered for {module}"
        raise AssertionError(msg)


def _command_of(argv: Sequence[str]) -> str | None:
    """The command ``argv`` names (its first positional argument, which argparse then
    checks), or ``None`` for the top-level help, whose list needs every command's
    description."""
    args = iter(argv)
    for arg in args:
        if arg == "--log-level":
            next(args, None)
        elif arg in ("-h", "--help", "--version"):
            return None
        elif not arg.startswith("-"):
            return arg
    return None


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(only=_command_of(argv))
    args = parser.parse_args(argv)
    level = getattr(logging, args.log_level.upper())
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for chatty in ("kademlia", "rpcudp"):  # their INFO is per-lookup detail: DEBUG only
        logging.getLogger(chatty).setLevel(level if level <= logging.DEBUG else logging.WARNING)
    func: Callable[[argparse.Namespace], int] = args.func
    try:
        return func(args)
    except AgiledartError as exc:
        print(f"Error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


def _key(args: argparse.Namespace) -> Any:
    from agiledart.overlay.auth import load_cluster_key

    return load_cluster_key(args.cluster_key_file, insecure=args.insecure)


def _cmd_keygen(args: argparse.Namespace) -> int:
    from agiledart.overlay.errors import ConfigError
    from agiledart.overlay.files import atomic_write
    from agiledart.overlay.keys import key_file_text, make_key_text, rotate

    path: Path = args.out
    if args.rotate:
        try:
            text, done = rotate(path.read_text(), args.rotate)
        except OSError as exc:
            msg = f"cannot read cluster key file {path}: {exc.strerror}"
            raise ConfigError(msg) from exc
        atomic_write(path, text.encode(), mode=0o600)
        print(f"{path}: {done}; copy it to every peer and restart them one by one")
        return 0
    if path.exists() and not args.force:
        msg = f"{path} exists; pass --force to overwrite it (or --rotate to rotate it)"
        raise ConfigError(msg)
    atomic_write(path, key_file_text([make_key_text()]).encode(), mode=0o600)
    print(f"wrote a new cluster key to {path}; give every peer --cluster-key-file {path}")
    return 0


def _cmd_peer(args: argparse.Namespace) -> int:
    from agiledart.overlay.address import parse_address
    from agiledart.peer import Peer, PeerConfig
    from agiledart.runtime.failover import PINNED_GRACE_S
    from agiledart.runtime.hosting import REPORT_TIMEOUT_S

    config = PeerConfig(
        listen=parse_address(args.listen, listening=True),
        bootstrap=[parse_address(b) for b in args.bootstrap],
        name=args.name,
        zone=args.zone,
        state_dir=args.state_dir,
        trace_dir=args.trace_dir,
        workers=args.workers,
        scheduler=args.scheduler,
        turn=args.turn,
        lachesis_policy=args.lachesis_policy,
        offload_us=args.offload_us,
        metrics_port=args.metrics_port,
        metrics_host=args.metrics_host,
        metrics_token_file=args.metrics_token_file,
        dashboard_port=args.dashboard_port,
        dashboard_host=args.dashboard_host,
        advertise=args.advertise,
        links=args.links,
        control_rtt_ms=args.control_rtt_ms,
        checkpoint_rate=args.checkpoint_rate,
        pinned_grace_s=PINNED_GRACE_S if args.pinned_grace_s is None else args.pinned_grace_s,
        report_timeout_s=args.report_timeout_s or REPORT_TIMEOUT_S,
        scheduling=args.scheduling,
        master=args.master,
        data_root=args.data_root,
        allow_paths=tuple(args.allow_path),
        allow_env=tuple(args.allow_env),
    )
    key = _key(args)
    if key.insecure:
        logging.getLogger("agiledart").warning("running with --insecure: frames can be forged")

    async def run() -> None:
        async with Peer(config, key) as peer:
            # streaming allocates many short-lived records and few cycles: keep what
            # start-up made out of the collector's way and collect young objects rarely
            gc.freeze()
            gc.set_threshold(20_000, 50, 100)
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(sig, peer.stop)
            print(f"peer {peer.name} listening on {peer.address[0]}:{peer.address[1]}", flush=True)
            for line in peer.site.banner() if peer.site is not None else ():
                print(line, flush=True)
            url = peer.site.dashboard_url() if peer.site is not None else None
            if args.show_dashboard_url and url is not None:
                print(f"dashboard URL with its token: {url}", flush=True)
            await peer.wait_stopped()

    _run(run())
    return 0


def _run(coro: Any) -> Any:
    try:
        import uvloop

        return uvloop.run(coro)
    except ImportError:
        return asyncio.run(coro)


async def call_peer(args: argparse.Namespace, rpc: str, body: dict[str, Any]) -> Any:
    """One control RPC to the ``--via`` peer."""
    from agiledart.overlay.address import parse_address
    from agiledart.overlay.errors import ConfigError
    from agiledart.overlay.tcp import FrameClient

    if not args.via:
        msg = f"no peer to talk to: pass --via HOST:PORT or set ${ENV_PEER}"
        raise ConfigError(msg)
    via = args.via if _is_address(args.via) else await _address_of_name(args, args.via)
    host, port = parse_address(via)
    client = await FrameClient.connect(host, port, key=_key(args), name="cli", timeout=args.timeout)
    async with client:
        return await client.request(rpc, body, timeout=args.timeout)


def _is_address(text: str) -> bool:
    """``HOST:PORT`` (or ``[v6]:PORT``) rather than a peer's name."""
    _, sep, port = text.rpartition(":")
    return bool(sep) and port.isdigit()


async def _address_of_name(args: argparse.Namespace, name: str) -> str:
    """The address of the peer called ``name``, as ``$AGILEDART_PEER``'s peer knows it
    (its contacts, else a route through the ring to the name's record)."""
    from agiledart.overlay.errors import ConfigError, UnknownPeer

    entry = os.environ.get(ENV_PEER)
    if not entry or not _is_address(entry):
        msg = (
            f"--via {name}: a peer's name is looked up through ${ENV_PEER} (HOST:PORT of "
            "any peer), which is not set; pass --via HOST:PORT instead"
        )
        raise ConfigError(msg)
    lookup = argparse.Namespace(**{**vars(args), "via": entry})
    ring = await call_peer(lookup, "ring", {})
    for peer in ring.get("peers", ()):
        if peer.get("name") == name:
            return str(peer["address"])
    if ring.get("self") == name:
        return entry
    unknown = f"--via {name}: no peer of that name is known to {ring.get('self')} ({entry})"
    try:
        route = await call_peer(lookup, "route", {"to": name})
    except UnknownPeer as exc:  # the name resolves to no record
        raise ConfigError(unknown) from exc
    last = (route.get("path") or [{}])[-1]
    if last.get("name") != name:
        raise ConfigError(unknown)
    return str(last["address"])


def _cmd_ring(args: argparse.Namespace) -> int:
    info = _run(call_peer(args, "ring", {}))
    if args.json:
        print(json.dumps(info, indent=2))
        return 0
    from rich.console import Console
    from rich.table import Table

    leaf = set(info["leaf_set"])
    table = Table(
        title=f"ring seen from {info['self']} ({info['node_id'][:8]}, "
        f"{info['address']}, zone {info['zone']})"
    )
    for col in ("name", "node id", "address", "rtt ms", "leaf set"):
        table.add_column(col)
    for p in info["peers"]:
        rtt = "" if p["rtt_ms"] is None else f"{p['rtt_ms']:.1f}"
        table.add_row(
            p["name"] or "?",
            p["node_id"][:8],
            p["address"],
            rtt,
            "yes" if (p["name"] or p["node_id"]) in leaf else "",
        )
    Console().print(table)
    print(f"{len(info['peers'])} peers known, {len(leaf)} in the leaf set")
    return 0


def _cmd_route(args: argparse.Namespace) -> int:
    result = _run(call_peer(args, "route", {"to": args.to}))
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(f"route to {result['key'][:8]}: {result['hops']} hops")
    for i, hop in enumerate(result["path"]):
        rtt = "" if hop["rtt_ms"] is None else f"  rtt {hop['rtt_ms']:.1f} ms"
        print(f"  {i}. {hop['name'] or hop['node_id'][:8]:20} {hop['address']}{rtt}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
