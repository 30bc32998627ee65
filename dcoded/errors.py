"""dcoded's errors: every failure that ends a run with one clear line derives from
:class:`DcodedError`, so a caller needs one ``except`` (``python -m dcoded`` prints
``error: <message>`` and exits with status 2; a traceback means a bug).

Bad input is refused before any work starts (:class:`ConfigError`, :class:`DatasetError`,
:class:`CheckpointError`, :class:`ClusterError`); a run that fails after training started
raises a :class:`RunError`, whose message names the last checkpoint to resume from. A run
stopped by Ctrl-C or SIGTERM raises :class:`dcoded.interrupt.Interrupted`, which is a
``KeyboardInterrupt`` (not an error) as Python's own convention asks.

>>> issubclass(ConfigError, DcodedError) and issubclass(ConfigError, ValueError)
True
>>> sorted(e.__name__ for e in RunError.__subclasses__())
['Divergence', 'ReplicaMismatch', 'ReplicaMissing', 'StepTimeout', 'WorkerLost']
"""

from __future__ import annotations


class DcodedError(Exception):
    """A failure dcoded explains in one line: its message names the setting, file, worker
    or step at fault and what to do."""


# -- refused before any work starts ------------------------------------------------------------


class ConfigError(DcodedError, ValueError):
    """A setting that cannot work; the message names it and says what is allowed."""


class DatasetError(DcodedError, ValueError):
    """A dataset setting or file is wrong; the message names the path or setting."""


class CheckpointError(DcodedError, ValueError):
    """A checkpoint is missing, corrupt or does not fit the run."""


class ClusterError(DcodedError, RuntimeError):
    """The cluster could not be started or reached, or has too few workers."""


class NetemUnavailable(ClusterError):
    """This machine (or user) cannot build the emulated network."""


class NetemRunFailed(DcodedError, RuntimeError):
    """The driver inside the emulated network exited with an error (it printed why)."""

    def __init__(self, code: int):
        super().__init__(f"the driver in the emulated network exited with status {code}")
        self.code = code


# -- failures during training: the message gets the checkpoint to resume from -----------------


class RunError(DcodedError, RuntimeError):
    """Training started and could not go on."""


class StepTimeout(RunError):
    """A step did not finish within ``train.step_timeout_s`` (or the workers' setup within
    ``train.setup_timeout_s``)."""


class WorkerLost(RunError):
    """A worker (or the scheduler) went away during the run; ``workers``: the addresses of
    the workers known to be gone (empty where it is the scheduler, or not known)."""

    def __init__(self, message: str = "", workers=()):
        super().__init__(message)
        self.workers = list(workers)

    def __reduce__(self):  # one argument for pickle, as RuntimeError's, plus the workers
        return (type(self), (str(self), self.workers))


class Divergence(RunError):
    """The training loss or the parameters stopped being finite."""


class ReplicaMismatch(RunError):
    """Two holders of one sub-batch computed different gradients; decoding would be wrong."""


class ReplicaMissing(RunError):
    """A task ran on a worker that does not hold the run's replica (a restarted worker)."""


# -- raised on a worker by the direct and multicast links; the driver reports them as
#    WorkerLost or StepTimeout, naming the ranks -------------------------------------------------


class LinkError(DcodedError, RuntimeError):
    """A worker-to-worker link of ``transport=direct`` or ``multicast`` failed."""


class PeerLost(LinkError):
    """A connection to a peer failed: the peer is gone, or the network dropped the link."""


class PeerTimeout(LinkError):
    """The messages a step expects did not all arrive within ``train.step_timeout_s``."""


class Aborted(LinkError):
    """The run was torn down while this worker waited for its peers."""


class Abandoned(DcodedError, RuntimeError):
    """A worker's computation stopped on purpose: the others finished without it
    (``coding.stragglers``). Caught by the map; never seen by a user."""
