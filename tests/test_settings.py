"""Every setting is checked for type and range before any cluster starts: a wrong one gets one
line naming it and what it accepts, never a traceback."""

from __future__ import annotations

import copy
import dataclasses
import functools
import re
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

import dcoded.run
import dcoded.settings
from dcoded.config import build_spec, compose_config, plain
from dcoded.errors import ConfigError, DcodedError
from dcoded.settings import (
    BY_MODEL,
    GROUP_CHOICES,
    OPTION_KEYS,
    READ_BY,
    SETTINGS,
    check_settings,
    conf_values,
    config_groups,
    default_of,
    is_overlay,
    leaves,
    option_settings,
)

ROOT = Path(__file__).resolve().parent.parent

#: One composition per option of every group, so that every leaf any option has is walked.
OPTIONS = [
    [],
    ["algorithm=ssgd"],
    ["model=cnn"],
    ["optimizer=adam"],
    ["dataset=synthetic"],
    ["dataset=mnist"],
    ["cluster=address", "cluster.address=tcp://127.0.0.1:8786"],
    ["cluster=address", "cluster.address=tcp://127.0.0.1:8786", "transport=multicast",
     "transport.lan=true", "transport.pace_mbit=100"],
    ["cluster=netem", "transport=multicast"],
    ["cluster=netem", "cluster.topology=racks", "cluster.rack_size=2", "cluster.uplink_mbit=50"],
    ["straggle=slow"],
    ["straggle=stall"],
    ["straggle=exp"],
    ["transport=dask"],
    ["experiment=bench"],
    ["logger=tensorboard"],
    ["logger=mlflow"],
]  # fmt: skip


def _composed():
    seen = {}
    for overrides in OPTIONS:
        for name, value in leaves(plain(compose_config(overrides))):
            seen.setdefault(name, (overrides, value))
    return sorted(seen.items())


LEAVES = _composed()


