"""Everything a worker needs to build its replica, as plain data (picklable, no Hydra)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field

from dcoded.coding import HybridPlan, Placement, hybrid_plan
from dcoded.coding.shuffles import scheme

#: How ``cdc``'s packets and segments travel (``transport``).
TRANSPORTS = ("dask", "direct", "multicast")


@dataclass(frozen=True)
class RunSpec:
    """One training run, independent of Hydra.

    ``dataset``, ``model`` and ``optimizer`` are plain dicts (the config groups of the same
    names); ``optimizer`` is a Hydra ``_partial_`` config of a ``torch.optim`` class.
    """

    algorithm: str
    n_workers: int
    batch_size: int
    steps: int
    dataset: Mapping
    model: Mapping
    optimizer: Mapping
    redundancy: int = 1
    group_size: int | None = None
    shuffle: str = "coded"
    #: ``coding.hybrid_m`` (``shuffle=hybrid``): groups of ``m + 1`` (see
    #: :func:`dcoded.config.build_spec`)
    hybrid_m: int | None = None
    seed: int = 0
    eval_every: int = 50
    torch_threads: int = 1
    run_id: str = "run"
    step_timeout_s: float = 300.0
    #: ``train.setup_timeout_s``: the workers' setup before the first step (their data,
    #: replicas, links or process group), bounded apart from the steps
    setup_timeout_s: float = 300.0
    checkpoint_every: int = 0
    #: ``train.on_worker_loss``: ``stop``, or ``continue`` from the newest checkpoint
    on_worker_loss: str = "stop"
    #: ``train.replace_within_s``: how long a recovery waits for a worker in a lost one's place
    replace_within_s: float = 30.0
    pipeline: bool = True
    transport: str = "dask"
    steps_per_task: int = 0
    overlap: bool = True
    pace_mbit: Mapping | None = None  # each sender's pace by phase (shuffle, seg), or None
    test_drop: float = 0.0  # multicast: a seeded fraction of datagrams dropped (tests only)
    repair_after_s: float = 0.05  # multicast: how long a datagram may take on the way
    #: ``coding.stragglers``: a step never waits for the ``s`` slowest maps (``s <= r - 1``)
    stragglers: int = 0
    #: ``coding.straggler_grace``: a worker gives up its map once ``g - s`` others are done and
    #: its own, at its pace so far, would end later than this fraction of their time after them
    straggler_grace: float = 1.0
    #: the ``straggle`` group, checked (:func:`dcoded.engine.straggle.check`)
    straggle: Mapping = field(default_factory=lambda: {"model": "none"})
    bucket_cap_mb: float | None = None  # ddp: DistributedDataParallel's (None: torch's)
    #: the scale model: the factor every host's quota was raised by for the compute speed
    #: under it (:func:`dcoded.scale.corrected_quota`; 1: none); a ``straggle=slow`` worker's
    #: quota, a fraction of its host's, is raised alike
    host_quota_scale: float = 1.0
    #: the scale model's time-dilation factor (1: none): the timers above that stand for a
    #: network or compute time are already multiplied by it; the others read it here
    dilation: float = 1.0
    extra: Mapping = field(default_factory=dict)

    @property
    def placement(self) -> Placement:
        return Placement(self.n_workers, self.redundancy, self.group_size)

    @property
    def hybrid(self) -> HybridPlan | None:
        """The hybrid shuffle's family and charges (one cluster), or ``None``."""
        if not scheme(self.shuffle).needs_plan:
            return None
        p = self.placement
        return hybrid_plan(p.g, self.redundancy, self.hybrid_m)

    @property
    def replicated(self) -> bool:
        """``r = K``: every worker computes the whole batch and updates all of ``θ`` itself,
        so nothing is shuffled or gathered."""
        return self.algorithm in ("cdc", "serial") and self.redundancy == self.n_workers

    def to_dict(self) -> dict:
        return asdict(self)
