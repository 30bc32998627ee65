"""Every setting is checked for type and range before any cluster starts: a wrong one gets one
line naming it and what it accepts, never a traceback."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

import dcoded.run
from dcoded.config import build_spec, compose_config, plain
from dcoded.errors import ConfigError, DcodedError
from dcoded.settings import GROUP_CHOICES, SETTINGS, check_settings, leaves

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
        ("+transport.test_drop=1.5", "transport.test_drop=1.5"),
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
        ("+straggle.mean_ms=0", "straggle.mean_ms=0 is not allowed: it must be a number > 0"),
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
        ["dataset.path=''"],
        ["train.resume=''"],
    ],
)
def test_values_the_code_takes_are_not_refused(overrides):
    build_spec(compose_config(overrides))


def test_path_values_from_a_notebook_are_taken_as_strings(tmp_path):
    cfg = compose_config(["dataset=synthetic", "dataset.n_samples=200", "dataset.n_test=20"])
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
        (["algorithm=serial", "straggle=slow"], ["straggle=slow (cdc and ssgd and asgd and ddp)"]),
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
