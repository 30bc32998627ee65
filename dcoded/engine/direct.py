"""CDC-SSGD with a direct data plane (``transport=direct``).

Dask places the work, launches it, watches it and notices a lost worker, as for
``transport=dask``; but a step's shuffle messages, reduced segments and updated segments go
straight from worker process to worker process, over one Dask comm per pair of workers opened
once per run (Dask's own comm layer: its addressing, its serialisation and, with
``cluster.tls.*``, its TLS). A worker pushes a message as ``{"op": "dcoded_push", ...}`` on its
connection; the receiving worker's handler drops it in the run's mailbox, where the step loop
waits for exactly the messages it expects (with ``train.step_timeout_s``).

Each worker runs the steps in one task per *chunk*: by default every step up to the next
evaluation, checkpoint or record collection (``transport.steps_per_task=0``), or ``N`` steps a task.
The math of a step is that of ``transport=dask`` (:mod:`dcoded.engine.cdc`), in the same order,
so both give ``serial``'s ``param_sha256``.

A worker that dies breaks its connections: its peers' sends fail (:class:`PeerLost`), the
driver finds the worker gone, and tearing the run down wakes every loop still waiting
(:meth:`Link.close`), so no thread is left stuck in a surviving worker.
"""

from __future__ import annotations

import secrets
import statistics
import time
from collections import defaultdict
from collections.abc import Sequence

import numpy as np
from distributed import get_worker

from dcoded.checkpoint import concat_shards
from dcoded.coding import charged_value, sum_in_order
from dcoded.coding.messages import (
    message_needs,
    sent_bytes,
    shuffle_receives,
    shuffle_sends,
    step_messages,
)
from dcoded.coding.stragglers import (
    decode_requests,
    encode_requests,
    length,
    next_round,
    value_piece,
)
from dcoded.engine import registry
from dcoded.engine.cdc import (
    cdc_replicated,
    cross_bytes,
    map_grads,
    own_chunk,
    payload,
    record_map,
    reduce_segment,
    update_segment,
)
from dcoded.engine.driver import (
    Clock,
    Context,
    after_step,
    bookkeeping_due,
    pinned,
)
from dcoded.engine.link import Link
from dcoded.engine.multicast import KEY, MulticastLink, group_address
from dcoded.engine.registry import WorkerState, record, task_key
from dcoded.engine.spec import RunSpec
from dcoded.engine.straggle import Injector
from dcoded.errors import Aborted, PeerLost, PeerTimeout, StepTimeout, WorkerLost
from dcoded.topology import sender_shares

# --------------------------------------------------------------------------- on the workers


def setup(
    run_id: str, rank: int, spec: RunSpec, peers: list[str], theta, optimizer_state, key=None
):
    """:func:`dcoded.engine.registry.setup`, the push handler, and this rank's :class:`Link`
    (``key``: the run's multicast authentication key, for ``transport=multicast``)."""
    out = registry.setup(run_id, rank, spec, theta, optimizer_state)
    if spec.transport == "multicast":
        link = MulticastLink(
            run_id,
            rank,
            peers,
            get_worker(),
            receiver_sets(spec, rank),
            spec.pace_mbit,
            key,
            spec.test_drop,
            spec.seed,
            spec.repair_after_s,
        )
    else:
        link = Link(run_id, rank, peers, get_worker())
        if spec.pace_mbit:
            link.pace(tcp_paces(spec, rank))
    link.connect_timeout *= spec.dilation  # the scale model: a connection is network time
    link.unacked_timeout_s = spec.step_timeout_s  # not Dask's 30 s: a live peer is not lost
    link.open(send_peers(spec, rank), spec.setup_timeout_s)  # while no rank computes
    st = registry.find_state(run_id, rank)
    st.link = link
    if spec.stragglers:
        link.serve = lambda step, asker, data: _serve(st, link, step, asker, data)
    return out


def tcp_paces(spec: RunSpec, rank: int) -> dict[str, dict[int, float]]:
    """Per phase (``shuffle``, ``seg``), the pace in Mbit/s of ``rank``'s connection to each
    peer it sends to: the rank's pace for the phase (``spec.pace_mbit``) times that peer's
    share of what it sends then (:func:`dcoded.topology.sender_shares`)."""
    phases = step_messages(spec.placement, spec.shuffle, spec.hybrid)
    return {
        key: {
            peer: spec.pace_mbit[key] * share
            for peer, share in sender_shares(phases[phase], rank).items()
        }
        for key, phase in (("shuffle", "shuffle"), ("seg", "params"))
    }


