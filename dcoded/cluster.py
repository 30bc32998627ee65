"""Clusters to train on: a local Dask cluster, or an existing scheduler at an address.

Only the entry point creates a cluster; library functions take a ``client``. Every worker
runs torch with one thread (``OMP_NUM_THREADS=1`` and ``torch.set_num_threads(1)``), so ``K``
workers on a few cores measure the algorithm and not thread contention.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import dask
from distributed import Client, LocalCluster
from distributed.security import Security
from distributed.utils import get_mp_context

from dcoded import files
from dcoded.errors import ClusterError
from dcoded.health import address_order, known_workers
from dcoded.interrupt import signals_deferred

CLUSTER_KINDS = ("local", "address", "netem")
CLOSE_TIMEOUT_S = 10


@dataclass
class Session:
    client: Client
    workers: list[str]
    dashboard: str | None
    kind: str


def security_from_config(tls: Mapping | None) -> Security | None:
    """``distributed.Security`` from ``cluster.tls`` (``ca_file``, ``cert``, ``key``: paths),
    or ``None`` when TLS is not configured. With TLS, encryption is required."""
    if not tls or not any(tls.get(k) for k in ("ca_file", "cert", "key")):
        return None
    missing = [k for k in ("ca_file", "cert", "key") if not tls.get(k)]
    if missing:
        raise ValueError(f"cluster.tls needs ca_file, cert and key; missing: {missing}")
    for k in ("ca_file", "cert", "key"):
        path = Path(tls[k]).expanduser()
        if not path.is_file():
            raise ValueError(f"cluster.tls.{k}={tls[k]} is not a file")
    return Security(
        tls_ca_file=str(Path(tls["ca_file"]).expanduser()),
        tls_client_cert=str(Path(tls["cert"]).expanduser()),
        tls_client_key=str(Path(tls["key"]).expanduser()),
        require_encryption=True,
    )


def available_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def check_cluster_config(cfg: Mapping, n_workers: int) -> None:
    kind = cfg.get("kind")
    if kind not in CLUSTER_KINDS:
        raise ValueError(f"cluster.kind={kind!r} is not known: choose one of {CLUSTER_KINDS}")
    if kind == "address" and not cfg.get("address"):
        raise ValueError(
            "cluster=address needs cluster.address=tcp://HOST:PORT (the scheduler to join)"
        )
    if kind == "address":
        _check_port(str(cfg["address"]))
        security_from_config(cfg.get("tls"))
    if not isinstance(n_workers, int) or isinstance(n_workers, bool) or n_workers < 1:
        raise ValueError(
            f"cluster.n_workers={n_workers!r} is not allowed: it must be an integer >= 1"
        )
    if kind == "netem":
        from dcoded.netem import check_links

        check_links(cfg, n_workers)
    if kind == "local" and cfg.get("dashboard"):
        _check_dashboard()


def _check_dashboard() -> None:
    """A ``ValueError`` where Dask's dashboard cannot be served here: it needs bokeh (the extra
    ``dcoded[dashboard]``), without which the cluster started and linked a page that only
    said "Dask needs bokeh"."""
    from distributed.versions import BOKEH_REQUIREMENT

    try:
        import bokeh
    except ImportError:
        found = "which does not import here"
    else:
        if BOKEH_REQUIREMENT.specifier.contains(bokeh.__version__, prereleases=True):
            return
        found = f"not bokeh {bokeh.__version__}"
    raise ValueError(
        f"cluster.dashboard=true needs the bokeh package ({BOKEH_REQUIREMENT}), {found}: "
        "pip install 'dcoded[dashboard]'"
    )


def _check_port(address: str) -> None:
    """A ``ValueError`` where ``cluster.address`` names a port no scheduler can listen on
    (outside 1..65535): a connection would be tried, on another port, and fail unclearly.

    >>> _check_port("tcp://10.0.0.5:8786")
    >>> _check_port("localhost:99999")
    Traceback (most recent call last):
    ...
    ValueError: cluster.address=localhost:99999 is not allowed: port 99999 is outside 1..65535
    """
    from distributed.comm import parse_address, parse_host_port

    try:
        _, port = parse_host_port(parse_address(address)[1])
    except (TypeError, ValueError):
        return  # no port, or not a number: Client says what is wrong with it
    if not 1 <= port <= 65535:
        raise ValueError(
            f"cluster.address={address} is not allowed: port {port} is outside 1..65535"
        )


@contextlib.contextmanager
def open_cluster(cfg: Mapping, n_workers: int) -> Iterator[Session]:
    """Start or join a cluster with at least ``n_workers`` workers; close what was started on
    exit, also on error and Ctrl-C."""
    check_cluster_config(cfg, n_workers)
    stack = contextlib.ExitStack()
    settings = {}
    processes = bool(cfg.get("processes", True))
    start_method = cfg.get("start_method", "forkserver")
    if cfg["kind"] == "local" and processes:
        settings["distributed.worker.multiprocessing-method"] = start_method
    with stack, dask.config.set(settings):
        if cfg["kind"] == "local":
            if processes:  # while the cluster lives: a worker restarted later starts too
                stack.enter_context(_main_not_rerun())
            if processes and start_method == "forkserver":
                _preload_forkserver()
            # loopback only, nothing is exposed; in-process workers talk in memory (inproc://)
            where = {}
            if processes:
                where = {
                    "host": "127.0.0.1",
                    "env": {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"},
                    "preload": ["dcoded.worker_signals"],
                }
            # a cluster interrupted while it starts cannot be closed (distributed fails on it
            # at exit, with a traceback): Ctrl-C and SIGTERM wait until it can
            with signals_deferred():
                cluster = stack.enter_context(
                    LocalCluster(
                        n_workers=n_workers,
                        threads_per_worker=1,
                        processes=processes,
                        # Dask's scheduler serves HTTP (health, metrics) even without a
                        # dashboard; its fixed default port, 8787, would collide with any other
                        # Dask here
                        dashboard_address="127.0.0.1:0",
                        scheduler_kwargs={"dashboard": bool(cfg.get("dashboard"))},
                        **where,
                        silence_logs=getattr(
                            logging, str(cfg.get("log_level", "critical")).upper()
                        ),
                    )
                )
                client = Client(cluster)
                stack.callback(_close, client)
        else:
            client = _join_scheduler(cfg)
            stack.callback(_close, client)
        where = f"the scheduler at {cfg['address']}" if cfg["kind"] != "local" else "the cluster"
        workers = _first_workers(client, n_workers, cfg.get("connect_timeout_s", 10), where)
        yield Session(
            client, workers, client.dashboard_link if cfg.get("dashboard") else None, cfg["kind"]
        )


def _join_scheduler(cfg: Mapping) -> Client:
    """A client of the scheduler at ``cluster.address``, or the one line why it cannot reach
    it (:class:`ClusterError`)."""
    if "given" not in cfg:  # a user's scheduler (netem's own is known to be up)
        timeout = cfg.get("connect_timeout_s", 10)
        _refused_at_once(cfg["address"], min(REFUSED_GRACE_S, timeout), timeout)
    try:
        return Client(
            cfg["address"],
            timeout=f"{cfg.get('connect_timeout_s', 10)}s",
            security=security_from_config(cfg.get("tls")),
        )
    except (OSError, TimeoutError, TypeError, ValueError) as e:  # TypeError: TLS needed
        raise ClusterError(
            f"cannot reach the Dask scheduler at cluster.address={cfg['address']}: "
            f"{str(e).splitlines()[0]}"
        ) from None


#: How long a refused connection to ``cluster.address`` is tried again (a scheduler that was
#: started a moment ago) before the run fails; ``Client`` would retry for its whole timeout.
REFUSED_GRACE_S = 3.0


def _refused_at_once(address: str, grace_s: float, handshake_s: float | None = None) -> None:
    """A ``ClusterError`` where nothing listens at a TCP or TLS ``address`` for ``grace_s``
    seconds (the host answers, refusing the port): ``Client`` would retry for its whole
    connect timeout. A host that does not answer is left to that timeout.

    With ``handshake_s``, a ``tcp://`` server that accepts must also speak first as a Dask
    scheduler does (its handshake, a frame of a sane length, within ``handshake_s`` seconds):
    another kind of server (HTTP waits for a request; SSH sends a banner) would leave
    ``Client`` waiting past its timeout, or reading a banner as a frame length of exabytes.
    """
    import socket
    import time

    from distributed.comm import parse_address, parse_host_port

    try:
        scheme, where = parse_address(address)
        host, port = parse_host_port(where)
    except (TypeError, ValueError):
        return  # Client says what is wrong with it
    if scheme not in ("tcp", "tls"):
        return
    deadline = time.monotonic() + grace_s
    while True:
        try:
            sock = socket.create_connection((host, port), timeout=1.0)
            break
        except ConnectionRefusedError:
            if time.monotonic() >= deadline:
                raise ClusterError(
                    f"cannot reach the Dask scheduler at cluster.address={address}: nothing "
                    f"listens on port {port} of {host} (connection refused for {grace_s:g} s)"
                ) from None
            time.sleep(0.2)
        except OSError:
            return
    with sock:
        if scheme == "tcp" and handshake_s is not None:
            _dask_speaks_first(sock, address, handshake_s)


#: The most a Dask handshake frame may claim to hold (it holds a few hundred bytes).
HANDSHAKE_MAX_BYTES = 1 << 20


def _dask_speaks_first(sock, address: str, timeout_s: float) -> None:
    """A ``ClusterError`` unless the server on ``sock`` sends what a Dask scheduler sends on
    accepting: 8 bytes, little-endian, the length of its handshake frame."""
    import time

    head = b""
    deadline = time.monotonic() + timeout_s
    try:
        while len(head) < 8:
            sock.settimeout(max(deadline - time.monotonic(), 0.001))
            got = sock.recv(8 - len(head))
            if not got:
                raise ClusterError(
                    f"the server at cluster.address={address} closed the connection without a "
                    f"Dask handshake{f' (it sent {head!r})' if head else ''}: is it a Dask "
                    "scheduler?"
                )
            head += got
    except TimeoutError:
        raise ClusterError(
            f"the server at cluster.address={address} accepted the connection but sent no Dask "
            f"handshake within {timeout_s:g} s (cluster.connect_timeout_s)"
            f"{f', only {head!r}' if head else ''}: is it a Dask scheduler, and one without "
            "TLS (tls:// otherwise)?"
        ) from None
    except OSError as e:
        raise ClusterError(
            f"cannot reach the Dask scheduler at cluster.address={address}: {e}"
        ) from None
    length = int.from_bytes(head, "little")
    if not 0 < length <= HANDSHAKE_MAX_BYTES:
        raise ClusterError(
            f"the server at cluster.address={address} does not speak Dask's protocol: it "
            f"began with {head!r}, not a handshake frame: is it a Dask scheduler?"
        )


#: The local cluster kept between the runs of this process (:func:`kept_cluster`): its key,
#: the stack that closes it, and its session.
_KEPT: dict = {}


def kept_cluster(cfg: Mapping, n_workers: int) -> Session:
    """The local cluster an earlier run of this process kept, if it has the same settings
    and all its ``n_workers`` workers; else a new one, kept for the next run (the jobs of a
    multirun: a short job spent most of its time starting one). Closed by
    :func:`close_kept_cluster`, and at the process's exit."""
    import atexit
    import json

    key = json.dumps(
        {k: v for k, v in cfg.items() if k != "connect_timeout_s"} | {"n": n_workers},
        sort_keys=True,
        default=str,
    )
    if _KEPT.get("key") == key:
        session = _KEPT["session"]
        try:  # the same workers (a recovery's replacement has another address)
            now = known_workers(session.client, 10)
            alive = sorted(now, key=address_order)[:n_workers] == session.workers
        except Exception:
            alive = False
        if alive and session.client.status == "running":
            return session
    close_kept_cluster()
    stack = contextlib.ExitStack()
    session = stack.enter_context(open_cluster(cfg, n_workers))
    if not _KEPT.get("registered"):
        atexit.register(close_kept_cluster)
    _KEPT.update(key=key, stack=stack, session=session, registered=True)
    return session