@pytest.fixture(autouse=True)
def no_cluster(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a cluster was started for a config that cannot work")

    monkeypatch.setattr(dcoded.run, "open_cluster", refuse)


@pytest.mark.parametrize("overrides", OPTIONS, ids=lambda o: " ".join(o) or "default")
def test_every_shipped_option_passes_the_check(overrides):
    check_settings(plain(compose_config(overrides)))


def _wrong(value):
    """A value of a type the leaf does not take, as one types it on the command line."""
    return "wrong" if isinstance(value, list) else "[9]"


@pytest.mark.parametrize("name,where", LEAVES, ids=[n for n, _ in LEAVES])
def test_a_wrong_type_in_any_leaf_is_one_line_naming_it(name, where):
    overrides, value = where
    if name.startswith("dataset.") and "dataset=mnist" in overrides:
        pytest.skip("the same leaves as digits and synthetic; mnist's files are not here")
    with pytest.raises(DcodedError) as err:
        dcoded.run.run(compose_config([*overrides, f"{name}={_wrong(value)}"]), progress=False)
    message = str(err.value)
    assert "\n" not in message
    spelled = GROUP_CHOICES.get(name, name)
    assert f"{spelled}=" in message or f"{spelled} " in message, message
    if name in SETTINGS:  # says what it accepts
        assert SETTINGS[name].accepts in message


@pytest.mark.parametrize(
    "override,needle",
    [
        ("train.seed=abc", "train.seed='abc' is not allowed: it must be an integer in 0..4294"),
        ("train.seed=-1", "train.seed=-1"),
        ("train.pipeline=maybe", "train.pipeline='maybe' is not allowed: it must be true or false"),
        ("train.eval_every=-5", "train.eval_every=-5 is not allowed: it must be an integer >= 0"),
        ("train.checkpoint_every=-1", "train.checkpoint_every=-1"),
        ("train.lr=nan", "train.lr=nan is not allowed: it must be a number >= 0"),
        ("train.lr=fast", "train.lr='fast' is not allowed"),
        ("train.step_timeout_s=0", "train.step_timeout_s=0"),
        ("cluster.log_level=verbose", "cluster.log_level='verbose' is not allowed: it must be one "
         "of debug, info, warning, error, critical"),
        ("cluster.start_method=bogus", "cluster.start_method='bogus'"),
        ("cluster.torch_threads=0", "cluster.torch_threads=0 is not allowed"),
        ("cluster.connect_timeout_s=-1", "cluster.connect_timeout_s=-1"),
        ("progress=sometimes", "progress='sometimes'"),
        ("+train.lerning_rate=0.1", "train.lerning_rate is not a setting of dcoded"),
        ("+transport.test_drop=1.5", "transport.test_drop is not a setting of transport=direct "
         "but of transport=multicast"),
        ("optimizer.momentum=-1", "optimizer.momentum=-1"),
        ("optimizer._partial_=false", "optimizer._partial_=False"),
    ],
)  # fmt: skip
def test_each_value_the_issue_found_is_refused_in_one_line(override, needle):
    with pytest.raises(ConfigError) as err:
        build_spec(compose_config([override]))
    assert needle in str(err.value)
    assert "\n" not in str(err.value)


def test_the_users_own_top_level_keys_are_kept():
    check_settings(plain(compose_config(["+tag=baseline"])))


def test_cluster_address_left_unset_says_how_to_set_it():
    with pytest.raises(ConfigError, match=r"cluster.address is not set: it must be the sched"):
        build_spec(compose_config(["cluster=address"]))


@pytest.mark.parametrize(
    "override",
    ["train.seed=abc", "cluster.start_method=bogus", "cluster.log_level=verbose",
     "cluster=address"],
)  # fmt: skip
def test_the_command_line_says_one_line_and_no_traceback(override, tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "dcoded", override, f"hydra.run.dir={tmp_path}"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), done.stderr
    assert "Traceback" not in done.stdout + done.stderr


@pytest.mark.parametrize(
    "name,text,needle",
    [
        ("nothere.yaml", None, "cannot read the config"),
        ("broken.yaml", "a: [", "is not valid YAML"),
        ("broken.json", "{", "is not valid JSON"),
        ("list.json", "[1, 2]", "holds no mapping of settings"),
        ("seed.yaml", "train:\n  seed: abc\n", "train.seed='abc'"),
    ],
)
def test_a_saved_config_that_cannot_be_read_is_one_line(tmp_path, capsys, name, text, needle):
    path = tmp_path / name
    if text is not None:
        path.write_text(text)
    assert dcoded.run.main([str(path), str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and needle in err[0], err
    assert needle in (tmp_path / "out" / "error.txt").read_text()


def test_every_experiment_at_every_size_passes_the_check():
    for path in sorted((ROOT / "conf" / "experiment").glob("*.yaml")):
        for size in ("small", "full"):
            check_settings(plain(compose_config([f"experiment={path.stem}", f"size={size}"])))


@pytest.mark.parametrize(
    "override,needle",
    [
        ("+trian.lr=0.1", "trian.lr is not a setting of dcoded: did you mean train?"),
        ("+progres=false", "progres is not a setting of dcoded: did you mean progress?"),
        ("+cluster.wire=1", "cluster.wire is not a setting of dcoded"),  # the netem driver's own
        ("train.lr=${nope}", "the config cannot be resolved: Interpolation key 'nope' not found"),
        (
            "+straggle.mean_ms=0",
            "straggle.mean_ms is not a setting of straggle=none but of straggle=exp",
        ),
    ],
)
def test_typos_internal_keys_and_broken_interpolations_are_one_line(override, needle):
    with pytest.raises(ConfigError) as err:
        build_spec(compose_config([override]))
    assert needle in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize(
    "overrides",
    [
        ["cluster.log_level=WARNING"],
        ["optimizer=adam", "optimizer.eps=0"],
        ["+dataset.path=''"],  # empty: what leaving it out means
        ["train.resume=''"],
    ],
)
def test_values_the_code_takes_are_not_refused(overrides):
    build_spec(compose_config(overrides))


def test_path_values_from_a_notebook_are_taken_as_strings(tmp_path):
    from tests.test_data import make_idx_folder

    make_idx_folder(tmp_path, n_train=200, n_test=20)
    cfg = compose_config(["dataset=mnist"])
    cfg.dataset.path = tmp_path  # a pathlib.Path, as a notebook sets it
    assert plain(cfg)["dataset"]["path"] == str(tmp_path)
    build_spec(cfg)


@pytest.mark.parametrize(
    "overrides,needle",
    [
        (
            ["optimizer._target_=pathlib.Path.touch", "+optimizer._args_=[MARKER]"],
            "optimizer._target_='pathlib.Path.touch' is not allowed: it must name a torch.optim",
        ),
        (["optimizer._target_=torch.optim.lr_scheduler.StepLR"], "must name a torch.optim"),
        (["optimizer._target_=torch.optim.nothere.X"], "must name a torch.optim"),
        (
            ["+optimizer.lr._target_=pathlib.Path.touch", "+optimizer.lr._args_=[MARKER]"],
            "the optimizer's settings are plain values",
        ),
    ],
)
def test_a_config_cannot_make_the_optimizer_run_another_callable(tmp_path, overrides, needle):
    """``optimizer._target_=pathlib.Path.touch`` once created the file named in ``_args_``
    during the config check (as root under netem)."""
    marker = tmp_path / "touched"
    overrides = [o.replace("MARKER", str(marker)) for o in overrides]
    if "+optimizer.lr._target_" in overrides[0]:
        overrides = ["~optimizer.lr", *overrides]
    with pytest.raises(ConfigError) as err:
        build_spec(compose_config(overrides))
    assert needle in str(err.value) and "\n" not in str(err.value)
    assert not marker.exists()


def test_a_layout_too_large_to_enumerate_fails_in_one_line_at_once():
    """``shuffle=hybrid n_workers=40 redundancy=20 batch_size=2e11`` ran 98 s and was killed by
    the out-of-memory killer at 24 GB: the batch passed its check and the hybrid plan began
    enumerating C(40, 21) sets."""
    with pytest.raises(ConfigError, match=r"makes 137,846,528,820 sub-batches or groups"):
        build_spec(
            compose_config(
                ["coding.shuffle=hybrid", "cluster.n_workers=40", "coding.redundancy=20",
                 "train.batch_size=200000000000"]
            )
        )  # fmt: skip


@pytest.mark.parametrize(
    "overrides,needle",
    [
        (["algorithm=ddp"], "algorithm=ddp with cluster.tls.* is refused"),
        (
            ["transport=multicast", "transport.lan=true", "transport.pace_mbit=100"],
            "transport=multicast with cluster.tls.* is refused",
        ),
    ],
)
def test_what_would_go_outside_tls_is_refused_with_tls(tmp_path, overrides, needle):
    for name in ("ca.pem", "cert.pem", "key.pem"):
        (tmp_path / name).write_text("x")
    tls = [f"cluster.tls.{k}={tmp_path / f}" for k, f in
           (("ca_file", "ca.pem"), ("cert", "cert.pem"), ("key", "key.pem"))]  # fmt: skip
    cfg = compose_config(["cluster=address", "cluster.address=tls://127.0.0.1:1", *tls, *overrides])
    with pytest.raises(ConfigError, match=re.escape(needle)):
        build_spec(cfg)


@pytest.mark.parametrize(
    "overrides,needle",
    [
        (["cluster.n_workers=5000"], "cluster.n_workers=5000 is not allowed"),
        (["model.hidden=[65536,65536]"], "4,299,948,042 parameters on digits; at most"),
        (
            ["dataset=synthetic", "dataset.n_samples=100000000", "dataset.shape=[3,64,64]"],
            "bytes in every process; at most 8,589,934,592",
        ),
        (["model.hidden=[" + ",".join(["1"] * 65) + "]"], "a list of at most 64 integers"),
    ],
)
def test_every_size_a_config_sets_is_bounded_before_work_starts(overrides, needle):
    with pytest.raises(ConfigError, match=re.escape(needle)):
        build_spec(compose_config(overrides))


def test_the_model_size_bound_counts_what_the_models_build():
    from dcoded.models import build_model
    from dcoded.settings import model_params

    for model, shape in [
        ({"name": "dnn", "hidden": [128, 64]}, (1, 8, 8)),
        ({"name": "cnn", "channels": [16, 32], "hidden": 64}, (3, 32, 32)),
    ]:
        built = sum(p.numel() for p in build_model(model, shape, 10, 0).parameters())
        assert model_params(model, shape) == built


@pytest.mark.parametrize(
    "overrides, named",
    [
        (["algorithm=ddp", "coding.stragglers=1"], ["coding.stragglers=1 (cdc only)"]),
        (["algorithm=ddp", "coding.redundancy=3"], ["coding.redundancy=3 (cdc and serial only)"]),
        (["algorithm=ssgd", "transport=multicast"], ["transport=multicast (cdc only)"]),
        (["algorithm=asgd", "train.pipeline=false"], ["train.pipeline=False (cdc only)"]),
        (["algorithm=serial", "straggle=slow"], ["straggle=slow (cdc, ssgd, asgd and ddp only)"]),
        (["algorithm=asgd", "train.on_worker_loss=continue"],
         ["train.on_worker_loss=continue (cdc, ssgd and ddp only)"]),
        (["algorithm=serial", "cluster.processes=false"],
         ["cluster.processes=False (cdc, ssgd, asgd and ddp only)"]),
        (
            ["algorithm=ssgd", "coding.shuffle=summed", "coding.straggler_grace=0.5"],
            ["coding.shuffle=summed (cdc and serial only)",
             "coding.straggler_grace=0.5 (cdc only)"],
        ),
    ],
)  # fmt: skip
def test_a_setting_the_algorithm_ignores_is_named_in_one_warning(overrides, named):
    """``algorithm=ddp coding.stragglers=1`` ran without a word (the summary said ``None``)."""
    spec, _, _ = build_spec(compose_config(overrides))
    assert spec.extra["warnings"] == [f"{overrides[0]} ignores {', '.join(named)}"]


@pytest.mark.parametrize(
    "overrides, line",
    [
        (["train.replace_within_s=10"], "train.on_worker_loss=stop ignores "
         "train.replace_within_s=10 (with train.on_worker_loss=continue only)"),
        (["coding.hybrid_m=1"], "coding.shuffle=coded ignores coding.hybrid_m=1 (with "
         "coding.shuffle=hybrid only)"),
        (["coding.straggler_grace=0.5"], "coding.stragglers=0 ignores coding.straggler_grace=0.5 "
         "(with coding.stragglers > 0 only)"),
        (["cluster=netem", "cluster.rack_size=2"], "cluster.topology=switch ignores "
         "cluster.rack_size=2 (with cluster.topology=racks or fattree only)"),
        (["cluster=netem", "transport=multicast", "transport.lan=true"], "cluster=netem ignores "
         "transport.lan=True (with a cluster other than netem only)"),
        (["algorithm=ssgd", "coding.redundancy=3", "train.replace_within_s=10"],
         "algorithm=ssgd ignores coding.redundancy=3 (cdc and serial only); "
         "train.on_worker_loss=stop ignores train.replace_within_s=10 (with "
         "train.on_worker_loss=continue only)"),
    ],
)  # fmt: skip
def test_a_setting_another_setting_leaves_unread_is_named_in_the_one_warning(overrides, line):
    """``train.replace_within_s`` without ``on_worker_loss=continue``, ``hybrid_m`` without
    the hybrid shuffle, racks on a switch: each ran without a word."""
    spec, _, _ = build_spec(compose_config(overrides))
    assert spec.extra["warnings"] == [line]


def test_the_warning_is_one_line_of_the_run(capsys):
    summary = dcoded.run.run(
        compose_config(["algorithm=serial", "train.steps=2", "train.step_timeout_s=10"]),
        progress=False,
    )
    warned = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("warning: ")]
    assert warned == [
        "warning: algorithm=serial ignores train.step_timeout_s=10 (cdc, ssgd, asgd and ddp only)"
    ]
    assert summary["steps_done"] == 2


@pytest.mark.parametrize(
    "overrides, needle",
    [
        (["+cluster.bandwidth_mbit=100"], "cluster.bandwidth_mbit is not a setting of "
         "cluster=local but of cluster=netem (the settings of cluster=local: connect_timeout_s,"),
        (["+dataset.path=/nonexistent"], "dataset.path is not a setting of dataset=digits but of "
         "dataset=cifar10, fashion_mnist and mnist (the settings of dataset=digits: name, "
         "validation)"),
        (["+model.channels=[8]"], "model.channels is not a setting of model=dnn but of model=cnn"),
        (["+algorithm.bucket_cap_mb=1"], "algorithm.bucket_cap_mb is not a setting of "
         "algorithm=cdc but of algorithm=ddp"),
        (["transport=dask", "+transport.overlap=false"], "transport.overlap is not a setting of "
         "transport=dask but of transport=direct and multicast"),
        (["+straggle.speed=0.5"], "straggle.speed is not a setting of straggle=none but of "
         "straggle=slow"),
    ],
)  # fmt: skip
def test_a_setting_of_another_option_of_its_group_is_refused(overrides, needle):
    """``+cluster.bandwidth_mbit=100`` on the local cluster (where Hydra's own hint, "To append
    to your config use +cluster.bandwidth_mbit=100", leads) ran on unshaped loopback without a
    word; ``dataset.path=/nonexistent`` trained on the bundled digits. Without the ``+`` the
    override is refused the same way, before Hydra composes anything."""
    with pytest.raises(ConfigError) as err:
        build_spec(compose_config(overrides))
    assert needle in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(ConfigError) as err:
        compose_config([o.lstrip("+") for o in overrides])
    assert needle in str(err.value) and "\n" not in str(err.value)


def test_a_key_set_to_what_leaving_it_out_means_is_taken():
    """A config saved before a key left its option (``dataset.path: null`` of the digits)."""
    spec, _, _ = build_spec(compose_config(["+dataset.path=null", "+cluster.bandwidth_mbit=null"]))
    assert spec.extra["warnings"] == []


def test_an_experiment_for_another_option_is_run_and_what_it_sets_for_that_one_named():
    """``experiment=bench cluster=local`` (the bench without root) runs as before; the emulated
    links the experiment sets are not shaped, and the warning says so."""
    spec, _, _ = build_spec(compose_config(["experiment=bench", "cluster=local"]))
    assert spec.extra["warnings"] == [
        "cluster=local ignores cluster.bandwidth_mbit=100, cluster.topology=switch, "
        "cluster.rack_size=2, cluster.uplink_mbit=100 (cluster=netem only)"
    ]


@pytest.mark.parametrize(
    "overrides, needle",
    [
        (["coding.redundency=2"],
         "coding.redundency is not a setting of dcoded: did you mean coding.redundancy?"),
        (["algorithm=cdcc"], "algorithm=cdcc is not an option of algorithm: did you mean cdc? "
         "(the options: asgd, cdc, ddp, serial, ssgd)"),
        (["model=cnm"], "model=cnm is not an option of model: did you mean cnn?"),
        (["trian.lr=0.1"], "trian.lr is not a setting of dcoded: did you mean train.lr?"),
        (["cluster=address", "cluster.tls.ca_fil=x"], "did you mean cluster.tls.ca_file"),
        (["experiment=paper_tim"], "experiment=paper_tim is not an option of experiment: did "
         "you mean paper_time"),
        (["tag=baseline"], "tag is not a setting of dcoded; a key of your own takes a + "
         "(+tag=...)"),
        (["+coding.redundancy=3"], "+coding.redundancy: coding.redundancy is a setting already; "
         "set it without the +"),
        (["coding.redundancy=[1"], "an override cannot be read: "),
    ],
)  # fmt: skip
def test_a_typo_in_a_key_or_an_option_is_one_dcoded_error_naming_the_nearest(overrides, needle):
    """``compose_config(["coding.redundency=2"])`` raised Hydra's
    ``ConfigCompositionException``, 7 lines long."""
    with pytest.raises(ConfigError) as err:
        compose_config(overrides)
    assert needle in str(err.value) and "\n" not in str(err.value)


def test_hydras_own_add_and_force_add_still_work():
    cfg = compose_config(["+tag=baseline", "++coding.redundancy=3"])
    assert cfg.tag == "baseline" and cfg.coding.redundancy == 3
    from dcoded.__main__ import check_command_line

    assert check_command_line(["+tag=x", "hydra.run.dir=/tmp/x", "hydra/job_logging=none"]) is None
    assert check_command_line(["--help", "coding.redundency=2"]) is None  # Hydra's help
    assert "did you mean cdc?" in check_command_line(["-m", "algorithm=cdcc,ssgd"])
    assert "coding.redundancy?" in check_command_line(["-m", "coding.redundency=1,2"])
    assert "dataset=cifar10" in check_command_line(["dataset.path=/nonexistent"])


def test_a_forced_key_of_another_option_is_kept_and_warned_of_not_refused():
    """``paper.sweep`` forces ``++cluster.scale_model=false`` into every experiment where host
    cgroups cannot be made, ``paper_tuning``'s ``cluster=local`` included: ``++`` forces a key
    of another option in (to be warned of where it is not read), ``+`` and a plain key do not."""
    from dcoded.__main__ import check_command_line

    forced = ["-m", "experiment=paper_tuning", "++cluster.scale_model=false"]
    assert check_command_line(forced) is None
    assert "cluster=netem" in check_command_line(["+cluster.bandwidth_mbit=100"])
    assert "cluster=netem" in check_command_line(["cluster.bandwidth_mbit=100"])
    cfg = compose_config(["++cluster.bandwidth_mbit=100"])
    assert cfg.cluster.bandwidth_mbit == 100 and cfg.cluster.kind == "local"


def test_hydras_own_exits_are_left_to_it_once(capsys):
    """``--version`` (and a flag without its value) exit in Hydra's parser: they were caught
    and parsed again by the app, so Hydra printed its version twice."""
    from dcoded.__main__ import check_command_line

    with pytest.raises(SystemExit) as e:
        check_command_line(["--version"])
    assert e.value.code == 0 and capsys.readouterr().out.count("Hydra") == 1


@pytest.mark.parametrize(
    "args, needle",
    [
        (["coding.redundency=2"], "did you mean coding.redundancy?"),
        (["algorithm=cdcc"], "algorithm=cdcc is not an option of algorithm: did you mean cdc?"),
        (["-m", "algorithm=cdcc,ssgd"], "algorithm=cdcc is not an option of algorithm"),
        (["cluster.bandwidth_mbit=100"], "not a setting of cluster=local but of cluster=netem"),
    ],
)
def test_a_typo_on_the_command_line_is_one_line_and_status_2(args, needle, tmp_path):
    """``coding.redundency=2`` was Hydra's 7-line error and ``algorithm=cdcc`` 14 lines, both
    with status 1 (dcoded's own refusals: one line, status 2)."""
    done = subprocess.run(
        [sys.executable, "-m", "dcoded", *args, f"hydra.run.dir={tmp_path / 'run'}",
         f"hydra.sweep.dir={tmp_path / 'sweep'}"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("error: ") and done.stderr.count("\n") == 1, done.stderr
    assert needle in done.stderr and done.stdout == ""
    assert not any(tmp_path.iterdir())  # nothing started, nothing written


@pytest.mark.parametrize("algorithm", ["cdc", "serial", "ssgd", "asgd", "ddp"])
def test_defaults_and_what_leaving_out_means_are_not_warned_of(algorithm):
    neutral = ["coding.redundancy=1", "coding.stragglers=0", "transport=dask"]
    for overrides in ([], neutral if algorithm not in ("cdc", "serial") else []):
        spec, _, _ = build_spec(compose_config([f"algorithm={algorithm}", *overrides]))
        assert spec.extra["warnings"] == []


def test_ssgd_on_multicast_is_not_refused_for_a_pace_it_does_not_use():
    """Refused with "needs transport.pace_mbit", a setting of cdc's multicast exchange."""
    spec, _, _ = build_spec(compose_config(["algorithm=ssgd", "transport=multicast"]))
    assert spec.transport == "dask" and spec.pace_mbit is None


def test_epochs_and_steps_both_set_are_refused_not_one_dropped():
    """``train.epochs=1 train.steps=20`` ran 15 steps and dropped ``steps`` silently."""
    with pytest.raises(ConfigError, match=r"train.epochs=1 and train.steps=20 are both set"):
        build_spec(compose_config(["train.epochs=1", "train.steps=20"]))
    for both in (["train.steps=null"], []):  # null, or left at its default
        spec, replica, _ = build_spec(compose_config(["train.epochs=1", *both]))
        assert spec.steps == len(replica.data.y_train) // spec.batch_size


# -- every setting of every option: read by the run, named in a warning, or refused -------------


def _setting_groups() -> dict[str, list[str]]:
    """The groups of ``conf/`` that hold settings and their options (not the overlays, such as
    ``experiment``, that set other groups' settings)."""
    out = {}
    for group, options in config_groups().items():
        own = [o for o in options if not is_overlay(group, o)]
        if own:
            out[group] = own
    return out


def _conf_keys() -> dict[str, str]:
    """Every setting a file of ``conf/`` sets, and the first file that sets it."""
    top = {k: v for k, v in conf_values("config.yaml").items() if k not in ("defaults", "hydra")}
    found = {name: "conf/config.yaml" for name, _ in leaves(top)}
    for group, options in _setting_groups().items():
        for option in options:
            for key in option_settings(group, option):
                found.setdefault(f"{group}.{key}", f"conf/{group}/{option}.yaml")
    return found


def _undeclared() -> list[str]:
    """The keys of ``conf/`` that :data:`READ_BY` (who reads it: the table the warning line is
    made from) or :data:`SETTINGS` (what it accepts) does not declare, and the groups of
    settings whose option no key names."""
    out = [
        f"{name} ({where}): add it to {'READ_BY' if name in SETTINGS else 'SETTINGS and READ_BY'}"
        for name, where in _conf_keys().items()
        if name not in READ_BY or (name not in SETTINGS and name != "model.hidden")
    ]
    out += [
        f"conf/{group}/: a group of settings without its option key in OPTION_KEYS"
        for group in _setting_groups()
        if group not in OPTION_KEYS and group != "optimizer"
    ]
    return out


def test_every_key_in_conf_is_a_setting_whose_readers_are_declared():
    """A key added to a file of ``conf/`` without saying what it accepts and who reads it fails
    here; the test below then checks each declaration against what a run does."""
    assert _undeclared() == []
    assert set(READ_BY) == {*SETTINGS, "model.hidden"}  # a declaration of every setting, no other


def test_a_key_added_to_conf_without_its_readers_is_found(monkeypatch):
    """The negative control of the test above: a new key in ``conf/cluster/local.yaml``."""
    real = dcoded.settings.conf_values

    def with_a_new_key(path):
        values = real(path)
        return {**values, "shiny": 1} if path == "cluster/local.yaml" else values

    monkeypatch.setattr(dcoded.settings, "conf_values", with_a_new_key)
    new = "cluster.shiny (conf/cluster/local.yaml): add it to SETTINGS and READ_BY"
    assert _undeclared() == [new]


#: Read outside the run's spec (the cluster, the logger and the progress bar get them whole;
#: a checkpoint is loaded): :data:`READ_BY` alone says who reads them.
OUTSIDE_SPEC = ("cluster.", "logger.", "progress", "train.resume")
#: Settings no value of which this machine can take in any combination (a checkpoint, PEM
#: files, root for the scale model, bokeh for the dashboard): refused, which the test allows.
MAY_BE_REFUSED_EVERYWHERE = (
    "train.resume",
    "cluster.tls.ca_file",
    "cluster.tls.cert",
    "cluster.tls.key",
    "cluster.scale_model",
    "cluster.dashboard",
    "cluster.fallback",
    "optimizer._partial_",
)


@pytest.fixture(scope="module")
def data_folders(tmp_path_factory):
    from tests.test_data import make_cifar_folder, make_idx_folder

    root = tmp_path_factory.mktemp("data")
    out = {}
    for name in ("mnist", "fashion_mnist"):
        for where in ("a", "b"):
            make_idx_folder(root / where / name, n_train=200, n_test=20)
        out[name] = (str(root / "a" / name), str(root / "b" / name))
    for where in ("a", "b"):
        make_cifar_folder(root / where / "cifar10")
    out["cifar10"] = (str(root / "a" / "cifar10"), str(root / "b" / "cifar10"))
    return out


@functools.cache
def _composed(overrides: tuple[str, ...]) -> dict:
    """The composed config, interpolations kept (``optimizer.lr: ${train.lr}``)."""
    return OmegaConf.to_container(compose_config(list(overrides)))


def _config(data, algorithm: str, cluster: str, group=None, option=None, skip="") -> dict:
    """The config of ``algorithm`` on ``cluster`` with ``group=option``, and what it needs to
    be taken (an address, data files, a LAN for multicast) but ``skip``."""
    c = copy.deepcopy(_composed((f"algorithm={algorithm}", f"cluster={cluster}")))
    if group not in (None, "algorithm", "cluster"):
        c[group] = copy.deepcopy(_composed((f"{group}={option}",))[group])
    needs = {}
    if cluster == "address":
        needs["cluster.address"] = "tcp://127.0.0.1:8786"
    if c["dataset"]["name"] in data:
        needs["dataset.path"] = data[c["dataset"]["name"]][0]
        needs["train.batch_size"] = 24  # the test's CIFAR-10 has 50 samples
    if c["transport"]["name"] == "multicast" and cluster != "netem":
        needs["transport.lan"], needs["transport.pace_mbit"] = True, 100.0
    for name, value in needs.items():
        if name != skip:
            _set(c, name, value)
    return c


def _set(c: dict, name: str, value) -> None:
    *path, key = name.split(".")
    for part in path:
        c = c[part]
    c[key] = value


def _resolved(value, c: dict):
    """``value`` with its ``${a.b}`` (``optimizer.lr: ${train.lr}``) read from ``c``."""
    if isinstance(value, dict):
        return {k: _resolved(v, c) for k, v in value.items()}
    if isinstance(value, str) and value.startswith("${") and value.endswith("}"):
        return _resolved(dcoded.settings._at(c, value[2:-1]), c)
    return value


_OUTCOMES: dict[str, tuple] = {}


def _outcome(c: dict):
    """``("refused", why)``, or ``("taken", what the run reads, its warning lines)``."""
    key = repr(c)
    if key not in _OUTCOMES:
        try:
            spec, _, _ = build_spec(_resolved(c, c))
        except DcodedError as e:
            _OUTCOMES[key] = ("refused", str(e))
        else:
            reads = {
                k: v for k, v in dataclasses.asdict(spec).items() if k not in ("run_id", "extra")
            }
            _OUTCOMES[key] = ("taken", reads, " ".join(spec.extra["warnings"]))
    return _OUTCOMES[key]


def _candidates(name: str, default) -> list:
    """Values of ``name`` other than ``default`` that its setting accepts, likeliest first."""
    setting = SETTINGS.get(name) or (BY_MODEL["dnn"] if isinstance(default, list) else
                                     BY_MODEL["cnn"])  # fmt: skip
    if setting.options:
        values = list(setting.options)
    elif isinstance(default, bool):
        values = [not default]
    elif isinstance(default, int):
        values = [default + 1, default * 2, default - 1, 3, 2, 1, 0]
    elif isinstance(default, float):
        values = [default * 2, default / 2, default + 1, 0.5, 1.0, 2.0]
    elif isinstance(default, list):
        values = [[*default[:-1], default[-1] + 1], [0.8, 0.99]]
    elif name == "optimizer._target_":  # another optimizer that takes the same keywords
        values = ["torch.optim.AdamW", "torch.optim.RMSprop"]
    else:  # null, or a string
        values = [1, 2, 0.5, 50.0, [2], "tcp://127.0.0.1:8787", "debug", "elsewhere"]
    return [v for v in values if v != default and setting.test(v)]


@functools.cache
def _cases() -> list[tuple[str, str, str, str | None]]:
    """``(name, group, option, cluster)`` of every setting of every option of ``conf/`` (and of
    ``conf/config.yaml``: group ``""``), and of every option but the default one of a group
    (its option key: ``transport.name`` with ``transport=multicast``); ``cluster``: the option
    of ``cluster`` it belongs to, or None."""
    cases = [(n, "", "", None) for n, where in _conf_keys().items() if where == "conf/config.yaml"]
    for group, options in _setting_groups().items():
        chooser = f"{group}.{OPTION_KEYS.get(group)}"
        for option in options:
            on = option if group == "cluster" else None
            cases += [(f"{group}.{k}", group, option, on) for k in option_settings(group, option)
                      if f"{group}.{k}" != chooser]  # fmt: skip
            if group in OPTION_KEYS and group != "algorithm" and option != default_of(chooser, {}):
                cases.append((chooser, group, option, None))
    return cases


_VALUES: dict[tuple, tuple] = {}


def _value(data, name: str, group: str, option: str, cluster_option) -> tuple:
    """``(default, value)``: the value ``name`` is changed to, the first of
    :func:`_candidates` some algorithm takes (cdc first) on its cluster (``local`` for a setting
    of no cluster), else the last."""
    from dcoded.engine import ALGORITHMS

    if (name, group, option, cluster_option) in _VALUES:
        return _VALUES[name, group, option, cluster_option]
    base = _config(data, "cdc", cluster_option or "local", group or None, option, skip=name)
    default = dcoded.settings._at(base, name)
    tried = _candidates(name, default)
    if name == "dataset.path":
        tried = [data[base["dataset"]["name"]][1]]  # another folder of the same files
    for value in tried:
        for algorithm in sorted(ALGORITHMS, key=lambda a: a != "cdc"):
            c = _config(data, algorithm, cluster_option or "local", group or None, option, name)
            _set(c, name, value)
            if _outcome(c)[0] == "taken":
                _VALUES[name, group, option, cluster_option] = default, value
                return default, value
    _VALUES[name, group, option, cluster_option] = default, tried[-1] if tried else None
    return _VALUES[name, group, option, cluster_option]


def _check_case(data, name, group, option, algorithm, cluster) -> tuple[str, str | None]:
    """``(what the run did, what is wrong with it)`` on changing ``name`` in this combination:
    ``refused``, ``warned`` or ``read``; wrong where it is taken without a warning while
    :data:`READ_BY` says the run does not read it, warned of where it says the run does, or
    read by nobody (the run's spec the same) where it says it is."""
    if group in OPTION_KEYS and OPTION_KEYS[group] == name.split(".", 1)[1]:  # another option
        value = option
        c = _config(data, algorithm, option if group == "cluster" else cluster, group, option)
        default = default_of(name, {})
        base = _config(data, algorithm, "local" if group == "cluster" else cluster, group, default)
    else:
        default, value = _value(data, name, group, option, cluster if group == "cluster" else None)
        if value is None:  # optimizer._partial_: true is its one value
            return "refused", None
        base = _config(data, algorithm, cluster, group or None, option, skip=name)
        c = copy.deepcopy(base)
        _set(c, name, value)
    changed, before = _outcome(c), _outcome(base)
    if changed[0] == "refused":
        return "refused", None
    said = bool(re.search(re.escape(dcoded.settings.spelled(name, value)) + "(,| \\()", changed[2]))
    unread = READ_BY[name].unread(_resolved(c, c))
    if unread and not said and not any(value == v for v in READ_BY[name].same):
        return "taken", f"{name}={value!r} is not read (READ_BY) and no warning names it"
    if not unread and said:
        return "warned", f"{name}={value!r} is read (READ_BY) but a warning says not: {changed[2]}"
    same = before[0] == "taken" and before[1] == changed[1]
    if not unread and same and not name.startswith(OUTSIDE_SPEC):
        return "taken", f"{name}={value!r} is read (READ_BY) but the run's spec is the same"
    return ("warned" if said else "read"), None


def _where(name: str, group: str, option: str) -> str:
    """The file a case's setting is in: ``train`` (of ``conf/config.yaml``), ``cluster/netem``."""
    return f"{group}/{option}" if group else name.split(".")[0]


@pytest.mark.parametrize("where", sorted({_where(*case[:3]) for case in _cases()}))
def test_every_setting_is_read_or_warned_of_or_refused_with_every_algorithm_and_cluster(
    where, data_folders
):
    """Each setting of each option of ``conf/`` (and of ``conf/config.yaml``), changed from
    its default with each algorithm on each cluster: the run reads it (its spec changes), or a
    warning line names it, or the run is refused; which one, as the table :data:`READ_BY` that
    the warning is made from says. A setting read by nobody, or warned of where it is read,
    fails; so does one refused in every combination (its test proves nothing) unless no value
    can be taken on this machine."""
    from dcoded.engine import ALGORITHMS

    wrong, did = [], {}
    for name, group, option, cluster_option in _cases():
        if _where(name, group, option) != where:
            continue
        for algorithm in ALGORITHMS:
            for cluster in [cluster_option] if cluster_option else config_groups()["cluster"]:
                outcome, why = _check_case(data_folders, name, group, option, algorithm, cluster)
                did.setdefault(name, set()).add(outcome)
                if why:
                    wrong.append(f"algorithm={algorithm} cluster={cluster}: {why}")
    wrong += [
        f"{name}: refused in every combination"
        for name, outcomes in did.items()
        if outcomes == {"refused"} and name not in MAY_BE_REFUSED_EVERYWHERE
    ]
    assert did and wrong == [], "\n".join(wrong)