def send_peers(spec: RunSpec, rank: int) -> set[int]:
    """Every rank that ``rank`` sends to: the others of its cluster (the shuffle, the
    all-gather) and the owners of its segment index in the other clusters (the cross-cluster
    sum); none at ``r = K``, where nothing moves."""
    if spec.replicated:
        return set()
    p = spec.placement
    c, me = p.cluster_of(rank), p.local(rank)
    return {p.global_id(c, i) for i in range(p.g) if i != me} | {
        p.global_id(o, me) for o in range(p.n_clusters) if o != c
    }


def receiver_sets(spec: RunSpec, rank: int) -> list[tuple[int, ...]]:
    """Every set of two or more receivers, ``rank`` among them, that a message of the run
    goes to (global ranks): coded packets, the all-gather, the cross-cluster sum."""
    p = spec.placement
    c, me = p.cluster_of(rank), p.local(rank)
    sets = set()
    if not spec.replicated:
        for j in range(p.g):
            for _, receivers in shuffle_sends(p, spec.shuffle, j, spec.hybrid):
                sets.add(tuple(p.global_id(c, k) for k in receivers))
            sets.add(tuple(p.global_id(c, i) for i in range(p.g) if i != j))
        for o in range(p.n_clusters):
            sets.add(tuple(p.global_id(x, me) for x in range(p.n_clusters) if x != o))
    return sorted(s for s in sets if len(s) > 1 and rank in s)


def multicast_groups(spec: RunSpec, workers: Sequence[str]) -> dict[str, list[str]]:
    """Every multicast group of the run (:func:`receiver_sets` of every rank), its address
    and its members' addresses (``workers``: each rank's)."""
    return {
        group_address(spec.run_id, members): [workers[m] for m in members]
        for rank in range(spec.n_workers)
        for members in receiver_sets(spec, rank)
    }


def _key(step: int, *parts) -> str:
    return "/".join(map(str, (step, *parts)))


def run_steps(run_id: str, rank: int, start: int, stop: int, *after) -> int:
    """Steps ``start..stop-1`` of this rank; ``after``: its previous task (an ordering)."""
    st = registry.state(run_id, rank)
    link: Link = st.link
    for step in range(start, stop):
        t0, repairs = time.time(), link.repair_counts()
        if st.spec.replicated:
            cdc_replicated(run_id, rank, step)  # r = K: nothing moves, as on Dask
        else:
            _step(run_id, st, link, step)
        link.flush(st.spec.step_timeout_s)
        record(
            run_id,
            step=step,
            rank=rank,
            phase="step",
            start=t0,
            stop=time.time(),
            sent=link.drain_sent(),
            repairs={k: v - repairs[k] for k, v in link.repair_counts().items()},
        )
    return stop


def _step(run_id: str, st: WorkerState, link: Link, step: int) -> None:
    """Map, shuffle, reduce (and sum across clusters), update, all-gather: one CDC step."""
    one = _Step(run_id, st, link, step)
    grads, complete = one.map()
    received, plain = one.shuffle(grads, complete)
    reduced = one.reduce(grads, received, plain)
    if one.p.n_clusters == 1:
        one.all_gather(one.update(reduced))
    else:
        one.across_clusters(reduced)