def close_kept_cluster() -> None:
    """Close the cluster :func:`kept_cluster` kept, if any (a run that failed on it leaves the
    next run a new one)."""
    stack = _KEPT.pop("stack", None)
    _KEPT.pop("key", None)
    _KEPT.pop("session", None)
    if stack is not None:
        with contextlib.suppress(Exception):
            stack.close()


@contextlib.contextmanager
def local_cluster(n_workers: int = 4, **settings) -> Iterator[Client]:
    """The local cluster ``run`` starts for ``cluster=local``, kept open for many runs: pass the
    client it yields as ``run(cfg, client=client)``. ``settings`` are ``cluster.*`` values
    (``dashboard=True``, ``start_method="spawn"``). Like ``run``'s own cluster, it starts its
    worker processes without re-running the caller's script, so a script needs no
    ``if __name__ == "__main__":`` guard and works piped to ``python -``; closed on exit.
    While it is open, the script's ``__file__`` is hidden from ``__main__`` (multiprocessing
    reads it to re-run the script in every worker it starts, a restarted one too): read it
    before the ``with``.

    >>> from dcoded import compose_config, run
    >>> with local_cluster(2) as client:  # doctest: +SKIP
    ...     for r in (1, 2):
    ...         run(compose_config([f"coding.redundancy={r}", "cluster.n_workers=2"]),
    ...             client=client)
    """
    import importlib.resources

    from omegaconf import OmegaConf

    local = importlib.resources.files("dcoded.conf").joinpath("cluster", "local.yaml")
    cfg = {**OmegaConf.to_container(OmegaConf.create(local.read_text())), **settings}
    with open_cluster(cfg, n_workers) as session:
        yield session.client


