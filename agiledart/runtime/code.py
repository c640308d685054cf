"""Registered code (Pluto, DESIGN §3 step 1): Python modules stored by their sha256.

``agiledart register bundle.py`` sends the module's source to a peer, which compiles
it (a syntax error is reported, nothing stored), computes the *code id* (sha256 of
the source bytes) and stores the source in the records store under ``code:<id>``.
Registering the same source again yields the same id and the same record: it is
stored once.

Peers fetch code on demand when an app that references ``<code_id>:<function>`` is
validated or deployed, check the digest, and cache it in ``<state-dir>/code/<id>.py``
and in memory as a loaded module. :meth:`CodeStore.resolver` turns references into
callables for the executor (built-ins first, then registered code).
"""

from __future__ import annotations

import hashlib
import re
import types
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from agiledart.app.functions import BUILTIN_PREFIX, Resolver, builtin_resolver
from agiledart.runtime.errors import CodeError
from agiledart.runtime.records import Records, record_key

__all__ = ["MAX_CODE_BYTES", "CodeStore", "code_id_of", "code_ids_in"]

MAX_CODE_BYTES = 1 << 20
_ID_RE = re.compile(r"^[0-9a-f]{64}$")


def code_id_of(source: bytes) -> str:
    return hashlib.sha256(source).hexdigest()


def code_ids_in(fn_refs: Iterable[str | None]) -> set[str]:
    """The registered code ids among ``fn`` references (built-ins excluded)."""
    out = set()
    for ref in fn_refs:
        if ref and ":" in ref:
            prefix = ref.split(":", 1)[0]
            if prefix != BUILTIN_PREFIX:
                out.add(prefix)
    return out


class CodeStore:
    def __init__(self, records: Records | None, cache_dir: Path) -> None:
        self.records = records
        self.cache_dir = cache_dir
        self._modules: dict[str, types.ModuleType] = {}

    def compile(self, source: bytes, name: str = "bundle.py") -> str:
        """Check ``source`` loads as a module; its code id."""
        if len(source) > MAX_CODE_BYTES:
            msg = f"{name} is {len(source)} bytes; registered code is at most {MAX_CODE_BYTES}"
            raise CodeError(msg)
        code_id = code_id_of(source)
        self._load(code_id, source, name)
        return code_id

    async def register(self, source: bytes, name: str = "bundle.py") -> str:
        code_id = self.compile(source, name)
        self._cache(code_id, source)
        if self.records is not None:
            await self.records.put(record_key("code", code_id), {"source": source, "name": name})
        return code_id

    async def fetch(self, code_ids: Iterable[str]) -> None:
        """Make every id in ``code_ids`` loadable here (CodeError names a missing one)."""
        for code_id in sorted(set(code_ids)):
            if code_id in self._modules:
                continue
            if not _ID_RE.match(code_id):
                msg = f"{code_id!r} is not a code id (64 hex digits from `agiledart register`)"
                raise CodeError(msg)
            path = self.cache_dir / f"{code_id}.py"
            source = path.read_bytes() if path.is_file() else None
            name = "bundle.py"
            if source is None and self.records is not None:
                record = await self.records.get(record_key("code", code_id))
                if isinstance(record, dict) and isinstance(record.get("source"), bytes):
                    source, name = record["source"], str(record.get("name", name))
            if source is None:
                msg = f"code {code_id[:12]}... is not registered (run `agiledart register`)"
                raise CodeError(msg)
            if code_id_of(source) != code_id:
                msg = f"code {code_id[:12]}... fetched with a wrong digest; refusing it"
                raise CodeError(msg)
            self._load(code_id, source, name)
            self._cache(code_id, source)

    def function(self, code_id: str, name: str) -> Callable[..., Any]:
        module = self._modules.get(code_id)
        if module is None:
            msg = f"code {code_id[:12]}... is not loaded here"
            raise CodeError(msg)
        fn = getattr(module, name, None)
        if not callable(fn):
            defined = sorted(
                n for n, v in vars(module).items() if callable(v) and not n.startswith("_")
            )
            msg = (
                f"registered code {code_id[:12]}... has no function {name!r}; it defines: "
                f"{', '.join(defined) or 'nothing callable'}"
            )
            raise CodeError(msg)
        return fn  # type: ignore[no-any-return]

    def resolver(self) -> Resolver:
        def registered(ref: str) -> Callable[..., Any]:
            code_id, _, name = ref.partition(":")
            return self.function(code_id, name)

        return builtin_resolver(registered)

    def _load(self, code_id: str, source: bytes, name: str) -> None:
        if code_id in self._modules:
            return
        module = types.ModuleType(f"agiledart_code_{code_id[:16]}")
        module.__file__ = f"<registered {name} {code_id[:12]}>"
        try:
            exec(compile(source, module.__file__, "exec"), module.__dict__)
        except (Exception, SystemExit, KeyboardInterrupt) as exc:  # not the peer's exit
            msg = f"{name} does not load: {type(exc).__name__}: {exc}"
            raise CodeError(msg) from exc
        self._modules[code_id] = module

    def _cache(self, code_id: str, source: bytes) -> None:
        path = self.cache_dir / f"{code_id}.py"
        if not path.exists():
            self.cache_dir.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp")
            tmp.write_bytes(source)
            tmp.replace(path)