class _Step:
    """One rank's CDC step on its links, phase by phase, each phase recorded."""

    def __init__(self, run_id: str, st: WorkerState, link: Link, step: int):
        self.run_id, self.st, self.link, self.step = run_id, st, link, step
        self.spec, self.p, self.rank = st.spec, st.placement, st.rank
        self.c, self.me, self.timeout = st.cluster, st.local, st.spec.step_timeout_s
        # each message leaves as soon as the sub-batches it needs are computed (with
        # transport.overlap), so the network works while the map goes on
        self.unsent = {
            tag: (receivers, message_needs(self.p, tag))
            for tag, receivers in shuffle_sends(
                self.p, self.spec.shuffle, self.me, self.spec.hybrid
            )
        }
        self.counts: dict[str, int] = defaultdict(int)
        self.encoding = 0.0  # seconds spent making messages inside the map
        self.began = time.monotonic()

    def peer(self, local: int) -> int:
        return self.p.global_id(self.c, local)

    def phase(self, name: str, start: float, **extra) -> float:
        now = time.time()
        record(
            self.run_id, step=self.step, rank=self.rank, phase=name, start=start, stop=now, **extra
        )
        return now

    def exchange(self, name: str, part: str, messages, expected) -> dict:
        """Send, then wait for what this rank expects; record when it began to send and
        when it had everything (the driver times the exchange across ranks)."""
        start = time.time()
        if messages:
            self.link.send(messages)
        got = self.link.take(expected, self.timeout)
        self.phase(name, start, exchange=part)
        return got

    def send_ready(self, grads: dict) -> None:
        ready = [tag for tag, (_, needs) in self.unsent.items() if needs <= grads.keys()]
        t = time.time()
        out = []
        for tag in ready:
            receivers, _ = self.unsent.pop(tag)
            message = payload(self.st, tag, grads)
            for field, n in sent_bytes(self.p, tag, message).items():
                self.counts[field] += n
            out += [(self.peer(k), _key(self.step, *tag), tag[0], message) for k in receivers]
        self.encoding += time.time() - t
        if out:
            self.link.send(out)

    def map(self) -> tuple[dict, bool]:
        """``(grads, complete)``: this rank's sub-batch gradients (all it holds, unless it
        gave up on its map as a straggler), their messages sent as each became ready."""
        st, spec, step, rank = self.st, self.spec, self.step, self.rank
        t = time.time()
        tolerant = spec.stragglers > 0
        injector = Injector(spec, rank, step, st.throttle is not None)
        stop, on_grad = None, self.send_ready if spec.overlap else None
        self.link.begin(step)  # what comes of earlier steps is dropped (a late one's, a replay)
        if tolerant:
            stop, on_grad, judged = _give_up_rule(st, self.link, step, self.began, on_grad)
        grads, loss, digests = map_grads(st, step, on_grad=on_grad, stop=stop, injector=injector)
        if tolerant:
            judged()
        complete = len(grads) == len(self.p.held_by(self.me))
        if complete and not spec.overlap:
            self.send_ready(grads)
        now = time.time()
        if injector.active or tolerant:
            record(
                self.run_id,
                step=step,
                rank=rank,
                phase="straggle",
                abandoned=not complete,
                **injector.fields(),
            )
        record_map(self.run_id, st, step, t, loss, digests, stop=now - self.encoding)
        record(
            self.run_id,
            step=step,
            rank=rank,
            phase="encode",
            start=now - self.encoding,
            stop=now,
            **self.counts,
        )
        return grads, complete

    def shuffle(self, grads: dict, complete: bool) -> tuple[dict, dict]:
        """``(received, plain)``: the messages this owner needs, and (not waiting for the
        stragglers) the plain values that replace what a late worker did not send."""
        st, spec, step, rank, p = self.st, self.spec, self.step, self.rank, self.p
        wanted = shuffle_receives(p, spec.shuffle, self.me, spec.hybrid)
        if spec.stragglers <= 0:
            expected = {_key(step, *tag): self.peer(j) for tag, j in wanted}
            got = self.exchange("shuffle", "inner", [], expected)
            return {tag: got[_key(step, *tag)] for tag, _ in wanted}, {}
        start = time.time()
        st.serving = (step, grads) if complete else None
        took_us = min(int(1e6 * (time.monotonic() - self.began)), 2**32 - 1)
        notice = np.array([took_us if complete else 0], np.uint32)  # how long the map took
        what = "done" if complete else "gave-up"
        self.link.send(
            [
                (self.peer(i), f"{step}/{what}/{rank}", "notice", notice)
                for i in range(p.g)
                if i != self.me
            ]
        )
        received, plain, late = _receive_tolerant(st, self.link, step, grads, wanted, self.timeout)
        self.phase("shuffle", start, exchange="inner")
        record(
            self.run_id,
            step=step,
            rank=rank,
            phase="tolerance",
            late=sorted(self.peer(j) for j in late),
        )
        return received, plain

    def reduce(self, grads: dict, received: dict, plain: dict) -> np.ndarray:
        """This owner's reduced segment (its cluster's sum)."""
        t = time.time()
        reduced = reduce_segment(self.st, grads, received, plain)
        extra = cross_bytes(self.st, reduced) if self.p.n_clusters > 1 else {}
        self.phase("decode", t, **extra)
        return reduced

    def across_clusters(self, reduced: np.ndarray) -> None:
        """``g < K``: the owners of one segment index sum it across the clusters
        (:mod:`dcoded.coding.cross`), and the θ all-gather inside the cluster overlaps the
        second half. Each owner's chunks go to the other owners of the same index, theirs of
        its own chunk come back (reduce-scatter, ``red``); it adds them in cluster order, steps
        that chunk of its segment at once and sends it to its cluster (``seg``) while the
        summed chunk goes to the other owners (all-gather, ``red-sum``); each summed chunk
        that comes is stepped and sent on to the cluster the same way. Every owner of the
        index steps every chunk with the same sum and kernels, so their segments agree bit
        for bit, and θ never leaves the cluster."""
        p, c, me, step = self.p, self.c, self.me, self.step
        others = {p.global_id(o, me): o for o in range(p.n_clusters) if o != c}
        mine = self.cross_scatter(reduced, others)
        peers = [self.peer(i) for i in range(p.g) if i != me]
        start, deadline = time.time(), time.monotonic() + self.timeout
        chunks: dict[int, np.ndarray] = {}
        stepping = 0.0

        def step_and_send(o: int, total: np.ndarray, also: list) -> None:
            nonlocal stepping
            t = time.time()
            chunks[o] = self.st.optimizer.step_chunk(o, total, self.spec.batch_size)
            stepping += time.time() - t
            seg = [(i, _key(step, "seg", me, o), "seg", chunks[o]) for i in peers]
            self.link.send(also + seg, phase="params")  # the summed chunk goes with θ's

        step_and_send(c, mine, [(k, _key(step, "red", c), "red", mine) for k in others])
        waiting = {_key(step, "red", o): k for k, o in others.items()}
        while waiting:
            for key, total in self.link.take_any(waiting, deadline, self.timeout).items():
                step_and_send(others[waiting.pop(key)], total, [])
        segment = np.concatenate([chunks[o] for o in range(p.n_clusters)])
        now = time.time()
        self.phase("update", now - stepping, params=segment.nbytes * (p.g - 1))
        expected = {
            _key(step, "seg", i, o): self.peer(i)
            for i in range(p.g)
            if i != me
            for o in range(p.n_clusters)
        }
        got = self.link.take(expected, max(0.0, deadline - time.monotonic()))
        self.phase("params", start, exchange="seg")
        segments = [
            segment
            if i == me
            else np.concatenate([got[_key(step, "seg", i, o)] for o in range(p.n_clusters)])
            for i in range(p.g)
        ]
        t = time.time()
        self.st.replica.set_theta(np.concatenate(segments))
        self.phase("update", t)  # installing θ for the next map

    def cross_scatter(self, reduced: np.ndarray, others: dict[int, int]) -> np.ndarray:
        """The reduce-scatter across clusters: this owner's chunks to the other owners of its
        index (``others``: rank -> cluster), theirs of its own chunk back, added in cluster
        order."""
        p, c, step = self.p, self.c, self.step
        got = self.exchange(
            "shuffle",
            "red",
            [
                (k, _key(step, "red", c, o), "red", own_chunk(self.st, reduced, o))
                for k, o in others.items()
            ],
            {_key(step, "red", o, c): k for k, o in others.items()},
        )
        parts = [
            own_chunk(self.st, reduced, c) if o == c else got[_key(step, "red", o, c)]
            for o in range(p.n_clusters)
        ]
        return sum_in_order(parts)

    def update(self, reduced: np.ndarray) -> np.ndarray:
        t = time.time()
        segment = update_segment(self.st, [reduced])
        self.phase("update", t, params=segment.nbytes * (self.p.g - 1))
        return segment

    def all_gather(self, segment: np.ndarray) -> None:
        """Send this owner's updated segment to the cluster, take theirs, install ``θ``."""
        p, me, step = self.p, self.me, self.step
        got = self.exchange(
            "params",
            "seg",
            [(self.peer(i), _key(step, "seg", me), "seg", segment) for i in range(p.g) if i != me],
            {_key(step, "seg", i): self.peer(i) for i in range(p.g) if i != me},
        )
        segments = [segment if i == me else got[_key(step, "seg", i)] for i in range(p.g)]
        t = time.time()
        self.st.replica.set_theta(np.concatenate(segments))
        self.phase("update", t)  # installing θ for the next map