@contextlib.contextmanager
def attach_cluster(client: Client, cfg: Mapping, n_workers: int) -> Iterator[Session]:
    """The cluster of a client the caller made (a notebook's, a dask-jobqueue or Kubernetes
    cluster's): wait up to ``cluster.connect_timeout_s`` for ``n_workers`` workers; on exit the
    client and its cluster keep running."""
    if client.status != "running":
        raise ClusterError(f"the client passed to run() is {client.status}, not running")
    timeout = cfg.get("connect_timeout_s", 10)
    workers = _first_workers(client, n_workers, timeout, "the client's cluster")
    yield Session(client, workers, None, "client")


def _first_workers(client: Client, n_workers: int, timeout: float, where: str) -> list[str]:
    """The run's workers: the first ``n_workers`` in address order (:func:`address_order`:
    on the emulated network, rank ``k`` is host ``w{k}``), once the scheduler has that many
    (waiting up to ``timeout`` seconds for them)."""
    try:
        client.wait_for_workers(n_workers, timeout=timeout)
    except TimeoutError:
        have = len(known_workers(client, stale_ok=True))
        raise ClusterError(
            f"{where} has {have} worker(s) after {timeout} s, cluster.n_workers={n_workers} needed"
        ) from None
    return sorted(known_workers(client, stale_ok=True), key=address_order)[:n_workers]


