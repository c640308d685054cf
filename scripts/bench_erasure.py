#!/usr/bin/env python3
"""Benchmark of the erasure codec behind checkpoints (paper §IV-D, Fig. 11(b)-(c)).

For each state size (``--sizes``, default 1, 16 and 64 MiB of seeded random bytes) and
code (``--m`` 4, ``--k`` 2, 1 MiB blocks), the best of ``--repeats`` runs of:

* ``encode``: :func:`agiledart.recovery.encode`, state -> n fragments per stripe,
  digests included (the state's running sha256 and one per fragment).
* ``decode``: :func:`agiledart.recovery.decode` from the m fragments of highest index
  of each stripe, so k data blocks are rebuilt from parity (zfec's slow path), every
  fragment verified; ``decode_data``: from the m data fragments (no arithmetic).
* ``wire``: ``Fragment.to_bytes`` then ``Fragment.from_bytes`` of all n fragments.

Anchors measured side by side in the same run: ``sha256_mb_s``, the hash alone, from
which ``digest_share_encode`` and ``_decode`` give the part of each figure spent on
digests ((1 + n/m)·B hashed by encode, 2·B by decode); and replication with the same
tolerance (k + 1 full copies, m = 1: digests and copies, no coding) as
``replicate_encode_mb_s``, at storage cost (k + 1)x against (m + k)/m x.

MB/s are state bytes (MiB) per second. ``encode_mb_s`` and ``decode_mb_s`` at top level
are over all sizes together (total MiB / total best seconds). Human-readable lines
first; with ``--json`` the last line is one JSON object.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import platform
import random
import sys
import time
from collections.abc import Callable
from typing import Any

from agiledart.recovery import Fragment, decode, encode, replicate

MIB = 1024 * 1024
IDS: dict[str, Any] = {"app": "bench", "instance": "op#0", "epoch": 1}


def best_seconds(repeats: int, run: Callable[[], object]) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return min(times)


def wire_round_trip(fragments: list[Fragment]) -> None:
    for fragment in fragments:
        Fragment.from_bytes(fragment.to_bytes())


def measure(size_mib: int, m: int, k: int, repeats: int, seed: int) -> dict[str, Any]:
    state = random.Random(seed).randbytes(size_mib * MIB)
    fragments = encode(state, m=m, k=k, **IDS)
    parity_heavy = [f for f in fragments if f.index >= k]
    data_only = [f for f in fragments if f.index < m]
    assert decode(parity_heavy) == state
    assert decode(data_only) == state

    mb = float(size_mib)
    n = m + k
    seconds = {
        "encode": best_seconds(repeats, lambda: encode(state, m=m, k=k, **IDS)),
        "decode": best_seconds(repeats, lambda: decode(parity_heavy)),
        "decode_data": best_seconds(repeats, lambda: decode(data_only)),
        "wire": best_seconds(repeats, lambda: wire_round_trip(fragments)),
        "sha256": best_seconds(repeats, lambda: hashlib.sha256(state).digest()),
        "replicate_encode": best_seconds(repeats, lambda: replicate(state, copies=k + 1, **IDS)),
    }
    row: dict[str, Any] = {"size_mib": size_mib, "fragments": len(fragments)}
    row |= {f"{name}_mb_s": round(mb / s, 1) for name, s in seconds.items()}
    row["digest_share_encode"] = round((1 + n / m) * seconds["sha256"] / seconds["encode"], 3)
    row["digest_share_decode"] = round(2 * seconds["sha256"] / seconds["decode"], 3)
    row["seconds"] = {name: round(s, 4) for name, s in seconds.items()}
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else "")
    parser.add_argument("--sizes", type=int, nargs="+", default=[1, 16, 64], metavar="MIB")
    parser.add_argument("--m", type=int, default=4)
    parser.add_argument("--k", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--json", action="store_true", help="print one JSON object last")
    args = parser.parse_args(argv)

    rows = []
    for size in args.sizes:
        row = measure(size, args.m, args.k, args.repeats, args.seed)
        rows.append(row)
        print(
            f"{size:4d} MiB  m={args.m} k={args.k}  encode {row['encode_mb_s']:7.1f} MB/s  "
            f"decode {row['decode_mb_s']:7.1f} (data only {row['decode_data_mb_s']:7.1f})  "
            f"wire {row['wire_mb_s']:7.1f}  sha256 {row['sha256_mb_s']:7.1f}  "
            f"replicate x{args.k + 1} {row['replicate_encode_mb_s']:7.1f}  "
            f"digest share enc {row['digest_share_encode']:.0%} "
            f"dec {row['digest_share_decode']:.0%}",
            file=sys.stderr if args.json else sys.stdout,
        )
    total_mb = float(sum(args.sizes))

    def overall(name: str) -> float:
        return round(total_mb / float(sum(r["seconds"][name] for r in rows)), 1)

    summary = {
        "benchmark": "erasure",
        "m": args.m,
        "k": args.k,
        "block_size": MIB,
        "repeats": args.repeats,
        "encode_mb_s": overall("encode"),
        "decode_mb_s": overall("decode"),
        "decode_data_mb_s": overall("decode_data"),
        "sha256_mb_s": overall("sha256"),
        "replicate_encode_mb_s": overall("replicate_encode"),
        "storage_overhead": round((args.m + args.k) / args.m, 3),
        "replication_storage_overhead": float(args.k + 1),
        "sizes": rows,
        "python": platform.python_version(),
        "machine": platform.machine(),
    }
    if args.json:
        print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