# --------------------------------------------------------------------------- not waiting


#: How long after the ``g - s``-th map a worker still behind keeps going before it judges its
#: own pace, as a fraction of the time that map took: the workers that finished have just
#: freed their share of the CPU, and a worker that was only queued behind them speeds up.
SETTLE = 0.25


def _give_up_rule(st: WorkerState, link: Link, step: int, began: float, on_grad):
    """``(stop, on_grad, judged)`` for this worker's map. Once ``g - s`` others have finished
    theirs (then every sub-batch has a finished holder), it is *late* if its own finish, at the
    pace it has kept so far, would come later than ``coding.straggler_grace`` times the time
    the last of them took, after them. It gives up at once if late and slow in its recent steps
    too (the median of its last paces, :attr:`WorkerState.paces`, above ``1 + grace``); else
    only after :data:`SETTLE` of that time, and only if it has computed nothing yet or has no
    history. So a slow worker gives up as soon as the others are done, a stalled one soon
    after, and one that was only queued behind the others for the CPU, or started late, is
    waited for. ``judged()`` (after the map): this step's pace against the others', for the
    history."""
    n = len(st.placement.held_by(st.local))
    need = st.placement.g - st.spec.stragglers
    grace = st.spec.straggler_grace
    done = [0]

    def counted(grads):
        done[0] = len(grads)
        if on_grad is not None:
            on_grad(grads)

    def quorum():
        finished = sorted(
            (t, said) for what, t, said in link.notices(step).values() if what == "done"
        )
        if len(finished) < need:
            return None
        return finished[need - 1][0], finished[need - 1][1] / 1e6  # when, and how long it took

    def stop() -> bool:
        found = quorum()
        if found is None:
            return False
        at, took = found
        now = time.monotonic()
        # nothing computed yet: at best it needs what the others took, from now on
        finish = began + (now - began) * n / done[0] if done[0] else now + took
        late = finish > at + grace * took
        if st.paces and statistics.median(st.paces) > 1 + grace:
            return late  # known to be slow: no need to wait and see
        if now < at + SETTLE * took:  # let the pace settle: the CPU the others freed
            return False
        return late and (not done[0] or not st.paces)

    def judged() -> None:
        found, took_me = quorum(), time.monotonic() - began
        if found is None or not found[1]:
            st.paces.append(1.0)  # among the first g - s
        elif done[0] == n:
            st.paces.append(max(took_me / found[1], 1.0))
        elif done[0]:
            st.paces.append(took_me * n / done[0] / found[1])

    return stop, counted, judged


