#!/usr/bin/env python3
"""The README's docker walk-through, unattended, with every result checked.

    .venv/bin/python scripts/docker_emulation.py            # or: make docker-emulation

1. Docker Engine: used if it answers, else ``dockerd`` is started in the background
   (and stopped at the end).
2. Images: the local Debian base (``docker/build-base.sh``: debootstrap + docker import,
   cached under ~/.cache/agiledart), the project's wheels (``pip wheel``, cached likewise;
   offline once cached), then ``compose build``: the broker and the peer image, built
   with no registry and no index.
3. The site: ``compose up``: Mosquitto, the sensor simulator and 6 peers in three zones
   (sensor-1, sensor-2, gateway-1, gateway-2, edge-1, edge-2); waits until every peer
   knows every other one.
4. From inside a peer container, with the CLI: the bundled urban-sensing app (output
   equal to the plain-Python reference), an MQTT app reading the simulator through the
   broker, a keyed running count over the ``counter`` dataset whose host peer is
   ``docker kill``-ed mid-run (output exact), and a peer cut off with ``docker network
   disconnect`` while an app runs and reconnected: the ring heals, the app finishes
   exactly, and a new app placed on that peer runs.
5. The traces of every peer are copied out (``--traces DIR``; ``--analyze`` runs
   ``agiledart analyze`` on them), and the site is torn down: no container, network or
   volume left (``--keep`` leaves it up to look around).

The Site class is what tests/docker drive. Exit code 0 when every check passed.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from agiledart import apps
from agiledart.app import AppSpec, parse_spec
from agiledart.apps.probes import counting
from agiledart.local.reference import canonical, reference_outputs

ROOT = Path(__file__).resolve().parents[1]
DOCKER = ROOT / "docker"
COMPOSE_FILE = DOCKER / "docker-compose.yml"
LOCAL_BASE = "agiledart/base:bookworm"
PEERS = ["sensor-1", "sensor-2", "gateway-1", "gateway-2", "edge-1", "edge-2"]


# Run in one peer container: the ``ring`` of every address given, asked concurrently
# (one ``docker exec`` instead of one per peer; None for a peer that does not answer).
RINGS = """
import asyncio, json, sys
from agiledart.overlay.auth import load_cluster_key
from agiledart.overlay.tcp import FrameClient
KEY = load_cluster_key(None, insecure=False)
async def ring(address):
    host, _, port = address.rpartition(":")
    try:
        client = await FrameClient.connect(host, int(port), key=KEY, name="cli", timeout=10)
        async with client:
            return await client.request("ring", {}, timeout=10)
    except Exception:
        return None
async def main():
    return await asyncio.gather(*(ring(a) for a in sys.argv[1:]))
print(json.dumps(asyncio.run(main())))
"""


class EmulationError(Exception):
    """A step of the emulation failed (the message says which and why)."""


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def cache_dir() -> Path:
    base = os.environ.get("AGILEDART_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "agiledart"
    )
    return Path(base) / "docker"


def sh(
    cmd: Sequence[str],
    *,
    check: bool = True,
    timeout: float = 120,
    env: dict[str, str] | None = None,
    quiet: bool = False,
) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        list(cmd), capture_output=True, text=True, timeout=timeout, env=env, check=False
    )
    if check and proc.returncode != 0:
        detail = (proc.stderr or proc.stdout).strip()[-3000:]
        msg = f"{' '.join(cmd)} exited {proc.returncode}: {detail}"
        raise EmulationError(msg)
    if not quiet and proc.returncode == 0 and os.environ.get("AGILEDART_EMULATION_VERBOSE"):
        log(f"$ {' '.join(cmd)}")
    return proc


def poll(condition: Callable[[], Any], *, what: str, timeout: float = 60.0) -> Any:
    """Wait for ``condition()`` to be truthy (the bound only keeps a broken site from
    hanging the run)."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            msg = f"gave up waiting for: {what}"
            raise EmulationError(msg)
        time.sleep(0.5)


# -- Docker Engine --------------------------------------------------------------------


def docker_answers() -> bool:
    try:
        return sh(["docker", "info"], check=False, timeout=30, quiet=True).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


