"""Registered code (Pluto stage 1; docs/apps.md): bundles stored by their sha256.

A *bundle* is a Python module (one ``.py`` file) or a small package (a directory with
an ``__init__.py``). Its *content* is the module's source, or for a package a canonical
msgpack archive of its files (sorted paths, no timestamps), so the same files always
give the same bytes; the *code id* is the sha256 of the content. Apps name functions
as ``<code_id>:<function>`` (a package's functions are those its ``__init__`` defines).

Storage, in the records store (the DHT):

* the content in chunks of :data:`CHUNK_BYTES`, each under ``chunk:<sha256 of the
  chunk>`` (content-addressed: bundles that share a chunk share its record);
* a manifest under ``code:<code_id>``: kind, name, size and the chunk digests, written
  after the chunks, so a manifest that can be read has all its chunks.

Registering checks that the bundle loads (a syntax error is reported, nothing is
stored) and then looks for the manifest: the same bytes registered again return the
same id and store nothing new. A peer fetches a bundle the first time an app needs it
(submission or deployment): manifest, then every chunk in parallel, each digest
checked, then the whole; a missing or corrupt bundle is a :class:`CodeError` naming the
code id, which fails the submission. The content is cached in
``<state-dir>/code/<id>.bundle`` (checked again when read back) and loaded once per
peer: every query using the bundle shares one code object in memory. Parameters are
bound per query at build time (``params:`` in the spec, ``--set``), so one bundle
serves many queries.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import importlib.util
import logging
import os
import re
import sys
import types
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

import msgpack

from agiledart.app.functions import BUILTIN_PREFIX, Resolver, builtin_resolver
from agiledart.overlay.files import atomic_write
from agiledart.runtime.errors import CodeError
from agiledart.runtime.records import Records, record_key

log = logging.getLogger(__name__)

__all__ = [
    "CHUNK_BYTES",
    "MAX_CODE_BYTES",
    "Bundle",
    "CodeStore",
    "code_id_of",
    "code_ids_in",
    "identifier",
]

MAX_CODE_BYTES = 8 << 20  #: a bundle's content, at most
MAX_FILES = 256  #: files in a package bundle, at most
CHUNK_BYTES = 256 << 10
_ID_RE = re.compile(r"^[0-9a-f]{64}$")
_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")
_ARCHIVE_MAGIC = "agiledart-bundle"
_ARCHIVE_VERSION = 1


def code_id_of(content: bytes) -> str:
    return hashlib.sha256(content).hexdigest()


def code_ids_in(fn_refs: Iterable[str | None]) -> set[str]:
    """The registered code ids among ``fn`` references (built-ins excluded)."""
    out = set()
    for ref in fn_refs:
        if ref and ":" in ref:
            prefix = ref.split(":", 1)[0]
            if prefix != BUILTIN_PREFIX:
                out.add(prefix)
    return out


@dataclass(frozen=True, slots=True)
class Bundle:
    """A module or a package, as files; :attr:`content` and :attr:`code_id` are canonical."""

    kind: str  #: "module" or "package"
    name: str  #: the module or package name
    files: tuple[tuple[str, bytes], ...]  #: (relative posix path, bytes), sorted

    def __post_init__(self) -> None:
        if self.kind not in ("module", "package"):
            msg = f"a bundle is a module or a package, not {self.kind!r}"
            raise CodeError(msg)
        if not _NAME_RE.match(self.name):
            msg = f"bundle name must be a Python identifier, got {self.name!r}"
            raise CodeError(msg)
        if self.kind == "module" and len(self.files) != 1:
            msg = "a module bundle is exactly one file"
            raise CodeError(msg)
        if self.kind == "package":
            if not self.files or len(self.files) > MAX_FILES:
                msg = f"a package bundle has 1 to {MAX_FILES} files, got {len(self.files)}"
                raise CodeError(msg)
            paths = [p for p, _ in self.files]
            for p in paths:
                _check_path(p)
            if "__init__.py" not in paths:
                msg = f"package {self.name!r} has no __init__.py"
                raise CodeError(msg)
            if paths != sorted(set(paths)):
                msg = "package files must be sorted and unique"
                raise CodeError(msg)
        size = sum(len(b) for _, b in self.files)
        if size > MAX_CODE_BYTES:
            msg = f"bundle {self.name!r} is {size} bytes; the limit is {MAX_CODE_BYTES}"
            raise CodeError(msg)

    @classmethod
    def module(cls, source: bytes, name: str = "bundle") -> Bundle:
        return cls("module", name, ((f"{name}.py", source),))

    @classmethod
    def package(cls, name: str, files: Mapping[str, bytes]) -> Bundle:
        return cls("package", name, tuple(sorted(files.items())))

    @classmethod
    def from_path(cls, path: Path) -> Bundle:
        """A ``.py`` file (a module) or a directory with ``__init__.py`` (a package);
        ``__pycache__`` and hidden files are left out."""
        if path.is_file():
            return cls.module(path.read_bytes(), identifier(path.stem))
        if not path.is_dir():
            msg = f"{path} is neither a .py file nor a package directory"
            raise CodeError(msg)
        files: dict[str, bytes] = {}
        for f in sorted(path.rglob("*")):
            rel = f.relative_to(path)
            if f.is_file() and not any(
                part.startswith(".") or part == "__pycache__" for part in rel.parts
            ):
                files[rel.as_posix()] = f.read_bytes()
        return cls.package(identifier(path.name), files)

    @classmethod
    def from_content(cls, kind: str, name: str, content: bytes) -> Bundle:
        """The inverse of :attr:`content` (CodeError if it is not a bundle)."""
        if kind == "module":
            return cls.module(content, name)
        try:
            magic, version, arch_name, files = msgpack.unpackb(content, raw=False)
            if magic != _ARCHIVE_MAGIC or version != _ARCHIVE_VERSION or arch_name != name:
                raise ValueError("not a bundle archive")  # noqa: EM101
            pairs = tuple((str(p), bytes(b)) for p, b in files)
        except (ValueError, TypeError, msgpack.UnpackException) as exc:
            msg = f"bundle {name!r}: corrupt archive ({exc})"
            raise CodeError(msg) from None
        return cls("package", name, pairs)

    @property
    def content(self) -> bytes:
        if self.kind == "module":
            return self.files[0][1]
        packed: bytes = msgpack.packb(
            [_ARCHIVE_MAGIC, _ARCHIVE_VERSION, self.name, [list(f) for f in self.files]],
            use_bin_type=True,
        )
        return packed

    @property
    def code_id(self) -> str:
        return code_id_of(self.content)


def identifier(stem: str) -> str:
    """A file or directory name made a Python identifier (``my-tools`` -> ``my_tools``)."""
    name = re.sub(r"\W", "_", stem)
    return name if name and not name[0].isdigit() else f"_{name}"


def _check_path(p: str) -> None:
    pure = PurePosixPath(p)
    if pure.is_absolute() or ".." in pure.parts or not p or "\\" in p or "\0" in p:
        msg = f"bundle file path {p!r} must be relative and stay inside the package"
        raise CodeError(msg)


class CodeStore:
    def __init__(self, records: Records | None, cache_dir: Path) -> None:
        self.records = records
        self.cache_dir = cache_dir
        self._modules: dict[str, types.ModuleType] = {}
        self._fetching: dict[str, asyncio.Lock] = {}

    def compile(self, source: bytes, name: str = "bundle.py") -> str:
        """Check a module's ``source`` loads; its code id."""
        bundle = Bundle.module(source, identifier(Path(name).stem))
        self._load(bundle.code_id, bundle)
        return bundle.code_id

    async def register(self, source: bytes, name: str = "bundle.py") -> str:
        """Register one module's source; its code id."""
        return (await self.register_bundle(Bundle.module(source, identifier(Path(name).stem))))[0]

    async def register_bundle(self, bundle: Bundle) -> tuple[str, bool]:
        """``(code id, whether anything new was stored)``; the bundle must load."""
        code_id = bundle.code_id
        self._load(code_id, bundle)
        content = bundle.content
        self._cache(code_id, bundle.kind, bundle.name, content)
        return code_id, await self._store(code_id, bundle.kind, bundle.name, content)

    async def offer_cached(self) -> int:
        """Store every bundle of the disk cache whose manifest the records store lacks
        (its holders all restarted without it); how many were stored. Nothing is loaded:
        the bundles were checked when first cached, and their digests are checked again."""
        stored = 0
        for path in sorted(self.cache_dir.glob("*.bundle")):
            code_id = path.stem
            if not _ID_RE.match(code_id):
                continue
            try:
                bundle = self._cached(code_id)
            except CodeError as exc:
                log.warning("not offering a cached bundle: %s", exc)
                continue
            if bundle is not None and await self._store(
                code_id, bundle.kind, bundle.name, bundle.content
            ):
                stored += 1
        return stored

    async def _store(self, code_id: str, kind: str, name: str, content: bytes) -> bool:
        """Chunks, then the manifest, unless the manifest is there; whether stored."""
        if self.records is None:
            return False
        manifest_key = record_key("code", code_id)
        if await self.records.get(manifest_key) is not None:
            return False
        chunks = [content[i : i + CHUNK_BYTES] for i in range(0, len(content), CHUNK_BYTES)]
        digests = [hashlib.sha256(c).hexdigest() for c in chunks]
        await asyncio.gather(
            *(
                self.records.put(record_key("chunk", d), c)
                for d, c in zip(digests, chunks, strict=True)
            )
        )
        manifest = {"kind": kind, "name": name, "size": len(content), "chunks": digests}
        await self.records.put(manifest_key, manifest)
        return True

    async def fetch(self, code_ids: Iterable[str]) -> None:
        """Make every id in ``code_ids`` loadable here (CodeError names a bad one)."""
        for code_id in sorted(set(code_ids)):
            if code_id in self._modules:
                continue
            if not _ID_RE.match(code_id):
                msg = f"{code_id!r} is not a code id (64 hex digits from `agiledart register`)"
                raise CodeError(msg)
            async with self._fetching.setdefault(code_id, asyncio.Lock()):
                if code_id not in self._modules:
                    bundle = self._cached(code_id) or await self._download(code_id)
                    self._load(code_id, bundle)
                    self._cache(code_id, bundle.kind, bundle.name, bundle.content)

    async def _download(self, code_id: str) -> Bundle:
        short = f"code {code_id[:12]}..."
        manifest = None
        if self.records is not None:
            manifest = await self.records.get(record_key("code", code_id))
        if manifest is None:
            msg = f"{short} is not registered (run `agiledart register`)"
            raise CodeError(msg, code_id=code_id)
        try:
            kind, name = str(manifest["kind"]), str(manifest["name"])
            digests = [str(d) for d in manifest["chunks"]]
            size = int(manifest["size"])
        except (KeyError, TypeError, ValueError) as exc:
            msg = f"{short} has a corrupt manifest ({type(exc).__name__})"
            raise CodeError(msg, code_id=code_id) from None
        assert self.records is not None
        chunks = await asyncio.gather(*(self.records.get(record_key("chunk", d)) for d in digests))
        for d, chunk in zip(digests, chunks, strict=True):
            if not isinstance(chunk, bytes) or hashlib.sha256(chunk).hexdigest() != d:
                what = "missing" if chunk is None else "corrupt"
                msg = f"{short}: chunk {d[:12]}... is {what}; the bundle cannot be used"
                raise CodeError(msg, code_id=code_id)
        content = b"".join(chunks)
        if len(content) != size or code_id_of(content) != code_id:
            msg = f"{short} fetched with a wrong digest; refusing it"
            raise CodeError(msg, code_id=code_id)
        return Bundle.from_content(kind, name, content)

    def load_cached(self, code_ids: Iterable[str]) -> None:
        """Load bundles from the disk cache only (a worker process: its peer fetched them)."""
        for code_id in sorted(set(code_ids)):
            if code_id in self._modules:
                continue
            bundle = self._cached(code_id)
            if bundle is None:
                msg = f"code {code_id[:12]}... is not in the cache {self.cache_dir}"
                raise CodeError(msg, code_id=code_id)
            self._load(code_id, bundle)

    def function(self, code_id: str, name: str) -> Callable[..., Any]:
        module = self._modules.get(code_id)
        if module is None:
            msg = f"code {code_id[:12]}... is not loaded here"
            raise CodeError(msg, code_id=code_id)
        fn = getattr(module, name, None)
        if not callable(fn):
            defined = sorted(
                n
                for n, v in vars(module).items()
                if callable(v) and not n.startswith("_") and _defined_in(v, module)
            )
            msg = (
                f"registered code {code_id[:12]}... has no function {name!r}; it defines: "
                f"{', '.join(defined) or 'nothing callable'}"
            )
            raise CodeError(msg, code_id=code_id)
        return fn  # type: ignore[no-any-return]

    def resolver(self) -> Resolver:
        def registered(ref: str) -> Callable[..., Any]:
            code_id, _, name = ref.partition(":")
            return self.function(code_id, name)

        return builtin_resolver(registered)

    @property
    def loaded(self) -> int:
        """Bundles loaded in this process (one code object each, shared by all queries)."""
        return len(self._modules)

    # -- loading and the disk cache ---------------------------------------------------

    def _load(self, code_id: str, bundle: Bundle) -> None:
        if code_id in self._modules:
            return
        unique = f"agiledart_code_{code_id[:16]}"
        try:
            if bundle.kind == "module":
                module = types.ModuleType(unique)
                module.__file__ = f"<registered {bundle.name}.py {code_id[:12]}>"
                exec(compile(bundle.files[0][1], module.__file__, "exec"), module.__dict__)
            else:
                module = self._import_package(code_id, unique, bundle)
        except CodeError:
            raise
        except (Exception, SystemExit, KeyboardInterrupt) as exc:  # not the peer's exit
            sys.modules.pop(unique, None)
            what = f"{bundle.name}.py" if bundle.kind == "module" else f"package {bundle.name}"
            msg = f"{what} does not load: {type(exc).__name__}: {exc}"
            raise CodeError(msg) from exc
        self._modules[code_id] = module

    def _import_package(self, code_id: str, unique: str, bundle: Bundle) -> types.ModuleType:
        """Unpack under the cache and import as ``unique`` (relative imports work)."""
        root = self.cache_dir / f"{code_id}.pkg"
        for rel, data in bundle.files:  # idempotent: worker processes unpack it too
            path = root / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            with contextlib.suppress(OSError):
                if path.read_bytes() == data:
                    continue
            tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
            tmp.write_bytes(data)
            tmp.replace(path)
        spec = importlib.util.spec_from_file_location(
            unique, root / "__init__.py", submodule_search_locations=[str(root)]
        )
        if spec is None or spec.loader is None:
            msg = f"package {bundle.name!r} cannot be imported"
            raise CodeError(msg)
        module = importlib.util.module_from_spec(spec)
        sys.modules[unique] = module
        spec.loader.exec_module(module)
        return module

    def _cached(self, code_id: str) -> Bundle | None:
        path = self.cache_dir / f"{code_id}.bundle"
        try:
            kind, name, content = msgpack.unpackb(path.read_bytes(), raw=False)
        except (OSError, ValueError, TypeError, msgpack.UnpackException):
            return None
        if not isinstance(content, bytes) or code_id_of(content) != code_id:
            msg = f"code {code_id[:12]}...: the cached copy in {path} is corrupt; delete it"
            raise CodeError(msg)
        return Bundle.from_content(str(kind), str(name), content)

    def _cache(self, code_id: str, kind: str, name: str, content: bytes) -> None:
        path = self.cache_dir / f"{code_id}.bundle"
        if not path.exists():
            self.cache_dir.mkdir(parents=True, exist_ok=True)
            atomic_write(path, msgpack.packb([kind, name, content], use_bin_type=True))


def _defined_in(value: Any, module: Any) -> bool:
    """Whether ``value`` comes from the bundle itself (its module or a submodule of its
    package), not from an import such as ``from agiledart.app import factory``."""
    origin = getattr(value, "__module__", None)
    name = module.__name__
    return isinstance(origin, str) and (origin == name or origin.startswith(name + "."))