def _receive_tolerant(st, link, step, grads, wanted, timeout):
    """``(received, plain, late)``: the messages this owner waited for, the plain values that
    replace what it will not get, and whom it did not wait for (local indices).

    The worker that falls behind knows it first (:func:`_give_up_rule`) and says so; each
    owner acts alone on what it has heard: it waits for every worker that did not give up,
    and asks the lowest finished holder of each value it lacks from those that did, or that
    its own abandoned map did not compute (:func:`dcoded.coding.stragglers.backups`). No sum
    depends on who was late, so owners that heard different things still agree to the bit."""
    spec, p, rank, me, c = st.spec, st.placement, st.rank, st.local, st.cluster
    have = set(grads)  # the map is over: what it computed stays as it is
    keys = {tag: _key(step, *tag) for tag, _ in wanted}
    senders = {keys[tag]: p.global_id(c, j) for tag, j in wanted}
    asked: dict[tuple, int] = {}  # request -> the holder asked
    replies: dict[str, tuple[int, list]] = {}  # reply key -> (holder, its requests in order)
    deadline = time.monotonic() + timeout
    while True:
        version, box, notices = link.look(step)
        arrived = {tag for tag, key in keys.items() if key in box}
        heard = {p.local(r): what for r, (what, *_) in notices.items()}
        move = next_round(
            p, spec.shuffle, spec.hybrid, me, st.segments, have, heard, arrived, asked
        )
        if move.on_time:
            if len(arrived) == len(keys):
                got = link.take({keys[t]: senders[keys[t]] for t in keys}, timeout)
                return {tag: got[keys[tag]] for tag in keys}, {}, set()
            waiting_for = {keys[t]: senders[keys[t]] for t in keys if t not in arrived}
        else:
            late = move.late
            _ask_for_plain(st, link, step, move.ask, asked, replies)
            waiting_for = {keys[t]: senders[keys[t]] for t in move.awaited}
            waiting_for.update(
                {key: p.global_id(c, h) for key, (h, _) in replies.items() if key not in box}
            )
            if not waiting_for and move.settled:
                break
        now = time.monotonic()
        if now > deadline:
            raise _timed_out(rank, timeout, waiting_for)
        link.nudge(waiting_for)
        link.wait_change(version, min(link.poll_s, deadline - now))
    use = [t for t in keys if t in arrived]
    got = link.take(
        {
            **{keys[t]: senders[keys[t]] for t in use},
            **{key: p.global_id(c, h) for key, (h, _) in replies.items()},
        },
        timeout,
    )
    return {t: got[keys[t]] for t in use}, _plain_values(st, got, replies), late