@contextlib.contextmanager
def docker_engine(*, keep: bool = False) -> Iterator[None]:
    """Docker Engine for the duration: the running one, else a ``dockerd`` started in
    the background (Debian's docker.io; needs root) and stopped afterwards."""
    if shutil.which("docker") is None:
        msg = "no docker client: install docker.io (scripts/setup.sh does, as root)"
        raise EmulationError(msg)
    if docker_answers():
        yield
        return
    dockerd = shutil.which("dockerd") or "/usr/sbin/dockerd"
    if not os.access(dockerd, os.X_OK) or os.geteuid() != 0:
        msg = "Docker Engine is not running and cannot be started here (needs root and dockerd)"
        raise EmulationError(msg)
    cache_dir().mkdir(parents=True, exist_ok=True)
    out = open(cache_dir() / "dockerd.log", "ab")  # noqa: SIM115 - dockerd owns it
    proc = subprocess.Popen([dockerd], stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    out.close()
    log(f"started dockerd (pid {proc.pid}, log {cache_dir() / 'dockerd.log'})")
    try:
        poll(
            lambda: proc.poll() is not None or docker_answers(),
            what="dockerd to answer",
            timeout=90,
        )
        if proc.poll() is not None:
            msg = f"dockerd exited with {proc.returncode}; see {cache_dir() / 'dockerd.log'}"
            raise EmulationError(msg)
        yield
    finally:
        if not keep:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def compose_cli() -> list[str]:
    """``docker compose`` (v2) where the plugin exists, else Debian's docker-compose."""
    if sh(["docker", "compose", "version"], check=False, quiet=True).returncode == 0:
        return ["docker", "compose"]
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    msg = "neither `docker compose` nor `docker-compose`: install docker-compose"
    raise EmulationError(msg)


# -- images ---------------------------------------------------------------------------


def build_wheels(source: Path | None = None) -> Path:
    """The project's wheels and its dependencies' in docker/wheels: from the cache
    alone when it has them (no index), else with the index, filling the cache. The
    project comes from this checkout, or ``source`` (``$AGILEDART_DOCKER_SOURCE``)."""
    source = source or Path(os.environ.get("AGILEDART_DOCKER_SOURCE") or ROOT)
    cache = cache_dir() / "wheels"
    cache.mkdir(parents=True, exist_ok=True)
    out = DOCKER / "wheels"
    shutil.rmtree(out, ignore_errors=True)
    deps, project = out / "deps", out / "project"
    pip = [sys.executable, "-m", "pip", "wheel", "-q", "--disable-pip-version-check"]
    pip += ["--find-links", str(cache), "--wheel-dir", str(deps)]
    offline = sh([*pip, "--no-index", str(source)], check=False, timeout=300)
    if offline.returncode != 0:
        log("building wheels with the package index (first time)")
        sh([*pip, str(source)], timeout=600)
        build_deps = [*pip[:-2], "--wheel-dir", str(cache), "setuptools>=68", "wheel"]
        sh(build_deps, timeout=600)  # so that the next build needs no index
    project.mkdir()
    for whl in deps.glob("*.whl"):  # exactly what the project needs
        if whl.name.startswith("agiledart-"):
            whl.rename(project / whl.name)
        elif not (cache / whl.name).exists():
            shutil.copy2(whl, cache / whl.name)
    return out


def build_images(env: dict[str, str], compose: list[str]) -> None:
    if env.get("BASE_IMAGE") == LOCAL_BASE:
        t = time.monotonic()
        res = sh([str(DOCKER / "build-base.sh"), "--tag", LOCAL_BASE], timeout=900)
        log(f"{res.stdout.strip()} ({time.monotonic() - t:.0f} s)")
    t = time.monotonic()
    build_wheels()
    log(f"wheels in docker/wheels ({time.monotonic() - t:.0f} s)")
    t = time.monotonic()
    sh([*compose, "-f", str(COMPOSE_FILE), "build", "broker", "sensors"], env=env, timeout=900)
    # a rebuild leaves the previous image untagged: drop those, keep the layer cache
    for image in ("peer", "broker"):
        prune = ["docker", "image", "prune", "-f", "--filter", f"label=org.agiledart.image={image}"]
        sh(prune, check=False)
    log(f"images built ({time.monotonic() - t:.0f} s)")


# -- the site -------------------------------------------------------------------------


@dataclass
class Site:
    """One compose project of the site, driven through docker and the CLI in its
    containers."""

    project: str
    workdir: Path
    base_image: str = LOCAL_BASE
    subnet: str = ""
    compose: list[str] = field(default_factory=compose_cli)
    env: dict[str, str] = field(init=False)

    def __post_init__(self) -> None:
        key = self.workdir / "cluster.key"
        if not key.exists():
            key.write_text(os.urandom(32).hex() + "\n")
        self.env = {
            **os.environ,
            "COMPOSE_PROJECT_NAME": self.project,
            "BASE_IMAGE": self.base_image,
            "CLUSTER_KEY_FILE": str(key),
            "EDGE_PEERS": "2",
            "SENSOR_RATE": "100",
            "SITE_SUBNET": self.subnet or free_subnet(),
        }

    # plumbing

    def compose_run(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return sh([*self.compose, "-f", str(COMPOSE_FILE), *args], env=self.env, timeout=timeout)

    def containers(self) -> dict[str, str]:
        """Peer (or service) name -> container id, for this project's containers."""
        fmt = '{{.ID}} {{.Label "com.docker.compose.service"}} '
        fmt += '{{.Label "com.docker.compose.container-number"}}'
        out = sh(["docker", "ps", "-a", "--filter", self.label, "--format", fmt]).stdout
        found = {}
        for line in out.splitlines():
            cid, service, number = line.split()
            found[service if service != "edge" else f"edge-{number}"] = cid
        return found

    @property
    def label(self) -> str:
        return f"label=com.docker.compose.project={self.project}"

    @property
    def network(self) -> str:
        return f"{self.project}_site"

    def container(self, name: str) -> str:
        try:
            return self.containers()[name]
        except KeyError:
            msg = f"no container for {name!r} in project {self.project}"
            raise EmulationError(msg) from None

    def exec(self, peer: str, *args: str, timeout: float = 60) -> str:
        return sh(["docker", "exec", self.container(peer), *args], timeout=timeout).stdout

    def cli(self, peer: str, *args: str, timeout: float = 60) -> Any:
        """``agiledart ARGS --json`` in ``peer``'s container, through that peer."""
        out = self.exec(peer, "agiledart", "--log-level", "error", *args, "--json", timeout=timeout)
        return json.loads(out)

    def try_cli(self, peer: str, *args: str) -> Any:
        try:
            return self.cli(peer, *args)
        except (EmulationError, json.JSONDecodeError, subprocess.TimeoutExpired):
            return None

    # life cycle

    def up(self) -> None:
        self.compose_run("up", "-d", "--no-build", timeout=300)

    def addresses(self) -> dict[str, str]:
        """Peer name -> its address on the site network."""
        ids = self.containers()
        fmt = f'{{{{(index .NetworkSettings.Networks "{self.network}").IPAddress}}}}'
        names = [p for p in PEERS if p in ids]
        out = sh(["docker", "inspect", "--format", fmt, *(ids[p] for p in names)]).stdout
        return {p: f"{ip}:4000" for p, ip in zip(names, out.split(), strict=True)}

    def rings(self, peers: Sequence[str], through: str = "gateway-1") -> dict[str, Any]:
        """Each peer's ``ring`` answer (None where it does not answer), asked from
        ``through``'s container."""
        addresses = self.addresses()
        cmd = ["python", "-c", RINGS, *(addresses[p] for p in peers)]
        try:
            answers = json.loads(self.exec(through, *cmd))
        except (EmulationError, json.JSONDecodeError, subprocess.TimeoutExpired):
            return dict.fromkeys(peers)
        return dict(zip(peers, answers, strict=True))

    def wait_formed(
        self, peers: Sequence[str] = PEERS, timeout: float = 120, through: str = "gateway-1"
    ) -> None:
        """Until every peer's ring lists every other one as alive."""

        def formed() -> bool:
            self.check_running(peers)
            for p, ring in self.rings(peers, through).items():
                if ring is None:
                    return False
                alive = {x["name"] for x in ring["peers"] if not x.get("suspect")}
                if not set(peers) - {p} <= alive:
                    return False
            return True

        poll(formed, what=f"the ring of {', '.join(peers)} to form", timeout=timeout)

    def alive(self) -> list[str]:
        """The peers whose containers run."""
        running = sh(["docker", "ps", "-q", "--filter", self.label]).stdout.split()
        return [p for p, cid in self.containers().items() if p in PEERS and cid in running]

    def check_running(self, peers: Sequence[str]) -> None:
        """Fail at once, with its log, when a peer's container has exited."""
        for p in peers:
            cid = self.container(p)
            state = sh(["docker", "inspect", "--format", "{{.State.Status}}", cid]).stdout
            if state.strip() != "running":
                tail = sh(["docker", "logs", "--tail", "15", cid], check=False)
                msg = f"{p} is {state.strip()}:\n{tail.stdout}{tail.stderr}"
                raise EmulationError(msg)

    def down(self) -> None:
        self.compose_run("down", "-v", "--remove-orphans", "--timeout", "3", timeout=180)

    def leftovers(self) -> list[str]:
        """This project's containers, networks and volumes still there."""
        left = []
        for kind in ("container", "network", "volume"):
            cmd = ["docker", kind, "ls", "-q", "--filter", self.label]
            if kind == "container":
                cmd.insert(3, "-a")
            left += [f"{kind} {x}" for x in sh(cmd).stdout.split()]
        return left

    # apps

    def submit(self, through: str, app: str | dict[str, Any], overrides: Sequence[str] = ()) -> str:
        """Submit a bundled app (by name) or a spec (copied into the container) from
        inside ``through``'s container; returns the app id."""
        if isinstance(app, dict):
            with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as fh:
                yaml.safe_dump(app, fh)
            name = f"/tmp/{app['name']}.yaml"
            sh(["docker", "cp", fh.name, f"{self.container(through)}:{name}"])
            os.unlink(fh.name)
            app = name
        sets = [a for o in overrides for a in ("--set", o)]
        try:
            return str(self.cli(through, "submit", app, *sets)["app_id"])
        except EmulationError as exc:
            if "could not be deployed" not in str(exc):
                raise
            log(f"submitting again after: {str(exc).rpartition('Error: ')[2]}")
            return str(self.cli(through, "submit", app, *sets)["app_id"])

    def status(self, through: str, app_id: str) -> dict[str, Any]:
        return dict(self.cli(through, "status", app_id))

    def finished(self, through: str, app_id: str, timeout: float = 240) -> dict[str, Any]:
        def done() -> dict[str, Any] | None:
            s = self.try_cli(through, "status", app_id)
            return s if s and s["state"] in ("finished", "failed", "stopped") else None

        try:
            return dict(poll(done, what=f"{app_id} to end", timeout=timeout))
        except EmulationError as exc:
            msg = f"{exc}; what the peers logged of it:\n{self.logged(app_id)}"
            raise EmulationError(msg) from exc

    def logged(self, app_id: str, lines: int = 20) -> str:
        """The last ``lines`` log lines of each peer that name ``app_id`` or a death, an
        adoption or a partition: what a failed check is explained by."""
        words = (app_id, "dead", "adopt", "rebind", "cut off", "not acting")
        shown = []
        for peer, cid in sorted(self.containers().items()):
            if peer not in PEERS:
                continue
            out = sh(["docker", "logs", cid], check=False)
            kept = [x for x in (out.stdout + out.stderr).splitlines() if any(w in x for w in words)]
            shown += [f"  {peer}: {x}" for x in kept[-lines:]]
        return "\n".join(shown) or "  (nothing)"

    def sink_records(self, status: dict[str, Any], sink: str, peer: str) -> list[dict[str, Any]]:
        path = status["peers"][peer]["sinks"][sink]["path"]
        text = self.exec(peer, "cat", path)
        return [json.loads(line) for line in text.splitlines() if line.strip()]

    def check_exact(self, spec: AppSpec, status: dict[str, Any]) -> int:
        """Every file sink's output equals the plain-Python reference; the records
        compared."""
        if status["state"] != "finished":
            msg = f"{status['app_id']} ended {status['state']}: {status.get('error')}"
            raise EmulationError(msg)
        expected = reference_outputs(spec)
        compared = 0
        for sink in spec.sinks:
            got = self.sink_records(status, sink.id, sink.peer)
            want = json.loads(json.dumps(expected[sink.id], sort_keys=True))
            if canonical(got) != canonical(want):
                msg = f"{status['app_id']}: sink {sink.id} wrote {len(got)} records, "
                msg += f"the reference has {len(want)}, and they differ"
                raise EmulationError(msg)
            compared += len(got)
        totals = status["totals"]
        if totals["late"] or totals["errors"]:
            msg = f"{status['app_id']}: late {totals['late']}, errors {totals['errors']}"
            raise EmulationError(msg)
        return compared

    # failures

    def kill(self, peer: str) -> None:
        sh(["docker", "kill", self.container(peer)])

    @contextlib.contextmanager
    def cut_off(self, peer: str) -> Iterator[None]:
        """``docker network disconnect`` for the body, then connect again with the same
        address and DNS names (the fixed subnet allows ``--ip``)."""
        cid = self.container(peer)
        info = json.loads(sh(["docker", "inspect", cid]).stdout)[0]
        net = info["NetworkSettings"]["Networks"][self.network]
        ip, aliases = net["IPAddress"], [a for a in net.get("Aliases") or [] if a != cid[:12]]
        sh(["docker", "network", "disconnect", self.network, cid])
        try:
            yield
        finally:
            cmd = ["docker", "network", "connect", "--ip", ip]
            cmd += [x for a in aliases for x in ("--alias", a)]
            sh([*cmd, self.network, cid])

    def copy_traces(self, dest: Path) -> int:
        """Every peer's trace folder (one volume) into ``dest``; the files copied."""
        dest.mkdir(parents=True, exist_ok=True)
        sh(["docker", "cp", f"{self.container('gateway-1')}:/traces/.", str(dest)])
        return sum(1 for p in dest.rglob("*") if p.is_file())


def remove_stale(prefix: str) -> list[str]:
    """Remove the containers, networks and volumes of compose projects named
    ``prefix...`` (what an interrupted run left behind); returns the projects."""
    fmt = '{{.Label "com.docker.compose.project"}}'
    projects: set[str] = set()
    for kind in ("container", "network", "volume"):
        cmd = ["docker", kind, "ls", "--filter", "label=com.docker.compose.project"]
        cmd += ["--format", fmt] + (["-a"] if kind == "container" else [])
        projects |= {x for x in sh(cmd).stdout.split() if x.startswith(prefix)}
    for project in sorted(projects):
        label = f"label=com.docker.compose.project={project}"
        for kind in ("container", "network", "volume"):
            cmd = ["docker", kind, "ls", "-q", "--filter", label]
            cmd += ["-a"] if kind == "container" else []
            ids = sh(cmd).stdout.split()
            force = [] if kind == "network" else ["-f"]
            if ids:
                sh(["docker", kind, "rm", *force, *ids], check=False)
    return sorted(projects)


def free_subnet() -> str:
    """A /24 in 172.31.77-126 that no docker network uses."""
    used = set()
    ids = sh(["docker", "network", "ls", "-q"]).stdout.split()
    if ids:
        fmt = "{{range .IPAM.Config}}{{.Subnet}} {{end}}"
        used = set(sh(["docker", "network", "inspect", "--format", fmt, *ids]).stdout.split())
    for third in range(77, 127):
        subnet = f"172.31.{third}.0/24"
        if subnet not in used:
            return subnet
    msg = "no free subnet in 172.31.77-126.0/24"
    raise EmulationError(msg)


# -- the walk-through's steps -----------------------------------------------------------


def quick(spec: AppSpec, seconds: float) -> list[str]:
    """Overrides replaying every generator source within about ``seconds``."""
    out = []
    for s in spec.sources:
        count, rate = s.params.get("count"), s.params.get("rate")
        if count and rate:
            out.append(f"sources.{s.id}.params.speedup={max(1.0, count / rate / seconds):.3f}")
    return out


def urban_sensing(site: Site, through: str = "edge-2") -> dict[str, Any]:
    """The bundled urban-sensing app, submitted in a peer container: output exact."""
    spec = parse_spec(apps.text("urban-sensing"), known_peers=PEERS)
    overrides = quick(spec, seconds=6.0)
    spec = parse_spec(apps.text("urban-sensing"), overrides=overrides, known_peers=PEERS)
    app_id = site.submit(through, "urban-sensing", overrides)
    s = site.finished(through, app_id)
    n = site.check_exact(spec, s)
    log(f"urban-sensing {app_id}: finished, {n} records equal to the reference")
    return s


def kill_stateful_peer(site: Site, victim: str = "edge-1", through: str = "gateway-2") -> None:
    """A keyed running count pinned to ``victim``, which is ``docker kill``-ed two
    seconds after the app started (of its 20 s of input: a loaded machine runs the CLI
    slowly, so the kill does not wait for it): the app restarts elsewhere, its output is
    exact. Then ``docker start`` brings the peer back, and the ring takes it in again."""
    raw = counting(victim, count=30_000, rate=1_500)
    spec = parse_spec(raw, known_peers=PEERS)
    app_id = site.submit(through, raw)
    time.sleep(2.0)
    site.kill(victim)
    log(f"counting {app_id}: docker kill {victim}, which hosts its running count")
    s = site.finished(through, app_id)
    n = site.check_exact(spec, s)
    if len(s["recoveries"]) != 1:
        msg = f"{app_id}: expected one recovery (the app finished before the kill?): "
        raise EmulationError(msg + str(s["recoveries"]))
    (event,) = s["recoveries"]
    if event["dead"] != victim or s["placement"]["counts"] != [event["takeover"]]:
        msg = f"unexpected recovery {event}, placement {s['placement']}"
        raise EmulationError(msg)
    log(f"counting {app_id}: {victim} died, {event['takeover']} took over, {n} records exact")
    sh(["docker", "start", site.container(victim)])
    site.wait_formed()
    log(f"{victim} started again and back in the ring")


def app_peers(status: dict[str, Any]) -> set[str]:
    hosting = {p for peers in status["placement"].values() for p in peers}
    hosting |= {p for path in status.get("paths", []) for p in path}
    return hosting | {status.get("scheduler", "")}


def partition(
    site: Site, alive: Sequence[str], through: str = "gateway-2", seconds: float = 8.0
) -> str:
    """While a counting app runs, cut off a peer that takes no part in it for
    ``seconds``: the others notice, the app goes on; after reconnecting the ring heals,
    the app's output is exact, and a new app with its running count on that peer runs
    exactly too. Returns the peer cut off."""
    host = next(p for p in ("edge-2", "edge-1", "gateway-2") if p in alive)
    raw = counting(host, count=72_000, rate=2_400, name="partitioned")  # 30 s
    spec = parse_spec(raw, known_peers=PEERS)
    app_id = site.submit(through, raw)
    s = site.status(through, app_id)
    spare = [p for p in alive if p not in app_peers(s)]
    if not spare:
        msg = f"every live peer takes part in {app_id}: {s['placement']}"
        raise EmulationError(msg)
    cut = spare[0]
    with site.cut_off(cut):
        log(f"partitioned {app_id}: {cut} cut off (docker network disconnect)")

        def noticed() -> bool:
            ring = site.try_cli(through, "ring")
            alive_seen = {x["name"] for x in (ring or {}).get("peers", []) if not x["suspect"]}
            return ring is not None and cut not in alive_seen

        before = site.status(through, app_id)["totals"]["sink_records"]
        poll(noticed, what=f"{through} to notice that {cut} is gone", timeout=60)
        time.sleep(max(0.0, seconds - 3))
        s = site.status(through, app_id)
        if s["state"] != "finished" and s["totals"]["sink_records"] <= before:
            msg = f"{app_id} made no progress while {cut} was cut off"
            raise EmulationError(msg)
    after = s["totals"]["sink_records"]
    log(f"{cut} reconnected; {after - before} records reached the sink meanwhile ({s['state']})")
    site.wait_formed(alive, timeout=90)
    log(f"the ring healed: all of {', '.join(alive)} know each other again")
    s = site.finished(through, app_id)
    n = site.check_exact(spec, s)
    if s["recoveries"]:
        msg = f"{app_id} recovered although none of its peers was cut: {s['recoveries']}"
        raise EmulationError(msg)
    log(f"partitioned {app_id}: finished, {n} records exact")
    raw = counting(host, count=6_000, name="rejoined")
    raw["operators"][2]["peer"] = cut
    spec = parse_spec(raw, known_peers=PEERS)
    app_id = site.submit(through, raw)
    s = site.finished(through, app_id)
    n = site.check_exact(spec, s)
    if s["placement"]["counts"] != [cut]:
        msg = f"{app_id} placed its count on {s['placement']['counts']}, not {cut}"
        raise EmulationError(msg)
    log(f"rejoined {app_id}: its count ran on {cut}, {n} records exact")
    return cut


def mqtt_app(count: int = 200) -> dict[str, Any]:
    """What the site's sensor simulator publishes, read through the broker."""
    return {
        "name": "live-urban",
        "sources": [
            {
                "id": "readings",
                "peer": "sensor-2",
                "connector": "mqtt",
                "params": {
                    "broker": "broker:1883",
                    "topic": "sensors/+/+",
                    "count": count,
                    "fields": {"value": "value"},
                    "topic_field": "topic",
                },
            }
        ],
        "operators": [],
        "sinks": [
            {
                "id": "out",
                "peer": "gateway-1",
                "connector": "file",
                "params": {"path": "live.jsonl"},
                "inputs": ["readings"],
            }
        ],
    }


def mqtt_sensors(site: Site, through: str = "sensor-1", count: int = 200) -> None:
    """An app reading the simulator's readings through the broker gets ``count``."""
    app_id = site.submit(through, mqtt_app(count))
    s = site.finished(through, app_id, timeout=120)
    got = site.sink_records(s, "out", "gateway-1")
    if s["state"] != "finished" or len(got) != count:
        msg = f"{app_id}: {s['state']} with {len(got)} of {count} readings"
        raise EmulationError(msg)
    if not all(r["topic"].startswith("sensors/") for r in got):
        msg = f"{app_id}: unexpected topics {sorted({r['topic'] for r in got})[:5]}"
        raise EmulationError(msg)
    log(f"live-urban {app_id}: {count} readings from the simulator through the broker")


def walk_through(site: Site, traces: Path | None) -> None:
    t = time.monotonic()
    site.up()
    site.wait_formed()
    log(f"site up: {', '.join(PEERS)} know each other ({time.monotonic() - t:.0f} s)")
    urban_sensing(site)
    mqtt_sensors(site)
    kill_stateful_peer(site, "edge-1")
    partition(site, PEERS)
    if traces is not None:
        n = site.copy_traces(traces)
        log(f"{n} trace files copied to {traces}")


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--project", default="agiledart-emulation", help="compose project name")
    ap.add_argument(
        "--base-image",
        default=os.environ.get("BASE_IMAGE") or LOCAL_BASE,
        help=f"image to build on ({LOCAL_BASE}, made by docker/build-base.sh, by default; "
        "python:3.11-slim-bookworm needs a registry)",
    )
    ap.add_argument("--traces", type=Path, help="copy the peers' traces here")
    ap.add_argument("--analyze", type=Path, help="run `agiledart analyze` on them into DIR")
    ap.add_argument("--keep", action="store_true", help="leave the site (and dockerd) up")
    ap.add_argument(
        "--build-only",
        action="store_true",
        help="only build the images (base, wheels, broker and peer) for `docker compose up`",
    )
    args = ap.parse_args(argv)
    if args.analyze and not args.traces:
        args.traces = args.analyze / "traces"
    started = time.monotonic()
    try:
        keep = args.keep or args.build_only
        with docker_engine(keep=keep), tempfile.TemporaryDirectory() as tmp:
            site = Site(args.project, Path(tmp), base_image=args.base_image)
            build_images(site.env, site.compose)
            if args.build_only:
                return 0
            try:
                walk_through(site, args.traces)
            finally:
                if not args.keep:
                    site.down()
                    left = site.leftovers()
                    if left:
                        msg = f"left behind: {', '.join(left)}"
                        raise EmulationError(msg)
                    log("site torn down: no container, network or volume left")
        if args.analyze:
            analyze = [sys.executable, "-m", "agiledart.cli", "analyze", str(args.traces)]
            sh([*analyze, "--out", str(args.analyze)], timeout=900)
            log(f"analysis in {args.analyze}/report.html")
    except EmulationError as exc:
        print(f"Error: {exc}", file=sys.stderr)
        return 1
    log(f"all checks passed ({time.monotonic() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
