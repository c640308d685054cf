"""Held acknowledgements (agiledart.runtime.mqtt.acks): which packet ids are
acknowledged when, and which redeliveries of a resumed session are duplicates."""

from __future__ import annotations

from pathlib import Path

from agiledart.runtime.mqtt.acks import HeldAcks, expand, read_acks, replay_ids, runs


def test_runs_compress_a_session_s_numbering_and_expand_back() -> None:
    ids = [65533, 65534, 65535, 1, 2, 0, 0, 7, 9]
    assert runs(ids) == [[65533, 5], [0, 2], [7, 1], [9, 1]]
    assert list(expand(runs(ids))) == ids


def test_ids_are_acknowledged_once_their_positions_are_done(tmp_path: Path) -> None:
    acks = HeldAcks(tmp_path, committed=0, done=0)
    acks.logged(0, [11, 12, 0, 13])  # position 2 came with QoS 0
    acks.logged(4, [14])
    assert acks.release(3) == [11, 12]
    assert acks.release(3) == []
    assert acks.release(5) == [13, 14]


def test_a_resumed_session_s_redeliveries_of_logged_messages_are_dropped(tmp_path: Path) -> None:
    acks = HeldAcks(tmp_path, committed=0, done=0)
    acks.logged(0, [1, 2, 3, 4])
    assert acks.release(2) == [1, 2]  # sent; the connection drops before they arrive
    acks.new_session()
    # the broker redelivers all four (DUP), in order: each matches its position
    assert [acks.redelivered(p) for p in (1, 2, 3, 4)] == [0, 1, 2, 3]
    assert acks.hold(0, 1) == [1]  # done already: acknowledged at once
    assert acks.hold(2, 3) == []  # acknowledged when position 2 is done
    assert acks.redelivered(9) is None  # not logged: a message to log
    assert acks.redelivered(4) is None  # the matching is over for this session


def test_a_redelivery_out_of_sequence_ends_the_matching(tmp_path: Path) -> None:
    acks = HeldAcks(tmp_path, committed=0, done=0)
    acks.logged(0, [5, 6, 7])
    acks.new_session()
    assert acks.redelivered(6) == 1
    assert acks.redelivered(5) is None
    acks.new_session()
    acks.fresh()  # a new message first: nothing after it is a redelivery
    assert acks.redelivered(5) is None


def test_the_ids_outlive_the_process_and_a_checkpoint_carries_them_to_another_peer(
    tmp_path: Path,
) -> None:
    here, there = tmp_path / "here", tmp_path / "there"
    here.mkdir()
    acks = HeldAcks(here, committed=0, done=0)
    acks.logged(0, [100, 101, 102, 103, 104])
    acks.release(2)  # epoch at 2 committed: ids from 0 on are kept (acks may be lost)
    assert read_acks(here) == (0, expand([[100, 5]]))
    again = HeldAcks(here, committed=5, done=2)  # the ingest process restarted
    again.new_session()
    assert again.redelivered(102) == 2
    replay = replay_ids(here, 4)  # a checkpoint at position 4
    assert replay == [0, [[100, 4]]]
    moved = HeldAcks(there, committed=4, done=4, seed=replay)  # an empty log at 4
    moved.new_session()
    assert moved.redelivered(102) == 2  # before the checkpoint: a duplicate
    assert moved.redelivered(103) == 3
    assert moved.redelivered(104) is None  # after it: the log's next message
    moved.logged(4, [104])
    assert moved.end == 5
