"""Erasure-coded checkpoints over the network (paper §IV-D; docs/recovery.md).

Two halves:

* :class:`FragmentStore`: what every peer runs for the others. It keeps the fragments
  it is given under ``<state-dir>/fragments/`` (one file per fragment in a folder per
  app, written to a temporary name, synced and renamed, so a crash never leaves half
  a fragment), verifies each
  one before it accepts it, and answers four requests: ``frag_put`` (one fragment),
  ``frag_get`` (a holder's fragments of one checkpoint, paged by stripe, at most
  ``PAGE_BYTES`` per answer), ``frag_drop`` (garbage-collect an instance's epochs below
  one) and ``frag_held`` (what it holds for an app). Fragments survive a restart of
  the holder: the directory is scanned when the store opens.
* :func:`save` and :func:`load`, what a checkpointing or restoring instance calls:
  ``save`` encodes a state into n = m + k fragments (zfec, in a thread when large) and
  puts fragment i of every stripe on holder i, all holders in parallel; ``load``
  fetches from m holders in parallel, moves on to a spare holder when one is dead or
  hands back a corrupt fragment, and decodes (digests checked, a fresh block list per
  stripe: :mod:`agiledart.recovery.erasure`).

What a store holds is bounded and collected. It takes at most ``capacity_bytes``
(4 GiB) and never more than ``disk_share`` (half) of the disk it could have, its own
fragments and the free space together, so a full disk refuses fragments
(:class:`StoreFull`, which the checkpoint that sent them reports) instead of filling up.
The fragments of an app that ended are of no use: its scheduler asks the holders of
its last checkpoint to drop them (:func:`forget`), and every store sweeps now and then
(:meth:`FragmentStore.sweep`, run by the peer every ``SWEEP_S``), dropping the apps whose
record says they ended, so that what a lost request or a dead scheduler left behind is
collected too.

Nothing here decides *when* to checkpoint or whom to pick as holders: the checkpoint
coordinator does (leaf-set peers, n of them).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agiledart.errors import AgiledartError
from agiledart.overlay.errors import MalformedError, OverlayError
from agiledart.overlay.files import fsync_dir
from agiledart.overlay.tcp import ConnectionInfo
from agiledart.recovery import Fragment, FragmentError, NotEnoughFragments, decode, encode
from agiledart.runtime.errors import CheckpointError, StoreFull
from agiledart.runtime.links import Address, Links

__all__ = [
    "CheckpointError",
    "FragmentStore",
    "Holder",
    "SaveReceipt",
    "Uplink",
    "fit_code",
    "forget",
    "holders_of",
    "load",
    "save",
]

log = logging.getLogger(__name__)

PAGE_BYTES = 8 << 20  #: fragment bytes per ``frag_get`` answer (frames carry 16 MiB)
THREAD_BYTES = 256 << 10  #: states larger than this are coded in a thread
CAPACITY_BYTES = 4 << 30  #: a store holds at most this much
DISK_SHARE = 0.5  #: ... and at most this share of its disk (its fragments + free space)
SWEEP_S = 300.0  #: how often a peer's store drops the fragments of apps that ended
_SUFFIX = ".frag"


@dataclass(frozen=True, slots=True)
class Holder:
    name: str
    address: Address


class Uplink:
    """A peer's emulated upload capacity (``bandwidth_mbit`` of the link model):
    transfers queue on it one after another, each taking bytes / rate seconds."""

    def __init__(self, bytes_per_s: float) -> None:
        if not bytes_per_s > 0:
            msg = f"an uplink needs a positive rate, got {bytes_per_s!r}"
            raise ValueError(msg)
        self.bytes_per_s = bytes_per_s
        self._free_at = 0.0

    async def send(self, n: int) -> None:
        loop = asyncio.get_running_loop()
        now = loop.time()
        self._free_at = max(now, self._free_at) + n / self.bytes_per_s
        await asyncio.sleep(self._free_at - now)


@dataclass(frozen=True, slots=True)
class SaveReceipt:
    holders: tuple[str, ...]  #: holder names, by fragment index
    bytes: int  #: the state's size
    stored_bytes: int  #: fragment bytes sent to the holders, all together
    seconds: float


Key = tuple[str, str, int]  #: app, instance, epoch


class FragmentStore:
    def __init__(
        self,
        root: Path,
        *,
        capacity_bytes: int = CAPACITY_BYTES,
        disk_share: float = DISK_SHARE,
        free_bytes: Callable[[Path], int] | None = None,
        uplink: Uplink | None = None,
    ) -> None:
        self.root = root
        self.capacity_bytes = capacity_bytes
        self.disk_share = disk_share
        #: the free bytes of the disk holding a folder (shutil.disk_usage's, by default)
        self.free_bytes = free_bytes or _free_bytes
        self.uplink = uplink  #: what serving fragments may send per second (emulation)
        self.used_bytes = 0
        #: (app, instance, epoch) -> {stripe: (path, size)}
        self._held: dict[Key, dict[int, tuple[Path, int]]] = {}
        self._scan()

    def handlers(self) -> dict[str, Callable[[dict[str, Any], ConnectionInfo], Any]]:
        return {
            "frag_put": self._put,
            "frag_get": self._get,
            "frag_drop": self._drop,
            "frag_held": self._list,
        }

    # -- on disk ------------------------------------------------------------------------

    def _path(self, app: str, instance: str, epoch: int, stripe: int, index: int) -> Path:
        """``<root>/<app hex>/<instance hex>-<epoch>-<stripe>-<index>.frag``: one folder
        per app, so storing a fragment makes no folder and dropping one removes a file
        (a folder per epoch cost ~1 ms of CPU a fragment here, with thousands of apps
        checkpointing)."""
        name = f"{instance.encode().hex()}-{epoch}-{stripe}-{index}{_SUFFIX}"
        return self.root / app.encode().hex() / name

    def _scan(self) -> None:
        if not self.root.is_dir():
            return
        for path in self.root.glob(f"*/*{_SUFFIX}"):
            try:
                app = bytes.fromhex(path.parent.name).decode()
                instance_hex, epoch, stripe, _ = path.stem.split("-")
                key = (app, bytes.fromhex(instance_hex).decode(), int(epoch))
                self._found(key, int(stripe), path)
            except (ValueError, UnicodeDecodeError, OSError):
                log.warning("ignoring a stray file in the fragment store: %s", path)
        for path in self.root.glob(f"*/*/*/*{_SUFFIX}"):  # a folder per epoch (earlier layout)
            try:
                epoch_dir = path.parent
                instance = bytes.fromhex(epoch_dir.parent.name).decode()
                app = bytes.fromhex(epoch_dir.parent.parent.name).decode()
                first = int(path.stem.split("-")[0])
                self._found((app, instance, int(epoch_dir.name)), first, path)
            except (ValueError, UnicodeDecodeError, OSError):
                log.warning("ignoring a stray file in the fragment store: %s", path)
        for pattern in ("*/*.tmp", "*/*/*/*.tmp"):
            for tmp in self.root.glob(pattern):
                with contextlib.suppress(OSError):
                    tmp.unlink()

    def _found(self, key: Key, stripe: int, path: Path) -> None:
        size = path.stat().st_size
        self._held.setdefault(key, {})[stripe] = (path, size)
        self.used_bytes += size

    def limit(self) -> int:
        """The bytes this store may hold now: ``capacity_bytes``, and no more than
        ``disk_share`` of its fragments and the disk's free space together."""
        try:
            free = self.free_bytes(self._existing())
        except OSError:
            free = 0
        return min(self.capacity_bytes, int(self.disk_share * (self.used_bytes + free)))

    def _existing(self) -> Path:
        """The store's folder or, before its first fragment, the nearest one above it."""
        path = self.root
        while not path.exists() and path.parent != path:
            path = path.parent
        return path

    def apps(self) -> list[str]:
        """The apps this store holds fragments of."""
        return sorted({app for app, _, _ in self._held})

    async def sweep(self, ended: Callable[[str], Awaitable[bool]]) -> list[str]:
        """Drop every fragment of each app held here that ``ended`` says has ended (an
        app whose end cannot be told is kept); the apps dropped."""
        dropped = []
        for app in self.apps():
            try:
                gone = await ended(app)
            except AgiledartError as exc:
                log.debug("cannot tell whether app %s ended: %s", app, exc)
                continue
            if gone:
                await self._remove_where(_of_app(app))
                dropped.append(app)
        if dropped:
            log.info("dropped the checkpoint fragments of ended apps: %s", ", ".join(dropped))
        return dropped

    async def sweep_loop(self, ended: Callable[[str], Awaitable[bool]], interval_s: float) -> None:
        """:meth:`sweep` every ``interval_s``, forever (the peer's task group owns it: a
        failing sweep is logged and tried again at the next, never the peer's end)."""
        while True:
            await asyncio.sleep(interval_s)
            try:
                await self.sweep(ended)
            except Exception:
                log.exception("sweeping the fragment store failed; trying again later")

    def held(self, app: str) -> dict[str, list[int]]:
        out: dict[str, list[int]] = {}
        for a, instance, epoch in self._held:
            if a == app:
                out.setdefault(instance, []).append(epoch)
        return {i: sorted(e) for i, e in out.items()}

    # -- handlers -----------------------------------------------------------------------

    async def _put(self, req: dict[str, Any], conn: ConnectionInfo) -> dict[str, Any]:
        data = req.get("f")
        if not isinstance(data, bytes):
            msg = "frag_put needs 'f': a fragment's bytes"
            raise MalformedError(msg)
        try:
            fragment = Fragment.from_bytes(data)
            fragment.verify()
        except FragmentError as exc:
            msg = f"refusing a fragment from {conn.peer_name}: {exc}"
            raise CheckpointError(msg) from None
        key = (fragment.app, fragment.instance, fragment.epoch)
        stripes = self._held.setdefault(key, {})
        if fragment.stripe in stripes:
            return {"stored": False}
        limit = self.limit()
        if self.used_bytes + len(data) > limit:
            if not stripes:
                del self._held[key]
            msg = (
                f"fragment store full: it holds {self.used_bytes} bytes and may hold {limit} "
                f"(the least of {self.capacity_bytes} and {self.disk_share:.0%} of its "
                "fragments and the free disk space together)"
            )
            raise StoreFull(msg)
        path = self._path(*key, fragment.stripe, fragment.index)
        self.used_bytes += len(data)
        stripes[fragment.stripe] = (path, len(data))
        try:
            await asyncio.to_thread(_write, path, data)
        except OSError as exc:
            del stripes[fragment.stripe]
            self.used_bytes -= len(data)
            msg = f"cannot store a fragment: {exc.strerror or exc}"
            raise CheckpointError(msg) from None
        return {"stored": True}

    async def _get(self, req: dict[str, Any], conn: ConnectionInfo) -> dict[str, Any]:
        app, instance, epoch = _checkpoint(req)
        start = req.get("from", 0)
        if type(start) is not int or start < 0:
            msg = "frag_get 'from' must be a stripe number"
            raise MalformedError(msg)
        stripes = self._held.get((app, instance, epoch))
        if not stripes:
            return {"fragments": [], "next": None, "held": False}
        out: list[bytes] = []
        size = 0
        order = sorted(s for s in stripes if s >= start)
        for n, stripe in enumerate(order):
            path, length = stripes[stripe]
            if out and size + length > PAGE_BYTES:
                if self.uplink is not None:
                    await self.uplink.send(size)
                return {"fragments": out, "next": order[n], "held": True}
            try:
                out.append(await asyncio.to_thread(path.read_bytes))
            except OSError as exc:
                log.warning("cannot read fragment %s: %s", path, exc)
                continue
            size += length
        if self.uplink is not None:
            await self.uplink.send(size)
        return {"fragments": out, "next": None, "held": True}

    async def _drop(self, req: dict[str, Any], conn: ConnectionInfo) -> dict[str, Any]:
        app = req.get("app")
        instance = req.get("instance")
        below = req.get("below")
        if not isinstance(app, str) or (instance is not None and not isinstance(instance, str)):
            msg = "frag_drop needs 'app' (and optionally 'instance') strings"
            raise MalformedError(msg)
        if below is not None and type(below) is not int:
            msg = "frag_drop 'below' must be an epoch number"
            raise MalformedError(msg)
        n = await self._remove_where(
            lambda key: (
                key[0] == app
                and (instance is None or key[1] == instance)
                and (below is None or key[2] < below)
            )
        )
        return {"dropped": n}

    async def _remove_where(self, doomed_if: Callable[[Key], bool]) -> int:
        """Remove the checkpoints whose key ``doomed_if`` picks; how many."""
        doomed = [key for key in self._held if doomed_if(key)]
        paths = []
        for key in doomed:
            stripes = self._held.pop(key)
            self.used_bytes -= sum(size for _, size in stripes.values())
            paths += [path for path, _ in stripes.values()]
        if paths:
            folders: set[Path] = set()
            for path in paths:  # the app's folder; an epoch's of the older layout too
                folders |= {self.root / p for p in path.relative_to(self.root).parents[:-1]}
            await asyncio.to_thread(_remove, paths, folders)
        return len(doomed)

    async def _list(self, req: dict[str, Any], conn: ConnectionInfo) -> dict[str, Any]:
        app = req.get("app")
        if not isinstance(app, str):
            msg = "frag_held needs 'app'"
            raise MalformedError(msg)
        return {"held": self.held(app), "used_bytes": self.used_bytes}