@contextlib.contextmanager
def _main_not_rerun() -> Iterator[None]:
    """Start worker processes without running the caller's ``__main__`` again in each.

    multiprocessing re-runs the main script (or module) in every process it starts, as
    ``__mp_main__``: a script that calls ``run`` at top level without an ``if __name__ ==
    "__main__":`` guard would start a cluster in every worker, and code piped to ``python -``
    fails on ``<stdin>``. The workers need nothing from ``__main__`` (their code is dcoded's and
    distributed's), so it is hidden from multiprocessing while the cluster lives (a nanny may
    restart a worker later).
    """
    main = vars(sys.modules["__main__"])
    # a script is found by __file__, a module run with -m by __spec__; a notebook has neither
    hidden = {key: main.pop(key) for key in ("__file__", "__spec__") if key in main}
    main["__spec__"] = None
    try:
        yield
    finally:
        main.pop("__spec__")
        main.update(hidden)


def _preload_forkserver() -> None:
    """Workers forked from a server that has imported torch and the engine once start in a
    fraction of a second, instead of each importing torch itself."""
    ctx = get_mp_context()  # distributed sets its own preload list here, first
    ctx.set_forkserver_preload(
        ["distributed", "numpy", "torch", "dcoded.engine.cdc", "dcoded.engine.direct"]
    )


def _close(client: Client) -> None:
    with contextlib.suppress(Exception):
        client.close(timeout=CLOSE_TIMEOUT_S)


#: The loggers of Dask and of what it runs on: while a run with a folder talks to its cluster,
#: into the folder's ``dcoded.log`` instead of the console (a lost scheduler made 34 lines and
#: two tracebacks there before the run's one line).
DASK_LOGGERS = ("distributed", "distributed.client", "tornado", "asyncio")


class _LogFile(logging.FileHandler):
    """A log file opened (its folder made) at the first record only, through
    :func:`dcoded.files.append`: a run that fails before anything is logged writes nothing."""

    def __init__(self, path: Path):
        super().__init__(path, delay=True)

    def _open(self):
        Path(self.baseFilename).parent.mkdir(parents=True, exist_ok=True)
        return files.append(self.baseFilename)


@contextlib.contextmanager
def dask_logs_into(run_dir: Path | None):
    """Send :data:`DASK_LOGGERS`' warnings and errors to ``run_dir/dcoded.log`` (appended to)
    and nothing of them to the console, for the time of the block; nothing changes without a
    folder."""
    if run_dir is None:
        yield
        return
    handler = _LogFile(run_dir / "dcoded.log")
    handler.setLevel(logging.WARNING)  # what went wrong, not Dask's chatter of every connection
    handler.setFormatter(logging.Formatter("[%(asctime)s][%(name)s][%(levelname)s] - %(message)s"))
    saved = {}
    for name in DASK_LOGGERS:
        logger = logging.getLogger(name)
        saved[name] = (list(logger.handlers), logger.propagate)
        console = [h for h in logger.handlers if type(h) is logging.StreamHandler]
        logger.handlers = [h for h in logger.handlers if h not in console] + [handler]
        logger.propagate = False
    try:
        yield
    finally:
        for name, (handlers, propagate) in saved.items():
            logger = logging.getLogger(name)
            logger.handlers, logger.propagate = handlers, propagate
        handler.close()