def _ask_for_plain(st, link, step, ask: dict[int, list], asked: dict, replies: dict) -> None:
    """Ask each holder ``h`` of ``ask`` for the plain values of its requests ``ask[h]``, in
    one message; note whom each request went to (``asked``) and the key of each reply, with
    its holder and requests (``replies``)."""
    p, spec, rank, c = st.placement, st.spec, st.rank, st.cluster
    for h, rs in ask.items():
        asked.update(dict.fromkeys(rs, h))
        n = len(replies)
        replies[f"{step}/plain/{p.global_id(c, h)}/{rank}/{n}"] = (h, rs)
        data = np.concatenate([[n], encode_requests(rs, p, spec.hybrid)]).astype(np.uint32)
        link.send([(p.global_id(c, h), f"{step}/ask/{rank}/{n}", "ask", data)])


def _timed_out(rank: int, timeout: float, waiting_for: dict) -> PeerTimeout:
    """The error of an owner that waited ``timeout`` seconds for ``waiting_for`` (message key
    -> sender), or, with none, for a finished holder to ask."""
    if waiting_for:
        return PeerTimeout(
            f"rank {rank} waited train.step_timeout_s={timeout:g}s for messages from "
            f"rank(s) {sorted(set(waiting_for.values()))} (e.g. {next(iter(waiting_for))})"
        )
    return PeerTimeout(
        f"rank {rank} waited train.step_timeout_s={timeout:g}s for a finished "
        "holder of what the workers that gave up did not send"
    )


def _plain_values(st, got: dict, replies: dict) -> dict:
    """The plain value of each request, cut from the replies ``got`` (reply key -> the
    values of its requests, one after another)."""
    plain = {}
    for key, (_, rs) in replies.items():
        reply, at = got[key], 0
        for request in rs:
            n = length(request, st.local, st.segments)
            plain[request] = reply[at : at + n]
            at += n
    return plain


def _serve(st: WorkerState, link: Link, step: int, asker: int, data) -> None:
    """Answer a request for plain values (on the thread that received it): the slices of
    this worker's gradients of ``step`` that the owner ``asker`` (global rank) lacks."""
    p, spec = st.placement, st.spec
    serving = st.serving
    if serving is None or serving[0] != step:
        link.fail(
            PeerTimeout(
                f"rank {st.rank} was asked for step {step}'s values by rank {asker} but holds "
                f"{'none' if serving is None else f'step {serving[0]}'}'s"
            )
        )
        return
    grads, k = serving[1], p.local(asker)
    values, n = [], int(data[0])
    for request in decode_requests(data[1:], p, spec.hybrid):
        if request[0] == "g":
            values.append(grads[request[1]][request[2] : request[3]])
        else:
            group, j = request[1], request[2]
            whole = charged_value(spec.hybrid, group, k, grads, st.segments)
            values.append(value_piece(group, k, j, whole))
    reply = np.concatenate(values) if values else np.zeros(0, np.float32)
    link.send([(asker, f"{step}/plain/{st.rank}/{asker}/{n}", "backup", reply)])


# --------------------------------------------------------------------------- the driver


def chunk_end(ctx: Context, start: int) -> int:
    """The step after the last one of the task that starts at ``start``: the next step with
    bookkeeping (evaluation, checkpoint, record collection, the last), or ``steps_per_task``."""
    spec = ctx.spec
    most = spec.steps_per_task or spec.steps
    step = start
    while step + 1 < spec.steps and step + 1 - start < most and not bookkeeping_due(ctx, step):
        step += 1
    return step + 1