def _of_app(app: str) -> Callable[[Key], bool]:
    return lambda key: key[0] == app


def _free_bytes(path: Path) -> int:
    return shutil.disk_usage(path).free


def _write(path: Path, data: bytes) -> None:
    for _ in range(3):
        try:
            return _write_file(path, data)
        except FileNotFoundError:  # the app's first fragment here (or its folder, empty,
            path.parent.mkdir(parents=True, exist_ok=True)  # was just removed)
    _write_file(path, data)


def _write_file(path: Path, data: bytes) -> None:
    tmp = path.with_suffix(".tmp")
    with tmp.open("wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    tmp.replace(path)
    fsync_dir(path.parent)  # the rename itself survives a power cut


def _remove(paths: Sequence[Path], folders: set[Path]) -> None:
    """Delete fragment files, then those of ``folders`` they left empty, deepest
    first (a folder still in use is refused and stays)."""
    for path in paths:
        with contextlib.suppress(OSError):
            path.unlink()
    for folder in sorted(folders, key=lambda f: len(f.parts), reverse=True):
        with contextlib.suppress(OSError):
            folder.rmdir()


def _checkpoint(req: Mapping[str, Any]) -> Key:
    app, instance, epoch = req.get("app"), req.get("instance"), req.get("epoch")
    if not isinstance(app, str) or not isinstance(instance, str) or type(epoch) is not int:
        msg = "this request needs 'app', 'instance' strings and an integer 'epoch'"
        raise MalformedError(msg)
    return app, instance, epoch


# -- the client side --------------------------------------------------------------------


def fit_code(m: int, k: int, holders: int) -> tuple[int, int] | None:
    """The (m, k) to checkpoint with when only ``holders`` peers can hold fragments.

    As asked when there are enough. Otherwise the tolerance ``k`` is kept (up to
    ``holders - 1``) and the data fragments ``m`` lowered to fit, since losing a
    holder is what the checkpoint is for: 4 holders turn the default (3, 2) into
    (2, 2). One holder gives (1, 0), a copy that survives this peer's death but no
    other; none gives None (nothing can be stored)."""
    if m + k <= holders:
        return m, k
    if holders < 1:
        return None
    k = min(k, holders - 1)
    return max(1, min(m, holders - k)), k


async def forget(
    links: Links, holders: Iterable[Address], app: str, *, timeout: float = 10.0
) -> None:
    """Ask every holder to drop all it holds of ``app`` (an app that ended). A holder
    that does not answer is logged: its own sweep collects the fragments later."""

    async def drop(address: Address) -> None:
        try:
            await links.request(address, "frag_drop", {"app": app}, timeout=timeout)
        except (OverlayError, AgiledartError) as exc:
            log.debug("holder %s:%d did not drop %s's fragments: %s", *address, app, exc)

    await asyncio.gather(*(drop(a) for a in set(holders)))


def holders_of(checkpoint: Mapping[str, Any] | None) -> set[Address]:
    """The addresses of the holders of a committed checkpoint (an app record's): of
    its operators' states and of what its network sinks held."""
    if not checkpoint:
        return set()
    sinks = checkpoint.get("sinks", {}).values()
    kept = [c["state"] for c in sinks if isinstance(c, dict) and "state" in c]  # network sinks'
    return {
        (str(a[0]), int(a[1]))
        for entry in [*checkpoint.get("states", []), *kept]
        for _, a in entry.get("holders", [])
    }


async def save(
    links: Links,
    holders: Sequence[Holder],
    state: bytes,
    *,
    app: str,
    instance: str,
    epoch: int,
    m: int,
    k: int,
    timeout: float = 60.0,
    uplink: Uplink | None = None,
) -> SaveReceipt:
    """Encode ``state`` into n = m + k fragments and store fragment i on holder i
    (through ``uplink``, when the sender's upload rate is emulated)."""
    started = time.monotonic()
    if len(holders) != m + k:
        msg = f"a checkpoint with m={m}, k={k} needs {m + k} holders, got {len(holders)}"
        raise CheckpointError(msg)

    def code() -> list[Fragment]:
        return encode(state, m=m, k=k, app=app, instance=instance, epoch=epoch)

    fragments = await asyncio.to_thread(code) if len(state) > THREAD_BYTES else code()
    by_index: dict[int, list[bytes]] = {}
    for fragment in fragments:
        by_index.setdefault(fragment.index, []).append(fragment.to_bytes())

    async def put(i: int, holder: Holder) -> None:
        try:
            for data in by_index.get(i, []):
                if uplink is not None:
                    await uplink.send(len(data))
                await links.request(holder.address, "frag_put", {"f": data}, timeout=timeout)
        except (OverlayError, AgiledartError) as exc:
            msg = f"holder {holder.name} did not store fragment {i}: {exc}"
            raise CheckpointError(msg) from None

    results = await asyncio.gather(
        *(put(i, h) for i, h in enumerate(holders)), return_exceptions=True
    )
    failed = [r for r in results if isinstance(r, BaseException)]
    if failed:
        raise CheckpointError("; ".join(str(e) for e in failed))
    return SaveReceipt(
        holders=tuple(h.name for h in holders),
        bytes=len(state),
        stored_bytes=sum(len(d) for ds in by_index.values() for d in ds),
        seconds=time.monotonic() - started,
    )


async def load(
    links: Links,
    holders: Sequence[Holder],
    *,
    app: str,
    instance: str,
    epoch: int,
    m: int,
    timeout: float = 60.0,
) -> bytes:
    """The state rebuilt from m holders fetched in parallel, spares used as needed.

    ``holders`` are in fragment-index order (as :func:`save` was given them). Raises
    :class:`CheckpointError` when fewer than m holders hand back intact fragments.
    """
    body = {"app": app, "instance": instance, "epoch": epoch}

    async def fetch(holder: Holder) -> list[Fragment]:
        out: list[Fragment] = []
        start: int | None = 0
        while start is not None:
            reply = await links.request(
                holder.address, "frag_get", {**body, "from": start}, timeout=timeout
            )
            for data in reply.get("fragments", []):
                with contextlib.suppress(FragmentError):
                    out.append(Fragment.from_bytes(data))
            start = reply.get("next")
        return out

    fragments: list[Fragment] = []
    problems: list[str] = []
    queue = list(holders)
    want = m
    while want > 0 and queue:
        batch, queue = queue[:want], queue[want:]
        results = await asyncio.gather(*(fetch(h) for h in batch), return_exceptions=True)
        for holder, result in zip(batch, results, strict=True):
            if isinstance(result, BaseException):
                problems.append(f"{holder.name}: {result}")
            elif not result:
                problems.append(f"{holder.name}: holds nothing of epoch {epoch}")
            else:
                fragments.extend(result)
        want = m - _intact_indices(fragments)
        if want <= 0:
            try:
                return await asyncio.to_thread(decode, fragments)
            except NotEnoughFragments as exc:  # a corrupt block: ask a spare
                problems.append(str(exc))
                want = 1
    detail = "; ".join(problems) or "no holders"
    msg = f"cannot rebuild {instance} of {app} at epoch {epoch}: {detail}"
    raise CheckpointError(msg)


def _intact_indices(fragments: Sequence[Fragment]) -> int:
    """Fewest distinct fragment indices any stripe has (checked digests come later)."""
    by_stripe: dict[int, set[int]] = {}
    last = 0
    for fragment in fragments:
        by_stripe.setdefault(fragment.stripe, set()).add(fragment.index)
        if fragment.last:
            last = max(last, fragment.stripe)
    if not by_stripe:
        return 0
    return min(len(by_stripe.get(s, ())) for s in range(last + 1))