def _setup_ranks(ctx: Context) -> list:
    """Run :func:`setup` on every rank (from the checkpoint resumed, if any); their futures."""
    spec, client, workers = ctx.spec, ctx.client, ctx.workers
    run = spec.run_id
    theta0 = ctx.resume.theta if ctx.resume else None
    opt0 = ctx.resume.optimizer if ctx.resume else None
    # the multicast datagrams' authentication key: new for each run, never written anywhere
    secret = secrets.token_bytes(KEY) if spec.transport == "multicast" else None
    last = [
        client.submit(
            setup,
            run,
            k,
            spec,
            list(workers),
            theta0,
            opt0,
            secret,
            key=task_key(run, "setup", ctx.start_step - 1, k),
            **pinned(workers[k]),
        )
        for k in range(spec.n_workers)
    ]
    ctx.wait_all(last, "worker setup", setup=True)
    ctx.collect("setup")  # setup's records are not training
    return last


def _submit_steps(ctx: Context, start: int, stop: int, after: list | None = None) -> list:
    """The task of each rank for steps ``start..stop-1``, after ``after[k]`` (one submitted
    ahead); a task after one the driver waited for depends on nothing, so the scheduler
    forgets each finished task instead of keeping a chain back to the setup."""
    spec, client, workers = ctx.spec, ctx.client, ctx.workers
    return [
        client.submit(
            run_steps,
            spec.run_id,
            k,
            start,
            stop,
            *([after[k]] if after else []),
            key=task_key(spec.run_id, "steps", start, k),
            **pinned(workers[k]),
        )
        for k in range(spec.n_workers)
    ]


def train_direct(ctx: Context) -> np.ndarray:
    """Run CDC steps from ``ctx.start_step`` to ``spec.steps`` over direct connections;
    return the final ``θ`` (from rank 0)."""
    spec, client, workers = ctx.spec, ctx.client, ctx.workers
    run, p = spec.run_id, spec.placement
    last = _setup_ranks(ctx)

    def theta() -> np.ndarray:
        current = client.submit(registry.current_theta, run, 0, last[0], **pinned(workers[0]))
        return ctx.gather(current, "gathering θ")

    def snapshot() -> tuple[np.ndarray, dict]:
        states = [
            client.submit(registry.shard_state, run, k, last[k], **pinned(workers[k]))
            for k in range(p.g)
        ]
        return theta(), concat_shards(ctx.gather(states, "gathering optimizer shards"))

    per_epoch = ctx.steps_per_epoch
    clock = Clock()
    ahead, done_at, step = None, 0.0, ctx.start_step  # from the clock's start
    while step < spec.steps:
        stop = chunk_end(ctx, step)
        # the clock stood still during bookkeeping: what the driver did since counts here
        t0 = done_at
        current = ahead or _submit_steps(ctx, step, stop)  # the driver has waited for the last ones
        ahead = None
        if spec.pipeline and stop < spec.steps and not bookkeeping_due(ctx, stop - 1):
            # the next task waits on this one on each worker: no driver round trip between
            ahead = _submit_steps(ctx, stop, chunk_end(ctx, stop), current)
        what = f"step {step}" if stop - step == 1 else f"steps {step}..{stop - 1}"
        wait_direct(ctx, current, what, spec.step_timeout_s * (stop - step))
        done_at = clock.now()
        last = current
        if stop - step == 1:
            ctx.log.driver_step(step, epoch=step // per_epoch, wall_s=done_at, step_s=done_at - t0)
        else:
            with clock.paused():
                ctx.collect(f"after step {stop - 1}")
            ctx.log.chunk_rows(range(step, stop), t0, done_at, per_epoch)
        for s in range(step, stop):
            after_step(ctx, s, clock, theta, snapshot)
        step = stop
    return theta()


def wait_direct(ctx: Context, futures: list, what: str, timeout: float) -> None:
    """:meth:`Context.wait_all`, with the workers' own failures told as the driver's: a lost
    peer is :class:`WorkerLost` (naming the dead worker when the scheduler knows it), a peer
    that never sent is :class:`StepTimeout`."""
    try:
        ctx.wait_all(futures, what, timeout=timeout)
    except (PeerLost, Aborted) as e:
        ctx.check_cluster(what)
        raise WorkerLost(f"{what}: {e}") from None
    except PeerTimeout as e:
        ctx.check_cluster(what)
        raise StepTimeout(f"{what}: {e}") from None
